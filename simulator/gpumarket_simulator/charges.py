"""The live service's billing listings (live profile only; the spec has neither): charges and invoices.

``GET /api/v0/charges/`` lists one charge per instance and UTC day, broken into ``gpu``, ``storage`` and
``bandwidth`` items, straight from the ledger (billing.py): the floats are the ledger's, never rounded.
``GET /api/v1/invoices/`` lists the money put into the account: the starting credit and the admin's top-ups.

Query, as the official CLI sends it (each value that is not a string JSON-encoded): ``select_filters``
(``{column: {operator: operand}}``), ``latest_first`` (``true``/``false``), ``limit`` (1 to 100, default 20; more
is read as 100), ``after_token`` (the previous page's ``next_token``) and, ignored, ``format``. Answer:
``results``, ``count`` (on this page), ``total`` (every match) and ``next_token`` (null on the last page).

A token is the sort key of the page's last item, with the filters and order it was cut for (base64 JSON: opaque
to clients, readable when debugging): a walk neither skips nor repeats, and a token sent with other filters is a
400, not a silently wrong page.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpumarket_simulator.errors import bad_request
from gpumarket_simulator.rules import LIST_OPERATORS, OPERATORS, is_number, offer_matches

if TYPE_CHECKING:
    from gpumarket_simulator.billing import DayLedger, Invoice
    from gpumarket_simulator.instances import Instance
    from gpumarket_simulator.world import World

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
#: Kinds of charge the live service lists; the simulator bills instances only.
CHARGE_TYPES = frozenset({"instance", "volume", "serverless"})
#: What ``select_filters`` may name, and the JSON kind of each column's operands.
CHARGE_COLUMNS = {
    "day": "number",
    "type": "string",
    "source": "string",
    "amount": "number",
    "start": "number",
    "end": "number",
}
INVOICE_COLUMNS = {
    "when": "number",
    "service": "string",
    "type": "string",
    "source": "string",
    "amount": "number",
    "start": "number",
    "end": "number",
}
_TRUE, _FALSE = frozenset({"true", "1"}), frozenset({"false", "0", ""})


@dataclass(frozen=True)
class PageQuery:
    filters: list[tuple[str, str, Any]]
    latest_first: bool
    limit: int
    #: The sort key the page starts after (from ``after_token``), or None for the first page.
    after: list[Any] | None


@dataclass(frozen=True)
class Row:
    key: list[Any]
    item: dict[str, Any]
    #: The item plus the columns only filters see (``day``, ``when``, ``service``).
    columns: dict[str, Any]


# --- the query ---------------------------------------------------------------------------------------------------
def parse_query(query: Mapping[str, str], columns: Mapping[str, str], what: str) -> PageQuery:
    """The listing's query, or a 400 naming the parameter at fault."""
    filters = _filters(query.get("select_filters"), columns, what)
    latest_first = _latest_first(query.get("latest_first"))
    limit = _limit(query.get("limit"))
    token = query.get("after_token")
    after = _decode(token, filters, latest_first) if token else None
    return PageQuery(filters, latest_first, limit, after)


def _json(raw: str, name: str) -> Any:
    def constant(value: str) -> Any:
        raise ValueError(f"{value} is not JSON")

    try:
        return json.loads(raw, parse_constant=constant)
    except (ValueError, RecursionError):
        raise bad_request(f"{name} must be JSON, got {raw[:80]!r}") from None


def _filters(raw: str | None, columns: Mapping[str, str], what: str) -> list[tuple[str, str, Any]]:
    example = '{"day": {"gte": 1767225600}}' if "day" in columns else '{"when": {"gte": 1767225600}}'
    value = {} if raw is None or raw == "" else _json(raw, "select_filters")
    if not isinstance(value, dict):
        raise bad_request(f"select_filters must be a JSON object like {example}")
    out = []
    for column, condition in value.items():
        if column not in columns:
            raise bad_request(
                f"select_filters: unknown column {column!r}; {what} filter on {', '.join(columns)}", "invalid_filter"
            )
        if not isinstance(condition, dict) or not condition:
            raise bad_request(
                f'select_filters: the filter on {column} must be an object like {{"gte": value}}', "invalid_filter"
            )
        for op, operand in condition.items():
            if op not in OPERATORS:
                raise bad_request(
                    f"select_filters: unknown operator {op!r} on {column}; use one of {', '.join(sorted(OPERATORS))}",
                    "invalid_filter",
                )
            _check_operand(column, op, operand, columns[column], what)
            out.append((column, op, operand))
    return sorted(out, key=lambda f: (f[0], f[1]))


def _check_operand(column: str, op: str, operand: Any, kind: str, what: str) -> None:
    if op in LIST_OPERATORS and not isinstance(operand, list):
        raise bad_request(f"select_filters: {op!r} on {column} takes a list", "invalid_filter")
    for value in operand if op in LIST_OPERATORS else [operand]:
        if not (is_number(value) if kind == "number" else isinstance(value, str)):
            raise bad_request(f"select_filters: {column} compares with a {kind}, got {value!r}", "invalid_filter")
        if what == "charges" and column == "type" and value not in CHARGE_TYPES:
            raise bad_request(
                f"select_filters: type is one of {', '.join(sorted(CHARGE_TYPES))}, got {value!r}", "invalid_filter"
            )


def _latest_first(raw: str | None) -> bool:
    text = (raw or "").strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise bad_request(f"latest_first must be true or false, got {raw[:40]!r}" if raw else "latest_first must be a bool")


def _limit(raw: str | None) -> int:
    if raw is None or raw == "":
        return DEFAULT_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        raise bad_request(f"limit must be an integer from 1 to {MAX_LIMIT}, got {raw[:40]!r}") from None
    if limit <= 0:
        raise bad_request(f"limit must be an integer from 1 to {MAX_LIMIT}, got {limit}")
    return min(limit, MAX_LIMIT)


def _bound(filters: list[tuple[str, str, Any]], latest_first: bool) -> Any:
    """What a token is bound to: the filters and the order it was cut for (the limit may change between pages)."""
    return {"f": [list(f) for f in filters], "lf": latest_first}


def _encode(key: list[Any], filters: list[tuple[str, str, Any]], latest_first: bool) -> str:
    data = {"k": key, **_bound(filters, latest_first)}
    return base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).decode()


def _decode(token: str, filters: list[tuple[str, str, Any]], latest_first: bool) -> list[Any]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        key, bound = data["k"], {"f": data["f"], "lf": data["lf"]}
    except (ValueError, KeyError, TypeError, RecursionError, binascii.Error):
        raise bad_request("after_token is not a token this server handed out", "invalid_token") from None
    if not isinstance(key, list) or len(key) != 2 or not all(is_number(k) for k in key):
        raise bad_request("after_token is not a token this server handed out", "invalid_token")
    if bound != _bound(filters, latest_first):
        raise bad_request(
            "after_token belongs to a listing with other select_filters or latest_first: send the same ones as for "
            "the page it came from",
            "invalid_token",
        )
    return key


# --- the page ----------------------------------------------------------------------------------------------------
def page(rows: list[Row], query: PageQuery) -> dict[str, Any]:
    matching = [r for r in rows if offer_matches(r.columns, query.filters)]
    matching.sort(key=lambda r: r.key, reverse=query.latest_first)
    rest = matching
    if query.after is not None:
        after = query.after
        rest = [r for r in matching if (r.key < after if query.latest_first else r.key > after)]
    cut = rest[: query.limit]
    more = len(rest) > query.limit
    return {
        "results": [r.item for r in cut],
        "count": len(cut),
        "total": len(matching),
        "next_token": _encode(cut[-1].key, query.filters, query.latest_first) if more else None,
    }


# --- charges -----------------------------------------------------------------------------------------------------
def charge_rows(world: World, now: float) -> list[Row]:
    """One row per instance and UTC day that something was billed on; destroyed instances' days included.

    With the account's ``charges_delay``, a day is listed only once it ended that long before ``now``.
    """
    rows = []
    delay = world.account.charges_delay
    for inst in world.instances.values():
        for day in inst.days.values():
            if delay is not None and day.next_day + delay > now:  # the UTC day ended at least delay ago
                continue
            item = _charge(inst, day)
            rows.append(Row([day.day, inst.id], item, item))
    return rows


def _charge(inst: Instance, day: DayLedger) -> dict[str, Any]:
    source = f"instance-{inst.id}"
    offer, disk = inst.offer, float(inst.config["disk"])
    hardware = f"{offer.num_gpus}x {offer.gpu_name}"
    span = (day.start, day.end)
    items = [
        _item(
            "gpu",
            str(inst.id),
            day.compute_dollars,
            _span(day.compute_start, day.compute_end, span),
            f"{day.compute_seconds / 3600:.4f} h of {hardware}",
            {"seconds": day.compute_seconds, "gpu_name": offer.gpu_name, "num_gpus": offer.num_gpus},
        ),
        _item(
            "storage",
            str(inst.id),
            day.storage_dollars,
            span,
            f"{disk:g} GB disk for {day.storage_seconds / 3600:.4f} h",
            {"seconds": day.storage_seconds, "disk_gb": disk},
        ),
        _item(
            "bandwidth",
            str(inst.id),
            day.bandwidth_dollars,
            _span(day.bandwidth_start, day.bandwidth_end, span),
            f"{day.bandwidth_up_bytes / 1e9:.4f} GB up, {day.bandwidth_down_bytes / 1e9:.4f} GB down",
            {"upload_bytes": day.bandwidth_up_bytes, "download_bytes": day.bandwidth_down_bytes},
        ),
    ]
    label = inst.config.get("label") or ""
    return {
        "type": "instance",
        "source": source,
        # The items in the ledger's own order, so the amount is the day's ledger total to the last bit.
        "amount": day.compute_dollars + day.storage_dollars + day.bandwidth_dollars,
        "start": day.start,
        "end": day.end,
        "day": day.day,
        "description": f"Instance {inst.id}{f' ({label})' if label else ''}: {hardware}, {disk:g} GB disk",
        "metadata": {
            "instance_id": inst.id,
            "label": label,
            "gpu_name": offer.gpu_name,
            "num_gpus": offer.num_gpus,
        },
        "items": items,
    }


def _span(start: float | None, end: float | None, whole: tuple[float, float]) -> tuple[float, float]:
    """When a part of the day's charge was billed; the whole charge's span when it never was."""
    return (start, end) if start is not None and end is not None else whole


def _item(
    kind: str, source: str, amount: float, span: tuple[float, float], description: str, metadata: dict[str, Any]
) -> dict[str, Any]:
    return {
        "type": kind,
        "source": source,
        "amount": amount,
        "start": span[0],
        "end": span[1],
        "description": description,
        "metadata": metadata,
        "items": [],
    }


# --- invoices ----------------------------------------------------------------------------------------------------
def invoice_rows(world: World) -> list[Row]:
    return [_invoice_row(i) for i in world.account.invoices]


def _invoice_row(invoice: Invoice) -> Row:
    item = {
        "type": "credit",
        "source": invoice.source,
        # As the live service signs it: money put in is negative (the official CLI negates a credit to show it).
        "amount": -invoice.added,
        "start": invoice.when,
        "end": invoice.when,  # paid when made
        "description": invoice.description,
        "metadata": {"invoice_id": invoice.id},
        "items": [],
    }
    return Row([invoice.when, invoice.id], item, {**item, "when": invoice.when, "service": invoice.service})
