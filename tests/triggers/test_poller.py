"""The shared poller (triggers/poller.py): one list call per round for every instance trigger of a process, a
missing instance confirmed before it is reported gone, and rounds within the live list budget."""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing

import pytest

from airflow_gpumarket import api, outcome
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
    assert [e["status"] for e in events] == [outcome.EventKind.REACHED] * 3
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
    assert _run(trigger, hook, monkeypatch)["status"] == outcome.EventKind.REACHED


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
    assert _run(trigger, hook, monkeypatch)["status"] == outcome.EventKind.REACHED
    assert waits and min(waits) > 1.9  # 2 s between list calls, although the trigger asked for 0 s


# --- waits stand alone: no subscriber can hold up the others ---------------------------------------------------------

INTERVAL = 0.02  # seconds between rounds in these tests
WINDOW = 1.0  # seconds the survivors are watched for


class ListsAll:
    """A hook whose list answers every watched instance as running, counting the list calls."""

    def __init__(self) -> None:
        self.lists = 0

    async def list_instances(self, *, ids=None, label=None):
        self.lists += 1
        return [{"id": i, "actual_status": "running"} for i in ids]

    async def get_instance(self, instance_id):
        return {"id": instance_id, "actual_status": "running"}

    def min_list_interval(self):
        return 0.0

    def service_now(self):
        return time.time()

    async def aclose(self):
        pass


async def _subscriber(poller, instance_id, received, *, busy=0.0, closing=True):
    """Take observations of ``instance_id`` into ``received``, spending ``busy`` seconds on each."""
    observations = poller.subscribe(instance_id, INTERVAL)
    if closing:
        async with aclosing(observations) as each:
            async for _ in each:
                received[instance_id] += 1
                await asyncio.sleep(busy)
    else:  # a subscriber whose subscription is never closed by its owner (kept alive by this frame)
        async for _ in observations:
            received[instance_id] += 1
            await asyncio.sleep(busy)


def _survivors_keep_receiving(hook, received, survivors):
    """Each survivor took at least 80 % of the rounds made while it was watched, and the rounds went on."""
    rounds = hook.lists
    assert rounds >= 0.5 * WINDOW / INTERVAL, f"{rounds} rounds in {WINDOW} s at a {INTERVAL} s interval"
    starved = {i: received[i] for i in survivors if received[i] < 0.8 * rounds}
    assert not starved, f"subscribers that fell behind the {rounds} rounds: {starved}"


def _watched_for_a_window(setup):
    """Run ``setup(poller, received)`` (which starts subscribers), then count what survivors take in ``WINDOW``."""
    from collections import Counter

    from airflow_gpumarket.triggers.poller import SharedInstancePoller

    hook = ListsAll()
    received: Counter = Counter()

    async def main():
        poller = SharedInstancePoller("standalone", lambda: hook)
        survivors, tasks = await setup(poller, received)
        received.clear()
        hook.lists = 0
        await asyncio.sleep(WINDOW)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return survivors

    survivors = asyncio.run(main())
    _survivors_keep_receiving(hook, received, survivors)


@pytest.mark.parametrize("closing", [True, False], ids=["closed-by-its-owner", "never-closed"])
def test_rule_a_subscriber_cancelled_while_busy_holds_up_no_other(closing):
    async def setup(poller, received):
        a = asyncio.ensure_future(_subscriber(poller, 1, received, busy=0.2, closing=closing))
        b = asyncio.ensure_future(_subscriber(poller, 2, received))
        while received[1] == 0:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.05)  # A is busy between two observations
        a.cancel()
        return [2], [b]

    _watched_for_a_window(setup)


def test_rule_a_slow_subscriber_holds_up_no_other():
    async def setup(poller, received):
        slow = asyncio.ensure_future(_subscriber(poller, 1, received, busy=1.0))
        fast = asyncio.ensure_future(_subscriber(poller, 2, received))
        return [2], [slow, fast]

    _watched_for_a_window(setup)


def test_rule_half_of_twenty_subscribers_cancelled_at_random_points_hold_up_no_other():
    import random

    rng = random.Random(54)

    async def setup(poller, received):
        doomed = rng.sample(range(1, 21), 10)
        tasks = {
            i: asyncio.ensure_future(
                _subscriber(
                    poller, i, received, busy=rng.choice([0.0, 0.01, 0.2]) if i in doomed else 0.0, closing=i % 2 == 0
                )
            )
            for i in range(1, 21)
        }
        for i in doomed:
            await asyncio.sleep(rng.uniform(0, 0.05))  # anywhere: awaiting, busy, or taking an observation
            tasks[i].cancel()
        survivors = [i for i in tasks if i not in doomed]
        return survivors, [tasks[i] for i in survivors]

    _watched_for_a_window(setup)


def test_rule_a_poller_round_that_hangs_is_cut_short_and_the_poller_starts_again(monkeypatch):
    """The watchdog: a list call that never answers ends after ROUND_LIMIT_ROUNDS intervals; the next round works."""
    from airflow_gpumarket.triggers import poller as poller_module
    from airflow_gpumarket.triggers.poller import SharedInstancePoller

    monkeypatch.setattr(poller_module, "MIN_LIMIT_SECONDS", 0.1)
    monkeypatch.setattr(poller_module, "STALE_ROUNDS", 1000)  # the subscriber waits for the restarted poller
    hooks = []

    class HangsOnce(ListsAll):
        async def list_instances(self, *, ids=None, label=None):
            if len(hooks) == 1:
                await asyncio.Event().wait()  # the first hook's list never answers
            return await super().list_instances(ids=ids)

    def fresh():
        hooks.append(HangsOnce())
        return hooks[-1]

    async def main():
        poller = SharedInstancePoller("hangs", fresh)
        seen = []
        async with aclosing(poller.subscribe(7, INTERVAL)) as observations:
            async for observation in observations:
                seen.append(observation)
                if observation.status == "running":
                    return poller, seen

    poller, seen = asyncio.run(main())
    assert poller.restarts == 1 and len(hooks) == 2
    assert seen[0].error is not None and "took over" in str(seen[0].error)  # the cut round is said, not hidden
    assert api.is_retryable(seen[0].error)  # a wait goes on after it: it judges its last status again


def test_rule_a_subscriber_the_rounds_do_not_reach_reads_its_instance_alone(monkeypatch):
    """A poller that makes no rounds at all (here: dead) costs a subscriber STALE_ROUNDS intervals, then it reads."""
    from airflow_gpumarket.triggers import poller as poller_module
    from airflow_gpumarket.triggers.poller import SharedInstancePoller

    monkeypatch.setattr(poller_module, "MIN_LIMIT_SECONDS", 0.05)
    hook = ListsAll()

    async def main():
        poller = SharedInstancePoller("dead", lambda: hook)
        monkeypatch.setattr(poller, "_ensure_running", lambda: None)  # no rounds: the poller is gone
        async with aclosing(poller.subscribe(7, INTERVAL)) as observations:
            async for observation in observations:
                return observation

    assert asyncio.run(main()).status == "running" and hook.lists == 0
