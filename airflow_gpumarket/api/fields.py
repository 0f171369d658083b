"""Request bodies: the creation-field tables and the builders that validate them.

The tables hold one line per field of the spec; a builder checks a body against every rule before anything is sent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_gpumarket.api.paths import (
    BODY_EXCERPT_CHARS,
    CLIENT_FILTER_OPERATORS,
    ENDPOINT_STATES,
    FILTER_OPERATORS,
    LIST_FILTER_OPERATORS,
    OFFER_FILTER_FIELDS,
    OFFER_FILTER_KINDS,
    OFFER_TYPES,
    RUNTYPES,
    TARGET_STATES,
    TFA_METHODS,
    TFA_METHODS_NEEDING_SECRET,
)
from airflow_gpumarket.api.validation import (
    OPERATOR_NAME,
    drop_none,
    require_bid,
    require_bool,
    require_choice,
    require_image_login,
    require_non_negative_int,
    require_non_negative_number,
    require_positive_int,
    require_positive_number,
    require_string,
    require_text,
    validate_env,
    validate_onstart,
    validate_order,
    validate_volume_info,
)
from airflow_gpumarket.exceptions import (
    GpuMarketError,
    GpuMarketValidationError,
)


def build_search_body(
    filters: Mapping[str, Any] | None = None,
    *,
    offer_type: str = "ondemand",
    limit: int | None = None,
    order: list | None = None,
    extra_fields: Iterable[str] = (),
    argument: str = "filters",
) -> dict[str, Any]:
    """Body of ``POST /bundles/``: filter objects plus ``type``, ``limit`` and ``order``.

    Each filter's field must be one the service filters on (``OFFER_FILTER_FIELDS``), or named in ``extra_fields``
    (a field newer than this provider, sent unchecked): the service ignores others, and the search would match every
    offer. Its operator must be one the service knows, and its value of the kind the field compares with.
    ``argument``: the name the caller gave ``filters`` (an operator's ``offer_filters``), which errors name.
    """
    if filters is not None and not isinstance(filters, Mapping):
        raise GpuMarketValidationError(
            argument, f"must be an object of field: {{operator: value}} pairs (a dict), got {type(filters).__name__}"
        )
    body: dict[str, Any] = {}
    extra = frozenset(extra_fields)
    for name, condition in (filters or {}).items():
        if name in ("type", "limit", "order"):
            instead = {"type": "offer_type", "order": "offer_order" if argument == "offer_filters" else "order"}
            raise GpuMarketValidationError(
                argument, f"{name!r} is not a filter field; pass it as the {instead.get(name, name)} argument instead"
            )
        where = f"{argument}[{name!r}]"
        if name not in OFFER_FILTER_FIELDS and name not in extra:
            raise GpuMarketValidationError(where, unknown_filter_field(name))
        if not isinstance(condition, Mapping) or len(condition) != 1:
            raise GpuMarketValidationError(
                where, f"must be an object with one operator key, like {{'eq': value}}, got {condition!r}"
            )
        ((operator, value),) = condition.items()
        if not isinstance(operator, str) or not OPERATOR_NAME.match(operator):
            raise GpuMarketValidationError(where, unknown_filter_operator(operator))
        if name not in extra:
            check_filter_value(where, name, operator, value)
        elif operator == "in" and not isinstance(value, list | tuple):
            raise GpuMarketValidationError(where, f"'in' takes a list of values, got {value!r}")
        body[name] = {operator: list(value) if operator in LIST_FILTER_OPERATORS else value}
    require_choice("offer_type", offer_type, OFFER_TYPES)
    body["type"] = offer_type
    if limit is not None:
        require_positive_int("limit", limit)
        body["limit"] = limit
    if order is not None:
        body["order"] = validate_order(order)
    return body


#: What the official client also reads as an operator, and the name the service knows it by.
_OPERATOR_ALIASES = {
    **{"=": "eq", "==": "eq", "equals": "eq", "!=": "neq", "ne": "neq", "noteq": "neq", "not_eq": "neq"},
    **{">": "gt", ">=": "gte", "ge": "gte", "<": "lt", "<=": "lte", "le": "lte", "nin": "notin", "not_in": "notin"},
}
#: Each kind of filter value: whether a value is of it, its name, and an example filter.
_KINDS: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "number": (
        lambda v: _spells_a_number(v) or (isinstance(v, int | float) and not isinstance(v, bool)),
        "a number",
        "{'gte': 1}",
    ),
    "string": (lambda v: isinstance(v, str), "text", "{'eq': 'RTX 4090'}"),
    "bool": (lambda v: isinstance(v, bool), "True or False", "{'eq': True}"),
}


def _spells_a_number(value: Any) -> bool:
    """Text the live service reads as a number, as a rendered template gives it."""
    try:
        return isinstance(value, str) and math.isfinite(float(value))
    except ValueError:
        return False


def unknown_filter_operator(operator: Any) -> str:
    """Why a filter's ``operator`` is refused, with the closest one the service knows."""
    import difflib

    known = (*FILTER_OPERATORS, *CLIENT_FILTER_OPERATORS)
    close = _OPERATOR_ALIASES.get(str(operator).strip().lower()) or next(
        iter(difflib.get_close_matches(str(operator).lower(), known, n=1, cutoff=0.5)), None
    )
    hint = f"did you mean {close!r}? " if close else ""
    return (
        f"operator {operator!r} is not one the service knows; {hint}Use one of the spec's "
        f"{', '.join(FILTER_OPERATORS)} or the live service's {', '.join(CLIENT_FILTER_OPERATORS)}"
    )


def check_filter_value(where: str, name: str, operator: str, value: Any) -> None:
    """Refuse a filter whose operator the service does not know, or whose value is not of the field's kind."""
    if operator not in FILTER_OPERATORS and operator not in CLIENT_FILTER_OPERATORS:
        raise GpuMarketValidationError(where, unknown_filter_operator(operator))
    if operator in LIST_FILTER_OPERATORS and not isinstance(value, list | tuple):
        raise GpuMarketValidationError(where, f"{operator!r} takes a list of values, got {value!r}")
    kind = OFFER_FILTER_KINDS.get(name)
    if kind is None:
        return
    accepts, said, example = _KINDS[kind]
    for one in value if operator in LIST_FILTER_OPERATORS else (value,):
        if not accepts(one):
            fix = (
                "for several values use {'in': [...]}"
                if isinstance(one, list | tuple)
                else f"give {said}, like {example}"
            )
            raise GpuMarketValidationError(where, f"compares with {said}, got {one!r} ({type(one).__name__}); {fix}")


_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda seen, wanted: seen == wanted,
    "neq": lambda seen, wanted: seen != wanted,
    "gt": lambda seen, wanted: seen > wanted,
    "gte": lambda seen, wanted: seen >= wanted,
    "lt": lambda seen, wanted: seen < wanted,
    "lte": lambda seen, wanted: seen <= wanted,
    "in": lambda seen, wanted: seen in wanted,
    "notin": lambda seen, wanted: seen not in wanted,
}


def filter_mismatch(offer: Mapping[str, Any], filters: Mapping[str, Any] | None) -> str | None:
    """The first filter ``offer`` contradicts, said in words; None when it contradicts none.

    Only fields the offer carries are compared, with the operators known here; a value that cannot be compared
    (another type) is no contradiction.
    """
    for name, condition in (filters or {}).items():
        if name not in offer or not isinstance(condition, Mapping) or len(condition) != 1:
            continue
        ((operator, wanted),) = condition.items()
        compare = _COMPARISONS.get(operator)
        try:
            holds = compare is None or compare(offer[name], wanted)
        except TypeError:
            continue
        if not holds:
            return f"its {name} is {offer[name]!r}, not {operator} {wanted!r}"
    return None


def unknown_filter_field(name: str) -> str:
    """Why a filter on ``name`` is refused, with the closest known field."""
    import difflib

    close = difflib.get_close_matches(str(name), sorted(OFFER_FILTER_FIELDS), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (
        f"is not an offer field the service filters on: it would ignore the filter and match every offer; {hint}"
        "A field newer than this provider goes in extra_filter_fields"
    )


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


def build_change_bid_body(instance_id: int, price: Any) -> dict[str, Any]:
    """``PUT instances/bid_price/{id}/``: the live service's body (``client_id`` "me": the key's own account)."""
    require_positive_int("instance_id", instance_id)
    require_bid("price", price)
    return {"client_id": "me", "price": price}


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
    CreationField("price", require_bid, "a bid in $/h (an interruptible instance)"),
    CreationField("env", lambda f, v: validate_env(v, f), "environment variables and port mappings"),
    CreationField("onstart", lambda f, v: validate_onstart(v), "script run at start (ssh and jupyter runtypes)"),
    CreationField("args_str", require_string, "arguments for runtype 'args'"),
    CreationField("use_jupyter_lab", require_bool, "JupyterLab instead of Notebook"),
    CreationField("jupyter_dir", require_text, "Jupyter's working directory", text=True),
    CreationField("python_utf8", require_bool, "PYTHONUTF8=1"),
    CreationField("lang_utf8", require_bool, "a UTF-8 locale"),
    CreationField("image_login", require_image_login, "registry login '-u <user> -p <token> <host>'"),
    CreationField("cancel_unavail", require_bool, "fail at once when the offer is taken"),
    CreationField("vm", require_bool, "a virtual machine instead of a container"),
    CreationField("volume_info", lambda f, v: validate_volume_info(v), "a volume to create or attach"),
)
CREATION_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in CREATION_FIELDS)


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
        require_string("label", label)
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
    return drop_none({**body, "label": label})


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
    return drop_none(
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
    body = drop_none(fields)
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
    return drop_none({"name": name, "tag": tag})


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
    return drop_none(
        {
            "tfa_method_id": tfa_method_id,
            "code": code,
            "secret": secret,
            "tfa_method": tfa_method,
            "backup_code": backup_code,
        }
    )


def build_request_logs_body(
    *, tail: int | str | None = None, filter: str | None = None, daemon_logs: bool | None = None
) -> dict[str, Any]:
    """The logs request's body.

    ``tail`` is a string number of lines, ``filter`` a server-side grep, and ``daemon_logs`` "true" asks for the host
    daemon's log instead of the container's.
    """
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
    """The ``result_url`` of a logs answer.

    Raises ``GpuMarketError`` for an answer without a usable one: only an http(s) URL is accepted, since it is fetched
    without the API key.
    """
    url = body.get("result_url") if isinstance(body, Mapping) else None
    if isinstance(url, str) and url.startswith(("https://", "http://")):
        return url
    excerpt = str(body)[:BODY_EXCERPT_CHARS]
    raise GpuMarketError(
        f"{operation}: the answer has no http(s) result_url to fetch the log from: {excerpt}", operation=operation
    )
