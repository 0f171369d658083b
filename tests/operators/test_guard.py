"""Every failure path ends what a task rented: the session's (an error, on_kill, a lost create answer) and
destroy_rentals_on_failure's (operators/guard.py: a lost worker); a duplicate of an ambiguous create is swept, and a
retry adopts what an earlier try left (operators/adoption.py), or destroys it."""

from __future__ import annotations

import time
from datetime import datetime
from types import SimpleNamespace

import pytest

from airflow_gpumarket import lifecycle
from airflow_gpumarket._compat import AirflowException, TaskDeferred
from airflow_gpumarket.exceptions import GpuMarketCreateRefusedError, GpuMarketServerError
from airflow_gpumarket.lifecycle import task_key
from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
from airflow_gpumarket.operators.guard import destroy_rentals_on_failure
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

from .renting_fakes import DONE, EXIT_0, BidMarketHook, FakeHook, ctx, earlier_try_left, job
from .test_session import session_of


def test_an_error_while_waiting_destroys_the_instance():
    hook = FakeHook({1: ["running"]})
    op = job(hook)
    hook.find_instance = lambda instance_id: (_ for _ in ()).throw(RuntimeError("worker bug"))
    with pytest.raises(RuntimeError, match="worker bug"):
        op.execute(ctx())
    assert hook.alive() == []


def test_on_kill_while_waiting_destroys_at_once():
    hook = FakeHook({1: ["running"]})
    op = job(hook)
    reads = hook.find_instance

    def read_then_kill(instance_id):
        op.on_kill()  # SIGTERM arrives while the job runs
        return reads(instance_id)

    hook.find_instance = read_then_kill
    with pytest.raises(AirflowException, match="killed"):
        op.execute(ctx())
    assert hook.destroyed[0] == 1001 and hook.alive() == []


def test_on_kill_during_a_create_whose_answer_never_came_finds_the_instance_by_its_label():
    hook = FakeHook({1: ["running"]})
    op = job(hook)
    create = hook.create_instance

    def create_then_die(offer_id, **body):
        create(offer_id, **body)  # the server made it...
        op.on_kill()  # ...and the task was killed before the answer arrived
        raise KeyboardInterrupt

    hook.create_instance = create_then_die
    with pytest.raises(KeyboardInterrupt):
        op.execute(ctx())
    assert hook.destroyed == [1001]


def kill_while_the_create_is_recorded(monkeypatch, op) -> None:
    """``op.on_kill()`` runs after the create answered and before its rental is built.

    As SIGTERM's handler does in the task's own thread (Airflow 3.3 calls on_kill and lets execute go on), or an
    on_kill from another thread, while the create's budget reservation is attached to the new instance.
    """
    from airflow_gpumarket.operators.budget import Budget

    created, kills = Budget.created, [op.on_kill]

    def killed_meanwhile(budget, instance_id):
        while kills:  # once: on_kill's own settling attaches the reservation too
            kills.pop()()  # destroys the instance, and the guard forgets it
        created(budget, instance_id)

    monkeypatch.setattr(Budget, "created", killed_meanwhile)


def test_on_kill_while_a_new_instance_is_recorded_fails_the_task_as_killed(monkeypatch):
    hook = FakeHook({1: ["running", DONE]})
    op = job(hook)
    kill_while_the_create_is_recorded(monkeypatch, op)
    with pytest.raises(AirflowException, match="killed while waiting for instance 1001"):
        op.execute(ctx())
    assert hook.destroyed[0] == 1001 and hook.alive() == []


def test_on_kill_while_a_new_instance_is_recorded_hands_nothing_over(monkeypatch):
    hook = FakeHook({1: ["running"]})
    op = GpuMarketCreateInstanceOperator(
        task_id="create", offer_filters={"num_gpus": {"gte": 1}}, image="img", wait_for_running=False
    )
    op.__dict__["hook"] = hook
    kill_while_the_create_is_recorded(monkeypatch, op)
    with pytest.raises(AirflowException, match="killed while waiting for instance 1001"):
        op.execute(ctx())  # not the summary of an instance that on_kill destroyed
    assert hook.destroyed[0] == 1001 and hook.alive() == []


def test_a_destroy_that_keeps_failing_fails_loudly_with_the_instance_id():
    hook = FakeHook({1: ["running", "stopped"]}, destroy_fails=True)
    with pytest.raises(AirflowException, match="DESTROY FAILED for instance 1001: it may still be billing"):
        job(hook).execute(ctx())


def test_retry_adopts_a_running_earlier_instance_and_destroys_the_other_leftovers():
    hook = FakeHook({1: ["running"], 2: ["running", DONE]})
    op = job(hook)
    key = task_key(op, ctx())
    for offer_id in (1, 2):  # two instances of earlier tries (one a duplicate of an ambiguous create)
        hook.create_instance(offer_id, label=lifecycle.make_label(key, time.time() + 600))
    for instance in hook.instances.values():
        instance["actual_status"] = "running"
    result = op.execute(ctx(try_number=2))
    assert result["instance_id"] == 1002  # the newest is kept, the older destroyed
    assert hook.destroyed == [1001, 1002] and len(hook.instances) == 2  # nothing rented anew


def test_retry_keeps_the_success_of_a_job_that_ended_after_the_worker_died_instead_of_running_it_again(task_log):
    hook = FakeHook({1: ["stopped"]})  # the wrapper stopped the instance after the job exited 0
    op = job(hook)
    earlier_try_left(hook, op, "stopped", "gpumarket: job started\nsaved model.pt\n" + EXIT_0)
    result = op.execute(ctx(try_number=2))
    assert result["instance_id"] == 1001 and result["job_status"] == "succeeded"
    assert len(hook.instances) == 1 and hook.alive() == []  # nothing rented anew; the stopped one destroyed
    assert "adopting instance 1001" in task_log()


def test_retry_runs_again_a_job_that_failed_before_the_worker_died():
    hook = FakeHook({1: ["running", DONE], 2: ["stopped"]})
    op = job(hook)
    earlier_try_left(hook, op, "stopped", "gpumarket: job started\ngpumarket: job exited with status 1\n")
    result = op.execute(ctx(try_number=2))
    assert result["instance_id"] == 1002 and result["job_status"] == "succeeded"
    assert hook.destroyed[0] == 1001 and hook.alive() == []


def test_retry_runs_again_a_job_whose_stopped_instance_has_no_exit_status_in_its_log():
    hook = FakeHook({1: ["running", DONE], 2: ["stopped"]})
    op = job(hook)
    earlier_try_left(hook, op, "stopped", "gpumarket: job started\nepoch 1\n")  # stopped by hand, mid-job
    assert op.execute(ctx(try_number=2))["instance_id"] == 1002
    assert hook.destroyed[0] == 1001 and hook.alive() == []


def test_retry_runs_again_when_the_log_of_a_stopped_earlier_instance_cannot_be_read(task_log):
    hook = FakeHook({1: ["running", DONE], 2: ["stopped"]})
    op = job(hook)
    earlier_try_left(hook, op, "stopped", EXIT_0)
    reads = hook.get_instance_logs

    def unreadable_once(instance_id, **kw):
        if instance_id == 1001:
            raise GpuMarketServerError("logs: HTTP 503 after retries", status_code=503)
        return reads(instance_id, **kw)

    hook.get_instance_logs = unreadable_once
    assert op.execute(ctx(try_number=2))["instance_id"] == 1002
    assert hook.destroyed[0] == 1001 and hook.alive() == []
    assert "Cannot read the log of instance 1001 to see how its job ended" in task_log()


def test_retry_of_an_instance_waiter_does_not_adopt_a_stopped_instance_nor_read_its_log():
    hook = FakeHook({1: ["running"], 2: ["stopped"]})
    op = GpuMarketCreateInstanceOperator(
        task_id="make", offer_filters={"num_gpus": {"gte": 1}}, image="img", poll_interval=0.001
    )
    op.__dict__["hook"] = hook
    hook.get_instance = lambda instance_id: hook.find_instance(instance_id)  # the details it returns
    earlier_try_left(hook, op, "stopped", EXIT_0)
    assert op.execute(ctx(try_number=2))["instance_id"] == 1002
    assert hook.destroyed == [1001] and hook.log_reads == []


def test_failure_callback_destroys_what_a_lost_worker_rented():
    hook = FakeHook({1: ["running"]})
    with pytest.raises(TaskDeferred):
        job(hook, deferrable=True).execute(ctx())
    parsed = job(hook)  # what the DAG processor parsed
    context = ctx()
    pushed = []
    context["ti"].xcom_push = lambda **kwargs: pushed.append(kwargs)
    destroy_rentals_on_failure({**context, "task": parsed})
    assert hook.alive() == []
    # No XCom from there: the DAG processor's supervisor cannot take one, and its parsing would stall.
    assert pushed == []


@pytest.mark.parametrize("kind", ["classic", "taskflow"])
def test_failure_callback_destroys_what_a_lost_worker_of_a_mapped_task_rented(monkeypatch, kind):
    """The DAG processor hands the callback the mapped task itself (never unmapped)."""
    from airflow.providers.common.compat.sdk import DAG

    from airflow_gpumarket.decorators.gpumarket import gpumarket_task
    from airflow_gpumarket.hooks import gpumarket

    hook = FakeHook({1: ["running"], 2: ["running"]})
    used: list[str] = []

    class Hook:
        default_conn_name = "gpumarket_default"

        def __new__(cls, conn_id):
            used.append(conn_id)
            return hook

    monkeypatch.setattr(gpumarket, "GpuMarketHook", Hook)
    common = {"offer_filters": {"num_gpus": {"gte": 1}}, "image": "img", "gpumarket_conn_id": "gpu"}
    with DAG(dag_id="mapped", start_date=datetime(2026, 1, 1), schedule=None):
        if kind == "classic":
            mapped = GpuMarketRunJobOperator.partial(
                task_id="job", on_failure_callback=destroy_rentals_on_failure, **common
            ).expand(command=["a", "b"])
        else:

            def square(x: int) -> int:
                return x * x

            mapped = gpumarket_task(**common)(square).expand(x=[1, 2]).operator
    key = lifecycle.rental_key("mapped", "run-1", mapped.task_id, 1)
    for offer, label_key in ((1, lifecycle.rental_key("mapped", "run-1", mapped.task_id, 0)), (2, key)):
        hook.create_instance(offer, label=lifecycle.make_label(label_key, 4_000_000_000))
    ti = SimpleNamespace(try_number=1, map_index=1, start_date=None)
    destroy_rentals_on_failure({"run_id": "run-1", "ti": ti, "task": mapped})
    assert hook.destroyed == [1002]  # map index 1's instance only
    assert used == ["gpu"]  # the connection of the partial() arguments


def test_a_create_that_made_an_instance_and_then_failed_destroys_it_through_the_in_flight_guard():
    """The answer to a create was lost after the server made the instance (the hook's retries gave up): the task
    fails, and the guard finds the instance by the label it was being created with."""
    hook = FakeHook({1: ["running"]})
    create = hook.create_instance

    def made_then_lost(offer_id, **body):
        create(offer_id, **body)
        raise GpuMarketServerError("create_instance: HTTP 502 after retries", status_code=502)

    hook.create_instance = made_then_lost
    with pytest.raises(GpuMarketServerError):
        job(hook).execute(ctx())
    assert hook.destroyed == [1001] and hook.alive() == []


def test_a_refused_bid_whose_instance_the_hook_could_not_destroy_fails_and_the_guard_destroys_it():
    hook = BidMarketHook({1: ["stopped"], 2: ["running"]}, destroy_worked=False)
    with pytest.raises(GpuMarketCreateRefusedError):
        job(hook, interruptible=True).execute(ctx())
    assert hook.destroyed == [1001] and hook.alive() == []  # found by the label it was created with


def test_an_ambiguous_create_destroys_the_duplicate_the_retried_request_left():
    hook = FakeHook({1: ["running", DONE]})
    create = hook.create_instance

    def twice(offer_id, **body):
        create(offer_id, **body)  # the first request landed after all...
        made = create(offer_id, **body)  # ...and the hook's re-send made a second one
        return {**made, "ambiguous": True}

    hook.create_instance = twice
    result = job(hook).execute(ctx())
    assert result["instance_id"] == 1002 and hook.destroyed[0] == 1001 and hook.alive() == []


def test_an_ambiguous_create_sweeps_again_when_the_wait_ends_for_a_duplicate_that_landed_late():
    hook = FakeHook({1: ["running", DONE], 2: ["running"]})
    create = hook.create_instance
    op = job(hook)

    def ambiguous(offer_id, **body):
        return {**create(offer_id, **body), "ambiguous": True}

    reads = hook.find_instance

    def late_duplicate(instance_id):
        if len(hook.instances) == 1:  # the delayed first request lands while the job runs
            create(2, label=hook.instances[1001]["label"])
        return reads(instance_id)

    hook.create_instance, hook.find_instance = ambiguous, late_duplicate
    op.execute(ctx())
    assert 1002 in hook.destroyed and hook.alive() == []


def test_the_sweep_after_an_ambiguous_create_spares_a_kept_checkpoint_source():
    hook = FakeHook({1: ["running"]})
    session = session_of(hook)
    label = lifecycle.make_label(session.key, time.time() + 600)
    for _ in range(3):  # the paused source, the rental, and a duplicate the lost answer left
        hook.create_instance(1, label=label)
    session.attempts.source_id = 1001
    session.check_duplicates(SimpleNamespace(instance_id=1002, ambiguous=True))
    assert hook.alive() == [1001, 1002]


def test_a_failure_destroys_the_kept_checkpoint_source_with_the_rental():
    hook = FakeHook({1: ["running"]})
    session = session_of(hook)
    hook.create_instance(1, label="a")
    hook.create_instance(1, label="b")
    session.attempts.source_id, session.instance_id = 1001, 1002
    session.failed(RuntimeError("boom"))
    assert hook.alive() == []


def _unreachable(*args, **kwargs):
    from airflow_gpumarket.exceptions import GpuMarketTransportError

    raise GpuMarketTransportError("list_instances: GET /api/v0/instances/ got no response", request_sent=False)


class _Lines:
    """The task's log, as lines by level."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def __getattr__(self, level: str):
        return lambda message, *args, **kwargs: self.lines.append((level, message % args if args else message))


def test_failure_callback_after_a_first_try_that_rented_nothing_lists_nothing(monkeypatch):
    hook = FakeHook({1: ["running"]})
    op = job(hook)
    hook.search_offers = _unreachable  # the service is down: the search fails before anything is rented
    context = ctx()
    with pytest.raises(Exception, match="got no response"):
        op.execute(context)
    hook.list_instances = lambda **kwargs: pytest.fail("the callback listed instances although nothing was rented")
    log = _Lines()
    monkeypatch.setattr(type(op), "log", property(lambda self: log))
    destroy_rentals_on_failure({**context, "task": op})
    assert log.lines == [("info", "The task failed before renting anything: no instance to look for")]


def test_failure_callback_whose_listing_fails_says_so_in_one_line_and_names_the_reaper(monkeypatch):
    hook = FakeHook({1: ["running"]})
    with pytest.raises(TaskDeferred):
        job(hook, deferrable=True).execute(ctx())
    hook.list_instances = _unreachable
    parsed, log = job(hook), _Lines()
    monkeypatch.setattr(type(parsed), "log", property(lambda self: log))
    destroy_rentals_on_failure({**ctx(), "task": parsed})  # nothing raised: no second traceback
    ((level, line),) = log.lines
    assert level == "error" and "got no response" in line and "GpuMarketReapOrphansOperator" in line


def test_failure_callback_on_a_retry_that_rented_nothing_still_looks_for_an_earlier_try_s_instance():
    hook = FakeHook({1: ["running"]})
    with pytest.raises(TaskDeferred):
        job(hook, deferrable=True).execute(ctx())  # try 1 rented, and its worker was lost
    retry, reachable = job(hook), (hook.search_offers, hook.list_instances, hook.find_instance)
    hook.search_offers = hook.list_instances = hook.find_instance = _unreachable  # down while the retry runs
    context = ctx(try_number=2)
    with pytest.raises(Exception, match="got no response"):
        retry.execute(context)
    assert retry.session is not None and retry.session.instance_id is None  # it failed before it took anything over
    hook.search_offers, hook.list_instances, hook.find_instance = reachable  # and back for its failure callback
    destroy_rentals_on_failure({**context, "task": retry})
    assert hook.alive() == []
