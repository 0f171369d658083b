"""One poller per connection and event loop, shared by every instance trigger of a triggerer process.

A naive trigger reads its own instance every interval, so N triggers make N requests per interval and a
per-key rate limit turns into a storm of 429s. Here the triggers of one process register with a shared poller
that makes **one** ``list_instances`` call per round (per page of watched ids: 25 on the live service) and hands
each trigger its instance's status. An instance
missing from the list is confirmed with a per-instance read before its trigger is told it is gone, so a list
that the service cut short never ends a wait by mistake.

Nothing here outlives the process or needs to: the registry is rebuilt from the triggers that are running, so a
trigger that moves to another triggerer simply registers with that process's poller.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import GpuMarketError, GpuMarketNotFoundError, GpuMarketRateLimitError
from airflow_gpumarket.waiting import Observation

#: The most the interval between rounds grows after rounds that were rate limited.
MAX_SLOWDOWN = 8.0
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


class SharedInstancePoller:
    """Polls the instances its watchers ask about, one list call per round, at the shortest interval asked."""

    def __init__(self, conn_id: str, hook_factory: Any) -> None:
        self.conn_id = conn_id
        self._hook_factory = hook_factory
        self._watchers: dict[int, list[asyncio.Queue[Observation]]] = {}
        self._intervals: dict[int, float] = {}
        self._task: asyncio.Task | None = None
        self._consumed = asyncio.Event()
        self._hook: Any = None
        #: Multiplies the interval after rounds that met 429s (the hook's own retries were not enough), so many
        #: triggerers sharing one key back off together; one clean round brings it back to 1.
        self._slowdown = 1.0

    async def watch(self, instance_id: int, interval: float) -> AsyncIterator[Observation]:
        """Observations of ``instance_id``, one per round, until the caller stops iterating."""
        queue: asyncio.Queue[Observation] = asyncio.Queue()
        self._watchers.setdefault(instance_id, []).append(queue)
        self._intervals[id(queue)] = interval
        self._ensure_running()
        try:
            while True:
                observation = await queue.get()
                self._consumed.set()
                yield observation
        finally:
            queues = self._watchers.get(instance_id, [])
            if queue in queues:
                queues.remove(queue)
            if not queues:
                self._watchers.pop(instance_id, None)
            self._intervals.pop(id(queue), None)

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"gpumarket-poller-{self.conn_id}")

    async def _run(self) -> None:
        self._hook = self._hook_factory()
        try:
            while self._watchers:
                started = time.monotonic()
                await self._round()
                interval = min(self._intervals.values(), default=api.POLL_INTERVAL_SECONDS)
                # Never faster than the list's budget, however short the triggers' intervals are.
                interval = max(interval, self._hook.min_list_interval()) * self._slowdown
                await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
                await self._until_consumed()
        finally:
            hook, self._hook = self._hook, None
            await hook.aclose()

    async def _until_consumed(self) -> None:
        """Wait until each watcher took its last observation, so polls never outrun the triggers.

        A watcher that left is no longer waited for.
        """
        while any(not q.empty() for queues in self._watchers.values() for q in queues):
            self._consumed.clear()
            await self._consumed.wait()

    async def _round(self) -> None:
        watched = list(self._watchers)
        if not watched:
            return
        try:
            # Only the watched ids, one page per chunk: the live list allows 0.5 requests/s per key.
            listed = {int(i["id"]): i for i in await self._hook.list_instances(ids=watched) if "id" in i}
        except Exception as exc:  # a poller that died would leave every watcher waiting for ever
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
        try:
            instance = await self._hook.get_instance(instance_id)
        except GpuMarketNotFoundError:
            return Observation(gone=True)
        except GpuMarketError as exc:
            return Observation(error=exc)
        return Observation.of(instance, self._hook.service_now())

    def _deliver(self, instance_id: int, observation: Observation) -> None:
        for queue in self._watchers.get(instance_id, []):
            queue.put_nowait(observation)

    def _deliver_all(self, instance_ids: list[int], observation: Observation) -> None:
        for instance_id in instance_ids:
            self._deliver(instance_id, observation)
