"""One poller per connection and event loop, shared by every instance trigger of a triggerer process.

A naive trigger reads its own instance every interval, so N triggers make N requests per interval and a
per-key rate limit turns into a storm of 429s. Here the triggers of one process subscribe to a shared poller
that makes **one** ``list_instances`` call per round (per page of watched ids: 25 on the live service) and puts
each instance's status in its subscribers' slots. An instance missing from the list is confirmed with a
per-instance read before its subscribers are told it is gone, so a list that the service cut short never ends a
wait by mistake.

Waits stand alone: a slot holds only the newest observation and is overwritten each round, so the poller never
waits for a subscriber, a subscriber that falls behind reads the newest state, and one whose task ended without
closing its subscription is dropped at the next round. A round that takes longer than ``ROUND_LIMIT_ROUNDS``
intervals is cut short and the poller starts again with a fresh hook; a subscriber that got nothing for
``STALE_ROUNDS`` intervals reads its instance itself.

Nothing here outlives the process or needs to: the registry is rebuilt from the triggers that are running, so a
trigger that moves to another triggerer simply subscribes to that process's poller.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import AsyncGenerator
from typing import Any

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import (
    GpuMarketError,
    GpuMarketNotFoundError,
    GpuMarketRateLimitError,
    GpuMarketTransportError,
)
from airflow_gpumarket.waiting import Observation

log = logging.getLogger(__name__)

#: The most the interval between rounds grows after rounds that were rate limited.
MAX_SLOWDOWN = 8.0
#: A round (the list call and its confirming reads) longer than this many intervals is cut short, and the poller
#: starts again with a fresh hook.
ROUND_LIMIT_ROUNDS = 3
#: A subscriber that received nothing for this many intervals reads its instance itself.
STALE_ROUNDS = 4
#: Seconds a round or a subscriber's own read may take at least, however short the interval.
MIN_LIMIT_SECONDS = 60.0
#: (connection id, event loop) -> poller; weak on the loop so a closed loop's poller goes away with it.
_POLLERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, SharedInstancePoller]] = (
    weakref.WeakKeyDictionary()
)


def poller_for(conn_id: str, hook_factory: Any) -> SharedInstancePoller:
    loop = asyncio.get_running_loop()
    per_loop = _POLLERS.setdefault(loop, {})
    poller = per_loop.get(conn_id)
    if poller is None:
        poller = per_loop[conn_id] = SharedInstancePoller(conn_id, hook_factory)
    return poller


class Slot:
    """The newest observation of one instance for one subscriber: written by the poller, taken by the subscriber."""

    __slots__ = ("instance_id", "interval", "owner", "observation", "fresh")

    def __init__(self, instance_id: int, interval: float, owner: asyncio.Task | None) -> None:
        self.instance_id = instance_id
        self.interval = interval
        self.owner = owner  # the task that subscribed: once it is done, nobody will take from this slot
        self.observation: Observation | None = None
        self.fresh = asyncio.Event()

    def put(self, observation: Observation) -> None:
        """Overwrite what the subscriber has not taken yet: it wants the newest state, not a backlog."""
        self.observation = observation
        self.fresh.set()

    def take(self) -> Observation | None:
        observation, self.observation = self.observation, None
        self.fresh.clear()
        return observation

    def abandoned(self) -> bool:
        return self.owner is not None and self.owner.done()


class SharedInstancePoller:
    """Polls the instances its subscribers ask about, one list call per round, at the shortest interval asked."""

    def __init__(self, conn_id: str, hook_factory: Any) -> None:
        self.conn_id = conn_id
        self._hook_factory = hook_factory
        self._slots: dict[int, list[Slot]] = {}
        self._task: asyncio.Task | None = None
        self._hook: Any = None
        #: Multiplies the interval after rounds that met 429s (the hook's own retries were not enough), so many
        #: triggerers sharing one key back off together; one clean round brings it back to 1.
        self._slowdown = 1.0
        self.rounds = 0  # rounds completed, for the watchdog's and the tests' eyes
        self.restarts = 0  # rounds cut short by the watchdog

    async def subscribe(self, instance_id: int, interval: float) -> AsyncGenerator[Observation, None]:
        """Observations of ``instance_id``, the newest at each take, until the caller stops iterating.

        Close it deterministically (``contextlib.aclosing``); a subscriber whose task ended without closing it is
        dropped by the poller all the same.
        """
        slot = Slot(instance_id, interval, asyncio.current_task())
        self._slots.setdefault(instance_id, []).append(slot)
        try:
            while True:
                self._ensure_running()
                stale_after = self.limit(STALE_ROUNDS, interval)
                try:
                    async with asyncio.timeout(stale_after):
                        await slot.fresh.wait()
                except TimeoutError:
                    yield await self._read_alone(instance_id, stale_after)
                    continue
                observation = slot.take()
                if observation is not None:
                    yield observation
        finally:
            self._drop(slot)

    def limit(self, rounds: int, interval: float) -> float:
        """Seconds that ``rounds`` rounds may take, at least ``MIN_LIMIT_SECONDS``.

        A round lasts ``interval``, or longer when the list's budget paces its pages (one per 25 watched ids).
        """
        per_list = self._hook.min_list_interval() if self._hook is not None else 0.0
        pages = -(-len(self._slots) // api.LIST_PAGE_LIMIT)
        return max(MIN_LIMIT_SECONDS, rounds * max(interval, pages * per_list) * self._slowdown)

    def _drop(self, slot: Slot) -> None:
        slots = self._slots.get(slot.instance_id, [])
        if slot in slots:
            slots.remove(slot)
        if not slots:
            self._slots.pop(slot.instance_id, None)

    async def _read_alone(self, instance_id: int, waited: float) -> Observation:
        """The subscriber's own read of its instance, when the shared rounds have not reached it for a while."""
        log.warning(
            "Instance %s: no observation from the shared poller of %r for %.0f s (%d rounds done, %d restarts); "
            "reading it alone",
            instance_id,
            self.conn_id,
            waited,
            self.rounds,
            self.restarts,
        )
        hook = self._hook_factory()
        try:
            async with asyncio.timeout(waited):
                return await _read_one(hook, instance_id)
        except TimeoutError:
            return Observation(error=_timed_out(f"reading instance {instance_id} alone took over {waited:.0f} s"))
        finally:
            await hook.aclose()

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"gpumarket-poller-{self.conn_id}")

    def _forget_abandoned(self) -> None:
        for slots in list(self._slots.values()):
            for slot in [s for s in slots if s.abandoned()]:
                self._drop(slot)

    async def _run(self) -> None:
        self._hook = self._hook_factory()
        try:
            while True:
                self._forget_abandoned()
                if not self._slots:
                    return
                started = time.monotonic()
                interval = min(
                    (slot.interval for slots in self._slots.values() for slot in slots),
                    default=api.POLL_INTERVAL_SECONDS,
                )
                await self._guarded_round(interval)
                # Never faster than the list's budget, however short the triggers' intervals are.
                paced = max(interval, self._hook.min_list_interval()) * self._slowdown
                await asyncio.sleep(max(0.0, paced - (time.monotonic() - started)))
        finally:
            if self._task is asyncio.current_task():
                self._task = None  # a subscriber arriving while the hook closes starts a new poller
            hook, self._hook = self._hook, None
            await hook.aclose()

    async def _guarded_round(self, interval: float) -> None:
        """One round, cut short by the watchdog when it outlasts ``ROUND_LIMIT_ROUNDS`` intervals."""
        limit = self.limit(ROUND_LIMIT_ROUNDS, interval)
        try:
            async with asyncio.timeout(limit):
                await self._round()
        except TimeoutError:
            self.restarts += 1
            held = sorted(self._slots)
            log.warning(
                "Shared poller of %r: a round took over %.0f s; starting again with a fresh hook. Watching %d "
                "instance(s): %s",
                self.conn_id,
                limit,
                len(held),
                held,
            )
            stuck, self._hook = self._hook, self._hook_factory()
            await stuck.aclose()
            self._deliver_all(held, Observation(error=_timed_out(f"a poll round took over {limit:.0f} s")))
            return
        self.rounds += 1

    async def _round(self) -> None:
        watched = list(self._slots)
        if not watched:
            return
        try:
            # Only the watched ids, one page per chunk: the live list allows 0.5 requests/s per key.
            listed = {int(i["id"]): i for i in await self._hook.list_instances(ids=watched) if "id" in i}
        except Exception as exc:  # a poller that died would leave every watcher waiting for its own reads
            if not isinstance(exc, GpuMarketError):
                exc = GpuMarketError(f"list_instances failed unexpectedly: {type(exc).__name__}: {exc}")
            if isinstance(exc, GpuMarketRateLimitError):
                self._slowdown = min(MAX_SLOWDOWN, self._slowdown * 2)
            self._deliver_all(watched, Observation(error=exc))
            return
        self._slowdown = 1.0
        at = self._hook.service_now()
        for instance_id in watched:
            if instance_id in listed:
                self._deliver(instance_id, Observation.of(listed[instance_id], at))
            else:
                self._deliver(instance_id, await self._confirm(instance_id))

    async def _confirm(self, instance_id: int) -> Observation:
        """Not in the list: gone, or the list was cut short. One read settles it."""
        return await _read_one(self._hook, instance_id)

    def _deliver(self, instance_id: int, observation: Observation) -> None:
        for slot in self._slots.get(instance_id, []):
            slot.put(observation)

    def _deliver_all(self, instance_ids: list[int], observation: Observation) -> None:
        for instance_id in instance_ids:
            self._deliver(instance_id, observation)


def _timed_out(message: str) -> GpuMarketTransportError:
    """A read that took too long: a transport failure, so each wait judges its last status again and goes on."""
    return GpuMarketTransportError(message, operation="list_instances")


async def _read_one(hook: Any, instance_id: int) -> Observation:
    """One read of one instance: its state, that it is gone, or the failure left after the hook's retries."""
    try:
        instance = await hook.get_instance(instance_id)
    except GpuMarketNotFoundError:
        return Observation(gone=True)
    except GpuMarketError as exc:
        return Observation(error=exc)
    return Observation.of(instance, hook.service_now())
