"""The service's API contract as code: paths, enums, limits, request validation and response parsing.

Every fact of ``api-reference.md`` that the client needs is written once, here. Pure functions only: no Airflow,
no transport. The sync hook, the async hook, the operators (for parse-time validation) and the tests use it.
The simulator imports the path and limit constants only; it implements the server's rules on its own.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:
    from airflow_gpumarket.types import Instance

from airflow_gpumarket.exceptions import (
    GpuMarketAuthError,
    GpuMarketCreateRefusedError,
    GpuMarketError,
    GpuMarketNotFoundError,
    GpuMarketOfferUnavailableError,
    GpuMarketQuotaExceededError,
    GpuMarketRateLimitError,
    GpuMarketServerError,
    GpuMarketTransportError,
    GpuMarketValidationError,
)

# --- Paths (mind the trailing slashes: they are part of the contract) ------------------------------------
API_PREFIX = "/api/v0"
PATH_SEARCH_OFFERS = f"{API_PREFIX}/bundles/"
PATH_CREATE_INSTANCE = f"{API_PREFIX}/asks/{{offer_id}}/"
PATH_INSTANCES = f"{API_PREFIX}/instances/"
PATH_INSTANCE = f"{API_PREFIX}/instances/{{instance_id}}/"
PATH_VOLUMES = f"{API_PREFIX}/volumes"
PATH_ENDPOINTS = f"{API_PREFIX}/endptjobs"
PATH_REGEN_BACKUP_CODES = f"{API_PREFIX}/tfa/regen-backup-codes"
PATH_DEPLOYMENTS = f"{API_PREFIX}/deployments"
PATH_PENDING_PRICE_INCREASES = f"{API_PREFIX}/instances/pending-price-increases"
PATH_API_KEYS = f"{API_PREFIX}/auth/apikeys"
PATH_CLOUD_INTEGRATIONS = f"{API_PREFIX}/users/cloud_integrations"
# Not in the spec; the live service and its official CLI use them (see the README's "live service" section).
API_V1_PREFIX = "/api/v1"
PATH_INSTANCES_V1 = f"{API_V1_PREFIX}/instances/"
PATH_CURRENT_USER = f"{API_PREFIX}/users/current"
#: Asks the service to upload the container's (or the host daemon's) log; answers a ``result_url`` to fetch it from.
PATH_REQUEST_LOGS = f"{API_PREFIX}/instances/request_logs/{{instance_id}}/"
#: Not in the spec: the live service's change of an interruptible instance's bid (what ``vastai change bid`` calls).
PATH_CHANGE_BID = f"{API_PREFIX}/instances/bid_price/{{instance_id}}/"

# --- Enums ---------------------------------------------------------------------------------------------------
RUNTYPES = ("ssh_direct", "ssh_proxy", "ssh", "jupyter_direct", "jupyter_proxy", "jupyter", "args")
TARGET_STATES = ("running", "stopped")
OFFER_TYPES = ("ondemand", "on-demand", "bid")
#: Filter operators the spec names; the complete list is "not shown", so other lowercase names are let through.
FILTER_OPERATORS = ("eq", "gte", "in")
ORDER_DIRECTIONS = ("asc", "desc")
ENDPOINT_STATES = ("active", "suspended", "stopped")
TFA_METHODS = ("sms", "totp", "email")
TFA_METHODS_NEEDING_SECRET = ("sms", "email")

# Instance actual_status values. None means "being provisioned".
STATUS_LOADING = "loading"
STATUS_RUNNING = "running"
#: Statuses that, per the spec, never become running: destroy and retry elsewhere.
FAILED_STATUSES = ("exited", "unknown", "offline")
BOOTING_STATUSES = (None, STATUS_LOADING)

# --- Limits --------------------------------------------------------------------------------------------------
ONSTART_MAX_CHARS = 4048
DEFAULT_DISK_GB = 8
POLL_INTERVAL_SECONDS = 10
#: Seconds to wait for each HTTP response unless the connection says otherwise.
REQUEST_TIMEOUT_SECONDS = 30.0
#: Characters of an unexpected body quoted in an error message.
BODY_EXCERPT_CHARS = 200

_PORT_KEY = re.compile(r"^-p (\d{1,5}):(\d{1,5})$")
_OPERATOR_NAME = re.compile(r"^[a-z_]+$")


# --- Status helpers ------------------------------------------------------------------------------------------
def is_booting(status: str | None) -> bool:
    """True while the instance may still become running (provisioning or loading)."""
    return status in BOOTING_STATUSES


def will_never_run(status: str | None) -> bool:
    """True for statuses that will not become running.

    The spec lists exited, unknown and offline; anything else it does not name (for instance the status after a
    stop, which is "not shown") is treated the same way, so a waiter never hangs on a status it cannot know.
    """
    return not is_booting(status) and status != STATUS_RUNNING


# --- Small validators (each names the field and says how to fix it) ----------------------------------------
def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def require_positive_number(field: str, value: Any) -> None:
    if not _is_number(value) or value <= 0:
        raise GpuMarketValidationError(field, f"must be a number greater than 0, got {value!r}")


def require_non_negative_number(field: str, value: Any) -> None:
    if not _is_number(value) or value < 0:
        raise GpuMarketValidationError(field, f"must be a number of at least 0, got {value!r}")


def is_positive_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def require_positive_int(field: str, value: Any) -> None:
    if not is_positive_int(value):
        raise GpuMarketValidationError(field, f"must be a positive integer, got {value!r}")


def require_non_negative_int(field: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise GpuMarketValidationError(field, f"must be an integer of at least 0, got {value!r}")


def require_bool(field: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise GpuMarketValidationError(field, f"must be true or false, got {value!r}")


def require_text(field: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise GpuMarketValidationError(field, f"must be a non-empty string, got {value!r}")


def require_choice(field: str, value: Any, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise GpuMarketValidationError(field, f"{value!r} is not one of {', '.join(choices)}")


def _drop_none(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Only the fields the caller gave are sent; nothing goes on the wire as null."""
    return {k: v for k, v in fields.items() if v is not None}


# --- env, port mappings, onstart ---------------------------------------------------------------------------
def port_mappings(*ports: int) -> dict[str, str]:
    """Build the env entries that open ports: ``port_mappings(8080, 22)`` -> ``{"-p 8080:8080": "1", ...}``."""
    for port in ports:
        _require_port("port_mappings", port)
    return {f"-p {port}:{port}": "1" for port in ports}


def _require_port(field: str, port: Any) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise GpuMarketValidationError(field, f"port must be an integer from 1 to 65535, got {port!r}")


def validate_env(env: Any, field: str = "env") -> None:
    """env is a JSON object of string keys to string values; port mappings are ``"-p N:N": "1"``."""
    if not isinstance(env, Mapping):
        raise GpuMarketValidationError(
            field,
            f"must be an object of NAME: value pairs (a dict), got {type(env).__name__}; "
            "the '-e NAME=value -p 8080:8080' flag string is only for templates",
        )
    for key, value in env.items():
        if not isinstance(key, str) or not key:
            raise GpuMarketValidationError(field, f"keys must be non-empty strings, got {key!r}")
        if key.startswith("-"):
            match = _PORT_KEY.match(key)
            if not match:
                raise GpuMarketValidationError(
                    field, f"{key!r} is not a port mapping; write it as '-p 8080:8080' (see port_mappings())"
                )
            _require_port(f"{field}[{key!r}]", int(match.group(1)))
            _require_port(f"{field}[{key!r}]", int(match.group(2)))
            if value != "1":
                raise GpuMarketValidationError(
                    f"{field}[{key!r}]", f'a port mapping takes the string value "1", got {value!r}'
                )
        elif not isinstance(value, str):
            raise GpuMarketValidationError(
                f"{field}[{key!r}]", f"environment values must be strings, got {type(value).__name__}; quote it"
            )


def env_variables(env: Mapping[str, str]) -> dict[str, str]:
    """The environment variables of an env object, without its port mappings."""
    return {k: v for k, v in env.items() if not k.startswith("-p ")}


def pack_onstart(script: str) -> str:
    """Return ``script`` unchanged when it fits the onstart limit, else a gzip+base64 self-unpacking form.

    :raises GpuMarketValidationError: when even the packed form exceeds 4048 characters.
    """
    if len(script) <= ONSTART_MAX_CHARS:
        return script
    payload = base64.b64encode(gzip.compress(script.encode(), compresslevel=9, mtime=0)).decode()
    # Unpacked into a file of this shell's own (two scripts on one host must never share one), removed at the end.
    packed = (
        "#!/bin/sh\n# packed by airflow-provider-gpumarket: gzip+base64 of the original script\n"
        'f="${TMPDIR:-/tmp}/.gpumarket_onstart.$$.sh"\n'
        f"echo '{payload}' | base64 -d | gunzip > \"$f\" || exit 1\n"
        'sh "$f"; rc=$?; rm -f "$f"; exit $rc\n'
    )
    if len(packed) > ONSTART_MAX_CHARS:
        raise GpuMarketValidationError(
            "onstart",
            f"the script is {len(script)} characters and still {len(packed)} after gzip+base64 packing, over "
            f"the service's {ONSTART_MAX_CHARS}-character limit; ship the code in the image or download it "
            "from the script instead",
        )
    return packed


def validate_onstart(onstart: Any) -> None:
    if not isinstance(onstart, str):
        raise GpuMarketValidationError("onstart", f"must be a string of shell commands, got {onstart!r}")
    if len(onstart) > ONSTART_MAX_CHARS:
        raise GpuMarketValidationError(
            "onstart",
            f"is {len(onstart)} characters, over the service's limit of {ONSTART_MAX_CHARS}; "
            "pack it with airflow_gpumarket.api.pack_onstart() (gzip+base64)",
        )


# --- Request bodies --------------------------------------------------------------------------------------
def build_search_body(
    filters: Mapping[str, Any] | None = None,
    *,
    offer_type: str = "ondemand",
    limit: int | None = None,
    order: list | None = None,
) -> dict[str, Any]:
    """Body of ``POST /bundles/``: filter objects plus ``type``, ``limit`` and ``order``."""
    if filters is not None and not isinstance(filters, Mapping):
        raise GpuMarketValidationError(
            "filters", f"must be an object of field: {{operator: value}} pairs (a dict), got {type(filters).__name__}"
        )
    body: dict[str, Any] = {}
    for name, condition in (filters or {}).items():
        if name in ("type", "limit", "order"):
            argument = "offer_type" if name == "type" else name
            raise GpuMarketValidationError(
                "filters", f"{name!r} is not a filter field; pass it as the {argument} argument instead"
            )
        if not isinstance(condition, Mapping) or len(condition) != 1:
            raise GpuMarketValidationError(
                f"filters[{name!r}]",
                f"must be an object with one operator key, like {{'eq': value}}, got {condition!r}",
            )
        ((operator, value),) = condition.items()
        if not isinstance(operator, str) or not _OPERATOR_NAME.match(operator):
            raise GpuMarketValidationError(
                f"filters[{name!r}]", f"operator {operator!r} is not valid; use one of {', '.join(FILTER_OPERATORS)}"
            )
        if operator == "in" and not isinstance(value, list | tuple):
            raise GpuMarketValidationError(f"filters[{name!r}]", f"'in' takes a list of values, got {value!r}")
        body[name] = {operator: list(value) if operator == "in" else value}
    require_choice("offer_type", offer_type, OFFER_TYPES)
    body["type"] = offer_type
    if limit is not None:
        require_positive_int("limit", limit)
        body["limit"] = limit
    if order is not None:
        body["order"] = _validate_order(order)
    return body


def _validate_order(order: Any) -> list[list[str]]:
    if not isinstance(order, list | tuple):
        raise GpuMarketValidationError("order", f"must be a list of [field, direction] pairs, got {order!r}")
    pairs = []
    for pair in order:
        if not isinstance(pair, list | tuple) or len(pair) != 2 or not isinstance(pair[0], str):
            raise GpuMarketValidationError(
                "order", f"each entry must be a [field, direction] pair like ['dph_total', 'asc'], got {pair!r}"
            )
        require_choice(f"order[{pair[0]!r}]", pair[1], ORDER_DIRECTIONS)
        pairs.append([pair[0], pair[1]])
    return pairs


class OfferQuery:
    """A small typed builder for offer filters.

    ``OfferQuery().eq("gpu_name", "RTX 4090").gte("num_gpus", 1).is_in("gpu_name", [...]).filters``
    """

    def __init__(self) -> None:
        self.filters: dict[str, dict[str, Any]] = {}

    def eq(self, field: str, value: Any) -> OfferQuery:
        self.filters[field] = {"eq": value}
        return self

    def gte(self, field: str, value: Any) -> OfferQuery:
        self.filters[field] = {"gte": value}
        return self

    def is_in(self, field: str, values: Iterable[Any]) -> OfferQuery:
        self.filters[field] = {"in": list(values)}
        return self


_IMAGE_LOGIN = re.compile(r"^-u \S+ -p \S+ \S+$")


def _require_bid(field: str, price: Any) -> None:
    if not _is_number(price) or price <= 0:
        raise GpuMarketValidationError(
            field,
            f"must be a bid in dollars per hour greater than 0, got {price!r}; "
            "omit it for an on-demand (not interruptible) instance",
        )


def build_change_bid_body(instance_id: int, price: Any) -> dict[str, Any]:
    """``PUT instances/bid_price/{id}/``: the live service's body (``client_id`` "me": the key's own account)."""
    require_positive_int("instance_id", instance_id)
    _require_bid("price", price)
    return {"client_id": "me", "price": price}


def _require_string(field: str, value: Any) -> None:
    if not isinstance(value, str):
        raise GpuMarketValidationError(field, f"must be a string, got {value!r}")


def _require_image_login(field: str, value: Any) -> None:
    if not isinstance(value, str) or not _IMAGE_LOGIN.match(value):
        # The value holds a registry token: never echo it.
        raise GpuMarketValidationError(
            field, "must have the form '-u <user> -p <access_token> <registry_host>' (value not shown)"
        )


@dataclass(frozen=True)
class CreationField:
    """One field of a creation body of the spec (an instance's, an endpoint's).

    ``rule`` checks a given value (None means "not sent"); ``text`` fields are plain strings whose value can be
    checked even while it still holds Jinja, the others only once rendered; ``doc`` is the one-line description.
    """

    name: str
    rule: Callable[[str, Any], None]
    doc: str
    text: bool = False


#: The create-instance fields, in the spec's order: the request builder, the hook, the operators' template fields
#: and their parse-time checks all come from here. Rules that tie two fields together are in
#: ``build_create_instance_body``.
CREATION_FIELDS: tuple[CreationField, ...] = (
    CreationField("image", require_text, "container image (or template_hash_id)", text=True),
    CreationField("template_hash_id", require_text, "a template to create from (or image)", text=True),
    CreationField("disk", require_positive_number, "disk size in GB"),
    CreationField("runtype", lambda f, v: require_choice(f, v, RUNTYPES), "how the instance is reached"),
    CreationField("target_state", lambda f, v: require_choice(f, v, TARGET_STATES), "running or stopped"),
    CreationField("price", _require_bid, "a bid in $/h (an interruptible instance)"),
    CreationField("env", lambda f, v: validate_env(v, f), "environment variables and port mappings"),
    CreationField("onstart", lambda f, v: validate_onstart(v), "script run at start (ssh and jupyter runtypes)"),
    CreationField("args_str", _require_string, "arguments for runtype 'args'"),
    CreationField("use_jupyter_lab", require_bool, "JupyterLab instead of Notebook"),
    CreationField("jupyter_dir", require_text, "Jupyter's working directory", text=True),
    CreationField("python_utf8", require_bool, "PYTHONUTF8=1"),
    CreationField("lang_utf8", require_bool, "a UTF-8 locale"),
    CreationField("image_login", _require_image_login, "registry login '-u <user> -p <token> <host>'"),
    CreationField("cancel_unavail", require_bool, "fail at once when the offer is taken"),
    CreationField("vm", require_bool, "a virtual machine instead of a container"),
    CreationField("volume_info", lambda f, v: _validate_volume_info(v), "a volume to create or attach"),
)
CREATION_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in CREATION_FIELDS)


def fields_doc(table: Iterable[CreationField], indent: str) -> str:
    """One ``:param:`` line per field of a table, for the docstrings of the operators that take them."""
    return "".join(f"{indent}:param {f.name}: {f.doc}.\n" for f in table)


def check_creation_field_names(names: Iterable[str]) -> None:
    unknown = sorted(set(names) - set(CREATION_FIELD_NAMES))
    if unknown:
        raise GpuMarketValidationError(
            unknown[0], f"is not a creation field of the spec; the fields are: {', '.join(CREATION_FIELD_NAMES)}"
        )


def build_create_instance_body(*, label: str | None = None, **fields: Any) -> dict[str, Any]:
    """Validate the creation fields (``CREATION_FIELDS``) against every rule of the spec; return the request body.

    ``label`` is written by the caller (the operators write their own); any other keyword must be a creation field.
    """
    check_creation_field_names(fields)
    if fields.get("image") is None and fields.get("template_hash_id") is None:
        raise GpuMarketValidationError(
            "image", "is required unless template_hash_id is given; name a container image or a template"
        )
    if label is not None:
        _require_string("label", label)
    for field in CREATION_FIELDS:
        if fields.get(field.name) is not None:
            field.rule(field.name, fields[field.name])
    runtype = fields.get("runtype")
    if fields.get("onstart") is not None and runtype == "args":
        raise GpuMarketValidationError(
            "onstart", "only runs with the ssh and jupyter runtypes; with runtype 'args' it would be ignored"
        )
    if fields.get("args_str") is not None and runtype != "args":
        raise GpuMarketValidationError(
            "args_str", f"is only used with runtype 'args' (runtype is {runtype!r}); it would be ignored"
        )
    body: dict[str, Any] = {name: fields.get(name) for name in CREATION_FIELD_NAMES}
    for name in ("env", "volume_info"):  # a copy: the caller's mapping is never sent or changed by reference
        if (value := body[name]) is not None:
            body[name] = dict(value)
    return _drop_none({**body, "label": label})


def _validate_volume_info(volume_info: Any) -> None:
    if not isinstance(volume_info, Mapping):
        raise GpuMarketValidationError(
            "volume_info", f"must be an object {{'volume_id': int, 'mount_path': str}}, got {volume_info!r}"
        )
    unknown = set(volume_info) - {"volume_id", "mount_path"}
    if unknown:
        raise GpuMarketValidationError(
            "volume_info", f"unknown keys {sorted(unknown)}; only volume_id and mount_path are allowed"
        )
    require_positive_int("volume_info.volume_id", volume_info.get("volume_id"))
    mount_path = volume_info.get("mount_path")
    if not isinstance(mount_path, str) or not mount_path.startswith("/"):
        raise GpuMarketValidationError(
            "volume_info.mount_path", f"must be an absolute path like '/workspace/data', got {mount_path!r}"
        )


def build_volume_listing_body(
    *, machine: int | None = None, machines: list[int] | None = None, hidden_listing: bool | None = None
) -> dict[str, Any]:
    if machine is None and not machines:
        raise GpuMarketValidationError("machine", "one of machine or machines (a non-empty list) is required")
    if machine is not None:
        require_positive_int("machine", machine)
    if machines is not None:
        if not isinstance(machines, list | tuple) or not machines:
            raise GpuMarketValidationError("machines", f"must be a non-empty list of machine ids, got {machines!r}")
        for m in machines:
            require_positive_int("machines[]", m)
    if hidden_listing is not None:
        require_bool("hidden_listing", hidden_listing)
    return _drop_none(
        {"hidden_listing": hidden_listing, "machine": machine, "machines": list(machines) if machines else None}
    )


#: The spec's endpoint creation fields, in its order; bounds are "not shown": numbers must be finite and >= 0.
ENDPOINT_FIELD_TABLE: tuple[CreationField, ...] = (
    CreationField("min_load", require_non_negative_number, "minimum load for the endpoint"),
    CreationField("min_cold_load", require_non_negative_number, "cold workers are kept below this load"),
    CreationField("target_util", require_non_negative_number, "target utilisation"),
    CreationField("cold_mult", require_non_negative_number, "multiplier for cold start"),
    CreationField("cold_workers", require_non_negative_int, "number of cold workers"),
    CreationField("max_workers", require_non_negative_int, "maximum number of workers"),
    CreationField("max_queue_time", require_non_negative_number, "seconds of queueing before scaling up"),
    CreationField("target_queue_time", require_non_negative_number, "desired queue time, <= max_queue_time"),
    CreationField("autoscaler_instance", require_text, "autoscaler environment to attach to", text=True),
    CreationField(
        "endpoint_state", lambda f, v: require_choice(f, v, ENDPOINT_STATES), "active, suspended or stopped", text=True
    ),
    CreationField("endpoint_name", require_text, "name of the endpoint", text=True),
    CreationField("inactivity_timeout", require_non_negative_number, "idle seconds before it may be suspended"),
    CreationField("overrecruit_ratio", require_non_negative_number, "over-recruiting of workers for spikes"),
)
ENDPOINT_FIELDS: tuple[str, ...] = tuple(f.name for f in ENDPOINT_FIELD_TABLE)


def build_endpoint_body(**fields: Any) -> dict[str, Any]:
    """Body of ``POST /endptjobs``: the given fields of ``ENDPOINT_FIELD_TABLE``, each checked by its rule."""
    unknown = set(fields) - set(ENDPOINT_FIELDS)
    if unknown:
        raise GpuMarketValidationError(
            sorted(unknown)[0], f"is not an endpoint field; allowed: {', '.join(ENDPOINT_FIELDS)}"
        )
    body = _drop_none(fields)
    for field in ENDPOINT_FIELD_TABLE:
        if field.name in body:
            field.rule(field.name, body[field.name])
    if "target_queue_time" in body and "max_queue_time" in body and body["target_queue_time"] > body["max_queue_time"]:
        raise GpuMarketValidationError(
            "target_queue_time",
            f"({body['target_queue_time']}) must be less than or equal to max_queue_time ({body['max_queue_time']})",
        )
    return body


def build_delete_deployments_body(name: str, tag: str | None = None) -> dict[str, Any]:
    require_text("name", name)
    if tag is not None:
        require_text("tag", tag)
    return _drop_none({"name": name, "tag": tag})


def build_regen_backup_codes_body(
    *,
    tfa_method: str | None = None,
    code: str | None = None,
    secret: str | None = None,
    tfa_method_id: int | None = None,
    backup_code: str | None = None,
) -> dict[str, Any]:
    """Body of ``PUT /tfa/regen-backup-codes``. Values are secrets: messages never echo them."""
    if tfa_method is not None:
        require_choice("tfa_method", tfa_method, TFA_METHODS)
    if tfa_method_id is not None:
        require_positive_int("tfa_method_id", tfa_method_id)
    for name, value in (("code", code), ("secret", secret), ("backup_code", backup_code)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise GpuMarketValidationError(name, "must be a non-empty string (value not shown)")
    if code is None and backup_code is None:
        raise GpuMarketValidationError(
            "code", "a verification code (with tfa_method or tfa_method_id) or an existing backup_code is required"
        )
    if code is not None and tfa_method is None and tfa_method_id is None:
        raise GpuMarketValidationError("tfa_method", "is required with code: one of sms, totp, email")
    if code is not None and tfa_method in TFA_METHODS_NEEDING_SECRET and secret is None:
        raise GpuMarketValidationError(
            "secret", f"is required for the {tfa_method} method: pass the tfa_secret returned by the send step"
        )
    return _drop_none(
        {
            "tfa_method_id": tfa_method_id,
            "code": code,
            "secret": secret,
            "tfa_method": tfa_method,
            "backup_code": backup_code,
        }
    )


# --- Logs (live service; not in the spec: from the official client's source and the published OpenAPI) -----------
#: Lines asked for when no tail is given (the official client's default).
LOG_TAIL_DEFAULT = 1000
#: Fetching the uploaded log: tries while it is not there yet, seconds between them, seconds per request (as the
#: official client does).
LOG_FETCH_TRIES = 30
LOG_FETCH_INTERVAL_SECONDS = 0.3
LOG_FETCH_TIMEOUT_SECONDS = 10.0
#: The most of one uploaded log that is read; its end is kept.
LOG_MAX_BYTES = 1 << 20


def build_request_logs_body(
    *, tail: int | str | None = None, filter: str | None = None, daemon_logs: bool | None = None
) -> dict[str, Any]:
    """The logs request's body: ``tail`` as a string number of lines, ``filter`` (a server-side grep),
    ``daemon_logs`` "true" for the host daemon's log instead of the container's."""
    body: dict[str, Any] = {}
    if tail is not None:
        text = str(tail).strip() if isinstance(tail, int | str) and not isinstance(tail, bool) else ""
        if not text.isdigit() or int(text) <= 0:
            raise GpuMarketValidationError("tail", f"must be a positive number of lines, got {tail!r}")
        body["tail"] = text
    if filter is not None:
        require_text("filter", filter)
        body["filter"] = filter
    if daemon_logs is not None:
        require_bool("daemon_logs", daemon_logs)
        if daemon_logs:
            body["daemon_logs"] = "true"
    return body


def log_result_url(operation: str, body: Any) -> str:
    """The ``result_url`` of a logs answer; a ``GpuMarketError`` for an answer without a usable one (an
    http(s) URL: it is fetched without the API key, so nothing else is followed)."""
    url = body.get("result_url") if isinstance(body, Mapping) else None
    if isinstance(url, str) and url.startswith(("https://", "http://")):
        return url
    excerpt = str(body)[:BODY_EXCERPT_CHARS]
    raise GpuMarketError(
        f"{operation}: the answer has no http(s) result_url to fetch the log from: {excerpt}", operation=operation
    )


# --- Responses -----------------------------------------------------------------------------------------------
def decode_body(content: bytes | str | None) -> Any:
    """JSON body, or the raw text when the body is not JSON (some proxies answer HTML)."""
    if not content:
        return None
    text = content.decode("utf-8", "replace") if isinstance(content, bytes) else content
    try:
        return json.loads(text)
    except ValueError:
        return text


def redact(text: str, secrets: Iterable[str | None]) -> str:
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the delta-seconds form; an HTTP date is ignored)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


#: An ``X-RateLimit-Reset`` above this is an epoch time, below it a number of seconds.
_EPOCH_THRESHOLD = 1_000_000_000


def parse_rate_limit_reset(value: str | None, now: float) -> float | None:
    """``X-RateLimit-Reset`` as seconds from ``now``: servers send either epoch seconds or a delta."""
    seconds = parse_retry_after(value)
    if seconds is None:
        return None
    return max(0.0, seconds - now) if seconds > _EPOCH_THRESHOLD else seconds


#: A wait the server asks for longer than this fails the call at once: a task must not sleep for hours on a
#: quota that resets tomorrow (the live service's daily search quota points its Retry-After hours ahead).
MAX_RETRY_AFTER_SECONDS = 300.0
#: ``error`` values of a quota that no short wait will restore.
QUOTA_ERRORS = ("search_quota_exceeded",)
#: ``error`` values and ``msg`` phrases that mean a bad key whatever the status (the live service has been seen
#: answering a revoked key with 404 ``auth_error``: read as "not found", a destroy would report "already gone").
AUTH_ERRORS = ("auth_error", "invalid_api_key", "unauthorized")
_AUTH_PHRASES = ("invalid user key", "invalid api key")
_TEXT_EXCERPT_CHARS = 200


def is_auth_error(error: str | None, msg: str | None) -> bool:
    words = (msg or "").lower()
    return (error or "").lower() in AUTH_ERRORS or any(p in words for p in _AUTH_PHRASES)


_UNAVAILABLE_WORDS = ("unavail", "not available", "no longer", "rented", "taken", "no_such_ask")


def raise_for_response(
    operation: str,
    status_code: int,
    body: Any,
    *,
    retry_after: str | None = None,
    rate_limit_reset: str | None = None,
    now: float | None = None,
    secrets: Iterable[str | None] = (),
) -> Any:
    """Return the decoded body of a successful response, or raise the exception a person can act on.

    The server's ``error`` and ``msg`` are kept on the exception and quoted in its message, with any secret
    (``secrets``: the API key) replaced by ``***``. ``retry_after`` and ``rate_limit_reset`` are the raw
    ``Retry-After`` and ``X-RateLimit-Reset`` headers; ``now`` (epoch seconds) reads the latter when it is a time.
    """
    secrets = tuple(secrets)
    error = body.get("error") if isinstance(body, dict) else None
    msg = body.get("msg") if isinstance(body, dict) else None
    error = redact(str(error), secrets) if error is not None else None
    msg = redact(str(msg), secrets) if msg is not None else None
    words = ": ".join(p for p in (error, msg) if p)
    if not words and isinstance(body, str) and body.strip():
        words = redact(body.strip()[:_TEXT_EXCERPT_CHARS], secrets)
    said = f" Server said: {words}" if words else ""
    kwargs: dict[str, Any] = {"status_code": status_code, "error": error, "msg": msg, "operation": operation}
    if 200 <= status_code < 300:
        if isinstance(body, dict) and body.get("success") is False:
            if is_auth_error(error, msg):
                raise GpuMarketAuthError(_auth_sentence(operation, status_code, said), **kwargs)
            contract = body.get("new_contract")
            if operation == "create_instance" and is_positive_int(contract):
                raise GpuMarketCreateRefusedError(
                    f"create_instance failed: the service answered success=false, yet made instance {contract} "
                    f"(stopped; a bid below the machine's minimum does this).{said}",
                    new_contract=contract,
                    **kwargs,
                )
            raise GpuMarketError(f"{operation} failed: the service answered success=false.{said}", **kwargs)
        return body
    if status_code in (401, 403) or is_auth_error(error, msg):
        raise GpuMarketAuthError(_auth_sentence(operation, status_code, said), **kwargs)
    if status_code == 429:
        _raise_rate_limited(operation, said, kwargs, retry_after, rate_limit_reset, now)
    if operation == "create_instance" and _offer_unavailable(status_code, error, msg):
        raise GpuMarketOfferUnavailableError(
            f"create_instance: the offer is no longer available (HTTP {status_code}); it was probably rented by "
            f"someone else after the search. Search again and pick another offer.{said}",
            **kwargs,
        )
    if status_code == 404:
        if not isinstance(body, dict):
            # The service answers its own 404s with an error object; anything else came from a proxy or a wrong
            # base URL, and must not be read as "the instance is gone" (a destroy would then report success).
            raise GpuMarketError(
                f"{operation}: HTTP 404 without the service's error object; the connection's host (base URL) may "
                f"point at the wrong server or path.{said}",
                **kwargs,
            )
        raise GpuMarketNotFoundError(f"{operation}: not found (HTTP 404).{said}", **kwargs)
    if status_code >= 500:
        raise GpuMarketServerError(
            f"{operation}: the service failed (HTTP {status_code}); retrying may help.{said}", **kwargs
        )
    raise GpuMarketError(f"{operation} was rejected (HTTP {status_code}).{said}", **kwargs)


def _auth_sentence(operation: str, status_code: int, said: str) -> str:
    return (
        f"{operation} was refused (HTTP {status_code}): the API key is missing, wrong, revoked or not allowed "
        f"to do this. Check the password of the gpumarket connection.{said}"
    )


def _raise_rate_limited(
    operation: str,
    said: str,
    kwargs: dict[str, Any],
    retry_after: str | None,
    rate_limit_reset: str | None,
    now: float | None,
) -> None:
    seconds = parse_retry_after(retry_after)
    if seconds is None:
        seconds = parse_rate_limit_reset(rate_limit_reset, time.time() if now is None else now)
    if kwargs["error"] in QUOTA_ERRORS or (seconds is not None and seconds > MAX_RETRY_AFTER_SECONDS):
        when = f" in about {_hours_and_minutes(seconds)}" if seconds is not None else ""
        raise GpuMarketQuotaExceededError(
            f"{operation}: a quota of the account is used up (HTTP 429) and resets{when or ' later'}. Failing now "
            f"instead of sleeping that long: run the task again after the reset, or make fewer calls of this "
            f"kind.{said}",
            retry_after=seconds,
            **kwargs,
        )
    hint = f" The server asked to wait {seconds:g} s." if seconds is not None else ""
    message = f"{operation} was rate limited (HTTP 429).{hint}{said}"
    raise GpuMarketRateLimitError(message, retry_after=seconds, **kwargs)


def _hours_and_minutes(seconds: float) -> str:
    minutes = math.ceil(seconds / 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def _offer_unavailable(status_code: int, error: Any, msg: Any) -> bool:
    if status_code in (404, 409, 410):
        return True
    words = f"{error or ''} {msg or ''}".lower()
    return 400 <= status_code < 500 and any(w in words for w in _UNAVAILABLE_WORDS)


def expect_list(operation: str, body: Any, key: str | None) -> list[Any]:
    """The list a listing endpoint answers (under ``key``, or the body itself when ``key`` is None).

    A 200 whose body has no such list is an error, not an empty list: after an ambiguous create, reading an empty
    list would wrongly prove that no instance exists and lead to renting twice.
    """
    value = body.get(key) if isinstance(body, dict) and key is not None else body
    if key is not None and isinstance(body, dict) and key not in body:
        value = None
    if isinstance(value, list):
        return value
    where = f"a list under {key!r}" if key else "a list"
    raise GpuMarketError(
        f"{operation}: the service answered HTTP 200 without {where}; it may be misconfigured or a proxy answered "
        f"instead. Got: {str(body)[:BODY_EXCERPT_CHARS]!r}",
        status_code=200,
        operation=operation,
    )


def unwrap_instance(body: Any, instance_id: int | None = None) -> Instance:
    """``GET /instances/{id}/`` answers ``{"instances": {...}}``; return the inner object.

    ``{"instances": null}`` is how the live service answers for an instance that no longer exists (or is not
    the caller's): not found. A body without ``instances`` at all is an error, not "gone".
    """
    if not isinstance(body, dict) or "instances" not in body:
        raise GpuMarketError(
            f"get_instance: the service answered HTTP 200 without an 'instances' object; it may be misconfigured "
            f"or a proxy answered instead. Got: {str(body)[:_TEXT_EXCERPT_CHARS]!r}",
            status_code=200,
            operation="get_instance",
        )
    inner = body["instances"]
    if isinstance(inner, list):  # tolerate a one-element list
        inner = inner[0] if inner else None
    if not isinstance(inner, dict):
        which = f"instance {instance_id}" if instance_id is not None else "the instance"
        raise GpuMarketNotFoundError(
            f"get_instance: {which} does not exist (the service returned no instance object)",
            status_code=200,
            operation="get_instance",
        )
    return inner  # type: ignore[return-value]


# --- Instance listing -------------------------------------------------------------------------------------
#: Page size of ``GET /api/v1/instances/``: the live service's maximum (it reads a limit <= 0 as 5).
LIST_PAGE_LIMIT = 25
#: A walk through more pages than this fails instead of going on: 10,000 instances is far beyond any account
#: this provider serves, so it means a server that keeps handing out tokens.
MAX_LIST_PAGES = 400
#: Requests per second the live service allows per key and client address (its published figures; the buckets
#: have no burst and charge a penalty for each refusal): the instance list, a create, a destroy, a change of an
#: instance (label, state: one PUT budget).
LIST_RATE_PER_SECOND = 0.5
CREATE_RATE_PER_SECOND = 1 / 4.5
DESTROY_RATE_PER_SECOND = 1 / 3
CHANGE_RATE_PER_SECOND = 1.0
#: Searches and per-instance reads (an instance, its logs) have no published figure: the provider assumes the
#: simulator's (search 1/s, the others 2/s). A fleet of 220 tasks on one key drew hundreds of 429s there without it.
SEARCH_RATE_PER_SECOND = 1.0
READ_RATE_PER_SECOND = 2.0
#: Operations that keep trying through 429s for ``RATE_LIMIT_PATIENCE_SECONDS`` whatever ``max_retries`` says: the
#: calls a fleet of tasks makes all at once when it starts (search, create), reads its jobs' final output or fails
#: (destroy). Refused with 429, none of them did anything, so waiting is safe; giving up fails a task or, for a
#: destroy, leaves an instance billing.
PATIENT_OPERATIONS = frozenset({"search_offers", "create_instance", "request_instance_logs", "destroy_instance"})


def rate_budget(operation: str) -> tuple[str, float] | None:
    """(budget, requests/s) that paces ``operation``, or None for an operation not paced. The hook books each such
    call a slot of its budget machine-wide (``pacing``), so the pages of a walk, the shared pollers' rounds and a
    fleet of tasks starting or failing at once stay within it."""
    return {
        "list_instances": ("list_instances", LIST_RATE_PER_SECOND),
        "create_instance": ("create_instance", CREATE_RATE_PER_SECOND),
        "destroy_instance": ("destroy_instance", DESTROY_RATE_PER_SECOND),
        "label_instance": ("change_instance", CHANGE_RATE_PER_SECOND),
        "stop_instance": ("change_instance", CHANGE_RATE_PER_SECOND),
        "change_bid": ("change_bid", CHANGE_RATE_PER_SECOND),  # its own path: assumed a bucket of its own
        "search_offers": ("search_offers", SEARCH_RATE_PER_SECOND),
        "get_instance": ("get_instance", READ_RATE_PER_SECOND),
        "request_instance_logs": ("request_instance_logs", READ_RATE_PER_SECOND),
    }.get(operation)


class InstanceListing:
    """One walk through the instance list: which requests to send, in order, and what they found.

    The live service lists instances through the paged ``GET /api/v1/instances/`` (its ``/api/v0/instances/``
    answers 410); a server that follows the spec only has ``GET /api/v0/instances/``. Both hooks drive this
    object the same way: :meth:`request` gives the next ``(path, query)`` or None when the walk is over,
    :meth:`take` reads the answer, :attr:`instances` holds the result. ``label`` and ``ids`` are sent as
    server-side filters (ids in chunks of one page) and applied again here, so a server that ignores a filter
    costs pages, never wrong answers.
    """

    def __init__(
        self,
        *,
        label: str | None = None,
        ids: Iterable[int] | None = None,
        v1: bool = True,
        page_limit: int | None = None,
        max_pages: int | None = None,
    ) -> None:
        if label is not None:
            require_text("label", label)
        wanted: list[int] | None = None
        if ids is not None:
            wanted = sorted(set(ids))
            for instance_id in wanted:
                require_positive_int("ids", instance_id)
        page_limit = LIST_PAGE_LIMIT if page_limit is None else page_limit
        self.label = label
        self.ids = frozenset(wanted) if wanted is not None else None
        self.v1 = v1
        self.page_limit = page_limit
        self.max_pages = MAX_LIST_PAGES if max_pages is None else max_pages
        self._by_id: dict[Any, Any] = {}
        self._chunks: list[list[int] | None] = (
            [None] if wanted is None else [wanted[i : i + page_limit] for i in range(0, len(wanted), page_limit)]
        )
        self._token: str | None = None
        self._seen_tokens: set[str] = set()
        self._pages = 0

    @property
    def instances(self) -> list[Instance]:
        return list(self._by_id.values())

    def request(self) -> tuple[str, dict[str, str] | None] | None:
        if not self._chunks:
            return None
        if not self.v1:
            return PATH_INSTANCES, None
        params = {"limit": str(self.page_limit)}
        filters: dict[str, Any] = {}
        if self.label is not None:
            filters["label"] = {"eq": self.label}
        chunk = self._chunks[0]
        if chunk is not None:
            filters["id"] = {"in": chunk}
        if filters:
            params["select_filters"] = json.dumps(filters, separators=(",", ":"))
        if self._token is not None:
            params["after_token"] = self._token
        return PATH_INSTANCES_V1, params

    def take(self, body: Any) -> None:
        page = expect_list("list_instances", body, "instances")
        for instance in page:
            if isinstance(instance, dict) and self._wanted(instance):
                self._by_id[instance.get("id")] = instance  # a page boundary that moved may repeat one
        self._pages += 1
        token = body.get("next_token") if self.v1 and isinstance(body, dict) else None
        if token is None or token == "":
            self._chunks.pop(0)
            self._token = None
            return
        token = str(token)
        if token in self._seen_tokens or self._pages >= self.max_pages:
            raise GpuMarketError(
                f"list_instances: the service kept answering with more pages ({self._pages} read, "
                f"next_token {token[:40]!r}); stopped so as not to loop forever. Try again later.",
                status_code=200,
                operation="list_instances",
            )
        self._seen_tokens.add(token)
        self._token = token

    def use_v0(self) -> None:
        """Start again on the spec's single-page ``GET /api/v0/instances/``."""
        self.v1 = False
        self._by_id.clear()
        self._chunks = [None]
        self._token = None
        self._pages = 0

    def _wanted(self, instance: Mapping[str, Any]) -> bool:
        if self.label is not None and instance.get("label") != self.label:
            return False
        return self.ids is None or instance.get("id") in self.ids


def falls_back_to_v0(exc: GpuMarketError) -> bool:
    """True when ``/api/v1/instances/`` does not exist on this server (an older or spec-only one)."""
    return exc.status_code in (404, 405) and not isinstance(exc, GpuMarketAuthError)


def listing_total(body: Any) -> int:
    """How many instances a list answer says there are (v1's ``total_instances``, else its list's length)."""
    if isinstance(body, dict):
        total = body.get("total_instances", body.get("instances_found"))
        if isinstance(total, int) and not isinstance(total, bool):
            return total
        if isinstance(body.get("instances"), list):
            return len(body["instances"])
    return 0


def find_by_label(instances: Iterable[Mapping[str, Any]], label: str) -> Instance | None:
    """The newest instance carrying ``label`` (highest id), or None."""
    matches = [i for i in instances if i.get("label") == label]
    return max(matches, key=lambda i: i.get("id") or 0) if matches else None  # type: ignore[return-value]


#: Longest backoff after a 429 that named no wait (the live service's buckets refill within seconds).
RATE_LIMIT_BACKOFF_CAP_SECONDS = 16.0
#: How long a ``PATIENT_OPERATIONS`` call keeps trying through 429s.
RATE_LIMIT_PATIENCE_SECONDS = 900.0


# --- Retry decisions (shared by the sync and async hooks; tenacity does the looping) ---------------------
@dataclass(frozen=True)
class RetryPolicy:
    """How failed calls are retried. Read from the connection's extras (see ``get_provider_info``)."""

    max_retries: int = 5
    min_wait: float = 1.0
    max_wait: float = 60.0
    #: A Retry-After header is honoured up to this many seconds (a longer one fails the call at once).
    max_retry_after: float = MAX_RETRY_AFTER_SECONDS


def is_retryable(exc: BaseException) -> bool:
    """429, 5xx and transport failures are worth another try (for idempotent calls); a quota that resets hours
    ahead is not."""
    if isinstance(exc, GpuMarketQuotaExceededError):
        return False
    return isinstance(exc, GpuMarketRateLimitError | GpuMarketServerError | GpuMarketTransportError)


def create_surely_not_processed(exc: BaseException) -> bool:
    """True when a failed create certainly made no instance, so it may be re-sent as is.

    429 and 503 are answered before any work; a connection that was never established carried nothing. A timeout,
    a dropped connection, 500, 502 or 504 may come after the instance was made: those are ambiguous.
    """
    if isinstance(exc, GpuMarketRateLimitError):
        return True
    if isinstance(exc, GpuMarketServerError):
        return exc.status_code == 503
    if isinstance(exc, GpuMarketTransportError):
        return not exc.request_sent
    return False


def retry_wait_seconds(exc: BaseException | None, attempt: int, policy: RetryPolicy, jitter: float) -> float:
    """Seconds to wait before try ``attempt + 1``: Retry-After when the server sent one, else exponential
    backoff from ``min_wait`` capped at ``max_wait``, scaled by ``jitter`` (0..1) into its upper half."""
    cap = policy.max_wait
    if isinstance(exc, GpuMarketRateLimitError):
        if exc.retry_after is not None:
            return min(exc.retry_after, policy.max_retry_after)
        # A plain 429 of the live service comes from a token bucket that refills within seconds; backing off
        # for a minute would only add billed time to a destroy.
        cap = min(cap, RATE_LIMIT_BACKOFF_CAP_SECONDS)
    base = min(cap, policy.min_wait * 2 ** max(0, attempt - 1))
    return base * (0.5 + 0.5 * jitter)
