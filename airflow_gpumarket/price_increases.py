"""Reading the pending price increase list: filtering by contract and describing old vs new costs.

Pure functions shared by the sensor (poke mode) and its trigger (deferrable mode).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any

#: Seconds between checks of the pending price increases by default (they are announced days ahead).
CHECK_INTERVAL_SECONDS = 300.0


class PriceIncreaseEvent(str, Enum):  # noqa: UP042 - StrEnum is 3.11+; Airflow 2.11 runs on 3.10
    """The ``status`` of the trigger's event.

    Either increases found (``pending``, ``truncated``), or an error (``message``) that no retry can mend.
    """

    FOUND = "found"
    ERROR = "error"


_COSTS = (
    ("GPU", "old_gpu_costpersec", "new_gpu_costpersec"),
    ("disk+RAM", "old_disk_ram_costpersec", "new_disk_ram_costpersec"),
)


def select(response: Mapping[str, Any], contract_ids: Iterable[int] | None) -> list[dict[str, Any]]:
    """The pending increases, only for ``contract_ids`` when given."""
    items = [dict(i) for i in response.get("pending_price_increases") or [] if isinstance(i, Mapping)]
    if contract_ids is None:
        return items
    wanted = {int(c) for c in contract_ids}
    return [i for i in items if i.get("contract_id") in wanted]


def describe(item: Mapping[str, Any]) -> str:
    """One line with old and new costs side by side (the spec does not show their units: printed as sent)."""
    parts = []
    for name, old_key, new_key in _COSTS:
        old, new = item.get(old_key), item.get(new_key)
        change = ""
        if isinstance(old, int | float) and isinstance(new, int | float) and old:
            change = f" ({(new - old) / old:+.0%})"
        parts.append(f"{name} {old} -> {new}{change}")
    return (
        f"contract {item.get('contract_id')} (host {item.get('host_id')}, increase "
        f"{item.get('pending_price_increase_id')}): " + "; ".join(parts)
    )
