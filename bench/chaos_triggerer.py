"""R1 chaos, deferred: jobs whose waits run as triggers in one event loop, cancelled by "Airflow" at any moment.

One asyncio loop in a thread of its own plays a triggerer: it runs every deferred job's trigger, sharing one poller,
while the job's log reads meet slow answers. At random moments (between two observations or in the middle of a
step: a lease renewal, a log read) a trigger is cancelled as Airflow 3.3's triggerer cancels it, with its user-action
message, and its ``on_kill`` is awaited:

- a hand-over: the task instance is still deferred, so nothing may be destroyed; a new copy of the trigger (from its
  ``serialize()``) goes on, as on another triggerer, and sometimes the old copy goes on beside it for a while;
- a user marked the task failed: ``on_kill`` must destroy the instance.

The task instance's state and its XComs are this harness's (a dict each), as Airflow's database would hold them. A
worker thread runs each operator's ``execute`` until it defers and its ``execute_complete`` after the event, as a
Celery worker would.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

#: A log read's answer is this slow now and then, so that cancellations land in the middle of a step.
SLOW_LOG_READ = {"endpoint": "request_instance_logs", "kind": "latency", "seconds": 0.4, "probability": 0.3}
#: The share of triggers handed over (a new copy goes on) and of those whose task a user marks failed.
HANDOVERS = 0.3
MARKED_FAILED = 0.15
#: The share of hand-overs whose old copy runs on beside the new one for a while (two triggerers at once).
BOTH_COPIES = 0.5
#: Seconds into a trigger's run at which a cancellation comes, at most.
CANCEL_WITHIN = 1.5
#: The ending of a job whose task a user marked failed while it was deferred: its task never resumed.
MARKED = "marked failed while deferred"


class Triggerer:
    """One event loop in a thread, running triggers as a triggerer does; the task instances' states and XComs."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.states: dict[tuple, str] = {}
        self.xcoms: dict[tuple, Any] = {}
        self.lock = threading.Lock()
        self.counts: Counter = Counter()

    def __enter__(self) -> Triggerer:
        from airflow_gpumarket import task_xcom
        from airflow_gpumarket.triggers import instances

        self._saved = (instances._task_instance_now, task_xcom.get_value, task_xcom.set_value)
        instances._task_instance_now = self.state_of
        task_xcom.get_value = self.get_xcom
        task_xcom.set_value = self.set_xcom
        instances.GpuMarketInstanceStatusTrigger._step = _noting_steps(instances.GpuMarketInstanceStatusTrigger._step)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        from airflow_gpumarket import task_xcom
        from airflow_gpumarket.triggers import instances

        instances._task_instance_now, task_xcom.get_value, task_xcom.set_value = self._saved
        step = instances.GpuMarketInstanceStatusTrigger._step
        instances.GpuMarketInstanceStatusTrigger._step = getattr(step, "__wrapped__", step)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    @staticmethod
    def key(ti: Any) -> tuple:
        return (ti.dag_id, ti.run_id, ti.task_id, ti.map_index)

    def state_of(self, ti: Any) -> tuple[str | None, int | None, str | None]:
        with self.lock:
            return (self.states.get(self.key(ti), "deferred"), ti.try_number, None)

    def get_xcom(self, ti: Any, key: str) -> Any:
        with self.lock:
            return self.xcoms.get((*self.key(ti), key))

    def set_xcom(self, ti: Any, key: str, value: Any) -> None:
        with self.lock:
            self.xcoms[(*self.key(ti), key)] = value

    def run(self, trigger: Any, rng: random.Random) -> dict | None:
        """The trigger's event, or None when a user marked the task failed (from the calling thread)."""
        return asyncio.run_coroutine_threadsafe(self._run(trigger, rng), self.loop).result(timeout=300)

    async def _run(self, trigger: Any, rng: random.Random) -> dict | None:
        old_copies: list[tuple[asyncio.Task, Any]] = []
        try:
            while True:
                running = asyncio.ensure_future(_first_event(trigger))
                fate = rng.random()
                if fate >= HANDOVERS + MARKED_FAILED:
                    return await running
                done, _ = await asyncio.wait({running}, timeout=rng.uniform(0, CANCEL_WITHIN))
                if done:
                    return running.result()
                handover = fate < HANDOVERS
                self.counts["cancelled in a step" if getattr(trigger, "in_step", False) else "cancelled between"] += 1
                if handover and rng.random() < BOTH_COPIES:  # the old copy goes on a while beside the new one
                    self.counts["hand-overs with both copies running"] += 1
                    old_copies.append((running, trigger))
                    trigger = _copy_of(trigger)
                    continue
                with self.lock:
                    self.states[self.key(trigger.task_instance)] = "deferred" if handover else "failed"
                running.cancel("user action")  # Airflow 3.3's message: on_kill follows
                with contextlib.suppress(asyncio.CancelledError):
                    await running
                await trigger.on_kill()
                if not handover:
                    self.counts["marked failed"] += 1
                    return None
                self.counts["hand-overs"] += 1
                trigger = _copy_of(trigger)
        finally:
            for old, copy in old_copies:  # Airflow cancels the copy on the triggerer that lost the trigger
                old.cancel("user action")
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await old
                await copy.on_kill()


def _noting_steps(step: Any) -> Any:
    async def noted(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.in_step = True
        try:
            return await step(self, *args, **kwargs)
        finally:
            self.in_step = False

    noted.__wrapped__ = step  # type: ignore[attr-defined]
    return noted


async def _first_event(trigger: Any) -> dict:
    async with contextlib.aclosing(trigger.run()) as events:
        async for event in events:
            return event.payload
    raise AssertionError("a trigger ended without an event")


def _copy_of(trigger: Any) -> Any:
    """The same trigger as another triggerer builds it from its row."""
    import importlib

    path, kwargs = trigger.serialize()
    module, name = path.rsplit(".", 1)
    copy = getattr(importlib.import_module(module), name)(**kwargs)
    copy.task_instance = trigger.task_instance
    return copy


def deferred_lifecycle(i: int, seed: int, sim: Any, triggerer: Triggerer, gpus: list[str], classify: Any) -> dict:
    """One deferred RunJob: execute until it defers, the trigger in the triggerer, resume; how it ended."""
    from airflow_gpumarket import lifecycle as lc
    from airflow_gpumarket._compat import TaskDeferred
    from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

    rng = random.Random(f"chaos-deferred-{seed}-{i}")
    command = rng.choice(["for i in 1 2 3 4 5 6; do echo tick $i; sleep 0.1; done", "sleep 0.5; exit 3"])
    op = GpuMarketRunJobOperator(
        task_id=f"chaos_deferred_{i}",
        offer_filters={"gpu_name": {"eq": rng.choice(gpus)}},
        image="chaos",
        command=command,
        poll_interval=0.05,
        log_interval=0.1,
        max_offer_attempts=4,
        max_runtime=60,
        deferrable=True,
    )
    run_id = f"chaos-deferred-{seed}-{i}"
    ti = SimpleNamespace(dag_id=op.dag_id or "", run_id=run_id, task_id=op.task_id, map_index=-1, try_number=1)
    ctx = {"run_id": run_id, "ti": ti}
    key = lc.rental_key(op.dag_id or "", run_id, op.task_id, -1)
    outcome, message, detail = "succeeded", "", ""
    try:
        call: Any = lambda: op.execute(ctx)  # noqa: E731
        while True:
            try:
                result = call()
                break
            except TaskDeferred as deferral:
                trigger = deferral.trigger
                trigger.task_instance = ti
                event = triggerer.run(trigger, rng)
                if event is None:
                    result = None
                    outcome = MARKED
                    break
                method = getattr(op, deferral.method_name)
                call = lambda m=method, e=event, k=deferral.kwargs or {}: m(ctx, event=e, **k)  # noqa: E731
        if result is not None and result.get("job_status") != "succeeded":
            outcome, detail = "UNCLEAR: returned without success", f"the operator returned {result!r}"
    except BaseException as exc:  # noqa: BLE001 - every ending is classified
        outcome, message = classify(exc), str(exc)
        detail = "".join(traceback.format_exception(exc)) if outcome.startswith("UNCLEAR") else ""
    ending = {"key": key, "command": command, "run_id": run_id, "task_id": op.task_id, "message": message}
    alive = [inst for inst in sim.alive() if (lc.parse_label(inst.get("label")) or ("",))[0] == key]
    return ending | {"outcome": outcome, "alive_at_finish": alive, "detail": detail}


def deferred_phase(
    sim: Any, seed: int, count: int, workers: int, *, faults: list[dict], gpus: list[str], classify: Any
) -> tuple[list[dict], Counter]:
    """``count`` deferred jobs, ``workers`` at a time, their triggers in one loop: endings, and what was done to them.

    ``faults`` are the simulator's fault rules for the run, ``gpus`` the offers' GPU names, ``classify`` names an
    exception's ending (chaos.py's).
    """
    sim.send("PUT", "/_sim/faults", {"rules": [*faults, SLOW_LOG_READ]}).raise_for_status()
    try:
        with Triggerer() as triggerer, ThreadPoolExecutor(workers) as pool:
            results = list(
                pool.map(lambda i: deferred_lifecycle(i, seed, sim, triggerer, gpus, classify), range(count))
            )
    finally:
        sim.send("DELETE", "/_sim/faults")
    return results, triggerer.counts
