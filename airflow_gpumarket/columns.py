"""The checks of the fields a signed route reads from its JSON body against the columns that store them.

Each check answers the field's value, or raises GpuMarketValidationError (a ValueError) naming the field and what it
must be: numbers finite and within the column they are stored in, strings within their column's length and free of
what a database refuses (NUL, lone surrogates).
"""

from __future__ import annotations

import math
from typing import Any

from airflow_gpumarket.exceptions import GpuMarketValidationError

#: The largest value of a 32-bit (``Integer``) and of a 64-bit (``BigInteger``) column.
INT32 = 2**31 - 1
INT64 = 2**63 - 1
#: The longest id (DAG, run, task, connection, team): Airflow's own columns.
ID_CHARS = 250
#: The largest amount of dollars, and of seconds, a ledger row may hold: far above any rental, far below overflow.
MAX_DOLLARS = 1e9
MAX_SECONDS = 1e9
#: The latest epoch second a timestamp may name (the year 5138).
MAX_EPOCH = 1e11


def text(body: dict[str, Any], name: str, *, required: bool = True, max_chars: int = ID_CHARS) -> Any:
    """The string field ``name`` of ``body``, checked as ``string`` does."""
    return string(name, body.get(name), required=required, max_chars=max_chars)


def string(name: str, value: Any, *, required: bool = True, max_chars: int = ID_CHARS) -> Any:
    """``value``: a non-empty string of at most ``max_chars``, storable (None when absent and not required)."""
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise GpuMarketValidationError(name, "must be a non-empty string")
    if len(value) > max_chars:
        raise GpuMarketValidationError(name, f"must be at most {max_chars} characters, got {len(value)}")
    return clean(name, value)


def clean(name: str, value: str) -> str:
    """``value`` when a database can store it; an error naming ``name`` when it holds NUL or a lone surrogate."""
    if "\x00" in value:
        raise GpuMarketValidationError(name, "must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise GpuMarketValidationError(name, "must be valid Unicode (it holds a lone surrogate)") from None
    return value


def integer(body: dict[str, Any], name: str, *, low: int, high: int, required: bool = True) -> Any:
    """An integer field within ``low``..``high`` (None when absent and not required)."""
    value = body.get(name)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise GpuMarketValidationError(name, f"must be an integer from {low} to {high}")
    return value


def number(
    body: dict[str, Any], name: str, *, low: float = 0.0, high: float = MAX_DOLLARS, required: bool = True
) -> Any:
    """A finite number field within ``low``..``high``, as a float (None when absent and not required)."""
    value = body.get(name)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise GpuMarketValidationError(name, f"must be a finite number from {low:g} to {high:g}")
    return float(value)


def finite(name: str, value: float, *, low: float = 0.0, high: float = math.inf) -> float:
    """``value`` when finite and within ``low``..``high``; an error naming ``name`` otherwise."""
    if not (math.isfinite(value) and low <= value <= high):
        raise GpuMarketValidationError(name, f"must be a finite number from {low:g} to {high:g}, got {value!r}")
    return value
