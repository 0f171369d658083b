"""Pending price increases of the account's rentals: the list the API shows, and more made up by the admin."""

from __future__ import annotations

import random
from typing import Any


class PendingPriceIncreases:
    """The account's pending price increases; made-up ones draw from the world's outcome stream."""

    def __init__(self, records: list[dict[str, Any]], rng: random.Random) -> None:
        self.records = records
        self.rng = rng
        self._next_id = max((p["pending_price_increase_id"] for p in records), default=0) + 1

    def listing(self, limit: int) -> dict[str, Any]:
        """The API's answer: the first ``limit`` records, and whether there are more."""
        items = [dict(p) for p in self.records[:limit]]
        return {
            "success": True,
            "count": len(items),
            "pending_price_increases": items,
            "truncated": len(self.records) > limit,
        }

    def add(self, n: int, contract_id: int | None, host_id: int | None, now: float) -> list[dict[str, Any]]:
        """Make up ``n`` increases of ``contract_id`` (on ``host_id``), or of made-up contracts and hosts (None)."""
        added = []
        for k in range(n):
            old_gpu = round(self.rng.uniform(0.00005, 0.0008), 8)
            old_disk = round(self.rng.uniform(0.0000001, 0.000002), 10)
            end = now + self.rng.uniform(1, 30) * 86400
            record = {
                "pending_price_increase_id": self._next_id,
                "contract_id": contract_id if contract_id is not None else 7_000_001 + self._next_id + k,
                "host_id": host_id if host_id is not None else self.rng.randint(60000, 69999),
                "new_gpu_costpersec": round(old_gpu * self.rng.uniform(1.05, 1.5), 8),
                "new_disk_ram_costpersec": round(old_disk * self.rng.uniform(1.0, 1.3), 10),
                "old_gpu_costpersec": old_gpu,
                "old_disk_ram_costpersec": old_disk,
                "contract_end_date": round(end, 3),
                "ask_end_date": round(end + self.rng.uniform(0, 30) * 86400, 3),
                "created_at": round(now - self.rng.uniform(0, 86400), 3),
            }
            self._next_id += 1
            self.records.append(record)
            added.append(record)
        return added
