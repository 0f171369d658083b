"""The simulated server's own rules for request bodies: what it accepts, and the 4xx it answers otherwise.

Here: JSON and the kinds of values every body shares, the offer search, and the account's bodies (volume listings,
serverless, two-factor); the instance endpoints' bodies are in ``instance_rules.py``.

These are written from the server's side of the published API reference on purpose, independently of the provider's
validation: if both sides shared one reading of the spec, a misreading would never show up in tests.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from gpumarket_simulator.errors import ApiError, bad_request

OFFER_TYPES = frozenset({"ondemand", "on-demand", "bid"})
ENDPOINT_STATES = frozenset({"active", "suspended", "stopped"})
TFA_METHODS = frozenset({"sms", "totp", "email"})

#: Offer fields a search may filter and sort on, with the JSON kind their operands must have.
OFFER_FIELD_KINDS: dict[str, str] = {
    "id": "number",
    "num_gpus": "number",
    "gpu_name": "string",
    "gpu_ram": "number",
    "dph_total": "number",
    "reliability": "number",
    "verified": "bool",
    "rentable": "bool",
    "direct_port_count": "number",
    "dlperf_per_dphtotal": "number",
    "machine_id": "number",
    "host_id": "number",
}
#: What the live service also filters and sorts offers on (the official CLI's ``inet_up_cost<0.01``); the spec
#: profile refuses them, since the spec does not list them.
LIVE_OFFER_FIELD_KINDS: dict[str, str] = {
    **OFFER_FIELD_KINDS,
    "inet_up_cost": "number",
    "inet_down_cost": "number",
    "inet_down": "number",
}
EQUALITY_OPERATORS = frozenset({"eq", "neq"})
ORDER_OPERATORS = frozenset({"gte", "gt", "lte", "lt"})
LIST_OPERATORS = frozenset({"in", "notin"})
OPERATORS = EQUALITY_OPERATORS | ORDER_OPERATORS | LIST_OPERATORS
SEARCH_CONTROL_KEYS = frozenset({"type", "limit", "order"})

ENDPOINT_NUMBER_FIELDS = (
    "min_load",
    "min_cold_load",
    "target_util",
    "cold_mult",
    "max_queue_time",
    "target_queue_time",
    "inactivity_timeout",
    "overrecruit_ratio",
)
ENDPOINT_INT_FIELDS = ("cold_workers", "max_workers")
ENDPOINT_TEXT_FIELDS = ("autoscaler_instance", "endpoint_name")


# --- JSON ---------------------------------------------------------------------------------------------------
def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(raw: bytes, *, required: bool = True) -> Any:
    """Decode a request body; malformed JSON (including NaN/Infinity, which Python would accept) is a 400."""
    if not raw.strip():
        if required:
            raise bad_request("a JSON body is required", "invalid_json")
        return {}
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"the body is not valid JSON: {exc}", "invalid_json") from None


def require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request(f"the body must be a JSON object, got {kind_of(body)}")
    return body


def kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def one_of(value: Any, choices: frozenset[str] | dict[str, Any]) -> bool:
    """Membership that cannot raise: JSON arrays and objects are unhashable."""
    return isinstance(value, str) and value in choices


def present(body: dict[str, Any], name: str) -> bool:
    """Optional fields sent as null count as not sent."""
    return body.get(name) is not None


# --- Search -------------------------------------------------------------------------------------------------
@dataclass
class SearchQuery:
    filters: list[tuple[str, str, Any]] = field(default_factory=list)
    offer_type: str = "ondemand"
    limit: int | None = None
    order: list[tuple[str, bool]] = field(default_factory=list)  # (field, descending)

    @property
    def filters_rentable(self) -> bool:
        return any(name == "rentable" for name, _, _ in self.filters)


def validate_search(body: Any, *, lenient: bool = False) -> SearchQuery:
    """The search body as a query.

    ``lenient`` is the live profile: unknown filter fields, top-level keys and order fields are ignored (the official
    CLI sends ``external``, ``allocated_storage`` and orders on ``score``), and numeric strings compare as numbers
    (``{"num_gpus": {"gte": "1"}}``).
    """
    body = require_object(body)
    query = SearchQuery()
    kinds = LIVE_OFFER_FIELD_KINDS if lenient else OFFER_FIELD_KINDS
    for name, condition in body.items():
        if lenient and name == "limit" and isinstance(condition, str) and condition.strip().isdigit():
            condition = int(condition)
        if lenient and name == "order" and isinstance(condition, list):
            condition = [p for p in condition if not (isinstance(p, list) and p and p[0] not in kinds)]
        if lenient and name in kinds and isinstance(condition, dict):
            condition = {op: _numeric(name, operand) for op, operand in condition.items()}
        if lenient and name not in kinds and name not in SEARCH_CONTROL_KEYS:
            continue
        if name == "type":
            if not one_of(condition, OFFER_TYPES):
                raise bad_request("type must be ondemand, on-demand or bid")
            query.offer_type = condition
        elif name == "limit":
            if not is_int(condition) or condition < 1:
                raise bad_request("limit must be a positive integer")
            query.limit = condition
        elif name == "order":
            query.order = _validate_order(condition, kinds)
        elif name in kinds:
            if not isinstance(condition, dict) or not condition:
                raise bad_request(f'the filter on {name} must be an object like {{"eq": value}}', "invalid_filter")
            for operator, operand in condition.items():
                _check_operand(name, operator, operand, kinds)
                query.filters.append((name, operator, operand))
        else:
            raise bad_request(
                f"{name!r} is not a filterable offer field; use one of {', '.join(OFFER_FIELD_KINDS)}",
                "invalid_filter",
            )
    return query


def _numeric(name: str, operand: Any) -> Any:
    """A numeric string as the number it spells, for a number field; anything else unchanged."""
    if LIVE_OFFER_FIELD_KINDS[name] != "number":
        return operand
    if isinstance(operand, list):
        return [_numeric(name, v) for v in operand]
    if isinstance(operand, str):
        try:
            number = float(operand)
        except ValueError:
            return operand
        return int(number) if number.is_integer() else number
    return operand


def _check_operand(name: str, operator: str, operand: Any, kinds: dict[str, str] = OFFER_FIELD_KINDS) -> None:
    if not one_of(operator, OPERATORS):
        raise bad_request(
            f"unknown operator {operator!r} on {name}; use one of {', '.join(sorted(OPERATORS))}",
            "invalid_filter",
        )
    kind = kinds[name]
    if operator in LIST_OPERATORS:
        if not isinstance(operand, list):
            raise bad_request(f"{operator!r} on {name} takes an array of values", "invalid_filter")
        values = operand
    elif operator in ORDER_OPERATORS and kind == "bool":
        raise bad_request(f"{name} is a boolean: use eq, neq or in", "invalid_filter")
    else:
        values = [operand]
    for value in values:
        ok = (
            (kind == "number" and is_number(value))
            or (kind == "string" and isinstance(value, str))
            or (kind == "bool" and isinstance(value, bool))
        )
        if not ok:
            raise bad_request(f"{name} compares with a {kind}, got {kind_of(value)}", "invalid_filter")


def _validate_order(order: Any, kinds: dict[str, str] = OFFER_FIELD_KINDS) -> list[tuple[str, bool]]:
    if not isinstance(order, list):
        raise bad_request('order must be an array of [field, "asc"|"desc"] pairs')
    out = []
    for pair in order:
        if not isinstance(pair, list) or len(pair) != 2 or not one_of(pair[0], kinds) or pair[1] not in ("asc", "desc"):
            raise bad_request(f'each order entry must be [offer field, "asc"|"desc"], got {pair!r}')
        out.append((pair[0], pair[1] == "desc"))
    return out


def offer_matches(offer: dict[str, Any], filters: list[tuple[str, str, Any]]) -> bool:
    for name, operator, operand in filters:
        value = offer.get(name)
        if operator == "eq":
            ok = value == operand
        elif operator == "neq":
            ok = value != operand
        elif operator == "in":
            ok = value in operand
        elif operator == "notin":
            ok = value not in operand
        elif value is None:
            ok = False
        elif operator == "gte":
            ok = value >= operand
        elif operator == "gt":
            ok = value > operand
        elif operator == "lte":
            ok = value <= operand
        else:
            ok = value < operand
        if not ok:
            return False
    return True


# --- Volume listings ----------------------------------------------------------------------------------------
def validate_volume_listing(body: Any) -> tuple[list[int], bool | None]:
    """Machine ids (``machines`` overrides ``machine``) and hidden_listing, with the spec's 400 and 422."""
    body = require_object(body)
    if present(body, "machines"):
        machines = body["machines"]
        if not isinstance(machines, list) or not machines or not all(_is_id(m) for m in machines):
            raise bad_request("Invalid machine id")
        ids = list(dict.fromkeys(machines))
    elif present(body, "machine"):
        if not _is_id(body["machine"]):
            raise bad_request("Invalid machine id")
        ids = [body["machine"]]
    else:
        raise bad_request("Invalid machine id")
    hidden = body.get("hidden_listing")
    if hidden is not None and not isinstance(hidden, bool):
        raise ApiError(422, "invalid_args", "Disk ask creation failed: hidden_listing must be a boolean")
    return ids, hidden


def _is_id(value: Any) -> bool:
    return is_int(value) and value > 0


# --- Serverless endpoints and deployments -------------------------------------------------------------------
def validate_endpoint(body: Any) -> dict[str, Any]:
    """Every field is optional (defaults fill the rest); types, states and the queue-time rule are checked."""
    body = require_object(body)
    out: dict[str, Any] = {}
    for name in ENDPOINT_NUMBER_FIELDS:
        if present(body, name):
            if not is_number(body[name]) or body[name] < 0:
                raise bad_request(f"{name} must be a number of at least 0")
            out[name] = body[name]
    for name in ENDPOINT_INT_FIELDS:
        if present(body, name):
            if not is_int(body[name]) or body[name] < 0:
                raise bad_request(f"{name} must be an integer of at least 0")
            out[name] = body[name]
    for name in ENDPOINT_TEXT_FIELDS:
        if present(body, name):
            if not isinstance(body[name], str) or not body[name].strip():
                raise bad_request(f"{name} must be a non-empty string")
            out[name] = body[name]
    if present(body, "endpoint_state"):
        if not one_of(body["endpoint_state"], ENDPOINT_STATES):
            raise bad_request("endpoint_state must be active, suspended or stopped", "invalid_endpoint_state")
        out["endpoint_state"] = body["endpoint_state"]
    if "target_queue_time" in out and "max_queue_time" in out and out["target_queue_time"] > out["max_queue_time"]:
        raise bad_request(
            f"target_queue_time ({out['target_queue_time']}) must be less than or equal to "
            f"max_queue_time ({out['max_queue_time']})",
            "invalid_queue_time",
        )
    return out


def validate_delete_deployments(body: Any) -> tuple[str, str | None]:
    body = require_object(body)
    name = body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise bad_request("name is required: the name of the deployments to delete")
    tag = body.get("tag")
    if tag is not None and not isinstance(tag, str):
        raise bad_request("tag must be a string")
    return name, tag


# --- Two-factor backup codes --------------------------------------------------------------------------------
def validate_tfa(body: Any) -> dict[str, Any]:
    body = require_object(body)
    out: dict[str, Any] = {}
    for name in ("code", "secret", "backup_code"):
        if present(body, name):
            if not isinstance(body[name], str) or not body[name].strip():
                raise bad_request(f"{name} must be a non-empty string")
            out[name] = body[name].strip()
    if present(body, "tfa_method"):
        if not one_of(body["tfa_method"], TFA_METHODS):
            raise bad_request("tfa_method must be sms, totp or email")
        out["tfa_method"] = body["tfa_method"]
    if present(body, "tfa_method_id"):
        if not _is_id(body["tfa_method_id"]):
            raise bad_request("tfa_method_id must be a positive integer")
        out["tfa_method_id"] = body["tfa_method_id"]
    if "code" not in out and "backup_code" not in out:
        raise bad_request("a verification code (with tfa_method or tfa_method_id) or a backup_code is required")
    if "backup_code" not in out and "tfa_method" not in out and "tfa_method_id" not in out:
        raise bad_request("tfa_method or tfa_method_id is required with code")
    return out
