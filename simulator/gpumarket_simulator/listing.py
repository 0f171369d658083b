"""The live service's paged instance list, ``GET /api/v1/instances/`` (live profile only; not in the spec).

Query: ``limit`` (at most 25; <= 0 reads as 5), ``after_token`` (the previous page's ``next_token``),
``order_by`` (JSON list of ``{"col": name, "dir": "asc"|"desc"}``; ``id`` always breaks ties), ``select_cols``
(JSON list, default ``["*"]``; ``id`` always included) and ``select_filters`` (JSON object
``{col: {op: value}}`` with eq, neq, gt, gte, lt, lte, in, notin). Answer: ``instances``, ``instances_found``
(rows on this page), ``total_instances`` and ``label_counts`` (over every matching row), ``next_token`` (null
on the last page).

A token is the sort key of the last row sent, so a walk neither skips nor repeats an instance that exists from
its start to its end, whatever is created or destroyed in between. It is base64 JSON: opaque to clients,
readable when debugging.
"""

from __future__ import annotations

import base64
import binascii
import collections
import functools
import json
from collections.abc import Mapping
from typing import Any

from gpumarket_simulator.errors import bad_request
from gpumarket_simulator.rules import offer_matches

MAX_LIMIT = 25
#: What the live service reads a limit of zero or less as.
NONPOSITIVE_LIMIT = 5
OPERATORS = ("eq", "neq", "gt", "gte", "lt", "lte", "in", "notin")
#: Columns the simulator documents as filterable (any column of the instance view works).
FILTERABLE_COLUMNS = (
    "id",
    "label",
    "actual_status",
    "intended_status",
    "gpu_name",
    "num_gpus",
    "dph_total",
    "start_date",
)


def _json_param(query: Mapping[str, str], name: str, default: Any) -> Any:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        return json.loads(raw)
    except ValueError:
        raise bad_request(f"{name} must be JSON, got {raw[:80]!r}") from None


def _limit(query: Mapping[str, str]) -> int:
    raw = query.get("limit")
    if raw is None or raw == "":
        return MAX_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        raise bad_request(f"limit must be an integer, got {raw[:40]!r}") from None
    return NONPOSITIVE_LIMIT if limit <= 0 else min(limit, MAX_LIMIT)


def _order(query: Mapping[str, str]) -> list[tuple[str, bool]]:
    order_by = _json_param(query, "order_by", [])
    if not isinstance(order_by, list):
        raise bad_request('order_by must be a JSON list like [{"col": "id", "dir": "asc"}]')
    out = []
    for entry in order_by:
        if isinstance(entry, dict) and isinstance(entry.get("col"), str) and entry.get("dir", "asc") in ("asc", "desc"):
            out.append((entry["col"], entry.get("dir") == "desc"))
        else:
            raise bad_request(f'each order_by entry must be {{"col": name, "dir": "asc"|"desc"}}, got {entry!r}')
    if not any(col == "id" for col, _ in out):
        out.append(("id", False))
    return out


def _filters(query: Mapping[str, str]) -> list[tuple[str, str, Any]]:
    raw = _json_param(query, "select_filters", {})
    if not isinstance(raw, dict):
        raise bad_request('select_filters must be a JSON object like {"label": {"eq": "x"}}')
    out = []
    for col, condition in raw.items():
        if not isinstance(condition, dict):
            raise bad_request(f'the filter on {col} must be an object like {{"eq": value}}')
        for op, value in condition.items():
            if op not in OPERATORS:
                raise bad_request(f"unknown operator {op!r} on {col}; use one of {', '.join(OPERATORS)}")
            if op in ("in", "notin") and not isinstance(value, list):
                raise bad_request(f"{op!r} on {col} takes a list")
            out.append((col, op, value))
    return out


def _matches(row: Mapping[str, Any], filters: list[tuple[str, str, Any]]) -> bool:
    try:
        return offer_matches(dict(row), filters)  # the same operators as the offer search
    except TypeError:  # an order operator between kinds that do not compare (a label gt a number)
        return False


def _sort_key(row: Mapping[str, Any], order: list[tuple[str, bool]]) -> list[Any]:
    # None sorts first; mixed kinds compare by kind name, so any column can be ordered on without a 500.
    return [(row.get(col) is not None, type(row.get(col)).__name__, row.get(col)) for col, _ in order]


def _encode(key: list[Any], order: list[tuple[str, bool]]) -> str:
    return base64.urlsafe_b64encode(json.dumps({"k": key, "o": order}).encode()).decode()


def _decode(token: str, order: list[tuple[str, bool]]) -> list[Any]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        key, token_order = data["k"], data["o"]
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise bad_request("after_token is not a token this server handed out", "invalid_token") from None
    if [list(o) for o in order] != token_order or not isinstance(key, list) or len(key) != len(order):
        raise bad_request("after_token belongs to a listing with another order_by", "invalid_token")
    return [tuple(k) for k in key]


def _after(key: list[Any], cursor: list[Any], order: list[tuple[str, bool]]) -> bool:
    for mine, theirs, (_, descending) in zip(key, cursor, order, strict=True):
        if mine != theirs:
            try:
                return (mine < theirs) if descending else (mine > theirs)
            except TypeError:
                return str(mine) > str(theirs)
    return False


def _column(index: int, keyed_row: tuple[list[Any], dict[str, Any]]) -> Any:
    return keyed_row[0][index]


def list_page(rows: list[dict[str, Any]], query: Mapping[str, str]) -> dict[str, Any]:
    """One page of ``rows`` (the API views of the live instances) as the v1 list answers it."""
    limit = _limit(query)
    order = _order(query)
    filters = _filters(query)
    columns = _json_param(query, "select_cols", ["*"])
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
        raise bad_request('select_cols must be a JSON list of column names, like ["id", "actual_status"]')
    matching = [r for r in rows if _matches(r, filters)]
    keyed = [(_sort_key(r, order), r) for r in matching]
    # Sort by each column from the last to the first, each in its own direction (stable sorts).
    for index in reversed(range(len(order))):
        keyed.sort(key=functools.partial(_column, index), reverse=order[index][1])
    token = query.get("after_token")
    if token:
        cursor = _decode(token, order)
        keyed = [kr for kr in keyed if _after(kr[0], cursor, order)]
    page = keyed[:limit]
    more = len(keyed) > limit
    if "*" not in columns:
        wanted = ["id", *columns]
        page = [(k, {c: r.get(c) for c in wanted}) for k, r in page]
    return {
        "instances": [r for _, r in page],
        "instances_found": len(page),
        "total_instances": len(matching),
        "label_counts": dict(collections.Counter(r.get("label") or "" for r in matching)),
        "next_token": _encode([list(k) for k in page[-1][0]], order) if more and page else None,
    }
