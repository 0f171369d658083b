"""How a wait ended, typed: ``WaitOutcome``, its sentence, and the trigger's event payload it travels as.

The operator's wait in the worker, the trigger and the sensor end a wait with a ``WaitOutcome``. Only the trigger's
``TriggerEvent`` carries it as a dict: ``to_event`` writes that dict and ``from_event`` reads it back, checked (the
payloads of earlier provider versions have the same keys). Nothing else reads a wait's result by key. No Airflow
and no transport imports.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import api, job_logs

if TYPE_CHECKING:
    from airflow_gpumarket.lifecycle import Rental


class EventKind(str, Enum):  # noqa: UP042 - StrEnum is 3.11+; Airflow 2.11 runs on 3.10
    """What ended a wait (the ``status`` key of the trigger's events)."""

    REACHED = "reached"
    NEVER_RUNS = "never_runs"
    GONE = "gone"
    JOB_SUCCEEDED = "job_succeeded"
    JOB_FAILED = "job_failed"
    BOOT_TIMEOUT = "boot_timeout"
    TIMEOUT = "timeout"
    ERROR = "error"
    LEASE_EXPIRED = "lease_expired"
    PREEMPTED = "preempted"  # a bid instance stopped by the market (see ``WaitOutcome.preempted``), or outbid too long


#: ``limit`` of a TIMEOUT that max_runtime ended (other timeouts come from an absolute deadline).
MAX_RUNTIME = "max_runtime"
#: ``limit`` of a TIMEOUT that max_cost ended: the rental's estimated cost reached it.
MAX_COST = "max_cost"


@dataclass(frozen=True)
class Marks:
    """What a wait learnt of its rental, on the service's clock: billing marks, the bid held, the label renewed."""

    running_at: float | None = None  # when the wait first saw it running
    stopped_at: float | None = None  # when it saw it stop since it last ran
    read_at: float | None = None  # the wait's last read
    bid: float | None = None  # the bid as held by the wait (``bid_strategy="hold"``), else None
    label: str | None = None  # the label as the wait last renewed it
    ssh_host: str | None = None  # the first SSH address a read reported


@dataclass(frozen=True)
class WaitOutcome:
    """How one wait on one instance ended: its kind, what the last read saw, and what the job's log said."""

    kind: EventKind
    instance_id: int | None = None
    actual_status: str | None = None  # the instance's status at the last read
    limit: str | None = None  # a TIMEOUT's own limit (MAX_RUNTIME, MAX_COST); None: an absolute deadline
    waited: bool = False  # a PREEMPTED wait for the bid that ran out: that preemption was counted already
    never_started: float | None = None  # NEVER_RUNS: seconds it ran with no line of the job wrapper
    message: str | None = None  # ERROR: the failure
    log_tail: tuple[str, ...] = ()  # the job's last lines read
    exit_status: int | None = None  # the exit status the job wrapper printed, when read
    log_read: bool | None = None  # None: the end of the log was not judged; else whether it was read to its end
    final_lines: tuple[str, ...] = ()  # a trigger's final read, held for the resumed task to log
    marks: Marks = field(default_factory=Marks)

    @property
    def preempted(self) -> bool:
        """Whether a job's end is a preemption: its bid instance was stopped by the market, not by the job.

        The job wrapper prints its exit status line before it stops its own instance, so a stopped instance whose log
        was read to its end without that line was stopped by someone else: on a bid instance, the market (an outbid).
        The service's ``status_msg`` is logged, never parsed. A log that could not be read proves nothing, and the
        job's end stays a failure. Only asked of bid instances: an on-demand instance stopped by hand is a failure.
        """
        if self.kind is EventKind.PREEMPTED:
            return True
        return (
            self.kind is EventKind.JOB_FAILED
            and self.actual_status == api.STATUS_STOPPED
            and self.exit_status is None
            and self.log_read is True
        )

    @property
    def destroyed_itself(self) -> bool:
        """A job that succeeded by destroying its own instance rather than stopping it: nothing is left to destroy."""
        return self.kind is EventKind.JOB_SUCCEEDED and self.actual_status is None

    @property
    def host_lost(self) -> bool:
        """The host failed under the running job: a failed status and no exit status."""
        return (
            self.kind is EventKind.JOB_FAILED and self.actual_status in api.FAILED_STATUSES and self.exit_status is None
        )

    def with_job_end(self, tail: list[str] | tuple[str, ...], exit_status: int | None, log_read: bool) -> WaitOutcome:
        """This outcome with what the final read of the job's log found, judged.

        The job wrapper stops its instance whatever the command's exit status when it stops on success (see
        ``airflow_gpumarket.job_script``), and prints the status first: an instance no longer running whose log ends
        with exit status 0 is a job that succeeded (whatever the service shows after a stop). Anything else (another
        status, a host failure or a stop by hand before the command ended, no status line read) stays a failure: an
        outcome the log does not prove is never reported as a success. A time limit whose wait ends with the log's
        exit status 0 came after the job had ended well: a success too.
        """
        kind, waited, limit = self.kind, self.waited, self.limit
        if kind is EventKind.PREEMPTED and exit_status is not None:
            kind, waited = EventKind.JOB_FAILED, False  # the line is the resumed run's, which ended unseen
        if kind in (EventKind.JOB_FAILED, EventKind.TIMEOUT) and exit_status == 0:
            kind, limit = EventKind.JOB_SUCCEEDED, None  # a time limit read after the job had ended well
        return replace(
            self,
            kind=kind,
            waited=waited,
            limit=limit,
            log_tail=tuple(tail),
            exit_status=exit_status,
            log_read=log_read,
        )

    def describe(self, instance_id: int | None = None) -> str:
        """A sentence for the task log and for exception messages; a failure's with its exit status and last lines."""
        sentence = _sentence(self, self.instance_id if instance_id is None else instance_id)
        return sentence if self.kind is EventKind.JOB_SUCCEEDED else self.with_detail(sentence)

    def with_detail(self, sentence: str) -> str:
        """``sentence`` followed by the job's exit status and last output lines, when this outcome carries them."""
        detail = job_logs.failure_detail(list(self.log_tail), self.exit_status)
        return f"{sentence}; {detail}" if detail else sentence


def _sentence(outcome: WaitOutcome, instance_id: int | None) -> str:
    kind, status = outcome.kind, outcome.actual_status
    if kind is EventKind.NEVER_RUNS:
        if outcome.never_started is not None:
            return (
                f"the job on instance {instance_id} never started: the instance ran {outcome.never_started / 60:.0f} "
                "min and its log holds no line of the provider's job wrapper, so its onstart script did not run; it "
                "must be destroyed and another offer tried"
            )
        return (
            f"instance {instance_id} ended in status {status!r}, which never becomes running (the host failed); it "
            "must be destroyed and another offer tried"
        )
    if kind is EventKind.JOB_SUCCEEDED:
        if status is None:
            return f"the job on instance {instance_id} exited 0 and the instance destroyed itself"
        return f"the job on instance {instance_id} exited 0 and stopped its instance (compute billing ended)"
    if kind is EventKind.JOB_FAILED:
        if outcome.log_read is not None and outcome.exit_status is None:
            return (
                f"the job on instance {instance_id} ended (the instance is in status {status!r}), but no exit status "
                "could be read from its log, so it is not reported as a success (the final log read failed, the host "
                "failed or someone stopped the instance before the command ended, or the service has no logs "
                "endpoint: set log_interval=0 there)"
            )
        return (
            f"the job on instance {instance_id} failed: the instance is in status {status!r} "
            "(the job wrapper stops the instance when the command exits non-zero, or the host failed mid-job)"
        )
    if kind is EventKind.TIMEOUT:
        if outcome.limit == MAX_RUNTIME:
            return f"the job on instance {instance_id} ran longer than max_runtime (last status {status!r})"
        if outcome.limit == MAX_COST:
            return (
                f"the job on instance {instance_id} reached max_cost; its log is read and its instance destroyed "
                f"(last status {status!r})"
            )
        return f"instance {instance_id} hit its time limit (last status {status!r})"
    if kind is EventKind.PREEMPTED:
        if outcome.waited:
            return f"bid instance {instance_id} was still outbid (status {status!r}) when max_outbid_wait ran out"
        return (
            f"bid instance {instance_id} was preempted: the market stopped it (status {status!r}) before the job "
            "ended (its log has no exit status line)"
        )
    return {
        EventKind.REACHED: f"instance {instance_id} reached status {status!r}",
        EventKind.GONE: f"instance {instance_id} no longer exists (destroyed)",
        EventKind.BOOT_TIMEOUT: f"instance {instance_id} did not reach running before boot_timeout "
        f"(last status {status!r})",
        EventKind.ERROR: f"waiting for instance {instance_id} failed: {outcome.message}",
        EventKind.LEASE_EXPIRED: f"instance {instance_id} is gone, but its lease had expired before (nothing "
        "renewed it), so the reaper may have destroyed it: the job's outcome is unknown",
    }[kind]


# --- the trigger's event payload: the only place a wait's result is a dict ------------------------------------------
def to_event(outcome: WaitOutcome, rental: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``TriggerEvent`` payload of ``outcome`` (JSON), with the rental the resumed task takes back."""
    event: dict[str, Any] = {"status": outcome.kind.value, "instance_id": outcome.instance_id}
    optional = {
        "actual_status": outcome.actual_status,
        "limit": outcome.limit,
        "waited": outcome.waited or None,
        "never_started": outcome.never_started,
        "message": outcome.message,
        "final_lines": list(outcome.final_lines) or None,
        "running_at": outcome.marks.running_at,
        "stopped_at": outcome.marks.stopped_at,
        "read_at": outcome.marks.read_at,
        "bid": outcome.marks.bid,
        "label": outcome.marks.label,
        "ssh_host": outcome.marks.ssh_host,
    }
    event.update({key: value for key, value in optional.items() if value is not None})
    if outcome.log_read is not None:
        event.update(log_tail=list(outcome.log_tail), exit_status=outcome.exit_status, log_read=outcome.log_read)
    elif outcome.log_tail:
        event["log_tail"] = list(outcome.log_tail)
    if rental is not None:
        event["resume"] = dict(rental)
    return event


def from_event(event: Any) -> tuple[WaitOutcome, Rental | None]:
    """The outcome and the rental a trigger's event payload carries; ValueError naming the key that is wrong."""
    from airflow_gpumarket.lifecycle import Rental

    if not isinstance(event, Mapping):
        raise ValueError(f"not an event of this provider's trigger: {event!r}")
    try:
        kind = EventKind(event.get("status"))
    except ValueError:
        raise ValueError(f"not an event of this provider's trigger: {event!r}") from None
    limit = _optional(event, "limit", str)
    if limit not in (None, MAX_RUNTIME, MAX_COST):
        raise ValueError(f"limit: unknown time limit {limit!r} in the trigger's event")
    exit_status = _optional(event, "exit_status", int)
    outcome = WaitOutcome(
        kind=kind,
        instance_id=_optional(event, "instance_id", int),
        actual_status=_optional(event, "actual_status", str),
        limit=limit,
        waited=bool(_optional(event, "waited", bool)),
        never_started=_number(event, "never_started"),
        message=_optional(event, "message", str),
        log_tail=_lines(event, "log_tail"),
        exit_status=exit_status,
        log_read=bool(event.get("log_read") is True) if "exit_status" in event else None,
        final_lines=_lines(event, "final_lines"),
        marks=Marks(
            running_at=_number(event, "running_at"),
            stopped_at=_number(event, "stopped_at"),
            read_at=_number(event, "read_at"),
            bid=_number(event, "bid"),
            label=_optional(event, "label", str),
            ssh_host=_optional(event, "ssh_host", str),
        ),
    )
    resume = event.get("resume")
    return outcome, None if resume is None else Rental.from_resume(resume)


def instance_of(event: Any) -> int | None:
    """The instance a trigger's event names, even when nothing else of it can be read (the task still ends it)."""
    found = event.get("instance_id") if isinstance(event, Mapping) else None
    return found if isinstance(found, int) and not isinstance(found, bool) else None


def _optional(event: Mapping[str, Any], key: str, kind: type) -> Any:
    value = event.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{key}: expected {kind.__name__} in the trigger's event, got {value!r}")
    return value


def _number(event: Mapping[str, Any], key: str) -> float | None:
    value = event.get(key)
    if value is None:
        return None
    if not api.is_positive_number(value) or not math.isfinite(value):
        raise ValueError(f"{key}: expected a positive number in the trigger's event, got {value!r}")
    return float(value)


def _lines(event: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = event.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(line, str) for line in value):
        raise ValueError(f"{key}: expected a list of lines in the trigger's event, got {value!r}")
    return tuple(value)
