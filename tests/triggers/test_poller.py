"""The shared poller (triggers/poller.py): one list call per round for every instance trigger of a process, a
missing instance confirmed before it is reported gone, and rounds within the live list budget."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

from airflow_gpumarket import api, lifecycle
from airflow_gpumarket.triggers.instances import GpuMarketInstanceStatusTrigger

from .fakes import FakeAsyncHook, _run


def test_shared_poller_makes_one_list_call_per_round_for_many_triggers(monkeypatch):
    """Three triggers of one process, one list call per round between them (the naive pattern makes three)."""
    hook = FakeAsyncHook(["loading", "loading", "running"])
    hook.list_instances = _list_of_three(hook)  # type: ignore[method-assign]

    async def all_three():
        triggers = [
            GpuMarketInstanceStatusTrigger(instance_id=i, poll_interval=0, gpumarket_conn_id="p") for i in (1, 2, 3)
        ]
        for trigger in triggers:
            monkeypatch.setattr(trigger, "_hook", lambda: hook)

        async def first(trigger):
            async with aclosing(trigger.run()) as events:
                async for event in events:
                    return event.payload

        return await asyncio.gather(*(first(t) for t in triggers))

    events = asyncio.run(all_three())
    assert [e["status"] for e in events] == [lifecycle.EventKind.REACHED] * 3
    assert hook.lists == 3  # rounds, not triggers x rounds
    assert hook.asked_ids == [1, 2, 3]  # only the watched instances are asked for


def _list_of_three(hook):
    async def list_instances(*, ids=None, label=None):
        hook.lists += 1
        hook.asked_ids = sorted(ids)
        status = hook._next()
        return [{"id": i, "actual_status": status} for i in (1, 2, 3)]

    return list_instances


def test_shared_poller_confirms_a_missing_instance_before_reporting_it_gone(monkeypatch):
    hook = FakeAsyncHook(["running"])

    async def list_without_it(*, ids=None, label=None):
        hook.lists += 1
        return []  # cut short by the server: the instance still exists

    hook.list_instances = list_without_it  # type: ignore[method-assign]
    trigger = GpuMarketInstanceStatusTrigger(instance_id=7, poll_interval=0, gpumarket_conn_id="q")
    assert _run(trigger, hook, monkeypatch)["status"] == lifecycle.EventKind.REACHED


def test_shared_poller_rounds_never_go_faster_than_the_live_list_budget(monkeypatch):
    from airflow_gpumarket.triggers import poller

    monkeypatch.setattr(api.retry, "LIST_RATE_PER_SECOND", 0.5)
    waits: list[float] = []

    class PollersAsyncio:
        """The poller's own sleeps recorded (and cut short); anything else of asyncio as it is."""

        def __getattr__(self, name: str):
            return getattr(asyncio, name)

        @staticmethod
        async def sleep(seconds: float) -> None:
            waits.append(seconds)
            await asyncio.sleep(0)

    monkeypatch.setattr(poller, "asyncio", PollersAsyncio())
    hook = FakeAsyncHook([None, "loading", "running"])
    trigger = GpuMarketInstanceStatusTrigger(instance_id=7, poll_interval=0, gpumarket_conn_id="budget")
    assert _run(trigger, hook, monkeypatch)["status"] == lifecycle.EventKind.REACHED
    assert waits and min(waits) > 1.9  # 2 s between list calls, although the trigger asked for 0 s
