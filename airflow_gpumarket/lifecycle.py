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
from typing import Any

from airflow_gpumarket import api, budgets
from airflow_gpumarket.outcome import Marks

LABEL_PREFIX = "afgm-"
_LABEL = re.compile(r"^afgm-([0-9a-f]{12})-(\d{1,12})$")

#: Wait modes of the trigger and the waiting loop.
WAIT_STATUS = "status"  # until actual_status equals a target (default running)
WAIT_JOB = "job"  # through boot and the onstart job, until the job ends its own billing


#: A kept-alive lease is renewed once less than this share of ``keepalive`` is left (every third of it).
RENEW_WHEN_LEFT = 2 / 3


def rental_key(dag_id: str, run_id: str, task_id: str, map_index: int | None) -> str:
    """Same value for every try of one task instance, so a retry finds what an earlier try rented."""
    raw = f"{dag_id}|{run_id}|{task_id}|{-1 if map_index is None else map_index}"
    return hashlib.sha256(raw.encode()).hexdigest()[:12]


def task_key(task: Any, context: Any) -> str:
    """The label key of ``task``'s task instance in ``context``: the same for every try (``rental_key``)."""
    ti = context.get("ti") if isinstance(context, Mapping) else None
    run_id = context.get("run_id") if isinstance(context, Mapping) else None
    map_index = getattr(ti, "map_index", -1) if ti is not None else -1
    return rental_key(task.dag_id or "", str(run_id), task.task_id, map_index)


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
    source_rental: dict[str, Any] | None = None  # its rental as kept (``Rental.as_source``): what it cost is known
    work_done: float = 0.0
    credited: int | None = None
    ended: list[dict[str, Any]] = field(default_factory=list)  # each ended rental's figure (``record_end``)

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

    def kept_source(self, instance_id: int) -> Rental | None:
        """The kept checkpoint source's rental as it was kept (its price, billing marks), when ``instance_id`` is it."""
        if not self.source_rental or self.source_rental.get("instance_id") != instance_id:
            return None
        try:
            return Rental.from_resume(self.source_rental)
        except ValueError:
            return None

    def record_end(self, instance_id: int, rental: Rental | None) -> None:
        """An instance of this task instance ended: its cost (None: unknown), once, for the task's result."""
        if any(e["instance_id"] == instance_id for e in self.ended):
            return
        figure = (rental.cost, rental.cost_kind) if rental is not None and rental.cost is not None else (None, None)
        self.ended.append({"instance_id": instance_id, "cost": figure[0], "cost_kind": figure[1]})

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
    secret_digests: tuple[str, ...] = ()  # the job's secrets by salted digest (``job_secrets``), masked the same way
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

    def disk_until(self, now: float) -> float | None:
        """What its disk alone has billed by ``now``, the service's time: its cost while it loads."""
        return budgets.rental_cost(
            0.0,
            created_at=self.billed_from,
            running_at=None,
            stopped_at=None,
            ended_at=now,
            disk_hourly=self.disk_hourly,
            digits=4,
        )

    @property
    def hourly(self) -> float | None:
        """What an hour of the rental costs, disk included: the one rate its messages and its max_cost quote."""
        price = self.hourly_price
        return None if price is None else round(price + self.disk_hourly, 6)

    # What a rental learns while it is held; nothing else changes it.
    def rebid(self, bid: float) -> None:
        """The bid was changed after a preemption (``bid_strategy="hold"``): what an hour costs from now on."""
        self.bid = bid

    def observe(self, marks: Marks) -> bool:
        """Take what a wait learnt (``outcome.Marks``): the one place a wait's facts enter a rental.

        Returns True when this is the first time the rental is known running.
        """
        first = self.running_at is None and marks.running_at is not None
        self.running_at, self.stopped_at = marks.running_at or self.running_at, marks.stopped_at
        self.read_at = marks.read_at or self.read_at
        if marks.label:
            self.label = marks.label
        if marks.bid is not None and self.bid is not None:
            self.bid = marks.bid  # the wait held the bid (``bid_strategy="hold"``)
        self.ssh_host = self.ssh_host or marks.ssh_host
        return first

    def marks(self) -> Marks:
        """What a wait starts from: the billing marks so far, the bid, the label."""
        read_at = self.read_at if self.read_at is not None else self.recorded_at
        return Marks(self.running_at, self.stopped_at, read_at, self.bid, self.label, self.ssh_host)

    def give_up(self, reason: str) -> None:
        """This rental failed over: why, for the message if no offer works."""
        self.attempts.reasons.append(reason)

    def to_resume(self) -> dict[str, Any]:
        return asdict(self)

    def as_source(self) -> dict[str, Any]:
        """What a kept checkpoint source keeps of its rental in ``Attempts``: all but the attempts themselves."""
        kept = self.to_resume()
        kept.pop("attempts")
        return kept

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


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def estimated_cost(dph_total: float | None, seconds: float, *, digits: int = 4) -> float | None:
    """The cost of ``seconds`` at an hourly rate: with the disk (the task log), or compute alone (the page)."""
    return None if dph_total is None else round(dph_total * max(0.0, seconds) / 3600.0, digits)
