"""The service's copies as a renting task runs them: started, then read in ``status_msg`` until they end.

A ``Copier`` belongs to one task's ``Stager``, which decides what to copy; this module only starts copies and
tells how they ended. The service shows a copy's news late, and other news overwrites it (``staging``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import api, staging
from airflow_gpumarket.exceptions import GpuMarketError

if TYPE_CHECKING:
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook


class StoppedRunning(Exception):
    """The rental stopped (preempted, or its host failed) or went while data was copied into it."""

    def __init__(self, status: Any) -> None:
        super().__init__(status)
        self.status = status  # None: the instance is gone


#: What a copy run to its end is for (``Copy.role``).
WATCHED = "watched to its end"


class Copy:
    """One copy as its instance's ``status_msg`` tells: started at ``started`` (service time), over ``before``."""

    def __init__(self, role: str, started: float, before: Any) -> None:
        self.role = role
        self.started = started
        self.before = before
        self.seen_new = False
        self.finished_seen_at: float | None = None  # epoch second of the first reading that it finished

    def reading(self, message: Any, now: float) -> api.CopyProgress | None:
        """What ``message``, read at service time ``now``, says of this copy; None while it may tell an older one.

        The service shows a copy's news late; a reading that has not changed since the copy started may still
        describe the copy before it, until that lag has passed twice.
        """
        elapsed = now - self.started
        if elapsed < staging.STATUS_MSG_LAG_SECONDS:
            return None
        self.seen_new = self.seen_new or message != self.before
        if not self.seen_new and elapsed < 2 * staging.STATUS_MSG_LAG_SECONDS:
            return None
        return staging.copy_reading(message)


class Copier:
    """Starts one task's copies and watches them, within the task's ``staging_timeout`` per step.

    :param hook: the task's hook.
    :param log: the task's logger.
    :param poll_interval: seconds between two reads of an instance while a copy runs.
    :param staging_timeout: the bound a message names when a copy outlived its deadline.
    :param stop_if_killed: raises when the task was killed meanwhile (given the instance a copy waits on).
    """

    def __init__(
        self,
        hook: GpuMarketHook,
        log: Any,
        poll_interval: float,
        staging_timeout: float,
        stop_if_killed: Callable[[int], None],
    ) -> None:
        self.hook = hook
        self.log = log
        self.poll_interval = poll_interval
        self.staging_timeout = staging_timeout
        self.stop_if_killed = stop_if_killed
        self.integration: int | None = None  # the cloud integration's id, once the stager resolved it

    def copy_of(self, instance_id: int, role: str) -> Copy:
        """A copy about to start on ``instance_id``, as its ``status_msg`` will tell."""
        return Copy(role, self.hook.service_now(), self.status_msg(instance_id))

    def start_cloud(self, instance_id: int, transfer: str, src: str, dst: str, *, quiet: bool = False) -> str | None:
        """Start one cloud copy; None when the service took it, else why not."""
        assert self.integration is not None
        if not quiet:
            self.log.info("Cloud copy (%s): %s -> %s on instance %s", transfer, src, dst, instance_id)
        try:
            self.hook.start_cloud_copy(instance_id, self.integration, src=src, dst=dst, transfer=transfer)
        except GpuMarketError as exc:
            return f"the service refused it ({exc})"
        return None

    def run_cloud(
        self,
        instance_id: int,
        transfer: str,
        src: str,
        dst: str,
        deadline: float,
        *,
        quiet: bool = False,
        running: bool = True,
        done: Callable[[], bool] | None = None,
    ) -> str | None:
        """Run one cloud copy to its end; None when it finished, else what went wrong (see ``watch``)."""
        copy = self.copy_of(instance_id, WATCHED)
        problem = self.start_cloud(instance_id, transfer, src, dst, quiet=quiet)
        if problem is not None:
            return problem
        return self.watch(instance_id, copy, deadline, cancel=True, running=running, done=done)

    def watch(
        self,
        instance_id: int,
        copy: Copy,
        deadline: float,
        *,
        cancel: bool,
        running: bool = False,
        done: Callable[[], bool] | None = None,
    ) -> str | None:
        """Read ``status_msg`` until ``copy`` ended, within ``deadline``; None when it finished, else the problem.

        ``running``: the instance runs its job's staging, so a stop (a preemption) raises ``StoppedRunning`` at once.
        ``done``: another sign the copy's files arrived (the job wrapper's log), asked at each read; with it, an
        instance gone meanwhile raises ``StoppedRunning`` too, since that log may tell why (a short job's end).
        """
        while True:
            if time.time() >= deadline:
                if cancel:
                    try:
                        self.hook.cancel_cloud_copy(instance_id)
                    except GpuMarketError as exc:
                        self.log.warning("Cancelling the cloud copy of instance %s failed: %s", instance_id, exc)
                return f"it did not end within staging_timeout ({self.staging_timeout:g} s)"
            time.sleep(self.poll_interval)
            self.stop_if_killed(instance_id)
            try:
                instance = self.hook.find_instance(instance_id)
            except GpuMarketError as exc:
                self.log.info("Reading instance %s during a copy: %s", instance_id, exc)
                continue
            if instance is None and done is None:
                return f"instance {instance_id} is gone"
            if instance is None or (running and instance.get("actual_status") != api.STATUS_RUNNING):
                raise StoppedRunning(None if instance is None else instance.get("actual_status"))
            if done is not None and done():
                return None
            message = instance.get("status_msg")
            reading = copy.reading(message, self.hook.service_now())
            if reading is api.CopyProgress.FINISHED:
                return None
            if reading in (api.CopyProgress.FAILED, api.CopyProgress.CANCELLED):
                return f"the service says {message!r}"

    def status_msg(self, instance_id: int) -> Any:
        """The instance's ``status_msg`` now; None when it cannot be read."""
        try:
            instance = self.hook.find_instance(instance_id)
        except GpuMarketError:
            return None
        return None if instance is None else instance.get("status_msg")
