"""Durable data for a renting task: the part that copies checkpoints, inputs and outputs through the service.

A ``Stager`` is a part of the ``RentalSession`` and holds none of its other parts. It decides the service's
copies (its ``Copier`` starts and watches them), reads the job wrapper's news of them, and tells the operator when a
rental's job may be watched. It never destroys anything on its own: a checkpoint source no longer needed goes to
the ``end_source`` it was given (the session's end of a rental).
The rules (what is copied where, the bounds) are in ``airflow_gpumarket.staging``.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import api, staging
from airflow_gpumarket.exceptions import GpuMarketError
from airflow_gpumarket.job_script import INPUT_ARRIVED_LINE, STARTED_LINE, WrapperStaging
from airflow_gpumarket.operators.copies import WATCHED, Copier, Copy, StoppedRunning
from airflow_gpumarket.operators.failures import GpuMarketStagingFailed
from airflow_gpumarket.utils import RunTimeModule

if TYPE_CHECKING:
    from airflow_gpumarket import job_logs, lifecycle
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
else:
    job_logs, lifecycle = RunTimeModule("airflow_gpumarket.job_logs"), RunTimeModule("airflow_gpumarket.lifecycle")


#: What a copy the stager watches itself is for (``copies.Copy.role``).
_RESTORE_FROM_INSTANCE = "restore from an instance"
_RESTORE_FROM_CLOUD = "restore from checkpoint_uri"
_GATE = "the gate's way back"
_GATE_TRIED = "the gate's way back, not sent out first"


def _cloud_restore_ended(log: Any, uri: str | None, problem: str) -> None:
    """The copy from ``checkpoint_uri`` did not finish: nothing saved there yet (a first run) is no warning."""
    if re.search(api.NOTHING_THERE, problem, re.IGNORECASE):
        log.info("checkpoint_uri %r holds nothing yet (%s)", uri, problem)
    else:
        log.warning("Restoring checkpoint_uri %r: %s", uri, problem)


class Stager:
    """Copies one task instance's data in and out of its rentals, within ``plan.staging_timeout`` per step.

    :param hook: the task's hook.
    :param log: the task's logger.
    :param plan: what the task asked for (``staging.DataPlan``).
    :param poll_interval: seconds between two reads of an instance while a copy runs.
    :param source_lease: seconds a kept checkpoint source's lease runs: past the next rental's boots and staging.
    :param key: the task instance's label key, which a kept checkpoint source keeps.
    :param stop_if_killed: raises when the task was killed meanwhile (given the instance a copy waits on).
    :param end_source: ends a kept checkpoint source no longer needed (the session's end of a rental).
    """

    def __init__(
        self,
        hook: GpuMarketHook,
        log: Any,
        plan: staging.DataPlan,
        poll_interval: float,
        *,
        source_lease: float,
        key: str,
        stop_if_killed: Callable[[int], None],
        end_source: Callable[[int], None],
    ) -> None:
        self.hook = hook
        self.log = log
        self.plan = plan
        self.poll_interval = poll_interval
        self.source_lease = source_lease
        self.key = key
        self.stop_if_killed = stop_if_killed
        self.end_source = end_source
        self.copier = Copier(hook, log, poll_interval, plan.staging_timeout, stop_if_killed)
        self._shown: list[str] = []  # the wrapper's lines read while a rental's data is staged
        self._running = True  # whether the rental ran at the read before the last read of those lines

    # --- before renting ------------------------------------------------------------------------------
    def resolve(self) -> None:
        """Find the cloud integration by name before anything bills: a typo fails here."""
        if self.plan.uses_cloud and self.copier.integration is None:
            found = self.hook.cloud_integration(self.plan.cloud_integration)  # type: ignore[arg-type]
            self.copier.integration = int(found["id"])
            self.cloud_type = found.get("cloud_type")  # names the datasets for lineage (airflow_gpumarket.lineage)
            self.log.info("Cloud integration %r is id %s", self.plan.cloud_integration, self.copier.integration)

    def wrapper(self, source_id: int | None) -> WrapperStaging:
        """The job wrapper's part for a rental restoring from ``source_id`` (a preempted instance) or the cloud."""
        plan = self.plan
        if source_id is not None:
            restore_from = f"instance {source_id}"
        else:
            restore_from = "cloud" if plan.restores_from_cloud(source_id) else ""
        return WrapperStaging(
            plan.checkpoint_dir,
            restore_from=restore_from,
            gated=plan.gated(source_id),
            timeout=plan.wrapper_timeout(),
            on_restore_failure=plan.on_restore_failure,
            inputs=plan.checked_inputs(),  # a manifest for each, or the gate
            outputs=tuple(filter(staging.is_quotable, plan.outputs)),
        )

    @staticmethod
    def staging_over(lines: list[str]) -> bool:
        """Whether the wrapper's lines show its staging over: the job started, or the wrapper ended without it."""
        return STARTED_LINE in lines or job_logs.exit_status(lines) is not None

    # --- stage in ------------------------------------------------------------------------------------
    def stage_in(self, rental: lifecycle.Rental) -> list[str]:
        """Copy the checkpoint and the inputs to a running rental, until its job started (or will not).

        Returns the job's log lines read (and logged) meanwhile. The rental is ``staged`` when the job's wait follows:
        its wrapper started the job or ended, or it still ran at the last read before its log was read (the wrapper
        prints its end before it stops). Otherwise it stopped before its job started (a preemption, or its host):
        it holds no checkpoint, and a kept source stays kept.
        """
        deadline = time.time() + self.plan.staging_timeout
        self._shown = []
        try:
            pending = self._copy_in(rental, deadline)
            self._await_start(rental, deadline + staging.WRAPPER_MARGIN_SECONDS, pending)
        except StoppedRunning as stopped:  # its job may have run and ended meanwhile: one read of its log tells
            how = "is gone" if stopped.status is None else f"stopped ({stopped.status!r})"
            self.log.info("Instance %s %s while its data was copied in", rental.instance_id, how)
            self._await_start(rental, time.time(), None)
        if rental.attempts.source_id is not None and self.staging_over(self._shown):
            self.drop_source(rental.attempts, "the next instance took over its checkpoint")
        rental.staged = self.staging_over(self._shown) or self._running
        return self._shown

    def _copy_in(self, rental: lifecycle.Rental, deadline: float) -> Copy | None:
        """Start the restore and the input copies, and the gate after inputs; the copy ``_await_start`` watches.

        That is the restore, else the gate's way back, if any. A restore is not waited for here: the wrapper starts
        the job once its files arrived, and ``_await_start`` acts when the service shows its copy ended without that.
        """
        plan, attempts, instance_id = self.plan, rental.attempts, rental.instance_id
        source = attempts.source_id
        restore: Copy | None = None
        if source is not None:
            self.finish_source_save(attempts, deadline)
            self.log.info(
                "Copying checkpoint_dir %s from preempted instance %s to instance %s",
                plan.checkpoint_dir,
                source,
                instance_id,
            )
            restore = self.copier.copy_of(instance_id, _RESTORE_FROM_INSTANCE)
            try:
                self.hook.start_instance_copy(
                    source, instance_id, staging.as_dir(plan.checkpoint_dir or "/"), staging.as_dir(staging.RESTORE_DIR)
                )
            except GpuMarketError as exc:
                self._restore_failed(f"the copy from instance {source} was refused ({exc})")
                self._abandon_restore(source, instance_id)
                restore = None
        elif plan.restores_from_cloud(source) and not plan.inputs:
            restore = self.copier.copy_of(instance_id, _RESTORE_FROM_CLOUD)
            problem = self.copier.start_cloud(
                instance_id, api.TRANSFER_FROM_CLOUD, plan.checkpoint_uri or "", staging.RESTORE_DIR
            )
            if problem is not None:
                self.log.warning("Restoring checkpoint_uri %r: %s", plan.checkpoint_uri, problem)
                return self._open_gate(instance_id, deadline)
            return restore
        copies: list[tuple[str, str, str]] = []
        if plan.restores_from_cloud(source):
            copies.append(("checkpoint_uri", plan.checkpoint_uri or "", staging.RESTORE_DIR))
        copies += [(f"inputs[{path!r}]", uri, path) for path, uri in plan.inputs.items()]
        for what, uri, path in copies:
            done = None if what == "checkpoint_uri" else functools.partial(self._arrived, instance_id, path)
            problem = self.copier.run_cloud(instance_id, api.TRANSFER_FROM_CLOUD, uri, path, deadline, done=done)
            if problem is None:
                self.log.info("Copied %s (%s) to %s on instance %s", what, uri, path, instance_id)
            elif what != "checkpoint_uri":
                raise GpuMarketStagingFailed(
                    f"Input {uri!r} could not be copied to {path} on instance {instance_id}: {problem}. The job did "
                    "not start; check the path in the cloud integration."
                )
            else:  # nothing saved there yet reads the same: the wrapper tells an empty restore from a partial one
                _cloud_restore_ended(self.log, self.plan.checkpoint_uri, problem)
        if copies and not plan.restores_from_cloud(source) and self._all_arrived(instance_id):
            return restore  # every input brought its manifest, and the wrapper needs no gate
        if copies and restore is not None:  # status_msg tells one copy's news at a time: the restore is watched
            self._open_gate(instance_id, deadline, send_out=True)
            return restore
        if copies:
            return self._open_gate(instance_id, deadline)
        return restore

    def _restore_failed(self, problem: str) -> None:
        if self.plan.on_restore_failure == "fail":
            raise GpuMarketStagingFailed(
                f"Restoring the checkpoint failed: {problem}. on_restore_failure='fail', so the job does not start "
                "from scratch; every instance of this try is destroyed."
            )
        self.log.warning(
            "Restoring the checkpoint failed: %s. on_restore_failure='restart': the job starts from scratch", problem
        )

    def _abandon_restore(self, source: int, instance_id: int) -> None:
        """Tell the wrapper to stop waiting for the checkpoint: a gate copied from the source to its abandon dir."""
        try:
            self.hook.start_instance_copy(
                source, instance_id, staging.as_dir(staging.GATE_SOURCE_DIR), staging.as_dir(staging.ABANDON_DIR)
            )
        except GpuMarketError as exc:
            self.log.warning(
                "Could not tell instance %s to give up the restore (%s); it waits out its bound", instance_id, exc
            )

    def _open_gate(self, instance_id: int, deadline: float, *, send_out: bool = False) -> Copy:
        """Copy the gate in from the cloud: its arrival tells the wrapper every copy before it ended.

        The cloud keeps the gate an earlier rental sent out; it is sent out first (``send_out``) after a restore from
        an instance (whose copy is the one watched), or once its way back ended without the job starting
        (``_copy_ended``). The way back is returned to be watched, not waited for: the wrapper's start shows it
        arrived. A gate that cannot arrive fails the task at once: the wrapper would wait out its bound for it.
        """
        problem = None
        if send_out:
            out = (api.TRANSFER_TO_CLOUD, staging.as_dir(staging.GATE_SOURCE_DIR), staging.CLOUD_GATE_DIR)
            problem = self.copier.run_cloud(instance_id, *out, deadline, quiet=True)
        back = self.copier.copy_of(instance_id, _GATE if send_out else _GATE_TRIED)
        if problem is None:
            problem = self.copier.start_cloud(
                instance_id,
                api.TRANSFER_FROM_CLOUD,
                staging.CLOUD_GATE_DIR,
                staging.as_dir(staging.GATE_DIR),
                quiet=True,
            )
        if problem is not None and not send_out:
            return self._open_gate(instance_id, deadline, send_out=True)
        if problem is not None:
            self._gate_failed(instance_id, problem)
        return back

    def _gate_failed(self, instance_id: int, problem: str) -> None:
        raise GpuMarketStagingFailed(
            f"The staged data did not arrive on instance {instance_id}: the gate that tells its job wrapper so could "
            f"not be copied through the cloud integration ({problem}). The job did not start; check the integration."
        )

    def _await_start(self, rental: lifecycle.Rental, deadline: float, pending: Copy | None) -> None:
        """Wait, in the worker, until the wrapper started the job or gave up; the normal wait then takes over.

        The job's lines read meanwhile are logged, and kept in ``_shown``. ``pending``: a copy the wrapper waits for,
        whose end without the job starting needs the provider (``_copy_ended``).
        """
        instance_id = rental.instance_id
        while True:
            self.stop_if_killed(instance_id)
            try:
                instance = self.hook.find_instance(instance_id)
                text = self.hook.get_instance_logs(instance_id)  # after the status: a job that ended shows its end
            except GpuMarketError as exc:
                self.log.info("Reading instance %s while its data is staged: %s", instance_id, exc)
                text, instance = "", {"actual_status": api.STATUS_RUNNING}
            self._running = instance is not None and instance.get("actual_status") == api.STATUS_RUNNING
            if self.staging_over(self._show(instance_id, text)):
                return
            if instance is None or not self._running:
                return  # gone or preempted while staging: the wait that follows tells which
            message = instance.get("status_msg")
            if pending is not None and (reading := pending.reading(message, self.hook.service_now())):
                pending = self._copy_ended(rental, pending, reading, message, deadline)
            if time.time() >= deadline:
                break
            time.sleep(self.poll_interval)
        self.log.warning(
            "Instance %s: the job had not started within the staging bound; watching it anyway", instance_id
        )

    def _show(self, instance_id: int, text: str) -> list[str]:
        """Log the wrapper's lines not logged yet, up to the job's start (the job's own are the wait's to show)."""
        lines = job_logs.split_lines(text, complete_only=True)
        if STARTED_LINE in lines:
            lines = lines[: lines.index(STARTED_LINE) + 1]
        for line in lines[len(self._shown) :]:
            self.log.info("[instance %s] %s", instance_id, line)
        self._shown = lines
        return lines

    def _copy_ended(
        self, rental: lifecycle.Rental, copy: Copy, reading: api.CopyProgress, message: Any, deadline: float
    ) -> Copy | None:
        """A copy the wrapper waits for may have ended, and the job has not started: what to watch next, if anything.

        A restore that ended without a complete checkpoint (else the wrapper would have started the job) is given
        up, and the wrapper applies ``on_restore_failure``: from an instance, by the abandon gate (unless the job
        waits for the gate of its inputs too); from ``checkpoint_uri``, by the gate (the wrapper tells a
        ``checkpoint_uri`` that holds nothing yet from a partial restore). A gate that failed fails the task.
        """
        if reading in (api.CopyProgress.RUNNING, api.CopyProgress.UNKNOWN):
            return copy
        if reading is api.CopyProgress.FINISHED:  # the wrapper may not have looked at the files since
            copy.finished_seen_at = copy.finished_seen_at or time.time()
            if time.time() - copy.finished_seen_at < staging.WRAPPER_NOTICE_SECONDS:
                return copy
        instance_id, source = rental.instance_id, rental.attempts.source_id
        if copy.role == _GATE_TRIED:  # the cloud held no gate (a first use), or the wrapper did not see one arrive
            self.log.info("Sending the gate to the cloud integration first (the service says %r)", message)
            return self._open_gate(instance_id, deadline, send_out=True)
        if copy.role == _GATE:
            if reading is not api.CopyProgress.FINISHED:
                self._gate_failed(instance_id, f"the service says {message!r}")
            return None
        if copy.role == _RESTORE_FROM_CLOUD:
            if reading is not api.CopyProgress.FINISHED:
                _cloud_restore_ended(self.log, self.plan.checkpoint_uri, f"the service says {message!r}")
            return self._open_gate(instance_id, deadline)
        if source is None:
            return None
        if reading is not api.CopyProgress.FINISHED:
            self._restore_failed(f"the service says {message!r}")
        elif self.plan.inputs:
            return None
        else:
            self.log.warning(
                "The copy from instance %s ended without a complete checkpoint (the service says %r)", source, message
            )
        self._abandon_restore(source, instance_id)
        return None

    # --- the wrapper's news of inputs ------------------------------------------------------------------
    def _arrived(self, instance_id: int, *paths: str) -> bool:
        """Whether the wrapper's log, read now, shows every input of ``paths`` arrived by its manifest, or its
        staging over."""
        try:
            self._show(instance_id, self.hook.get_instance_logs(instance_id))
        except GpuMarketError as exc:
            self.log.info("Reading the log of instance %s during a copy: %s", instance_id, exc)
        return self.staging_over(self._shown) or all(map(self._seen_arrived, paths))

    def _all_arrived(self, instance_id: int) -> bool:
        """Whether the wrapper saw every input arrive by its manifest, given the time it takes to look.

        A copy whose end ``status_msg`` told first may not have been looked at yet: the log is read again for up to
        ``WRAPPER_NOTICE_SECONDS`` before the gate is sent. Inputs the wrapper cannot check are not waited for.
        """
        inputs = self.plan.checked_inputs()
        if not inputs:
            return False
        until = time.time() + staging.WRAPPER_NOTICE_SECONDS
        while not self._arrived(instance_id, *inputs):
            if time.time() >= until:
                return False
            time.sleep(min(self.poll_interval, 0.5))
        return True

    def _seen_arrived(self, path: str) -> bool:
        """Whether the wrapper's lines read so far show input ``path`` arrived by its manifest."""
        start = INPUT_ARRIVED_LINE.format(path=path) + " "
        return any(line.startswith(start) for line in self._shown)

    # --- the checkpoint's source and saves -----------------------------------------------------------
    def keep_source(self, rental: lifecycle.Rental) -> bool:
        """After a preemption: keep the paused instance as the next rental's checkpoint source (its save starts).

        False when there is nothing worth keeping (no checkpoint_dir, or its job never started).
        """
        attempts = rental.attempts
        if not self.plan.checkpoint_dir or rental.running_at is None or self.stages_in(rental):
            return False
        if attempts.source_id is not None and attempts.source_id != rental.instance_id:
            self.drop_source(attempts, f"instance {rental.instance_id} holds a newer checkpoint")
        attempts.source_id, attempts.source_rental = rental.instance_id, rental.as_source()
        try:
            label = lifecycle.make_label(self.key, time.time() + self.source_lease)
            self.hook.label_instance(rental.instance_id, label)
        except GpuMarketError as exc:
            self.log.warning("Could not extend the lease of instance %s: %s", rental.instance_id, exc)
        self.log.warning(
            "Keeping preempted instance %s (stopped: storage bills, compute does not) until its checkpoint_dir %s "
            "reached the next instance",
            rental.instance_id,
            self.plan.checkpoint_dir,
        )
        if self.plan.checkpoint_uri:
            attempts.source_save = self._start_save(rental.instance_id)
        return True

    def stages_in(self, rental: lifecycle.Rental) -> bool:
        """Whether the rental still waits for its data to be copied in before its job is watched."""
        return not rental.staged and self.plan.stages_in(rental.attempts.source_id)

    def _start_save(self, instance_id: int) -> list[Any] | None:
        """Start saving checkpoint_dir to checkpoint_uri; what ``finish_source_save`` needs to watch it."""
        copy = self.copier.copy_of(instance_id, WATCHED)
        self.log.info(
            "Saving checkpoint_dir of instance %s to checkpoint_uri %r", instance_id, self.plan.checkpoint_uri
        )
        src, dst = staging.as_dir(self.plan.checkpoint_dir or "/"), staging.as_dir(self.plan.checkpoint_uri or "")
        problem = self.copier.start_cloud(instance_id, api.TRANSFER_TO_CLOUD, src, dst, quiet=True)
        if problem is not None:
            self.log.warning("The checkpoint of instance %s was NOT saved: %s", instance_id, problem)
            return None
        return [copy.started, copy.before]

    def finish_source_save(self, attempts: lifecycle.Attempts, deadline: float) -> None:
        """Wait for a save from the kept source that is still in flight, within ``deadline``."""
        save, attempts.source_save = attempts.source_save, None
        if not save or attempts.source_id is None:
            return
        problem = self.copier.watch(attempts.source_id, Copy(WATCHED, save[0], save[1]), deadline, cancel=True)
        self._report_save(attempts.source_id, problem)

    def _report_save(self, instance_id: int, problem: str | None) -> None:
        if problem is None:
            self.log.info(
                "Saved the checkpoint of instance %s to checkpoint_uri %r", instance_id, self.plan.checkpoint_uri
            )
        else:
            self.log.warning(
                "The checkpoint of instance %s was NOT saved to checkpoint_uri %r: %s",
                instance_id,
                self.plan.checkpoint_uri,
                problem,
            )

    def save(self, instance_id: int) -> None:
        """Save checkpoint_dir to checkpoint_uri and wait for it, within the bound (a destroy follows)."""
        if not (self.plan.checkpoint_uri and self.plan.checkpoint_dir):
            return
        started = self._start_save(instance_id)
        if started is None:
            return
        copy = Copy(WATCHED, started[0], started[1])
        problem = self.copier.watch(instance_id, copy, time.time() + self.plan.staging_timeout, cancel=True)
        self._report_save(instance_id, problem)

    def drop_source(self, attempts: lifecycle.Attempts, why: str) -> None:
        """Destroy the kept checkpoint source once it is no longer needed (its save waited for first)."""
        source = attempts.source_id
        if source is None:
            return
        self.finish_source_save(attempts, time.time() + self.plan.staging_timeout)
        self.log.info("Destroying preempted instance %s: %s", source, why)
        attempts.source_id = None
        self.end_source(source)

    # --- stage out -----------------------------------------------------------------------------------
    def stage_out(self, instance_id: int) -> dict[str, str]:
        """Copy each output to the cloud after exit 0; the outputs that did not arrive, with why."""
        deadline = time.time() + self.plan.staging_timeout
        lost: dict[str, str] = {}
        for path, uri in self.plan.outputs.items():
            problem = self.copier.run_cloud(instance_id, api.TRANSFER_TO_CLOUD, path, uri, deadline, running=False)
            if problem is None:
                self.log.info("Copied output %s of instance %s to %r", path, instance_id, uri)
            else:
                self.log.error("Output %s of instance %s did NOT reach %r: %s", path, instance_id, uri, problem)
                lost[path] = f"{uri!r}: {problem}"
        return lost
