"""Trigger that waits for an instance in the triggerer, holding no worker slot."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from functools import cached_property
from typing import Any

from airflow_gpumarket import _compat, api, job_logs, lifecycle, waiting
from airflow_gpumarket._compat import BaseTrigger, TriggerEvent
from airflow_gpumarket.triggers.poller import poller_for
from airflow_gpumarket.waiting import Observation

#: Seconds ``cleanup`` waits for the task instance's state before leaving the instance to its lease.
STATE_READ_TIMEOUT = 15


class GpuMarketInstanceStatusTrigger(BaseTrigger):
    """Poll one instance until a status is reached, it can never be reached, or the job on it ends.

    :param instance_id: the instance to watch.
    :param gpumarket_conn_id: connection of type ``gpumarket``.
    :param wait_for: ``"status"`` (until ``target_status``) or ``"job"`` (through boot and the onstart job:
        gone = the job succeeded, stopped = it failed; see ``airflow_gpumarket.job_script``).
    :param target_status: status to wait for in ``"status"`` mode (default running).
    :param poll_interval: seconds between reads (the spec recommends 10).
    :param boot_deadline: epoch seconds after which a still-booting instance is given up.
    :param deadline: epoch seconds after which waiting stops whatever the status.
    :param max_runtime: seconds the job may run, counted from when this trigger first sees the instance running
        (a restarted trigger counts again; ``deadline`` stays the absolute bound).
    :param running_since: epoch seconds since which the instance is known to run (its data was staged before its job
        started): ``max_runtime`` counts from then, and a status that never runs ends its job, not its boot.
    :param destroy_on_kill: destroy the instance when a user marks the deferred task failed or clears it
        (Airflow 3.3+ calls ``on_kill``; before 3.3 ``cleanup`` finds it out, see there); True for operators
        that rented the instance, False for sensors.
    :param dph_total: the rental's rate in $/h, disk included, only to log the cost so far.
    :param cost_deadline: the service's epoch second at which the rental's estimated cost reaches the task's
        ``max_cost``: the first read at or after it ends the wait as a timeout whose ``limit`` is ``"max_cost"``.
    :param label: the instance's label as the operator last wrote it (its lease is read from it).
    :param keepalive: keep the label's lease this many seconds ahead, renewing it by a label change every third
        of it, never past ``lease_cap`` (see ``airflow_gpumarket.lifecycle``); None renews nothing.
    :param lease_cap: epoch seconds past which the lease is never moved.
    :param shared_poller: share one poller per connection with the other triggers of this triggerer process (one
        list call per round for all of them, see ``airflow_gpumarket.triggers.poller``); False reads this
        instance on its own every interval.
    :param log_interval: in ``"job"`` mode, seconds between reads of the job's output through the logs endpoint;
        new lines go to the trigger's log (which Airflow shows in the task log), each once, prefixed with the
        instance id; when the job fails, a last read, whose last lines and the exit status go into the event
        (``log_tail``, ``exit_status``). 0 (the default) reads nothing.
    :param key_digest: sha256 of the instance's key, so the key is masked in its output although the triggerer
        never holds it.
    :param outbid_wait_until: epoch seconds until which a preempted bid instance is left to win its machine
        back: any status but running is waited through until then, a failed host ends the wait at once, and the
        job's log is read meanwhile (see ``airflow_gpumarket.bidding``).
    :param hold_bid_up_to: for a bid instance under ``bid_strategy="hold"``, the most its bid may be raised to:
        the bid is raised (``airflow_gpumarket.bidding.held_bid``) whenever a read shows its machine's
        ``min_bid`` rising toward it or past it, and the event carries the bid as last read or placed (``bid``).
        None holds nothing.
    :param shown_lines: the last lines of the job's log an earlier wait showed (after a preemption): this wait's
        first read shows what follows them.
    :param resume: state the deferring operator needs back, returned unchanged in every event under ``resume``
        (Airflow also passes the defer kwargs, but ``dag.test()`` drops them; carrying the state in the event
        works under both).

    Events carry ``status`` (one of the ``airflow_gpumarket.lifecycle`` event kinds), ``instance_id`` and, when
    known, ``actual_status``. 429 answers are retried by the hook, honouring Retry-After; transient failures
    left after those retries are logged and polling goes on until a deadline.
    """

    def __init__(
        self,
        *,
        instance_id: int,
        gpumarket_conn_id: str = "gpumarket_default",
        wait_for: str = lifecycle.WAIT_STATUS,
        target_status: str = api.STATUS_RUNNING,
        poll_interval: float = api.POLL_INTERVAL_SECONDS,
        boot_deadline: float | None = None,
        deadline: float | None = None,
        max_runtime: float | None = None,
        running_since: float | None = None,
        destroy_on_kill: bool = False,
        dph_total: float | None = None,
        label: str | None = None,
        keepalive: float | None = None,
        lease_cap: float | None = None,
        shared_poller: bool = True,
        log_interval: float = 0.0,
        key_digest: str | None = None,
        outbid_wait_until: float | None = None,
        cost_deadline: float | None = None,
        hold_bid_up_to: float | None = None,
        shown_lines: list[str] | None = None,
        resume: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.instance_id = instance_id
        self.gpumarket_conn_id = gpumarket_conn_id
        self.wait_for = wait_for
        self.target_status = target_status
        self.poll_interval = poll_interval
        self.boot_deadline = boot_deadline
        self.deadline = deadline
        self.max_runtime = max_runtime
        self.running_since = running_since
        self.destroy_on_kill = destroy_on_kill
        self.dph_total = dph_total
        self.label = label
        self.keepalive = keepalive
        self.lease_cap = lease_cap
        self.shared_poller = shared_poller
        self.log_interval = log_interval
        self.key_digest = key_digest
        self.outbid_wait_until = outbid_wait_until
        self.cost_deadline = cost_deadline
        self.hold_bid_up_to = hold_bid_up_to
        self.shown_lines = shown_lines
        self.resume = resume
        self._fired = False  # an event was handed to Airflow: the task resumes and owns the instance again
        self._current: waiting.Wait | None = None  # the wait under way: its billing marks go into on_kill's record

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "instance_id": self.instance_id,
                "gpumarket_conn_id": self.gpumarket_conn_id,
                "wait_for": self.wait_for,
                "target_status": self.target_status,
                "poll_interval": self.poll_interval,
                "boot_deadline": self.boot_deadline,
                "deadline": self.deadline,
                "max_runtime": self.max_runtime,
                "running_since": self.running_since,
                "destroy_on_kill": self.destroy_on_kill,
                "dph_total": self.dph_total,
                "label": self.label,
                "keepalive": self.keepalive,
                "lease_cap": self.lease_cap,
                "shared_poller": self.shared_poller,
                "log_interval": self.log_interval,
                "key_digest": self.key_digest,
                "outbid_wait_until": self.outbid_wait_until,
                "cost_deadline": self.cost_deadline,
                "hold_bid_up_to": self.hold_bid_up_to,
                "shown_lines": self.shown_lines,
                "resume": self.resume,
            },
        )

    def _hook(self):
        from airflow_gpumarket.hooks.gpumarket import GpuMarketAsyncHook

        return GpuMarketAsyncHook(self.gpumarket_conn_id)

    async def _own_reads(self) -> AsyncIterator[Observation]:
        """The naive pattern: this trigger reads its own instance every interval."""
        hook = self._hook()
        try:
            while True:
                yield await hook.run_flow(waiting.read_flow(hook, self.instance_id))
                await asyncio.sleep(self.poll_interval)
        finally:
            await hook.aclose()

    def _observations(self) -> AsyncIterator[Observation]:
        if self.shared_poller:
            return poller_for(self.gpumarket_conn_id, self._hook).watch(self.instance_id, self.poll_interval)
        return self._own_reads()

    def _watch(self) -> lifecycle.Watch:
        """The watch of this run, started from the label the trigger was given.

        A restarted trigger starts again from that label; renewals since then are read back as soon as it renews again.
        """
        return lifecycle.Watch(
            wait_for=self.wait_for,
            target_status=self.target_status,
            boot_deadline=self.boot_deadline,
            deadline=self.deadline,
            max_runtime=self.max_runtime,
            running_since=self.running_since,
            label=self.label,
            keepalive=self.keepalive,
            lease_cap=self.lease_cap,
            outbid_wait_until=self.outbid_wait_until,
            cost_deadline=self.cost_deadline,
        )

    @cached_property
    def _flow_hook(self) -> Any:
        """The hook this run's flows (each read's lease renewal, bid and log read) go through.

        The connection is read once per run, and the HTTP client is closed after each use (``aclose`` keeps the
        settings).
        """
        return self._hook()

    def _wait(self) -> waiting.Wait:
        interval = self.log_interval if self.wait_for == lifecycle.WAIT_JOB else 0.0
        created = (self.resume or {}).get("created_at")
        pump = job_logs.LogPump(
            self.instance_id,
            interval,
            key_digest=self.key_digest,
            shown=self.shown_lines or (),
            since=created if api.is_positive_number(created) else None,
        )
        return waiting.Wait(self._watch(), pump, self.log, hold_bid_up_to=self.hold_bid_up_to, hold_final=True)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        wait = self._current = self._wait()
        hook = self._flow_hook
        observations = self._observations()
        try:
            async for seen in observations:
                if seen.error is not None and not api.is_retryable(seen.error):
                    event: dict[str, Any] | None = {
                        "status": lifecycle.EventKind.ERROR.value,
                        "message": str(seen.error),
                    }
                else:
                    try:
                        event = await hook.run_flow(wait.step(hook, seen, time.time()))
                    finally:
                        await hook.aclose()
                if event is not None:
                    if event.get("final_lines"):
                        self.log.info(
                            "The last read of the log of instance %s found %d new lines: the resumed task shows them",
                            self.instance_id,
                            len(event["final_lines"]),
                        )
                    yield self._event(event, wait)
                    return
        finally:
            await observations.aclose()  # type: ignore[attr-defined]

    def _event(self, event: dict[str, Any], wait: waiting.Wait) -> TriggerEvent:
        self._fired = True
        event["instance_id"] = self.instance_id
        if wait.running_at is not None:
            event["running_at"] = wait.running_at
        if wait.stopped_at is not None:
            event["stopped_at"] = wait.stopped_at
        if self.hold_bid_up_to is not None and wait.bid is not None:
            event["bid"] = wait.bid
        if wait.watch.label is not None:
            event["label"] = wait.watch.label  # as renewed: the resumed operator's copy is older
        if self.resume is not None:
            event["resume"] = self.resume
        self.log.info("%s", lifecycle.describe_event(event, self.instance_id))
        return TriggerEvent(event)

    async def on_kill(self) -> None:
        """A user marked the deferred task failed or cleared it: stop the billing of what the task rented."""
        if not self.destroy_on_kill:
            return
        hook = self._hook()
        try:
            await hook.destroy_instance(self.instance_id)
            self.log.warning("Task killed while deferred: destroyed instance %s", self.instance_id)
        except Exception as exc:  # best effort: the reaper is the last line of defence
            self.log.error("Task killed while deferred, and destroying instance %s failed: %s", self.instance_id, exc)
            return
        finally:
            await hook.aclose()
        await self._record_end(hook)

    async def _record_end(self, hook: Any) -> None:
        """The rental's end on its task instance's XComs: a task marked failed writes nothing more itself."""
        from airflow_gpumarket.ui import records

        ti = getattr(self, "task_instance", None)  # set by the triggerer
        if ti is None:
            return
        end = records.end_only(
            instance_id=self.instance_id,
            ended_at=hook.service_now(),
            ended_by="trigger (task left deferred)",
            running_at=None if self._current is None else self._current.running_at,
            stopped_at=None if self._current is None else self._current.stopped_at,
        )
        try:
            await asyncio.to_thread(records.write_end, ti, end)
        except Exception as exc:  # the page is a view: nothing else depends on this record
            self.log.warning(
                "Could not record the end of instance %s for the GPU rentals page: %s", self.instance_id, exc
            )

    async def cleanup(self) -> None:
        """Destroy the instance when a user took the task out of the deferred state (Airflow before 3.3).

        Before 3.3 Airflow never calls ``on_kill``; its triggerer calls ``cleanup`` whenever this trigger stops: after
        its event, when the triggerer stops or hands the trigger to another triggerer, and when the task left the
        deferred state under it. Only a user's doing destroys: the task instance, read now, marked failed or cleared
        (see ``_left_by_a_user``). 2.11's triggerer reads the metadata database; 3.0-3.2's asks the Task SDK, as the
        standard provider's ``WorkflowTrigger`` does. 3.3+ calls ``on_kill`` instead.

        The read and the destroy run as a task of their own: 3.2's triggerer cancels a trigger it dropped again on each
        pass of its loop (about every second), which would cut them off half-way.
        """
        if self._fired or not self.destroy_on_kill or _compat.triggerer_calls_on_kill():
            return
        ti = getattr(self, "task_instance", None)  # set by the triggerer
        if ti is None:
            return
        work = asyncio.ensure_future(self._destroy_if_left_by_a_user(ti))
        _CLEANUPS.add(work)  # the loop keeps only a weak reference to a task
        work.add_done_callback(_CLEANUPS.discard)
        await asyncio.shield(work)

    async def _destroy_if_left_by_a_user(self, ti: Any) -> None:
        try:
            now = await asyncio.wait_for(asyncio.to_thread(_task_instance_now, ti), timeout=STATE_READ_TIMEOUT)
        except Exception as exc:  # a database hiccup or a triggerer shutting down must not destroy a wanted job
            self.log.warning(
                "Could not read the state of %s (%r); instance %s left to its lease", ti, exc, self.instance_id
            )
            return
        if not _left_by_a_user(now, ti.try_number):
            self.log.info("Trigger stopped, the task goes on (%s): instance %s kept", now, self.instance_id)
            return
        self.log.warning("The task left the deferred state under its trigger (%s)", now)
        await self.on_kill()


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
