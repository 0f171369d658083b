"""What a renting try does next, as pure rules: ``next_step`` from where the try stands, and how a job's end fails.

The operator's loop asks ``next_step`` after each rental and each wait, and does the one thing the step names
(``GpuMarketRentingBaseOperator._run``). No hook, no Airflow: the table in ``tests/operators/test_plan.py`` is the
whole behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from airflow_gpumarket import job_logs
from airflow_gpumarket.outcome import MAX_COST, MAX_RUNTIME, EventKind, WaitOutcome

if TYPE_CHECKING:
    from airflow_gpumarket.lifecycle import Rental
    from airflow_gpumarket.operators.spec import RentalSpec


@dataclass(frozen=True)
class Rent:
    """No rental is held: rent on the next untried offer (a retry's first takes back what an earlier try left)."""


@dataclass(frozen=True)
class Wait:
    """A rental is held and not waited for yet: wait for it (in the worker, or deferred to the triggerer).

    ``stages_in``: its data is still to be copied in, so the wait is for it to run, not for its job.
    """

    stages_in: bool


@dataclass(frozen=True)
class StageIn:
    """The rental runs and its data is still to be copied in; then ``wait`` for its job, or finish (no job)."""

    outcome: WaitOutcome
    wait: bool


@dataclass(frozen=True)
class FailOver:
    """The host failed before the job ran (never runs, boot timeout, preflight): destroy, remember, rent again."""

    outcome: WaitOutcome
    preflight: job_logs.PreflightFailure | None


@dataclass(frozen=True)
class AfterPreemption:
    """The market took the bid instance: wait for the bid, fail over, go on demand or fail (``Preemptions``)."""

    outcome: WaitOutcome


@dataclass(frozen=True)
class TimedOut:
    """The task's ``execution_timeout`` ended the wait, not the job's own limit: destroy and raise the timeout."""

    outcome: WaitOutcome


@dataclass(frozen=True)
class Finish:
    """The wait is over (or there is none, ``outcome`` None): the operator judges the outcome and ends the rental."""

    outcome: WaitOutcome | None


Step = Rent | Wait | StageIn | FailOver | AfterPreemption | TimedOut | Finish


def next_step(spec: RentalSpec, rental: Rental | None, outcome: WaitOutcome | None, *, limit: float | None) -> Step:
    """The try's next step, from its rental (None: none held) and how its last wait ended (None: not waited yet).

    ``limit``: the epoch second at which the task's ``execution_timeout`` ends, if it has one.
    """
    if rental is None:
        return Rent()
    if outcome is None:
        return Wait(stages_in(spec, rental)) if spec.terms.waits else Finish(None)
    if outcome.kind is EventKind.TIMEOUT and execution_timeout_binds(spec, rental, outcome, limit):
        return TimedOut(outcome)
    preflight = preflight_failed(spec, outcome)
    if outcome.kind in (EventKind.NEVER_RUNS, EventKind.BOOT_TIMEOUT) or preflight is not None:
        return FailOver(outcome, preflight)
    if outcome.kind is EventKind.REACHED and stages_in(spec, rental):
        return StageIn(outcome, wait=spec.terms.job)
    if rental.bid is not None and outcome.preempted:
        return AfterPreemption(outcome)
    return Finish(outcome)


def stages_in(spec: RentalSpec, rental: Rental) -> bool:
    """Whether the rental still waits for its data to be copied in before its job is watched."""
    plan = spec.data_plan
    return plan is not None and plan.active and not rental.staged and plan.stages_in(rental.attempts.source_id)


def execution_timeout_binds(spec: RentalSpec, rental: Rental, outcome: WaitOutcome, limit: float | None) -> bool:
    """Whether a wait's time limit is ``execution_timeout``'s (its epoch second ``limit``), not the job's own."""
    if outcome.limit in (MAX_RUNTIME, MAX_COST):
        return False
    own = spec.runtime_deadline(rental)
    return limit is not None and (own is None or limit <= own)


def preflight_failed(spec: RentalSpec, outcome: WaitOutcome) -> job_logs.PreflightFailure | None:
    """What the job wrapper's preflight found wrong with the host, when a job's wait ended on it; else None."""
    if outcome.kind is not EventKind.JOB_FAILED or spec.command is None:
        return None
    return job_logs.preflight_failure(list(outcome.log_tail), outcome.exit_status)


class Failure(str, Enum):  # noqa: UP042 - StrEnum is 3.11+; Airflow 2.11 runs on 3.10
    """Why a watched job did not succeed, in the order a failure is named (the operator raises one per kind)."""

    MAX_COST = "max_cost"  # its estimated cost reached max_cost
    CREDIT = "credit"  # no exit status, and the account's credit ran out: the service stopped it
    HOST_LOST = "host_lost"  # the host failed under the running job
    NOT_STARTED = "not_started"  # its staged data did not arrive: the wrapper never started it
    JOB_FAILED = "job_failed"  # the job itself failed
    OTHER = "other"  # the wait ended otherwise (gone, lease expired, a wait that failed)


def failure(outcome: WaitOutcome, *, not_started: bool, credit_ran_out: bool) -> Failure:
    """Why ``outcome`` is a failure. ``credit_ran_out``: the account's credit is $0 or less (asked only when it
    matters: ``may_be_credit``)."""
    if outcome.limit == MAX_COST:
        return Failure.MAX_COST
    if may_be_credit(outcome) and credit_ran_out:
        return Failure.CREDIT
    if outcome.host_lost:
        return Failure.HOST_LOST
    if outcome.kind is EventKind.JOB_FAILED:
        return Failure.NOT_STARTED if not_started else Failure.JOB_FAILED
    return Failure.OTHER


def may_be_credit(outcome: WaitOutcome) -> bool:
    """Whether a failed job's end may be the account's credit running out (no exit status was read)."""
    return outcome.limit != MAX_COST and outcome.exit_status is None
