"""An offer watcher for ``AssetWatcher``: fires when offers that match it appear on the market (Airflow 3)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Hashable, Mapping
from typing import Any

from airflow_gpumarket import _compat, offer_watch
from airflow_gpumarket._compat import TriggerEvent
from airflow_gpumarket.exceptions import GpuMarketError, GpuMarketValidationError
from airflow_gpumarket.utils import duration_seconds

try:  # Airflow 3: a trigger an AssetWatcher may run
    from airflow.triggers.base import BaseEventTrigger
except ImportError:  # Airflow 2.11 has no event-driven scheduling
    BaseEventTrigger = _compat.BaseTrigger  # type: ignore[misc]

#: Searches in flight or just answered, by (event loop, shared key): watchers of one triggerer share them.
_SEARCHES: dict[tuple[int, Hashable], tuple[float, asyncio.Future]] = {}


class OfferSearches:
    """What the offer triggers share: one connection's searches for a watch, every ``poll_interval`` seconds, shared
    with the triggers of this process that search the same."""

    gpumarket_conn_id: str
    watch: offer_watch.OfferWatch
    poll_interval: float
    log: Any

    def shared_stream_key(self) -> Hashable | None:
        """Watchers of one connection, search and interval share one search (Airflow 3.3+'s shared streams)."""
        return ("gpumarket-offers", self.gpumarket_conn_id, self.watch.key(), self.poll_interval)

    async def _searches(self, *, shared: bool) -> AsyncIterator[tuple[float, list | None]]:
        """``(service time, offers or None when the search failed)``, one per interval."""
        from airflow_gpumarket.hooks.gpumarket import GpuMarketAsyncHook

        hook = GpuMarketAsyncHook(self.gpumarket_conn_id)
        try:
            while True:
                search = self._search(hook)
                yield await (self._shared(search) if shared else search)
                await asyncio.sleep(self.poll_interval)
        finally:
            await hook.aclose()

    async def _search(self, hook: Any) -> tuple[float, list | None]:
        watch = self.watch
        try:
            offers = await hook.search_offers(
                watch.search_filters(),
                offer_type=watch.offer_type,
                limit=offer_watch.SEARCH_LIMIT,
                extra_filter_fields=watch.extra_filter_fields,
            )
        except GpuMarketError as exc:  # no news: the appearance in course neither ends nor starts
            self.log.warning("Searching offers failed (%s); searching again in %g s", exc, self.poll_interval)
            return hook.service_now(), None
        finally:
            await hook.aclose()
        return hook.service_now(), offers

    async def _shared(self, search: Any) -> tuple[float, list | None]:
        """The answer of a search another trigger of this process started less than half an interval ago, if any;
        else ``search``'s, shared with the next ones."""
        key = (id(asyncio.get_running_loop()), self.shared_stream_key())
        now = time.monotonic()
        started = _SEARCHES.get(key)
        if started is not None and now - started[0] < self.poll_interval / 2:
            search.close()
            return await asyncio.shield(started[1])
        future = asyncio.ensure_future(search)
        _SEARCHES[key] = (now, future)
        return await asyncio.shield(future)


class GpuMarketOfferTrigger(OfferSearches, BaseEventTrigger):
    """Fire when offers matching a filter appear, once per appearance: an ``AssetWatcher``'s trigger.

    Every ``poll_interval`` it searches the market (cheapest first, ``offer_watch.SEARCH_LIMIT`` offers) and checks
    the answer against the filter and caps. The first search that finds a match after none fires an event whose
    payload names the cheapest match (``offer_id``, ``price``, ``machine_id``, ``gpu_name``, ``num_gpus``,
    ``reliability``, ``matches``, ``seen_at``); the next fires only after every match has gone and one came back.
    Watchers of one connection with the same search share it: one search per interval however many watch (the
    triggerer's shared streams on Airflow 3.3+, the process's own sharing before).

    :param gpumarket_conn_id: connection of type ``gpumarket``.
    :param offer_filters: the search's filter fields, as the renting operators take them.
    :param offer_type: ``"ondemand"`` or ``"bid"`` (the price compared is then the offer's ``min_bid``).
    :param max_dph: the most per hour an offer may cost to count.
    :param min_reliability: the lowest reliability (0-1) that counts.
    :param verified: only verified (True) or unverified (False) hosts.
    :param min_direct_ports: the fewest direct ports (a service needs one).
    :param poll_interval: seconds between searches (default 300); the hook paces searches to the key's budget.
    """

    def __init__(
        self,
        *,
        gpumarket_conn_id: str = "gpumarket_default",
        offer_filters: Mapping[str, Any] | None = None,
        offer_type: str = "ondemand",
        max_dph: float | None = None,
        min_reliability: float | None = None,
        verified: bool | None = None,
        min_direct_ports: int | None = None,
        poll_interval: float = 300.0,
    ) -> None:
        if BaseEventTrigger is _compat.BaseTrigger:
            raise GpuMarketValidationError(
                "GpuMarketOfferTrigger",
                "needs Airflow 3.0 or later (AssetWatcher); on 2.11 schedule the DAG by time instead",
            )
        super().__init__()
        self.gpumarket_conn_id = gpumarket_conn_id
        self.watch = offer_watch.OfferWatch(
            dict(offer_filters or {}), offer_type, max_dph, min_reliability, verified, min_direct_ports
        )
        self.poll_interval = duration_seconds("poll_interval", poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        watch = self.watch
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "gpumarket_conn_id": self.gpumarket_conn_id,
                "offer_filters": dict(watch.filters),
                "offer_type": watch.offer_type,
                "max_dph": watch.max_dph,
                "min_reliability": watch.min_reliability,
                "verified": watch.verified,
                "min_direct_ports": watch.min_direct_ports,
                "poll_interval": self.poll_interval,
            },
        )

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        """The group's searches, one per interval: ``(service time, offers or None when the search failed)``."""
        async for found in cls(**kwargs)._searches(shared=False):
            yield found

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for event in self._appearances(shared_stream):
            yield event

    async def run(self) -> AsyncIterator[TriggerEvent]:
        async for event in self._appearances(self._searches(shared=True)):
            yield event

    async def _appearances(self, searches: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        seen = offer_watch.Appearances(present=await self._remembered())
        async for at, offers in searches:
            was = seen.present
            event = seen.observe(self.watch, offers, at)
            if seen.present != was:
                await self._remember(seen.present)
            if event is not None:
                self.log.info("Offers matching the watch appeared: %s", event)
                yield TriggerEvent(event)

    @property
    def _state_key(self) -> str:
        return "gpumarket_offers_present_" + hashlib.sha256(self.watch.key().encode()).hexdigest()[:16]

    async def _remembered(self) -> bool:
        """Whether matches were present when this watch last searched, as the asset's state store (3.3+) kept it:
        a watcher restarted in the middle of an appearance does not fire for it again."""
        store = getattr(self, "asset_state_store", None)
        if store is None:
            return False
        try:
            return bool(await store.aget(self._state_key, False))
        except Exception as exc:  # noqa: BLE001 - the store is a help: without it the watcher works, from scratch
            self.log.warning("Could not read the watch's state from the asset's state store: %s", exc)
            return False

    async def _remember(self, present: bool) -> None:
        store = getattr(self, "asset_state_store", None)
        if store is None:
            return
        try:
            await store.aset(self._state_key, present)
        except Exception as exc:  # noqa: BLE001 - see _remembered
            self.log.warning("Could not write the watch's state to the asset's state store: %s", exc)
