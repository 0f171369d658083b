"""Deadline-aware bidding as pure rules: whether an interruptible job's next rental may still bid, and why not.

A bid rental is worth it while the time left to the ``deadline`` can absorb one more preemption and still finish on
demand after it: ``time left >= finishing on demand + one preemption``, where

- finishing on demand is a boot, a restore (with a checkpoint) and the work left;
- one preemption is the time to notice it (a poll interval), the work it loses (all of the work left without a
  checkpoint; at most ``CHECKPOINT_INTERVAL`` with one), and another boot and restore.

Once that no longer holds, every rental of the try is on demand. When the time left meets these estimates, the
deadline holds whatever the market does: a preemption comes, at worst, with the time to recover from it.

What it assumes (documented in docs/howto/interruptible.md):

- work: ``expected_runtime`` when given, else the median of the task's earlier successful runs (``learned``), else
  the job's ``max_runtime``; without any, only boots count;
- with ``checkpoint_dir`` the job writes a checkpoint at least every ``CHECKPOINT_INTERVAL``, so a preempted run
  counts as done for its running time less that interval and a restore (``credited_work``); without one nothing
  counts as done;
- a boot takes what the last rental of the try took to run, else what ``offer_cost.boot_seconds`` expects of the
  image on a host of unknown (slow) download speed;
- a restore of the checkpoint takes ``RESTORE_SECONDS``.

Seconds are the worker's clock, as for ``execution_timeout``. No Airflow and no transport imports; not imported when
a DAG file is parsed.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from airflow_gpumarket import offer_cost

#: With ``checkpoint_dir``, the most work one preemption is taken to lose (the job checkpoints at least this often).
CHECKPOINT_INTERVAL = 10 * 60.0
#: With ``checkpoint_dir``, how long a new rental is taken to need before its job resumes from the checkpoint.
RESTORE_SECONDS = 2 * 60.0


def deadline_at(deadline: dt.datetime | dt.timedelta, started: float) -> float:
    """The deadline as an epoch second: a datetime as it is, a timedelta counted from ``started`` (the try's start)."""
    if isinstance(deadline, dt.timedelta):
        return started + deadline.total_seconds()
    return deadline.timestamp()


def expected_work(expected_runtime: float | None, learned: float | None, max_runtime: float | None) -> float:
    """The job's expected work in seconds: the first known of ``expected_runtime``, ``learned`` and ``max_runtime``."""
    for seconds in (expected_runtime, learned, max_runtime):
        if seconds is not None:
            return float(seconds)
    return 0.0


def credited_work(ran: float) -> float:
    """What a preempted run of a checkpointing job counts as done: its running time less a restore and one interval."""
    return max(0.0, ran - RESTORE_SECONDS - CHECKPOINT_INTERVAL)


def expected_boot(measured: float | None, image_size_gb: float | None) -> float:
    """Seconds from create to running: ``measured`` on this try when known, else the image's boot on a slow host."""
    if measured is not None and measured > 0:
        return measured
    model = offer_cost.CostModel(expected_runtime=0.0)
    if image_size_gb is not None:
        model = offer_cost.CostModel(expected_runtime=0.0, image_size_gb=image_size_gb)
    return offer_cost.boot_seconds({}, model)


@dataclass(frozen=True)
class Estimate:
    """What the rest of the job is expected to take, in seconds (see the module docstring)."""

    work: float  # the work left
    boot: float
    notice: float  # how long a preemption may go unseen: a poll interval
    checkpointed: bool

    @property
    def restore(self) -> float:
        return RESTORE_SECONDS if self.checkpointed else 0.0

    @property
    def lost(self) -> float:
        """The work one preemption may lose."""
        return min(self.work, CHECKPOINT_INTERVAL) if self.checkpointed else self.work

    @property
    def on_demand(self) -> float:
        """Finishing on demand: a boot, a restore and the work left."""
        return self.boot + self.restore + self.work

    @property
    def preemption(self) -> float:
        """What one more preemption costs: noticing it, the work it loses, a new boot and restore."""
        return self.notice + self.lost + self.boot + self.restore


def estimate(
    work: float,
    *,
    done: float,
    checkpointed: bool,
    boot_seen: float | None,
    image_size_gb: float | None,
    notice: float,
) -> Estimate:
    """The estimate of a job of ``work`` seconds: ``done`` counts only with a checkpoint (see ``expected_boot``)."""
    return Estimate(
        work=max(0.0, work - done) if checkpointed else work,
        boot=expected_boot(boot_seen, image_size_gb),
        notice=notice,
        checkpointed=checkpointed,
    )


@dataclass(frozen=True)
class Decision:
    """Whether the next rental may bid, until when a bid may start (or a stopped one wait), and why, in a sentence."""

    bids: bool
    bid_until: float
    why: str


def decide(deadline: float, now: float, estimate: Estimate) -> Decision:
    """Whether the next rental may still bid; ``deadline`` and ``now`` are epoch seconds (see the module docstring)."""
    left = deadline - now
    bid_until = deadline - estimate.on_demand - estimate.preemption
    when = _when(deadline, now)
    work, on_demand = _span(estimate.work), _span(estimate.on_demand)
    finishing = f"finishing on demand (a boot and the {work} left of the job, ~{on_demand})"
    if left <= 0:
        return Decision(False, bid_until, f"deadline {when} passed {_span(-left)} ago: renting on demand from now on")
    head = f"deadline {when} in {_span(left)}: "
    if left < estimate.on_demand:
        return Decision(
            False,
            bid_until,
            head + f"even {finishing} may not fit; renting on demand from now on, the fastest way left",
        )
    if now > bid_until:
        return Decision(
            False,
            bid_until,
            head + f"one more preemption (~{_span(estimate.preemption)}) plus {finishing} would not fit; "
            "renting on demand from now on",
        )
    return Decision(
        True,
        bid_until,
        head + f"one more preemption (~{_span(estimate.preemption)}) plus {finishing} fit; bidding, and renting "
        f"on demand from {_when(bid_until, now)} on",
    )


def _when(epoch: float, now: float) -> str:
    """An epoch second in UTC, to the minute; with its date when it is not within a day of ``now``."""
    moment = dt.datetime.fromtimestamp(epoch, dt.UTC)
    return moment.strftime("%H:%M UTC" if abs(epoch - now) < 86400 else "%Y-%m-%d %H:%M UTC")


def _span(seconds: float) -> str:
    """A duration rounded to the minute ("1 h 12 min", "25 min"), or to the second under a minute."""
    if seconds < 60:
        return f"{max(0, round(seconds))} s"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min"
