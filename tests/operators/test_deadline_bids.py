"""Deadline-aware interruptible rentals in the renting operator (operators/preemption.py, with a fake hook and clock).

Each sleep of the operator moves its clock at once (``use_clock``), so a poll interval of 10 minutes makes hours
pass in a few reads. ``deadlines.py``'s own rules are in tests/test_deadlines.py; the simulator runs the same paths
in tests/integration/test_deadlines.py.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from airflow_gpumarket import deadlines, lifecycle, outcome, task_history
from airflow_gpumarket._compat import TaskDeferred
from airflow_gpumarket.operators.preemption import Preemptions
from airflow_gpumarket.operators.spec import RentalSpec

from .renting_fakes import DONE, BidMarketHook, PreemptionsOfASession, ctx, fired, job, use_clock

LOG = logging.getLogger("tests.deadline_bids")
FIRST_RUN = "gpumarket: job started\nepoch 1\n"  # a preempted run: no exit status line
PREEMPTED = {"status": "job_failed", "actual_status": "stopped", "exit_status": None, "log_read": True}
HOUR = 3600.0
#: An hour's job without a checkpoint, polled every 10 minutes: bidding needs the job twice, two boots and a poll.
HOUR_JOB = {"expected_runtime": timedelta(hours=1), "poll_interval": 600, "log_interval": 600, "keepalive": None}


def test_rule_a_deadline_with_room_for_a_preemption_bids_and_says_until_when(monkeypatch, task_log):
    use_clock(monkeypatch)
    hook = BidMarketHook({2: [None, "running", DONE]}, destroy_worked=True)
    result = job(hook, interruptible=True, deadline=timedelta(hours=6), **HOUR_JOB).execute(ctx())
    assert result["job_status"] == "succeeded" and result["bid"] == 0.21  # min_bid + 5 %
    assert "bidding, and renting on demand from" in task_log()


def test_rule_after_a_preemption_that_leaves_no_room_the_next_rental_is_on_demand_and_says_why(monkeypatch, task_log):
    """Bidding needs 2 h 10 min and two boots; the preempted rental ran an hour of the 3 hours."""
    use_clock(monkeypatch)
    scripts = {2: [None, "running", "running", "running", "running", "stopped"], 3: ["running", DONE]}
    hook = BidMarketHook(scripts, destroy_worked=True)
    hook.log_text = FIRST_RUN
    result = job(hook, interruptible=True, deadline=timedelta(hours=3), **HOUR_JOB).execute(ctx())
    assert result["job_status"] == "succeeded" and result["instance_id"] == 1002
    assert "bid" not in result  # the second rental is on demand
    log = task_log()
    assert "Preemption 1 of at most 3" in log
    assert "one more preemption (~" in log and "would not fit; renting on demand from now on" in log
    assert hook.alive() == []


@pytest.mark.parametrize(
    ("deadline", "why"),
    [
        (timedelta(hours=1, minutes=30), "would not fit; renting on demand from now on"),
        (timedelta(minutes=40), "even finishing on demand (a boot and the 50 min left of the job"),
    ],
)
def test_rule_a_deadline_without_room_for_a_preemption_rents_on_demand_from_the_first_rental(
    monkeypatch, task_log, deadline, why
):
    use_clock(monkeypatch)
    hook = BidMarketHook({2: ["running", DONE]}, destroy_worked=True)
    op = job(hook, interruptible=True, deadline=deadline, expected_runtime=timedelta(minutes=50))
    result = op.execute(ctx())
    assert result["job_status"] == "succeeded" and "bid" not in result
    assert why in task_log()


def test_rule_a_retry_past_its_deadline_rents_on_demand_at_once_and_says_so(monkeypatch, task_log):
    clock = use_clock(monkeypatch)
    hook = BidMarketHook({2: ["running", DONE]}, destroy_worked=True)
    op = job(hook, interruptible=True, deadline=datetime.now(UTC) + timedelta(hours=1), **HOUR_JOB)
    clock.now += 2 * HOUR  # the first try failed; the retry starts after the deadline
    result = op.execute(ctx(try_number=2))
    assert result["job_status"] == "succeeded" and "bid" not in result
    assert "passed 1 h 0 min ago: renting on demand from now on" in task_log()


@pytest.mark.parametrize(
    "deadline",
    [
        lambda context, jinja_env: context["data_interval_end"] + timedelta(minutes=30),
        "{{ (data_interval_end + macros.timedelta(minutes=30)).isoformat() }}",
    ],
    ids=["callable", "template"],
)
def test_rule_a_deadline_of_the_run_is_the_same_for_every_retry(monkeypatch, task_log, deadline):
    """Done 30 minutes after the data interval: a retry an hour later finds it passed, whatever its own start."""
    try:
        from airflow.sdk import macros
    except ImportError:  # Airflow 2
        from airflow import macros  # type: ignore[no-redef]

    clock = use_clock(monkeypatch)
    hook = BidMarketHook({2: ["running", DONE]}, destroy_worked=True)
    op = job(hook, interruptible=True, deadline=deadline, **HOUR_JOB)
    context = ctx(try_number=2)
    context.update(data_interval_end=datetime.fromtimestamp(clock.now, UTC) - timedelta(hours=1), macros=macros)
    op.render_template_fields(context)
    result = op.execute(context)
    assert result["job_status"] == "succeeded" and "bid" not in result
    assert "passed 30 min ago: renting on demand from now on" in task_log()


def test_rule_a_deferred_task_resumed_after_a_preemption_counts_its_deadline_from_the_tries_start(
    monkeypatch, task_log
):
    """The trigger's event comes back an hour into a 3-hour deadline: the next rental is on demand, and defers."""
    clock = use_clock(monkeypatch)
    hook = BidMarketHook({2: ["stopped"], 3: ["running"]}, destroy_worked=True)
    hook.log_text = FIRST_RUN
    context = ctx()
    with pytest.raises(TaskDeferred) as deferred:
        job(hook, interruptible=True, deadline=timedelta(hours=3), deferrable=True, **HOUR_JOB).execute(context)
    assert deferred.value.trigger.rental["bid"] == 0.21
    clock.now += HOUR
    event = fired(deferred, outcome.EventKind.JOB_FAILED, **PREEMPTED)
    with pytest.raises(TaskDeferred) as again:  # Airflow resumes on a fresh operator object, with the same TI
        job(hook, interruptible=True, deadline=timedelta(hours=3), deferrable=True, **HOUR_JOB).execute_complete(
            context, event
        )
    assert again.value.trigger.rental["bid"] is None and again.value.trigger.instance_id == 1002
    assert "would not fit; renting on demand from now on" in task_log()
    assert hook.destroyed == [1001]


def preemptions(hook, **kwargs) -> PreemptionsOfASession:
    return PreemptionsOfASession(hook, LOG, **kwargs)


def preempted_rental(hook, *, ran: float = 0.0) -> lifecycle.Rental:
    """A bid rental on offer 2 that booted in 5 minutes and ran ``ran`` seconds before the market stopped it."""
    made = hook.create_instance(2, label="afgm-0123456789ab-1")["new_contract"]
    rental = lifecycle.Rental(made, 2, 0.5, "x", "afgm-0123456789ab-1", 0.0, bid=0.21, machine_id=502)
    rental.attempts = lifecycle.Attempts(tried=[2])
    rental.recorded_at, rental.running_at, rental.stopped_at = 1000.0, 1300.0, 1300.0 + ran
    return rental


def test_rule_on_preemption_wait_never_waits_past_the_last_moment_a_bid_may_start(monkeypatch):
    """Bidding needs 2 h 20 min (a measured 5 min boot); the deadline is 2 h 40 min away: 20 minutes of waiting."""
    clock = use_clock(monkeypatch)
    hook = BidMarketHook({2: ["stopped"]}, destroy_worked=True)
    deadline = timedelta(hours=2, minutes=40)
    handler = preemptions(hook, on_preemption="wait", max_outbid_wait=HOUR, deadline=deadline, **HOUR_JOB)
    watch = handler.after(preempted_rental(hook), PREEMPTED)
    assert watch is not None and hook.destroyed == []
    assert watch.outbid_wait_until == pytest.approx(clock.now + 20 * 60)


def test_rule_on_preemption_wait_does_not_wait_once_the_deadline_ends_the_bidding(monkeypatch, caplog):
    use_clock(monkeypatch)
    hook = BidMarketHook({2: ["stopped"]}, destroy_worked=True)
    handler = preemptions(hook, on_preemption="wait", max_outbid_wait=HOUR, deadline=timedelta(hours=2), **HOUR_JOB)
    rental = preempted_rental(hook)
    assert handler.after(rental, PREEMPTED) is None
    assert rental.attempts.on_demand and hook.destroyed == [1001]
    assert "Deadline: deadline" in caplog.text and "max_preemptions" not in caplog.text


@pytest.mark.parametrize(("checkpoint_dir", "bids"), [(None, False), ("/workspace/ckpt", True)])
def test_rule_only_a_checkpoint_carries_a_preempted_runs_work_into_the_decision(monkeypatch, checkpoint_dir, bids):
    """A 2-hour job that ran 90 minutes before its preemption, 2 hours before its deadline: with a checkpoint 78
    minutes count as done and bidding needs 1 h 6 min (2 h 24 min were they not counted); without one, all of the
    job is to be done again."""
    use_clock(monkeypatch)
    hook = BidMarketHook({2: ["stopped"]}, destroy_worked=True)
    handler = preemptions(
        hook,
        deadline=timedelta(hours=2),
        expected_runtime=timedelta(hours=2),
        checkpoint_dir=checkpoint_dir,
    )
    rental = preempted_rental(hook, ran=90 * 60)
    handler.after(rental, PREEMPTED)
    assert rental.attempts.on_demand is not bids
    credited = deadlines.credited_work(90 * 60) if checkpoint_dir else 0.0
    assert rental.attempts.work_done == credited


def test_rule_a_rental_preempted_again_after_winning_its_machine_back_is_credited_once():
    attempts = lifecycle.Attempts()
    attempts.credit_work(1001, 600.0)
    attempts.credit_work(1001, 1800.0)  # its first run again, with the wait and a second run: not counted twice
    attempts.credit_work(1002, 300.0)
    assert attempts.work_done == 900.0


@pytest.mark.parametrize(
    ("learned", "bids"),
    [
        (None, False),
        (task_history.Learned(None, image_gb=0.5, image_gb_max=0.5), True),
        (task_history.Learned(None, image_gb=0.5, image_gb_max=6.0), False),  # one boot as slow as 6 GB: cautious
    ],
)
def test_rule_the_deadline_expects_boots_of_the_largest_image_size_earlier_boots_imply(monkeypatch, learned, bids):
    """Bidding needs the hour's job twice, a poll and two boots: 2 h 45 min with the default 6 GB on a slow host,
    2 h 14 min with the 0.5 GB the task's earlier boots imply at most; the deadline is 2 h 30 min away."""
    use_clock(monkeypatch)
    hook = BidMarketHook({}, destroy_worked=True)
    spec = RentalSpec.of(job(hook, interruptible=True, deadline=timedelta(hours=2, minutes=30), **HOUR_JOB))
    handler = Preemptions(hook, LOG, spec, None, learned=learned)
    attempts = lifecycle.Attempts()
    handler.before_renting(attempts)
    assert attempts.on_demand is not bids


def test_the_nightly_examples_deadline_is_six_hours_after_its_data_interval():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "example_dags" / "example_gpumarket_nightly_deadline.py"
    spec = importlib.util.spec_from_file_location("nightly_example", path)
    assert spec and spec.loader
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    op = example.dag.get_task("fine_tune")
    end = datetime(2026, 3, 2, tzinfo=UTC)
    op.render_template_fields({"data_interval_end": end, **ctx()})
    assert op.deadline == end + timedelta(hours=6)
