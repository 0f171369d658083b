"""Trigger that waits for an instance in the triggerer, holding no worker slot."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import replace
from functools import cached_property
from typing import Any

from airflow_gpumarket import _compat, api, job_logs, lifecycle, task_xcom, waiting
from airflow_gpumarket._compat import BaseTrigger, TriggerEvent
from airflow_gpumarket.outcome import EventKind, WaitOutcome, to_event
from airflow_gpumarket.triggers.poller import poller_for
from airflow_gpumarket.waiting import Observation

#: Seconds ``on_kill`` and ``cleanup`` wait for the task instance's state before leaving the instance to its lease.
STATE_READ_TIMEOUT = 15
#: Seconds one step of a wait (lease renewal, bid, log read) may take; a call still retrying then is cut short.
STEP_TIMEOUT_SECONDS = 300.0
#: The XCom key prefix of the job's log lines this task's triggers showed last (``shown_key``).
SHOWN_KEY_PREFIX = "gpumarket_log_shown_"
#: Lines that record keeps: the last ones shown, as ``job_logs.LogFollower`` takes an earlier wait's.
SHOWN_LINES = 20
#: Seconds a read or write of that record may take before the wait goes on without it.
SHOWN_TIMEOUT_SECONDS = 10.0
#: Failures in a row after which a run stops reading and writing that record (a triggerer's supervisor may stall for
#: half a minute under a burst of trigger starts; a task instance whose XComs cannot be reached never answers).
SHOWN_FAILURES = 3


def shown_key(instance_id: int) -> str:
    return f"{SHOWN_KEY_PREFIX}{int(instance_id)}"


class GpuMarketInstanceStatusTrigger(BaseTrigger):
    """Poll one instance until a status is reached, it can never be reached, or the job on it ends.

    :param instance_id: the instance to watch.
    :param gpumarket_conn_id: connection of type ``gpumarket``.
    :param watch: what to wait for and its bounds, as ``waiting.Watch.to_dict`` writes it: ``wait_for``
        (``"status"`` until ``target_status``, default running; or ``"job"``, through boot and the onstart job),
        the deadlines, the label whose lease is kept ``keepalive`` ahead (never past ``lease_cap``), the bid held
        up to ``hold_bid_up_to``, the job log's lines an earlier wait showed. Default: wait until running.
    :param rental: the renting operator's rental (``lifecycle.Rental.to_resume``), returned unchanged in every
        event under ``resume`` (Airflow also passes the defer kwargs, but ``dag.test()`` drops them; carrying the
        state in the event works under both). Its ``key_digest`` masks the instance's key in the job's output,
        and its ``created_at`` bounds the first log read. None for a sensor.
    :param poll_interval: seconds between reads (the spec recommends 10).
    :param log_interval: in ``"job"`` mode, seconds between reads of the job's output through the logs endpoint;
        new lines go to the trigger's log (which Airflow shows in the task log), each once, prefixed with the
        instance id; when the job fails, a last read, whose last lines and the exit status go into the event
        (``log_tail``, ``exit_status``). 0 (the default) reads nothing.
    :param destroy_on_kill: destroy the instance when a user marks the deferred task failed or clears it
        (Airflow 3.3+ calls ``on_kill``; before 3.3 ``cleanup`` finds it out, see there); True for operators
        that rented the instance, False for sensors.
    :param shared_poller: share one poller per connection with the other triggers of this triggerer process (one
        list call per round for all of them, see ``airflow_gpumarket.triggers.poller``); False reads this
        instance on its own every interval.
    :param legacy: the keyword arguments of a trigger row written by an earlier version of the provider (the
        watch's fields one by one, ``resume``); read into ``watch`` and ``rental``, so that a task deferred during
        an upgrade resumes.

    Events carry a ``WaitOutcome`` as ``outcome.to_event`` writes it: ``status`` (its kind), ``instance_id`` and,
    when known, ``actual_status``. 429 answers are retried by the hook, honouring Retry-After; transient failures
    left after those retries are logged and polling goes on until a deadline.
    """

    def __init__(
        self,
        *,
        instance_id: int,
        gpumarket_conn_id: str = "gpumarket_default",
        watch: Mapping[str, Any] | None = None,
        rental: Mapping[str, Any] | None = None,
        poll_interval: float = api.POLL_INTERVAL_SECONDS,
        log_interval: float = 0.0,
        destroy_on_kill: bool = False,
        shared_poller: bool = True,
        **legacy: Any,
    ) -> None:
        super().__init__()
        if legacy:
            watch, rental = _from_legacy(legacy, watch, rental)
        self.instance_id = instance_id
        self.gpumarket_conn_id = gpumarket_conn_id
        self.watch = waiting.Watch.from_dict(watch or {}).to_dict()  # a bad watch fails here, before any wait
        self.rental = None if rental is None else dict(rental)
        self.poll_interval = poll_interval
        self.log_interval = log_interval
        self.destroy_on_kill = destroy_on_kill
        self.shared_poller = shared_poller
        self._fired = False  # an event was handed to Airflow: the task resumes and owns the instance again
        self._current: waiting.Wait | None = None  # the wait under way: its billing marks go into on_kill's record
        self._lines_shared = True  # the record of lines shown is read and written (see _catch_up)
        self._record_failures = 0  # reads or writes of that record that failed in a row
        self._recorded: int | None = None  # the log follower's progress when the record was last read or written

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "instance_id": self.instance_id,
                "gpumarket_conn_id": self.gpumarket_conn_id,
                "watch": self.watch,
                "rental": self.rental,
                "poll_interval": self.poll_interval,
                "log_interval": self.log_interval,
                "destroy_on_kill": self.destroy_on_kill,
                "shared_poller": self.shared_poller,
            },
        )

    def _hook(self):
        from airflow_gpumarket.hooks.gpumarket import GpuMarketAsyncHook

        return GpuMarketAsyncHook(self.gpumarket_conn_id)

    async def _own_reads(self) -> AsyncGenerator[Observation, None]:
        """The naive pattern: this trigger reads its own instance every interval."""
        hook = self._hook()
        try:
            while True:
                yield await hook.run_flow(waiting.read_flow(hook, self.instance_id))
                await asyncio.sleep(self.poll_interval)
        finally:
            await hook.aclose()

    def _observations(self) -> AsyncGenerator[Observation, None]:
        if self.shared_poller:
            return poller_for(self.gpumarket_conn_id, self._hook).subscribe(self.instance_id, self.poll_interval)
        return self._own_reads()

    @cached_property
    def _flow_hook(self) -> Any:
        """The hook this run's flows (each read's lease renewal, bid and log read) go through.

        The connection is read once per run, and the HTTP client is closed after each use (``aclose`` keeps the
        settings).
        """
        return self._hook()

    def _wait(self) -> waiting.Wait:
        """This run's wait, from the watch the trigger was given (a restarted trigger starts again from it)."""
        watch = waiting.Watch.from_dict(self.watch)
        rental = self.rental or {}
        created = rental.get("created_at")
        pump = job_logs.LogPump(
            self.instance_id,
            self.log_interval if watch.wait_for == lifecycle.WAIT_JOB else 0.0,
            key_digest=rental.get("key_digest"),
            secret_digests=rental.get("secret_digests") or (),
            shown=watch.shown_lines,
            since=created if api.is_positive_number(created) else None,
        )
        deferred = self._deferred()
        marks = None if deferred is None else deferred.marks()  # what the rental's earlier waits learnt
        return waiting.Wait(watch, pump, self.log, marks=marks, hold_final=True)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        wait = self._current = self._wait()
        hook = self._flow_hook
        async with contextlib.aclosing(self._observations()) as observations:
            async for seen in observations:
                if seen.error is not None and not api.is_retryable(seen.error):
                    ended: WaitOutcome | None = WaitOutcome(EventKind.ERROR, message=str(seen.error))
                else:
                    ended = await self._step(hook, wait, seen, time.time())
                if ended is not None:
                    if ended.final_lines:
                        self.log.info(
                            "The last read of the log of instance %s found %d new lines: the resumed task shows them",
                            self.instance_id,
                            len(ended.final_lines),
                        )
                    yield self._event(ended, wait)
                    return

    async def _step(self, hook: Any, wait: waiting.Wait, seen: Observation, now: float) -> WaitOutcome | None:
        """One read taken (lease, bid, log) within ``STEP_TIMEOUT_SECONDS``; a step cut short is taken again."""
        if self._may_read_the_log(wait, seen, now):
            await self._catch_up(wait)
        ended = None
        try:
            async with asyncio.timeout(STEP_TIMEOUT_SECONDS):  # unlike wait_for, never swallows a cancellation
                ended = await hook.run_flow(wait.step(hook, seen, now))
        except TimeoutError:
            self.log.warning(
                "Instance %s: a step of the wait (lease, bid, log read) took over %.0f s and was cut short; "
                "the next read takes it again",
                self.instance_id,
                STEP_TIMEOUT_SECONDS,
            )
        finally:
            await hook.aclose()
        if ended is None:  # the lines an ending step read are held for the event, not shown yet
            await self._record_shown(wait)
        return ended

    # Airflow may run this trigger on two triggerers at once (a hand-over under load). The job's lines each copy
    # forwards are recorded on the task instance (an XCom), and each copy reads that record before it reads the log,
    # so that a line one copy showed is not shown again by the other.
    def _shares_lines(self) -> bool:
        return self._lines_shared and getattr(self, "task_instance", None) is not None

    def _may_read_the_log(self, wait: waiting.Wait, seen: Observation, now: float) -> bool:
        """Whether this step may read the job's log: the first, a periodic read that is due, or a job's end."""
        if not self._shares_lines() or wait.pump.off:
            return False
        first = wait.pump.follower.advanced == 0 and self._recorded is None
        ending = seen.gone or seen.status != api.STATUS_RUNNING
        return first or (wait.watch.reads_log() and (wait.pump.read_due(now) or ending))

    async def _catch_up(self, wait: waiting.Wait) -> None:
        lines = await self._shared_record(task_xcom.get_value, shown_key(self.instance_id))
        if isinstance(lines, list) and all(isinstance(line, str) for line in lines):
            wait.pump.shown_elsewhere(lines)
        if self._recorded is None:
            self._recorded = wait.pump.follower.advanced

    async def _record_shown(self, wait: waiting.Wait) -> None:
        follower = wait.pump.follower
        if not self._shares_lines() or follower.advanced == (self._recorded or 0):
            return
        self._recorded = follower.advanced
        lines = [line[: job_logs.EVENT_LINE_CHARS] for line in follower.recent(SHOWN_LINES)]
        await self._shared_record(task_xcom.set_value, shown_key(self.instance_id), lines)

    async def _shared_record(self, call: Any, *args: Any) -> Any:
        """Read or write the record of lines shown; failures are said once, and the third turns sharing off."""
        try:
            async with asyncio.timeout(SHOWN_TIMEOUT_SECONDS):
                answer = await asyncio.to_thread(call, getattr(self, "task_instance", None), *args)
        except Exception as exc:
            self._record_failures += 1
            self._lines_shared = self._record_failures < SHOWN_FAILURES
            if self._record_failures == 1:
                self.log.warning(
                    "Could not reach the record of the job's lines shown for instance %s (%r): should Airflow run "
                    "this trigger twice, some lines may show twice",
                    self.instance_id,
                    exc,
                )
            return None
        self._record_failures = 0
        return answer

    def _event(self, ended: WaitOutcome, wait: waiting.Wait) -> TriggerEvent:
        """The event that ends this trigger: the outcome as its payload, with the rental the task takes back."""
        self._fired = True
        ended = replace(ended, instance_id=self.instance_id, marks=wait.marks())
        self.log.info("%s", ended.describe())
        return TriggerEvent(to_event(ended, self.rental))

    async def on_kill(self) -> None:
        """Airflow 3.3+ cancelled this trigger "by user action": destroy only if a person took the task out of it.

        The triggerer takes that path for a hand-over to another triggerer too, so the task instance is read first
        (``_destroy_if_left_by_a_user``), as ``cleanup`` does before 3.3.
        """
        if self.destroy_on_kill and not self._fired:
            await self._destroy_if_left_by_a_user()

    async def _destroy(self) -> None:
        """End the rental as its task would have (``ending.end_rental``): destroyed, settled, recorded, released.

        The books are written in a thread (the ledger and the XComs are blocking calls); the destroy itself runs on
        this loop, with this trigger's async hook, whose connection is read first.
        """
        hook = self._hook()
        loop = asyncio.get_running_loop()

        def destroy(instance_id: int) -> Any:
            return asyncio.run_coroutine_threadsafe(hook.destroy_instance(instance_id), loop).result()

        try:
            await hook.asettings()  # read on the loop: the thread reads no connection
            await asyncio.to_thread(self._end, hook, destroy)
        except Exception as exc:  # best effort: the reaper is the last line of defence
            self.log.error("Task killed while deferred, and destroying instance %s failed: %s", self.instance_id, exc)
            return
        finally:
            await hook.aclose()
        self.log.warning("Task killed while deferred: destroyed instance %s", self.instance_id)

    def _end(self, hook: Any, destroy: Any) -> None:
        """``_destroy``'s books, in a thread: settled at the estimate on the service's clock, recorded, released."""
        from airflow_gpumarket import metrics
        from airflow_gpumarket.operators.ending import Books, Disposal, end_rental

        books = Books(
            hook,
            self.log,
            conn_id=self.gpumarket_conn_id,
            rental=self._rental(),
            record_end=lambda instance_id: self._record_end(instance_id, hook.service_now()),
            destroy=destroy,
        )
        why = "task killed while deferred"
        end_rental(books, self.instance_id, Disposal.DESTROY, metric=metrics.TASK_FAILED, why=why, read_charge=False)

    def _deferred(self) -> lifecycle.Rental | None:
        """The rental as the task deferred it; None for a sensor's trigger, or a value of another shape."""
        try:
            return lifecycle.Rental.from_resume(self.rental)
        except ValueError:
            return None

    def _rental(self) -> lifecycle.Rental | None:
        """The rental as the task deferred it, with what this wait saw since (its cost is settled from it)."""
        rental = self._deferred()
        if rental is not None and self._current is not None:
            rental.observe(self._current.marks())
        return rental

    def _record_end(self, instance_id: int, ended_at: float) -> None:
        """The rental's end on its task instance's XComs: a task marked failed writes nothing more itself."""
        from airflow_gpumarket.ui import records

        ti = getattr(self, "task_instance", None)  # set by the triggerer
        if ti is None:
            return
        end = records.end_only(
            instance_id=instance_id,
            ended_at=ended_at,
            ended_by="trigger (task left deferred)",
            running_at=None if self._current is None else self._current.running_at,
            stopped_at=None if self._current is None else self._current.stopped_at,
        )
        try:
            records.write_end(ti, end)
        except Exception as exc:  # the page is a view: nothing else depends on this record
            self.log.warning("Could not record the end of instance %s for the GPU rentals page: %s", instance_id, exc)

    async def cleanup(self) -> None:
        """Destroy the instance when a user took the task out of the deferred state (Airflow before 3.3).

        Before 3.3 Airflow never calls ``on_kill``; its triggerer calls ``cleanup`` whenever this trigger stops: after
        its event, when the triggerer stops or hands the trigger to another triggerer, and when the task left the
        deferred state under it. Only a user's doing destroys (``_destroy_if_left_by_a_user``). 3.3+ calls ``on_kill``
        instead.

        The read and the destroy run as a task of their own: 3.2's triggerer cancels a trigger it dropped again on each
        pass of its loop (about every second), which would cut them off half-way.
        """
        if self._fired or not self.destroy_on_kill or _compat.triggerer_calls_on_kill():
            return
        if getattr(self, "task_instance", None) is None:  # set by the triggerer
            return
        work = asyncio.ensure_future(self._destroy_if_left_by_a_user())
        _CLEANUPS.add(work)  # the loop keeps only a weak reference to a task
        work.add_done_callback(_CLEANUPS.discard)
        await asyncio.shield(work)

    async def _destroy_if_left_by_a_user(self) -> None:
        """Destroy the instance if the task instance, read now, was taken out of its deferral by a person.

        That is marked failed or skipped, cleared, or its run deleted (``_left_by_a_user``). A hand-over to another
        triggerer, an event fired elsewhere, or a state that cannot be read leaves the instance alone: the wait goes on
        elsewhere, or the lease ends it. 2.11's triggerer reads the metadata database; 3.x's asks the Task SDK, as the
        standard provider's ``WorkflowTrigger`` does.
        """
        ti = getattr(self, "task_instance", None)  # set by the triggerer
        if ti is None:
            self.log.warning("No task instance to read: instance %s left to its lease", self.instance_id)
            return
        try:
            async with asyncio.timeout(STATE_READ_TIMEOUT):
                now = await asyncio.to_thread(_task_instance_now, ti)
        except Exception as exc:  # a database hiccup or a triggerer shutting down must not destroy a wanted job
            self.log.warning(
                "Could not read the state of %s (%r); instance %s left to its lease", ti, exc, self.instance_id
            )
            return
        if not _left_by_a_user(now, ti.try_number):
            self.log.info(
                "Trigger stopped, but nobody took the task out of its deferral (%s): a hand-over to another "
                "triggerer or an event fired elsewhere; instance %s kept",
                now,
                self.instance_id,
            )
            return
        self.log.warning("The task left the deferred state under its trigger (%s)", now)
        await self._destroy()


#: Keyword arguments of the earlier trigger that no longer travel: the rental carries its rate and its key's digest.
_LEGACY_DROPPED = ("dph_total", "key_digest")


def _from_legacy(
    legacy: dict[str, Any], watch: Mapping[str, Any] | None, rental: Mapping[str, Any] | None
) -> tuple[dict[str, Any], Mapping[str, Any] | None]:
    """The watch and the rental of a trigger row written before they travelled as one value each.

    Raises TypeError naming an argument neither version knows, as a wrong keyword would.
    """
    legacy = dict(legacy)
    rental = legacy.pop("resume", None) if rental is None else rental
    for name in _LEGACY_DROPPED:
        legacy.pop(name, None)
    unknown = set(legacy) - set(waiting.Watch().to_dict())
    if unknown:
        raise TypeError(f"GpuMarketInstanceStatusTrigger got unexpected keyword argument(s) {sorted(unknown)}")
    if legacy.get("shown_lines") is None:
        legacy.pop("shown_lines", None)
    return {**legacy, **(watch or {})}, rental


#: Cleanups under way (see ``cleanup``), so that none is garbage-collected before it ends.
_CLEANUPS: set[asyncio.Future] = set()

#: Task instance states that a user's "mark failed", "mark skipped" or "clear" (None) leaves behind, and "removed"
#: (the task left the DAG). Not "success": a resumed task that already ended well looks the same, and the
#: instance it handed over may be a downstream task's (a user's "mark success" is left to the lease).
_LEFT_BY_A_USER = (None, "failed", "skipped", "removed")


def _left_by_a_user(now: tuple[str | None, int | None, str | None] | None, try_number: int) -> bool:
    """Whether the task instance, as read now, was taken out of the deferred state by a user.

    ``now`` is (state, try_number, next_method), or None when the row is gone. Airflow itself moves the task instance on
    to scheduled, queued or running when an event fires (perhaps another triggerer's copy of this trigger, in an HA
    hand-over) or the deferral times out (next_method ``__fail__``: the task's own failure path destroys, or a retry
    adopts). A new try means a clear was followed by a rerun, which adopts the instance by its label. A try number of
    None (3.0-3.2 do not tell it) counts as the same try: the read follows the user's action by about a second, before a
    rerun could reach its instance.
    """
    if now is None:
        return True  # its DAG run was deleted: nobody will come back for the instance
    state, now_try, _next_method = now
    return now_try in (try_number, None) and state in _LEFT_BY_A_USER


def _task_instance_now(ti: Any) -> tuple[str | None, int | None, str | None] | None:
    """State, try number and next method of the task instance ``ti`` names, or None when the row is gone.

    The row is gone when, for example, its DAG run was deleted. Airflow 2.11: read from the metadata database. Airflow
    3.0-3.2: the state alone, through the Task SDK's supervisor (their triggerer has no database); try number and next
    method are None.
    """
    if not _compat.is_airflow_2():
        return _task_instance_now_from_the_task_sdk(ti)
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        row = (
            session.query(TaskInstance.state, TaskInstance.try_number, TaskInstance.next_method)
            .filter_by(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id, map_index=ti.map_index)
            .one_or_none()
        )
    return None if row is None else (row[0], row[1], row[2])


def _task_instance_now_from_the_task_sdk(ti: Any) -> tuple[str | None, None, None] | None:
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    by_run = RuntimeTaskInstance.get_task_states(
        dag_id=ti.dag_id, map_index=ti.map_index, task_ids=[ti.task_id], run_ids=[ti.run_id]
    )
    # The answer names a mapped task instance "<task_id>_<map_index>".
    key = ti.task_id if ti.map_index < 0 else f"{ti.task_id}_{ti.map_index}"
    states = by_run.get(ti.run_id, {})
    if key not in states:
        return None
    state = states[key]
    return (None if state is None else getattr(state, "value", state), None, None)  # the enum's value
