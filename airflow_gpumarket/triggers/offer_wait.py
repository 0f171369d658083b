"""A renting task's wait for an offer, in the triggerer: until one that its search did not see appears, or a time."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from airflow_gpumarket import offer_watch
from airflow_gpumarket._compat import BaseTrigger, TriggerEvent
from airflow_gpumarket.triggers.offers import OfferSearches
from airflow_gpumarket.utils import duration_seconds

#: The event's ``status`` when a new matching offer appeared, and when ``deadline`` came first.
OFFER, TIMEOUT = "offer", "timeout"


class GpuMarketOfferWaitTrigger(OfferSearches, BaseTrigger):
    """Search every ``poll_interval`` until an offer matches that the task has not seen, or until ``deadline``.

    The task searched and found nothing it could rent: the offers it saw (``seen_offers``) and the machines host
    memory skips (``avoided_machines``) do not count, so that an offer it already refused does not wake it again.
    The event is ``{"status": "offer", "offer_id", "price", ...}`` (as the offer watcher's) or ``{"status":
    "timeout"}``. It holds nothing: a task taken out of its wait leaves nothing to destroy.

    :param watch: ``offer_watch.OfferWatch``'s fields: the task's own search and price cap.
    :param deadline: epoch seconds at which the wait ends.
    """

    def __init__(
        self,
        *,
        watch: Mapping[str, Any],
        deadline: float,
        seen_offers: Sequence[int] = (),
        avoided_machines: Sequence[int] = (),
        gpumarket_conn_id: str = "gpumarket_default",
        poll_interval: float = 300.0,
    ) -> None:
        super().__init__()
        fields = dict(watch)
        fields["extra_filter_fields"] = tuple(fields.get("extra_filter_fields") or ())
        self.watch = offer_watch.OfferWatch(**fields)
        self.deadline = float(deadline)
        self.seen_offers = sorted({int(i) for i in seen_offers})
        self.avoided_machines = sorted({int(i) for i in avoided_machines})
        self.gpumarket_conn_id = gpumarket_conn_id
        self.poll_interval = duration_seconds("poll_interval", poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        watch = self.watch
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "watch": {
                    "filters": dict(watch.filters),
                    "offer_type": watch.offer_type,
                    "max_dph": watch.max_dph,
                    "extra_filter_fields": list(watch.extra_filter_fields),
                },
                "deadline": self.deadline,
                "seen_offers": self.seen_offers,
                "avoided_machines": self.avoided_machines,
                "gpumarket_conn_id": self.gpumarket_conn_id,
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        seen, avoided = set(self.seen_offers), set(self.avoided_machines)
        async for at, offers in self._searches(shared=True):
            new = [o for o in offers or () if o.get("id") not in seen and o.get("machine_id") not in avoided]
            found = offer_watch.Appearances().observe(self.watch, new, at)
            if found is not None:
                self.log.info("An offer the task may rent appeared: %s", found)
                yield TriggerEvent({"status": OFFER, **found})
                return
            if time.time() >= self.deadline:
                yield TriggerEvent({"status": TIMEOUT})
                return
