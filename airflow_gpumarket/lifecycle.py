"""The rental's life as pure functions: labels with a lease, the rental a task holds, and what an event means.

Used by the operators, the trigger, the sensor and the reaper alike; the wait itself (``Watch``, what each read
means) is ``airflow_gpumarket.waiting``. No Airflow and no transport imports.

Label format (at most 28 characters): ``afgm-<key>-<lease_until>`` where ``key`` is 12 hex characters of
sha256(dag_id|run_id|task_id|map_index), the same for every try of one task instance, and ``lease_until`` is the
epoch second after which the reaper may destroy the instance.

Leases kept alive: while a task watches a job (in the worker or in the triggerer), the lease in the label is kept a
short ``keepalive`` ahead and renewed by changing the label, never past the job's own limit. When the watching side
is gone for longer than that, the reaper may destroy the instance; an instance found gone after its lease expired
cannot count as a job that ended well (the reaper, not the job, may have destroyed it).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any

from airflow_gpumarket import api, budgets, job_logs

LABEL_PREFIX = "afgm-"
_LABEL = re.compile(r"^afgm-([0-9a-f]{12})-(\d{1,12})$")

#: Wait modes of the trigger and the waiting loop.
WAIT_STATUS = "status"  # until actual_status equals a target (default running)
WAIT_JOB = "job"  # through boot and the onstart job, until the job ends its own billing


class EventKind(str, Enum):  # noqa: UP042 - StrEnum is 3.11+; Airflow 2.11 runs on 3.10
    """What ended a wait: the ``status`` key of every event the trigger, the operator's loop and the sensor make."""

    REACHED = "reached"
    NEVER_RUNS = "never_runs"
    GONE = "gone"
    JOB_SUCCEEDED = "job_succeeded"
    JOB_FAILED = "job_failed"
    BOOT_TIMEOUT = "boot_timeout"
    TIMEOUT = "timeout"
    ERROR = "error"
    LEASE_EXPIRED = "lease_expired"
    PREEMPTED = "preempted"  # a bid instance stopped by the market (see ``preempted``), or outbid for too long


#: ``limit`` of a TIMEOUT event that max_runtime ended (other timeouts come from an absolute deadline).
MAX_RUNTIME = "max_runtime"
#: ``limit`` of a TIMEOUT event that max_cost ended: the rental's estimated cost reached it.
MAX_COST = "max_cost"


def event_kind(event: Any) -> EventKind:
    """The kind of an event that came back from a trigger.

    Raises ValueError naming the event for anything else (a payload of another provider version, or none at all).
    """
    kind = event.get("status") if isinstance(event, Mapping) else None
    try:
        return EventKind(kind)
    except ValueError:
        raise ValueError(f"not an event of this provider's trigger: {event!r}") from None


#: A kept-alive lease is renewed once less than this share of ``keepalive`` is left (every third of it).
RENEW_WHEN_LEFT = 2 / 3


def rental_key(dag_id: str, run_id: str, task_id: str, map_index: int | None) -> str:
    """Same value for every try of one task instance, so a retry finds what an earlier try rented."""
    raw = f"{dag_id}|{run_id}|{task_id}|{-1 if map_index is None else map_index}"
    return hashlib.sha256(raw.encode()).hexdigest()[:12]


def kept_key(key: str) -> str:
    """The key of an instance a task kept on purpose (``keep_on_output_failure``): its failure paths skip it."""
    return hashlib.sha256(f"{key}|kept".encode()).hexdigest()[:12]


def make_label(key: str, lease_until: float) -> str:
    return f"{LABEL_PREFIX}{key}-{int(lease_until)}"


def parse_label(label: Any) -> tuple[str, int] | None:
    """(key, lease_until) of a label this provider wrote, else None (instances made by hand are never touched)."""
    match = _LABEL.match(label) if isinstance(label, str) else None
    return (match.group(1), int(match.group(2))) if match else None


def renewed_label(label: Any, *, now: float, keepalive: float, lease_cap: float) -> str | None:
    """The label with its lease moved to ``min(now + keepalive, lease_cap)`` when a renewal is due, else None.

    Due once less than ``RENEW_WHEN_LEFT`` of ``keepalive`` is left; never moved past ``lease_cap`` (the job's own
    limit) and never moved backwards. None as well for a label this provider did not write.
    """
    parsed = parse_label(label)
    if parsed is None:
        return None
    key, lease_until = parsed
    target = int(min(now + keepalive, lease_cap))
    if lease_until - now >= keepalive * RENEW_WHEN_LEFT or target <= lease_until:
        return None
    return make_label(key, target)


def lease_of(label: Any) -> int | None:
    """The lease_until of a label this provider wrote, else None."""
    parsed = parse_label(label)
    return parsed[1] if parsed else None


def started_at(instance: Mapping[str, Any], *, fallback: float, now: float) -> float:
    """When the instance started billing.

    Read from the service's ``start_date`` (epoch seconds) when it is a plausible number, else ``fallback``.
    """
    value = instance.get("start_date")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= now:
        return float(value)
    return fallback


@dataclass
class Attempts:
    """What one task instance tried so far, carried from rental to rental (and through the trigger and back).

    ``tried``: every offer rented or tried, this one last (an offer is never tried twice); ``reasons``: why the
    earlier ones failed. ``preemptions``: how many times the market took a bid instance of this job;
    ``lost_machines``: the machines it took them on (never rented again); ``round_start``: offers from this index
    on count against ``max_offer_attempts`` (a preemption starts a new round); ``on_demand``: the job fell back to
    on-demand rentals after ``max_preemptions`` or because of its ``deadline``; ``work_done``: seconds of the job a
    checkpoint carries past its preemptions (``deadlines.credited_work``), counted once per rental (``credited``: the
    last one counted).
    """

    tried: list[int] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    preemptions: int = 0
    lost_machines: list[int] = field(default_factory=list)
    round_start: int = 0
    on_demand: bool = False
    source_id: int | None = None  # a preempted instance kept until its checkpoint reached the next rental
    source_save: list[Any] | None = None  # its save to checkpoint_uri in flight: [service time started, status_msg]
    work_done: float = 0.0
    credited: int | None = None

    def offers_this_round(self) -> int:
        return len(self.tried) - self.round_start

    def count_preemption(self) -> None:
        self.preemptions += 1

    def lose_machine(self, machine_id: int | None, reason: str) -> None:
        """A preemption took this job's instance for good: a new round of offers begins, never on that machine."""
        if machine_id is not None:
            self.lost_machines.append(machine_id)
        self.reasons.append(reason)
        self.round_start = len(self.tried)

    def fall_back_to_on_demand(self) -> None:
        self.on_demand = True

    def credit_work(self, instance_id: int, seconds: float) -> None:
        """A preempted rental's run counts as ``seconds`` of work done: the first time it is credited only."""
        if self.credited != instance_id:
            self.work_done += seconds
            self.credited = instance_id


@dataclass
class Rental:
    """What a renting task holds while it waits.

    That is the instance, what it costs, when it started billing, its label, and what this task instance tried so far
    (``Attempts``).

    Travels to the trigger and back in the event (``to_resume``/``from_resume``): a job that succeeded has
    destroyed its instance, so its price and start cannot be read again afterwards.
    """

    instance_id: int
    offer_id: int | None
    dph_total: float | None
    gpu_name: str | None
    label: str | None
    created_at: float  # epoch seconds: when billing started (the service's start_date on adoption)
    lease_cap: float | None = None  # the lease is never moved past this epoch second
    ambiguous: bool = False  # the create's answer was lost and retried: a duplicate may exist
    ssh_host: str | None = None
    key_digest: str | None = None  # sha256 of the instance key: masks it in the job's log where the key is not held
    bid: float | None = None  # $/h bid for an interruptible rental; None on demand
    machine_id: int | None = None  # the offer's machine, when the search named it
    attempts: Attempts = field(default_factory=Attempts)
    recorded_at: float | None = None  # the start in the rental's record, on the service's clock
    running_at: float | None = None  # when its watcher first saw it running, on the service's clock
    stopped_at: float | None = None  # when its watcher saw it stop since it last ran, on that clock
    read_at: float | None = None  # its watcher's last read, on that clock
    staged: bool = False  # its staged data arrived and its job started (``operators.stager``)
    disk_hourly: float = 0.0  # what its disk bills per hour, at the offer's storage_cost
    inet_down: float | None = None  # the offer's download speed in Mbps: with its boot, the image's size
    ended_at: float | None = None  # when its instance was gone, on the service's clock
    cost: float | None = None  # then: what it cost, as ``cost_kind`` says (``operators.cost``)
    cost_kind: str | None = None

    def note_billing(self, status: str | None, at: float) -> bool:
        """Take one read's status at the service's time ``at`` (see ``billing_marks``).

        Returns True when it is the first read that found the rental running.
        """
        first = self.running_at is None
        previous = self.read_at if self.read_at is not None else self.recorded_at
        self.running_at, self.stopped_at = billing_marks(self.running_at, self.stopped_at, status, at, previous)
        self.read_at = at
        return first and self.running_at is not None

    def elapsed(self, now: float) -> float:
        return now - self.created_at

    @property
    def billed_from(self) -> float:
        """When its bill starts: the service's time just before its create, or its start_date, when known."""
        return self.recorded_at if self.recorded_at is not None else self.created_at

    def cost_until(self, now: float, *, digits: int = 4) -> float | None:
        """Its estimated cost by ``now``, the service's time (``budgets.rental_cost``)."""
        return budgets.rental_cost(
            self.hourly_price,
            created_at=self.billed_from,
            running_at=self.running_at,
            stopped_at=self.stopped_at,
            ended_at=now,
            disk_hourly=self.disk_hourly,
            digits=digits,
        )

    @property
    def hourly_price(self) -> float | None:
        """What an hour of compute costs: the bid of an interruptible rental, else the offer's on-demand price."""
        return self.bid if self.bid is not None else self.dph_total

    @property
    def hourly(self) -> float | None:
        """What an hour of the rental costs, disk included: the one rate its messages and its max_cost quote."""
        price = self.hourly_price
        return None if price is None else round(price + self.disk_hourly, 6)

    # What a rental learns while it is held; nothing else changes it.
    def relabel(self, label: str | None) -> None:
        """The lease was renewed (by this task or, while deferred, by the trigger): the label now on the instance."""
        if label:
            self.label = label

    def rebid(self, bid: float) -> None:
        """The bid was changed (``bid_strategy="hold"``): what an hour costs from now on."""
        self.bid = bid

    def learn_ssh_host(self, ssh_host: str | None) -> None:
        """The first SSH address an instance read reports is kept."""
        self.ssh_host = self.ssh_host or ssh_host

    def continue_attempts(self, attempts: Attempts) -> None:
        """This rental carries on the task instance's attempts (its offer is the last one tried)."""
        self.attempts = attempts

    def give_up(self, reason: str) -> None:
        """This rental failed over: why, for the message if no offer works."""
        self.attempts.reasons.append(reason)

    def to_resume(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_resume(cls, data: Any) -> Rental:
        """ValueError naming what is wrong when ``data`` is not what ``to_resume`` wrote."""
        names = {f.name for f in fields(cls)}
        if not isinstance(data, Mapping) or "instance_id" not in data or "created_at" not in data:
            raise ValueError(f"no rental to resume in {data!r}")
        data = dict(data)
        attempts = data.pop("attempts", None) or {}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown rental fields {sorted(unknown)} in {data!r}")
        try:
            return cls(**data, attempts=Attempts(**attempts))
        except TypeError as exc:
            raise ValueError(f"bad attempts in {data!r}: {exc}") from None


def billing_marks(
    running_at: float | None,
    stopped_at: float | None,
    status: str | None,
    at: float,
    previous: float | None = None,
) -> tuple[float | None, float | None]:
    """When compute billing started and, if stopped after running, when it stopped.

    Billing started when the instance was first read running; the marks are taken after one more read at ``at``. A
    change is put halfway between the read that found it and the ``previous`` read (when known), so each mark is off by
    at most half a poll, either way.
    """
    change = at if previous is None or previous > at else (previous + at) / 2
    if status == api.STATUS_RUNNING:
        return (change if running_at is None else running_at), None
    if status == api.STATUS_STOPPED and running_at is not None:
        return running_at, (change if stopped_at is None else stopped_at)
    return running_at, stopped_at


def rentals_of(instances: Iterable[Mapping[str, Any]], key: str) -> list[Mapping[str, Any]]:
    """Instances rented by the task instance with this key (any try), oldest first."""
    found = [i for i in instances if (parsed := parse_label(i.get("label"))) and parsed[0] == key]
    return sorted(found, key=lambda i: i.get("id") or 0)


def preempted(event: Mapping[str, Any]) -> bool:
    """Whether a job's end is a preemption: its bid instance was stopped by the market, not by the job.

    The job wrapper prints its exit status line before it stops its own instance, so a stopped instance whose log
    was read to its end (``log_read``) without that line was stopped by someone else: on a bid instance, the market
    (an outbid). The service's ``status_msg`` is logged, never parsed. A log that could not be read proves nothing,
    and the job's end stays a failure. Only asked of bid instances: an on-demand instance stopped by hand is a
    failure. A wait for the bid that ran out (``waited``) is a preemption too."""
    kind = event.get("status")
    if kind == EventKind.PREEMPTED.value:
        return True
    return (
        kind == EventKind.JOB_FAILED.value
        and event.get("actual_status") == api.STATUS_STOPPED
        and "exit_status" in event
        and event.get("exit_status") is None
        and event.get("log_read") is True
    )


def destroyed_itself(event: Mapping[str, Any]) -> bool:
    """True for a job that succeeded by destroying its own instance rather than stopping it.

    The wrapper destroys it on success; nothing is left to destroy.
    """
    return event.get("status") == EventKind.JOB_SUCCEEDED.value and event.get("actual_status") is None


def describe_event(event: Mapping[str, Any], instance_id: int) -> str:
    """A sentence for the task log and for exception messages.

    For a job that did not succeed, it has the exit status and last output lines when the event carries them; a success
    quotes none, as the task log showed them.
    """
    try:
        kind = event_kind(event)
    except ValueError:
        return f"instance {instance_id}: unexpected event {event!r}"
    sentence = _sentence(kind, event, instance_id)
    return sentence if kind is EventKind.JOB_SUCCEEDED else with_job_detail(sentence, event)


def with_job_detail(sentence: str, event: Mapping[str, Any]) -> str:
    """``sentence`` followed by the job's exit status and last output lines, when the event carries them."""
    tail, status = event.get("log_tail"), event.get("exit_status")
    lines = [str(line) for line in tail] if isinstance(tail, list) else []
    detail = job_logs.failure_detail(lines, status if isinstance(status, int) else None)
    return f"{sentence}; {detail}" if detail else sentence


def _sentence(kind: EventKind, event: Mapping[str, Any], instance_id: int) -> str:
    status = event.get("actual_status")
    return {
        EventKind.REACHED: f"instance {instance_id} reached status {status!r}",
        EventKind.NEVER_RUNS: (
            f"the job on instance {instance_id} never started: the instance ran {event['never_started'] / 60:.0f} min "
            "and its log holds no line of the provider's job wrapper, so its onstart script did not run; it must be "
            "destroyed and another offer tried"
            if api.is_positive_number(event.get("never_started"))
            else f"instance {instance_id} ended in status {status!r}, which never becomes running "
            "(the host failed); it must be destroyed and another offer tried"
        ),
        EventKind.GONE: f"instance {instance_id} no longer exists (destroyed)",
        EventKind.JOB_SUCCEEDED: (
            f"the job on instance {instance_id} exited 0 and the instance destroyed itself"
            if status is None
            else f"the job on instance {instance_id} exited 0 and stopped its instance (compute billing ended)"
        ),
        EventKind.JOB_FAILED: _job_failed_sentence(event, instance_id),
        EventKind.BOOT_TIMEOUT: f"instance {instance_id} did not reach running before boot_timeout "
        f"(last status {status!r})",
        EventKind.TIMEOUT: (
            f"the job on instance {instance_id} ran longer than max_runtime (last status {status!r})"
            if event.get("limit") == MAX_RUNTIME
            else f"the job on instance {instance_id} reached max_cost: {event.get('cost_text') or 'its cost limit'}; "
            f"its log is read and its instance destroyed (last status {status!r})"
            if event.get("limit") == MAX_COST
            else f"instance {instance_id} hit its time limit (last status {status!r})"
        ),
        EventKind.ERROR: f"waiting for instance {instance_id} failed: {event.get('message')}",
        EventKind.PREEMPTED: (
            f"bid instance {instance_id} was still outbid (status {status!r}) when max_outbid_wait ran out"
            if event.get("waited")
            else f"bid instance {instance_id} was preempted: the market stopped it (status {status!r}) before the "
            "job ended (its log has no exit status line)"
        ),
        EventKind.LEASE_EXPIRED: f"instance {instance_id} is gone, but its lease had expired before (nothing "
        "renewed it), so the reaper may have destroyed it: the job's outcome is unknown",
    }[kind]


def _job_failed_sentence(event: Mapping[str, Any], instance_id: int) -> str:
    status = event.get("actual_status")
    if "exit_status" in event and event.get("exit_status") is None:
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


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def estimated_cost(dph_total: float | None, seconds: float, *, digits: int = 4) -> float | None:
    """The cost of ``seconds`` at an hourly rate: with the disk (the task log), or compute alone (the page)."""
    return None if dph_total is None else round(dph_total * max(0.0, seconds) / 3600.0, digits)
