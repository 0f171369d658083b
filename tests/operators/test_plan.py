"""The plan (operators/plan.py) as a table: where a try stands in, its next step out; no hook, no Airflow run.

Each row names the step the old behaviour's nearest neighbour would take instead, and the test checks the plan does
not take it: a plan changed to that neighbour fails the row.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from airflow_gpumarket import lifecycle
from airflow_gpumarket.job_script import PREFLIGHT_FAILED_LINE, PREFLIGHT_FAILED_STATUS
from airflow_gpumarket.operators import plan
from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator
from airflow_gpumarket.operators.spec import RentalSpec
from airflow_gpumarket.outcome import MAX_COST, MAX_RUNTIME, EventKind, WaitOutcome

COMMON = {"offer_filters": {"num_gpus": {"gte": 1}}, "image": "img"}
DURABLE = {"checkpoint_dir": "/ckpt", "checkpoint_uri": "bucket/ckpt", "cloud_integration": "s3"}
CREATED = 1000.0  # the rental's creation, epoch seconds
BOOT, RUNTIME = 900.0, 3600.0  # boot_timeout and max_runtime: the job's own limit ends at CREATED + BOOT + RUNTIME


def spec(kind: str, *, durable: bool = False) -> RentalSpec:
    """A task's spec: ``job`` (RunJob), ``create`` (CreateInstance, waits until running) or ``create_nowait``."""
    data = DURABLE if durable else {}
    if kind == "job":
        op = GpuMarketRunJobOperator(
            task_id="t", command="train", boot_timeout=BOOT, max_runtime=RUNTIME, **COMMON, **data
        )
    else:
        op = GpuMarketCreateInstanceOperator(
            task_id="t", wait_for_running=kind == "create", onstart="echo hi", boot_timeout=BOOT, **COMMON
        )
    return RentalSpec.of(op)


def rental(*, bid: float | None = None, staged: bool = False) -> lifecycle.Rental:
    held = lifecycle.Rental(7, 2, 0.5, "g", "afgm-x", CREATED, bid=bid)
    held.staged = staged
    return held


def ended(kind: EventKind, **fields) -> WaitOutcome:
    return WaitOutcome(kind, instance_id=7, **fields)


PREEMPTED = {"actual_status": "stopped", "exit_status": None, "log_read": True}
PREFLIGHT = {
    "actual_status": "stopped",
    "exit_status": PREFLIGHT_FAILED_STATUS,
    "log_read": True,
    "log_tail": (PREFLIGHT_FAILED_LINE.format(check="gpus", seen="1 GPU(s) visible, 2 promised"),),
}
OWN_LIMIT = CREATED + BOOT + RUNTIME
BID, DEMAND = 0.2, None

ROWS = [
    # (case, spec, rental, outcome, execution_timeout's end, expected step, the neighbour it must not be)
    ("nothing held: rent", spec("job"), None, None, None, plan.Rent, plan.Wait),
    ("held, not waited: wait", spec("job"), rental(), None, None, plan.Wait, plan.Finish),
    ("created, no wait asked: finish", spec("create_nowait"), rental(), None, None, plan.Finish, plan.Wait),
    ("created, waits: wait", spec("create"), rental(), None, None, plan.Wait, plan.Finish),
    ("reached, no data: finish", spec("create"), rental(), ended(EventKind.REACHED), None, plan.Finish, plan.StageIn),
    (
        "reached, data to copy in: stage in",
        spec("job", durable=True),
        rental(),
        ended(EventKind.REACHED),
        None,
        plan.StageIn,
        plan.Finish,
    ),
    (
        "reached, data staged already: finish",
        spec("job", durable=True),
        rental(staged=True),
        ended(EventKind.REACHED),
        None,
        plan.Finish,
        plan.StageIn,
    ),
    ("never runs: fail over", spec("job"), rental(), ended(EventKind.NEVER_RUNS), None, plan.FailOver, plan.Finish),
    ("boot timeout: fail over", spec("job"), rental(), ended(EventKind.BOOT_TIMEOUT), None, plan.FailOver, plan.Finish),
    (
        "preflight failed: fail over",
        spec("job"),
        rental(),
        ended(EventKind.JOB_FAILED, **PREFLIGHT),
        None,
        plan.FailOver,
        plan.Finish,
    ),
    (
        "bid stopped unannounced: after preemption",
        spec("job"),
        rental(bid=BID),
        ended(EventKind.JOB_FAILED, **PREEMPTED),
        None,
        plan.AfterPreemption,
        plan.Finish,
    ),
    (
        "on demand stopped unannounced: finish (a failure)",
        spec("job"),
        rental(bid=DEMAND),
        ended(EventKind.JOB_FAILED, **PREEMPTED),
        None,
        plan.Finish,
        plan.AfterPreemption,
    ),
    (
        "bid outbid past max_outbid_wait: after preemption",
        spec("job", durable=True),
        rental(bid=BID, staged=True),
        ended(EventKind.PREEMPTED, actual_status="stopped", waited=True),
        None,
        plan.AfterPreemption,
        plan.Finish,
    ),
    (
        "bid job failed with its status: finish",
        spec("job"),
        rental(bid=BID),
        ended(EventKind.JOB_FAILED, actual_status="stopped", exit_status=2, log_read=True),
        None,
        plan.Finish,
        plan.AfterPreemption,
    ),
    ("job succeeded: finish", spec("job"), rental(), ended(EventKind.JOB_SUCCEEDED), None, plan.Finish, plan.FailOver),
    (
        "execution_timeout before the job's own limit: timed out",
        spec("job"),
        rental(),
        ended(EventKind.TIMEOUT, actual_status="running"),
        OWN_LIMIT - 1,
        plan.TimedOut,
        plan.Finish,
    ),
    (
        "a deadline after the job's own limit: finish",
        spec("job"),
        rental(),
        ended(EventKind.TIMEOUT, actual_status="running"),
        OWN_LIMIT + 1,
        plan.Finish,
        plan.TimedOut,
    ),
    (
        "max_runtime, even with execution_timeout sooner: finish",
        spec("job"),
        rental(),
        ended(EventKind.TIMEOUT, actual_status="running", limit=MAX_RUNTIME),
        OWN_LIMIT - 1,
        plan.Finish,
        plan.TimedOut,
    ),
    (
        "max_cost: finish",
        spec("job"),
        rental(bid=BID),
        ended(EventKind.TIMEOUT, actual_status="running", limit=MAX_COST),
        OWN_LIMIT - 1,
        plan.Finish,
        plan.TimedOut,
    ),
    (
        "a created instance's time limit under execution_timeout: timed out",
        spec("create"),
        rental(),
        ended(EventKind.TIMEOUT, actual_status="loading"),
        CREATED + 60,
        plan.TimedOut,
        plan.Finish,
    ),
    ("gone: finish", spec("job"), rental(bid=BID), ended(EventKind.GONE), None, plan.Finish, plan.AfterPreemption),
    ("a wait that failed: finish", spec("job"), rental(), ended(EventKind.ERROR), None, plan.Finish, plan.FailOver),
]


@pytest.mark.parametrize(
    ("the_spec", "held", "outcome", "limit", "expected", "neighbour"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_the_plan_takes_each_step_from_where_the_try_stands(the_spec, held, outcome, limit, expected, neighbour):
    step = plan.next_step(the_spec, held, outcome, limit=limit)
    assert isinstance(step, expected) and not isinstance(step, neighbour)
    if outcome is not None and expected is not plan.Rent:
        assert getattr(step, "outcome", outcome) == outcome  # the step carries the outcome it was decided on


def test_every_step_of_the_plan_is_in_the_table():
    assert {row[5] for row in ROWS} == set(plan.Step.__args__)


def test_a_stage_in_then_waits_for_a_job_and_finishes_a_created_instance():
    reached = ended(EventKind.REACHED)
    job_step = plan.next_step(spec("job", durable=True), rental(), reached, limit=None)
    assert job_step == plan.StageIn(reached, wait=True)
    durable_create = RentalSpec.of(
        GpuMarketCreateInstanceOperator(task_id="t", command="x", **COMMON, **DURABLE)
    )  # a created instance's data, with no job to watch after
    assert plan.next_step(durable_create, rental(), reached, limit=None) == plan.StageIn(reached, wait=False)


def test_a_wait_is_for_the_instance_to_run_while_its_data_is_still_to_be_copied_in_else_for_the_job():
    assert plan.next_step(spec("job", durable=True), rental(), None, limit=None) == plan.Wait(stages_in=True)
    assert plan.next_step(spec("job", durable=True), rental(staged=True), None, limit=None) == plan.Wait(False)
    assert plan.next_step(spec("job"), rental(), None, limit=None) == plan.Wait(stages_in=False)


def test_a_preflight_failure_is_named_in_the_step_and_only_a_command_has_one():
    failed = ended(EventKind.JOB_FAILED, **PREFLIGHT)
    step = plan.next_step(spec("job"), rental(), failed, limit=None)
    assert isinstance(step, plan.FailOver) and step.preflight is not None
    assert plan.preflight_failed(spec("create"), failed) is None  # onstart, not the provider's wrapper


@pytest.mark.parametrize(
    ("outcome", "not_started", "credit", "expected"),
    [
        (ended(EventKind.TIMEOUT, limit=MAX_COST), False, True, plan.Failure.MAX_COST),
        (ended(EventKind.JOB_FAILED, actual_status="stopped", log_read=True), False, True, plan.Failure.CREDIT),
        (ended(EventKind.JOB_FAILED, actual_status="exited"), False, False, plan.Failure.HOST_LOST),
        (
            ended(EventKind.JOB_FAILED, actual_status="stopped", exit_status=1, log_read=True),
            True,
            False,
            plan.Failure.NOT_STARTED,
        ),
        (
            ended(EventKind.JOB_FAILED, actual_status="stopped", exit_status=1, log_read=True),
            False,
            True,
            plan.Failure.JOB_FAILED,
        ),
        (ended(EventKind.LEASE_EXPIRED), False, False, plan.Failure.OTHER),
        (ended(EventKind.TIMEOUT, limit=MAX_RUNTIME, actual_status="running"), False, False, plan.Failure.OTHER),
    ],
)
def test_a_failed_jobs_cause_is_named_in_order(outcome, not_started, credit, expected):
    assert plan.failure(outcome, not_started=not_started, credit_ran_out=credit) is expected


def test_the_credit_is_asked_only_when_no_exit_status_was_read():
    assert plan.may_be_credit(ended(EventKind.JOB_FAILED, actual_status="stopped"))
    assert not plan.may_be_credit(replace(ended(EventKind.JOB_FAILED), exit_status=1))
    assert not plan.may_be_credit(ended(EventKind.TIMEOUT, limit=MAX_COST))
