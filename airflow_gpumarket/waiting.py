"""One wait on one instance, shared by the renting operators, the trigger and the sensor.

``Watch`` is the wait as a pure state machine (what a read means, its deadlines, the lease's renewals) that
serialises itself for the trigger (``to_dict``/``from_dict``). Each read of the instance (an ``Observation``) goes
to ``Wait.step``, a flow either hook runs (``hook.run_flow``): it renews the lease, holds the bid, judges the read
(``Watch.observe``), reads the job's log when due, and returns the ``outcome.WaitOutcome`` that ends the wait, or
None. The callers differ only in how they read and sleep: the operator reads and sleeps in the worker, the trigger
gets its reads from the shared poller, the sensor reads once a poke.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from airflow_gpumarket import api, bidding, budgets, job_logs, lifecycle
from airflow_gpumarket.exceptions import GpuMarketError
from airflow_gpumarket.lifecycle import WAIT_JOB, WAIT_STATUS, lease_of, renewed_label
from airflow_gpumarket.outcome import MAX_COST, MAX_RUNTIME, EventKind, Marks, WaitOutcome


class Observation:
    """What one read learnt about one instance, and the service's time of the read (``at``).

    That is its status (and, for a bid instance, its bid and its machine's ``min_bid``), that it is gone, or a failure;
    ``at`` is in epoch seconds.
    """

    __slots__ = ("status", "gone", "error", "at", "bid", "min_bid", "ssh_host")

    def __init__(
        self,
        status: str | None = None,
        gone: bool = False,
        error: GpuMarketError | None = None,
        at: float | None = None,
        bid: Any = None,
        min_bid: Any = None,
        ssh_host: str | None = None,
    ) -> None:
        self.status = status
        self.gone = gone
        self.error = error
        self.at = time.time() if at is None else at
        self.bid = bid
        self.min_bid = min_bid
        self.ssh_host = ssh_host

    @classmethod
    def of(cls, instance: Mapping[str, Any], at: float) -> Observation:
        """What a read of ``instance`` at the service's time ``at`` learnt."""
        return cls(
            status=instance.get("actual_status"),
            at=at,
            bid=instance.get("bid_price"),
            min_bid=instance.get("min_bid"),
            ssh_host=instance.get("ssh_host"),
        )


def read_flow(hook: Any, instance_id: int) -> Any:
    """One read of the instance as an ``Observation``: its state, that it is gone, or the failure left after the
    hook's retries."""
    try:
        instance = yield from hook.find_instance_flow(instance_id)
    except GpuMarketError as exc:
        return Observation(error=exc)
    at = hook.service_now()
    return Observation(gone=True, at=at) if instance is None else Observation.of(instance, at)


def hold_bid_flow(hook: Any, instance_id: int, bid: float, min_bid: Any, cap: float, log: Any) -> Any:
    """Raise the bid when the machine's ``min_bid`` rose toward it (``bidding.held_bid``): the bid placed, else None."""
    raised = bidding.held_bid(bid, min_bid, cap)
    if raised is None:
        return None
    try:
        yield from hook.change_bid_flow(instance_id, raised)
    except GpuMarketError as exc:
        log.warning("Could not raise the bid of instance %s to $%s/h: %s", instance_id, raised, exc)
        return None
    log.warning(
        "Raised the bid of instance %s from $%s/h to $%s/h: its machine's minimum bid is now $%s/h (cap $%s/h)",
        instance_id,
        bid,
        raised,
        min_bid,
        cap,
    )
    return raised


def evaluate(
    *,
    wait_for: str,
    status: str | None,
    gone: bool,
    now: float,
    seen_running: bool,
    target_status: str = api.STATUS_RUNNING,
    boot_deadline: float | None = None,
    deadline: float | None = None,
    lease_until: float | None = None,
    max_runtime: float | None = None,
    running_since: float | None = None,
    outbid_wait_until: float | None = None,
    cost_deadline: float | None = None,
    service_at: float | None = None,
    over_max_cost: bool = False,
) -> WaitOutcome | None:
    """What one observation means: the outcome when waiting is over, None to keep waiting.

    ``status``: the instance's actual_status (ignored when ``gone``, i.e. the instance answered 404).
    In job mode, the job wrapper destroys the instance after exit 0 (gone = success) and stops it otherwise; gone
    after ``lease_until`` (the label's lease as last written) proves nothing, since the reaper may have destroyed it.
    ``max_runtime`` counts from ``running_since``, when the watcher first saw the instance running (the job starts
    then); ``deadline`` is absolute. With ``outbid_wait_until`` (a preempted bid instance left to win its machine
    back), any status but running is waiting for the bid until then, and PREEMPTED after; so is a failed host at
    once. Either way the log decides (``with_job_end``): the resumed run may have ended between two reads.
    ``over_max_cost``: the rental's estimated cost reached ``max_cost`` (``Watch.spent``); ``cost_deadline`` is the
    same written by an older provider, as a time on the service's clock, as ``service_at`` (the time of the read) is.
    """
    if wait_for == WAIT_JOB:
        if gone and lease_until is not None and now > lease_until:
            return WaitOutcome(EventKind.LEASE_EXPIRED)
        if gone:
            return WaitOutcome(EventKind.JOB_SUCCEEDED)
        if status == api.STATUS_RUNNING:
            pass
        elif outbid_wait_until is not None:
            # Booting: the bid won, boot_deadline rules.
            if status in api.FAILED_STATUSES or (now >= outbid_wait_until and not api.is_booting(status)):
                return WaitOutcome(EventKind.PREEMPTED, actual_status=status, waited=True)
        elif status in api.FAILED_STATUSES and not seen_running:
            return WaitOutcome(EventKind.NEVER_RUNS, actual_status=status)
        elif not api.is_booting(status):
            return WaitOutcome(EventKind.JOB_FAILED, actual_status=status)
    else:
        if gone:
            return WaitOutcome(EventKind.GONE)
        if status == target_status:
            return WaitOutcome(EventKind.REACHED, actual_status=status)
        if status in api.FAILED_STATUSES or (target_status == api.STATUS_RUNNING and api.will_never_run(status)):
            return WaitOutcome(EventKind.NEVER_RUNS, actual_status=status)
    if boot_deadline is not None and not seen_running and api.is_booting(status) and now >= boot_deadline:
        return WaitOutcome(EventKind.BOOT_TIMEOUT, actual_status=status)
    if deadline is not None and now >= deadline:
        return WaitOutcome(EventKind.TIMEOUT, actual_status=status)
    if max_runtime is not None and running_since is not None and now >= running_since + max_runtime:
        return WaitOutcome(EventKind.TIMEOUT, actual_status=status, limit=MAX_RUNTIME)
    if over_max_cost or (cost_deadline is not None and (now if service_at is None else service_at) >= cost_deadline):
        return WaitOutcome(EventKind.TIMEOUT, actual_status=status, limit=MAX_COST)
    return None


@dataclass
class Watch:
    """One wait on one instance, as a state machine fed one read at a time.

    The operator's loop (in the worker), the trigger (in the triggerer) and the sensor (one poke per read) differ
    only in how they read and sleep; what a read means, when the job started, and when the lease in the label is
    due for renewal are decided here, the same way for all three. ``observe`` returns the outcome that ends the wait,
    or None to keep waiting.
    """

    wait_for: str = WAIT_STATUS
    target_status: str = api.STATUS_RUNNING
    boot_deadline: float | None = None  # epoch seconds
    deadline: float | None = None  # epoch seconds
    max_runtime: float | None = None  # seconds from running_since
    label: str | None = None  # as last written on the instance: its lease is read from it
    keepalive: float | None = None  # keep the lease this far ahead (None: never renewed)
    lease_cap: float | None = None  # never move the lease past this epoch second
    running_since: float | None = None  # when a read first saw the instance running
    status: str | None = None  # the last status read
    shown: str = ""  # the last read as the task log shows it ("gone" or the status)
    changed: bool = False  # the last read differs from the one before it
    outbid_wait_until: float | None = None  # a preempted bid instance may win its machine back until then
    cost_deadline: float | None = None  # an older provider's max_cost, as the service time it is reached
    max_cost: float | None = None  # dollars: the wait ends when the rental's estimated cost reaches it
    cost_rates: list[float] | None = None  # [billed from (service time), compute $/h, disk $/h] for ``spent``
    compute_from: float | None = None  # the service's time of the first read that saw it running
    hold_bid_up_to: float | None = None  # raise a bid instance's bid up to this (None: hold nothing)
    shown_lines: list[str] = field(default_factory=list)  # an earlier wait showed these lines of the job's log last

    def to_dict(self) -> dict[str, Any]:
        """What a trigger carries of this wait: every field but the last read's (``status``, ``shown``, ``changed``)."""
        return {name: getattr(self, name) for name in _WATCH_FIELDS if name not in _READ_STATE}

    @classmethod
    def from_dict(cls, data: Any) -> Watch:
        """ValueError naming what is wrong when ``data`` is not what ``to_dict`` wrote."""
        if not isinstance(data, Mapping):
            raise ValueError(f"not a watch: {data!r}")
        unknown = set(data) - set(_WATCH_FIELDS)
        if unknown:
            raise ValueError(f"unknown watch fields {sorted(unknown)} in {data!r}")
        watch = cls(**data)
        watch.shown_lines = list(watch.shown_lines or ())
        return watch

    def observe(
        self,
        now: float,
        *,
        status: str | None = None,
        gone: bool = False,
        unread: bool = False,
        service_at: float | None = None,
    ) -> WaitOutcome | None:
        """Take one read: ``status``, or ``gone`` (the instance answered 404), or ``unread``.

        ``unread``: the read failed after the hook's retries; nothing new was learnt, so the last status read is judged
        again.
        """
        if unread:
            status = self.status
        shown = "gone" if gone else "no status yet" if status is None else repr(status)
        self.changed, self.status, self.shown = shown != self.shown, status, shown
        if status == api.STATUS_RUNNING and self.running_since is None:
            self.running_since = now
        if status == api.STATUS_RUNNING and self.compute_from is None and service_at is not None:
            self.compute_from = service_at
        if not unread and (status == api.STATUS_RUNNING or api.is_booting(status)):
            self.outbid_wait_until = None  # the bid won again: the job runs again, and its next stop is judged anew
        return evaluate(
            wait_for=self.wait_for,
            status=status,
            gone=gone,
            now=now,
            seen_running=self.running_since is not None,
            target_status=self.target_status,
            boot_deadline=self.boot_deadline,
            deadline=self.deadline,
            lease_until=lease_of(self.label),
            max_runtime=self.max_runtime,
            running_since=self.running_since,
            outbid_wait_until=self.outbid_wait_until,
            cost_deadline=self.cost_deadline,
            service_at=service_at,
            over_max_cost=self.max_cost is not None and (self.spent(service_at) or 0.0) >= self.max_cost,
        )

    def spent(self, service_at: float | None) -> float | None:
        """The rental's estimated cost at ``service_at`` as the service bills: disk from creation, compute once running.

        None without the rates or the time of a read.
        """
        if self.cost_rates is None or service_at is None:
            return None
        billed_from, compute_hourly, disk_hourly = self.cost_rates
        return budgets.rental_cost(
            compute_hourly if self.compute_from is not None else 0.0,  # watched while it loads: no compute yet
            created_at=billed_from,
            running_at=self.compute_from,
            stopped_at=None,
            ended_at=service_at,
            disk_hourly=disk_hourly,
        )

    def reads_log(self) -> bool:
        """Whether the job's log is read as this wait goes on.

        It is once the job was seen running, or when a preempted bid instance may win its machine back and run the job
        to its end between two reads (``ended_while_waiting``).
        """
        return self.running_since is not None or self.outbid_wait_until is not None

    def lease_renewal(self, now: float) -> str | None:
        """The label to write now to keep the lease ahead, or None when no renewal is due.

        See ``renewed_label``. Set ``label`` once the service took it.
        """
        if self.keepalive is None or self.lease_cap is None:
            return None
        return renewed_label(self.label, now=now, keepalive=self.keepalive, lease_cap=self.lease_cap)


_WATCH_FIELDS = tuple(f.name for f in fields(Watch))
_READ_STATE = ("status", "shown", "changed")


#: Events after which a job's instance still exists, so the end of its log can be read (and is, in job mode).
#: A wait for an outbid instance that ran out reads the log too: the instance may have won its machine back, run
#: the job to its end and stopped again between two reads.
ENDS_WITH_LOG = (EventKind.JOB_FAILED, EventKind.TIMEOUT, EventKind.PREEMPTED)


def needs_final_read(outcome: WaitOutcome, pump: job_logs.LogPump) -> bool:
    """Whether the wait that ``outcome`` ends reads the job's log once more first.

    It does when the job ended (its last lines and its exit status are in the log) and reads are on. The operator, the
    sensor and the trigger ask this alike.
    """
    return outcome.kind in ENDS_WITH_LOG and pump.interval > 0 and not pump.off


def ended_while_waiting(watch: Watch, pump: job_logs.LogPump) -> WaitOutcome | None:
    """The outcome ending a preempted bid instance's wait once its log shows the job ended, else None.

    While such an instance is left to win its machine back, a read of its log that found the job wrapper's exit status
    line means the resumed run ended (and stopped its instance) between two reads of its status. The wait ends there,
    judged by the log like any job's end. None while no such line was read.
    """
    if watch.outbid_wait_until is None or pump.follower.exit_status is None:
        return None
    return WaitOutcome(EventKind.JOB_FAILED, actual_status=watch.status)


#: Seconds (on the service's clock) a running instance's log may hold no line of the job wrapper before its onstart
#: is taken never to run: the wrapper prints its first line as soon as the service's entrypoint starts it.
WRAPPER_START_SECONDS = 300.0


def never_started(
    watch: Watch, pump: job_logs.LogPump, running_at: float | None, at: float | None
) -> WaitOutcome | None:
    """The outcome failing over an instance whose job wrapper never started, else None.

    That is a running instance whose whole log, read ``WRAPPER_START_SECONDS`` after it began running, holds lines and
    none of the wrapper's: its onstart script did not run (a host that does not run it, or a simulator that does not
    execute onstart scripts), and the job never will.
    """
    if not pump.without_wrapper or watch.status != api.STATUS_RUNNING or running_at is None or at is None:
        return None
    if at - running_at < WRAPPER_START_SECONDS:
        return None
    return WaitOutcome(
        EventKind.NEVER_RUNS,
        actual_status=watch.status,
        never_started=round(at - running_at),
        log_tail=tuple(pump.tail()),
    )


class Wait:
    """The state of one wait: the ``Watch``, the job log's ``LogPump``, the billing marks and the bid held.

    :param watch: what the wait waits for, and its deadlines.
    :param pump: the job's log reader (interval 0: no reads).
    :param log: where status changes and the job's lines go.
    :param marks: what earlier waits learnt of the rental (billing marks, bid, label), when it is known.
    :param hold_final: return the final read's lines in the outcome (``final_lines``) instead of logging them.
    """

    def __init__(
        self,
        watch: Watch,
        pump: job_logs.LogPump,
        log: Any,
        *,
        marks: Marks | None = None,
        hold_final: bool = False,
    ) -> None:
        marks = marks or Marks()
        self.watch = watch
        self.pump = pump
        self.log = log
        self.bid = marks.bid
        self.hold_final = hold_final
        self.read_at = marks.read_at
        self.running_at = marks.running_at
        self.stopped_at = marks.stopped_at
        self.ssh_host = marks.ssh_host

    @property
    def instance_id(self) -> int:
        return self.pump.instance_id

    def marks(self) -> Marks:
        """What this wait learnt of the rental so far (the bid only when it holds one)."""
        bid = self.bid if self.watch.hold_bid_up_to is not None else None
        return Marks(self.running_at, self.stopped_at, self.read_at, bid, self.watch.label, self.ssh_host)

    def step(self, hook: Any, seen: Observation, now: float) -> Any:
        """Take one read: the ``WaitOutcome`` that ends the wait, or None.

        A read that failed (after the hook's retries) is judged as the last status read; the caller ends the wait on a
        failure that retries cannot mend.
        """
        if seen.error is not None:
            self.log.warning(
                "Reading instance %s failed after retries (%s); still polling", self.instance_id, seen.error
            )
        elif not seen.gone:
            self.pump.began(seen.status == api.STATUS_RUNNING, now)
            yield from hook.renew_lease_flow(self.instance_id, self.watch, now, self.log)
            yield from self._hold_bid(hook, seen)
        outcome = self.watch.observe(
            now,
            status=seen.status,
            gone=seen.gone,
            unread=seen.error is not None,
            service_at=seen.at if seen.error is None else None,
        )
        if seen.error is None:
            self.running_at, self.stopped_at = lifecycle.billing_marks(
                self.running_at, self.stopped_at, self.watch.status, seen.at, self.read_at
            )
            self.read_at = seen.at
            self.ssh_host = self.ssh_host or seen.ssh_host
        if self.watch.changed:
            self.log.info("Instance %s: status %s", self.instance_id, self.watch.shown)
        if outcome is None and self.watch.reads_log() and self.pump.due(now):
            yield from job_logs.forward_flow(hook, self.pump, self.log)
            outcome = ended_while_waiting(self.watch, self.pump) or never_started(
                self.watch, self.pump, self.running_at, seen.at if seen.error is None else None
            )
        if outcome is None:
            return None
        final: tuple[str, ...] = ()
        if needs_final_read(outcome, self.pump):
            lines = yield from job_logs.forward_flow(hook, self.pump, self.log, final=True, hold_final=self.hold_final)
            final = tuple(job_logs.held_for_the_task(lines, self.instance_id)) if lines else ()
        if outcome.kind in ENDS_WITH_LOG and self.pump.interval > 0:
            outcome = outcome.with_job_end(self.pump.tail(), self.pump.follower.exit_status, not self.pump.off)
        return replace(outcome, instance_id=self.instance_id, final_lines=final, marks=self.marks())

    def _hold_bid(self, hook: Any, seen: Observation) -> Any:
        cap = self.watch.hold_bid_up_to
        if cap is None:
            return
        known = [float(bid) for bid in (seen.bid, self.bid) if api.is_positive_number(bid)]
        if not known:
            return
        self.bid = max(known)  # a listing may predate this wait's last raise
        raised = yield from hold_bid_flow(hook, self.instance_id, self.bid, seen.min_bid, cap, self.log)
        if raised is not None:
            self.bid = raised
