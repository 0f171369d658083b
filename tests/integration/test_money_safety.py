"""The failure matrix: whatever fails, no instance is left alive and none is rented twice.

Each test drives the real operators against the simulator (onstart scripts really run) and ends by reading the
simulator's ledger. Waiting for a condition (an instance to appear, a job to start) uses a bounded loop; time
itself is driven through the simulator's clock speed.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from types import SimpleNamespace

import pytest

from airflow_gpumarket import lifecycle
from airflow_gpumarket._compat import AirflowException
from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
from airflow_gpumarket.lifecycle import task_key
from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
from airflow_gpumarket.operators.result import summary as rental_summary
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator
from airflow_gpumarket.operators.session import RentalSession
from airflow_gpumarket.operators.spec import RentalSpec

from .conftest import AIRFLOW_2, POLL, alive, task_states

FILTERS = {"num_gpus": {"gte": 1}}


def context(try_number: int = 1, run_id: str = "run-1") -> dict:
    return {"run_id": run_id, "ti": SimpleNamespace(try_number=try_number, map_index=-1)}


def job(**kwargs) -> GpuMarketRunJobOperator:
    kwargs.setdefault("offer_filters", FILTERS)
    kwargs.setdefault("command", "echo ok")
    kwargs.setdefault("deferrable", False)
    return GpuMarketRunJobOperator(task_id="job", image="img", poll_interval=POLL, **kwargs)


def cheapest_offers(n: int, filters=FILTERS) -> list[dict]:
    return GpuMarketHook().search_offers(filters, order=[["dph_total", "asc"]], limit=n)


@pytest.fixture(autouse=True)
def healthy_market(sim):
    """The world seeds some failing hosts among the cheap offers; each test here sets its own failures."""
    for offer in cheapest_offers(12):
        sim.set_offer_fate(offer["id"], "running")


def wait_until(predicate, timeout: float = 20.0):
    """Bounded wait for a condition another thread brings about."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


def assert_no_double_rental(sim) -> None:
    offers = Counter(i["offer_id"] for i in sim.state()["instances"])
    assert max(offers.values(), default=0) == 1, offers


def test_job_exiting_non_zero_fails_the_task_and_destroys_the_instance(sim):
    with pytest.raises(AirflowException, match="failed: the instance is in status 'stopped'"):
        job(command="echo about to fail; exit 7").execute(context())
    (instance,) = sim.state()["instances"]
    assert sim.onstart_result(instance["id"])["exit_code"] == 7
    assert alive(sim) == []


def test_job_exiting_zero_stops_its_instance_from_inside_and_the_task_destroys_it_after_the_final_read(sim, task_log):
    result = job(command="echo computed 42").execute(context())
    assert result["job_status"] == "succeeded"
    # Compute billing ended with the instance's own key (a stop); the task read the log, then destroyed it.
    calls = [
        (r["method"], r["key"], "request_logs" in r["path"])
        for r in sim.requests()
        if r["path"].startswith("/api/v0/instances/")
    ]
    stop, read, destroy = ("PUT", "instance", False), ("PUT", "account", True), ("DELETE", "account", False)
    assert stop in calls and calls.index(stop) < calls.index(read) < calls.index(destroy)
    assert f"[instance {result['instance_id']}] computed 42" in task_log()
    assert alive(sim) == []


def test_with_log_interval_zero_a_job_exiting_zero_destroys_its_own_instance(sim):
    result = job(command="echo done", log_interval=0).execute(context())
    assert result["job_status"] == "succeeded"
    # The instance destroyed itself with its own key; nothing read its log.
    destroys = [r for r in sim.requests() if r["method"] == "DELETE" and r["status"] == 200]
    assert destroys and destroys[0]["key"] == "instance"
    assert alive(sim) == []


@pytest.mark.parametrize("fate", ["exited", "unknown", "offline"])
def test_rule_failed_host_destroys_and_fails_over_to_the_next_offer(sim, fate):
    first, second = cheapest_offers(2)
    sim.set_offer_fate(first["id"], fate)
    result = job().execute(context())
    assert result["offer_id"] == second["id"] and result["job_status"] == "succeeded"
    instances = sim.state()["instances"]
    assert [i["offer_id"] for i in instances] == [first["id"], second["id"]]
    assert alive(sim) == []


def test_all_offers_failing_fails_the_task_cleanly(sim):
    offers = cheapest_offers(3)
    for offer in offers:
        sim.set_offer_fate(offer["id"], "exited")
    with pytest.raises(AirflowException, match="after trying 3 offer"):
        job(max_offer_attempts=3).execute(context())
    assert [i["offer_id"] for i in sim.state()["instances"]] == [o["id"] for o in offers]
    assert alive(sim) == []


def test_offer_taken_between_search_and_create_moves_to_the_next_offer(sim):
    stale = cheapest_offers(3)
    sim.vanish_offer(stale[0]["id"])  # someone else rents it after our search
    op = job()
    op.hook.search_offers = lambda *args, **kwargs: stale  # type: ignore[method-assign]
    result = op.execute(context())
    assert result["offer_id"] == stale[1]["id"]
    assert [i["offer_id"] for i in sim.state()["instances"]] == [stale[1]["id"]]
    assert alive(sim) == []


def test_create_dropped_after_processing_finds_the_instance_by_label_instead_of_renting_again(sim):
    sim.set_faults([{"endpoint": "create_instance", "kind": "drop", "times": 1, "after": True}])
    assert job().execute(context())["job_status"] == "succeeded"
    assert len(sim.state()["instances"]) == 1
    assert alive(sim) == []


def test_5xx_and_429_storms_during_create_polling_and_destroy(sim):
    sim.set_faults(
        [
            {"endpoint": "create_instance", "kind": "status", "status": 429, "times": 2, "retry_after": 0},
            {"endpoint": "create_instance", "kind": "status", "status": 502, "times": 1},
            {"endpoint": "search_offers", "kind": "status", "status": 503, "times": 2},
            {"endpoint": "get_instance", "kind": "status", "status": 503, "probability": 0.4},
            {"endpoint": "get_instance", "kind": "status", "status": 429, "probability": 0.2},
            {"endpoint": "destroy_instance", "kind": "status", "status": 500, "times": 2},
        ]
    )
    result = job(command="echo storm").execute(context())
    assert result["job_status"] == "succeeded"
    assert len(sim.state()["instances"]) == 1
    assert_no_double_rental(sim)
    assert alive(sim) == []


#: The live service's rate limiting: plain-text 429s without Retry-After, from buckets without burst.
PLAIN_TEXT_429S = [
    {
        "kind": "rate_limit",
        "endpoint": ["get_instance", "list_instances_v1", "destroy_instance", "create_instance"],
        "capacity": 1,
        "per_second": 8,
        "body": "text",
        "retry_after": False,
    }
]
#: The same at one token a second: a destroy follows the poll that saw the job exit by milliseconds, so the limit
#: surely bites (at 8/s a slow machine can space a short job's few calls out enough never to meet it).
SURE_PLAIN_TEXT_429S = [{**PLAIN_TEXT_429S[0], "per_second": 1}]


def test_live_plain_text_429s_a_job_still_succeeds_with_nothing_alive(sim):
    sim.set_faults(SURE_PLAIN_TEXT_429S)
    result = job(command="echo paced").execute(context())
    assert result["job_status"] == "succeeded"
    assert any(r["status"] == 429 for r in sim.state()["requests"])  # the limits did bite
    assert_no_double_rental(sim)
    assert alive(sim) == []


def test_live_plain_text_429s_a_failing_job_still_fails_and_is_destroyed(sim):
    sim.set_faults(PLAIN_TEXT_429S)
    with pytest.raises(AirflowException, match="exit"):
        job(command="exit 3").execute(context())
    assert alive(sim) == []


def test_live_plain_text_429s_deferrable_jobs_succeed_and_fail_with_nothing_alive(example_dag, sim):
    sim.set_faults(SURE_PLAIN_TEXT_429S)
    assert example_dag("gpm_deferred_job_ok").test().state == "success"
    assert example_dag("gpm_deferred_job_fails").test().state == "failed"
    assert any(r["status"] == 429 for r in sim.state()["requests"])
    assert alive(sim) == []


def test_live_wrong_key_is_an_auth_error_and_rents_nothing(sim, monkeypatch):
    from airflow_gpumarket.exceptions import GpuMarketAuthError

    monkeypatch.setenv("AIRFLOW_CONN_GPUMARKET_DEFAULT", sim.conn_uri.replace(sim.api_key, "revoked-key"))
    with pytest.raises(GpuMarketAuthError):
        job().execute(context())
    assert sim.state()["instances"] == []


def test_destroy_that_keeps_failing_fails_loudly_with_the_instance_id(sim):
    sim.set_faults([{"endpoint": "destroy_instance", "kind": "status", "status": 500, "probability": 1.0}])
    with pytest.raises(AirflowException, match=r"DESTROY FAILED for instance \d+"):
        job(command="exit 1").execute(context())
    sim.clear_faults()
    (instance,) = alive(sim)
    GpuMarketHook().destroy_instance(instance["id"])
    assert alive(sim) == []


def _run_in_thread(op, ctx):
    outcome: dict = {}

    def target():
        if AIRFLOW_2:
            # Airflow 2's ExecutorSafeguard keeps its callers in a thread-local that only the main thread has: a
            # worker calls execute() there, this test from a thread of its own.
            from airflow.models.baseoperator import ExecutorSafeguard

            ExecutorSafeguard._sentinel.callers = {}
        try:
            outcome["result"] = op.execute(ctx)
        except BaseException as exc:  # noqa: BLE001 - the test inspects whatever ended the task
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def test_on_kill_mid_boot_destroys_the_instance(sim):
    sim.set_speed(5)  # a 60-300 s boot now takes 12-60 s: long enough to kill it mid-boot
    # The buckets refill on the simulated clock: at 5x the search that follows the fixture's own would wait longer
    # than the connection's millisecond retries do (this test is about on_kill, not rate limits).
    sim.set_rate_limits(False)
    try:
        op = job()
        thread, outcome = _run_in_thread(op, context())
        instance = wait_until(lambda: sim.state()["instances"])[0]
        assert instance["actual_status"] in (None, "loading")
        op.on_kill()
        thread.join(timeout=20)
        assert not thread.is_alive() and "killed" in str(outcome.get("error"))
    finally:
        sim.set_speed(600)
        sim.set_rate_limits(True)
    assert alive(sim) == []


def test_on_kill_mid_job_destroys_the_instance_and_stops_the_job(sim):
    op = job(command="echo started; sleep 60")
    thread, outcome = _run_in_thread(op, context())
    instance = wait_until(lambda: sim.state()["instances"])[0]
    wait_until(lambda: (sim.onstart_result(instance["id"]) or {}).get("running"))
    op.on_kill()
    thread.join(timeout=20)
    assert not thread.is_alive() and "error" in outcome
    assert alive(sim) == []
    wait_until(lambda: not sim.onstart_result(instance["id"])["running"])  # the job process is killed too


def rented_by_a_dead_try(ctx: dict, command: str) -> int:
    """What try 1 made before its worker vanished: same label key, same job script."""
    first = job(command=command)
    label = lifecycle.make_label(task_key(first, ctx), time.time() + 3600)
    body = RentalSpec.of(first).creation_body(label=label, base_url=first.hook.settings.base_url)
    return first.hook.create_instance(cheapest_offers(1)[0]["id"], **body)["new_contract"]


def test_retry_after_the_worker_died_adopts_the_earlier_instance_instead_of_renting_again(sim):
    ctx = context(try_number=2)
    made = rented_by_a_dead_try(ctx, "echo adopted")
    # Booting, running or already stopped by its wrapper after exit 0 when the retry looks: adopted all the same.
    result = job(command="echo adopted").execute(ctx)
    assert result["instance_id"] == made and result["job_status"] == "succeeded"
    assert [i["id"] for i in sim.state()["instances"]] == [made]
    assert alive(sim) == []


def test_retry_after_the_job_ended_unseen_reports_its_success_without_running_it_again(sim):
    ctx = context(try_number=2)
    made = rented_by_a_dead_try(ctx, "echo trained")
    wait_until(lambda: sim.onstart_result(made) and not sim.onstart_result(made)["running"])
    wait_until(lambda: sim.state()["instances"][0]["actual_status"] == "stopped")  # the wrapper stopped it
    result = job(command="echo trained").execute(ctx)
    assert result["instance_id"] == made and result["job_status"] == "succeeded"
    assert [i["id"] for i in sim.state()["instances"]] == [made]  # nothing rented, nothing run twice
    assert alive(sim) == []


def test_adopted_instance_counts_elapsed_time_and_cost_from_its_own_start():
    """8 minutes of running before the worker died are part of the job's time and cost, and of its deadlines."""
    ctx = context(try_number=2)
    op = job(command="echo adopted", max_runtime=3600)
    started = time.time() - 480
    earlier = {
        "id": 5,
        "label": lifecycle.make_label(task_key(op, ctx), time.time() + 3600),
        "actual_status": "running",
        "start_date": started,
        "dph_total": 0.5,
        "offer_id": 3,
    }
    hook = SimpleNamespace(list_instances=lambda **_: [earlier], service_now=time.time)
    session = RentalSession(hook, op.log, RentalSpec.of(op), ctx, task=op)
    rental = session.rent()
    assert rental.created_at == started
    assert session.spec.watch(rental, stages_in=False, now=time.time()).deadline == started + op.boot_timeout + 3600
    summary = rental_summary(rental, "running", hook.service_now)
    assert summary["elapsed_seconds"] == pytest.approx(480, abs=5)
    assert summary["estimated_cost"] == pytest.approx(0.5 * 480 / 3600, abs=0.001)


def test_retry_destroys_an_earlier_instance_that_will_never_run_and_rents_anew(sim):
    ctx = context(try_number=2)
    op = job()
    first_offer, _ = cheapest_offers(2)
    sim.set_offer_fate(first_offer["id"], "offline")
    label = lifecycle.make_label(task_key(op, ctx), time.time() + 3600)
    made = op.hook.create_instance(first_offer["id"], image="img", label=label)["new_contract"]
    sim.advance(600)  # the earlier instance has ended offline by now
    result = job().execute(ctx)
    assert result["instance_id"] != made and result["job_status"] == "succeeded"
    assert alive(sim) == []


def test_create_instance_operator_hands_over_a_running_instance_and_teardown_destroys_it(sim):
    from airflow_gpumarket.operators.teardown import GpuMarketDestroyInstanceOperator

    created = GpuMarketCreateInstanceOperator(
        task_id="create", offer_filters=FILTERS, image="img", poll_interval=POLL, deferrable=False
    ).execute(context())
    assert created["actual_status"] == "running" and created["ssh_port"]
    assert "instance_api_key" not in created
    assert [i["id"] for i in alive(sim)] == [created["instance_id"]]
    GpuMarketDestroyInstanceOperator(task_id="destroy", instance_id=created).execute(context())
    assert GpuMarketDestroyInstanceOperator(task_id="again", instance_id=created).execute(context())["already_gone"]
    assert alive(sim) == []


@pytest.mark.parametrize(
    ("state", "left_alive"), [("failed", 0), ("deferred", 1)], ids=["marked-failed", "handed-over"]
)
def test_deferred_tasks_trigger_killed_by_a_user_destroys_the_instance(sim, monkeypatch, state, left_alive):
    """Airflow 3.3's on_kill: a task marked failed loses its instance; a trigger handed over elsewhere keeps it."""
    import asyncio
    from types import SimpleNamespace

    from airflow_gpumarket.triggers import instances
    from airflow_gpumarket.triggers.instances import GpuMarketInstanceStatusTrigger

    offer = cheapest_offers(1)[0]
    made = GpuMarketHook().create_instance(offer["id"], image="img", label="afgm-0123456789ab-9999999999")
    trigger = GpuMarketInstanceStatusTrigger(instance_id=made["new_contract"], destroy_on_kill=True)
    trigger.task_instance = SimpleNamespace(dag_id="d", run_id="r", task_id="t", map_index=-1, try_number=1)
    monkeypatch.setattr(instances, "_task_instance_now", lambda ti: (state, 1, None))
    monkeypatch.setattr(instances.task_xcom, "set_value", lambda ti, key, value: None)  # the rentals page's record
    asyncio.run(trigger.on_kill())
    assert len(alive(sim)) == left_alive


def test_deferrable_job_succeeds_through_the_trigger(example_dag, sim):
    run = example_dag("gpm_deferred_job_ok").test()
    assert run.state == "success", task_states(run)
    assert alive(sim) == []


def test_deferrable_job_failure_fails_the_task_and_destroys(example_dag, sim):
    run = example_dag("gpm_deferred_job_fails").test()
    assert run.state == "failed"
    assert len(sim.state()["instances"]) == 1
    assert alive(sim) == []


def run_into_execution_timeout(dag):
    """dag.test() of a one-task DAG whose task hits its execution_timeout. Airflow 2.11's dag.test() records the
    task's failure, then lets AirflowTaskTimeout (a BaseException there) escape before it ends the run: the run is
    read back from the database, still running."""
    try:
        return dag.test()
    except BaseException as exc:
        if not (AIRFLOW_2 and type(exc).__name__ == "AirflowTaskTimeout"):
            raise
        return dag.get_last_dagrun(include_externally_triggered=True)


def test_execution_timeout_destroys_the_instance(example_dag, sim):
    run = run_into_execution_timeout(example_dag("gpm_job_execution_timeout"))
    assert AIRFLOW_2 or run.state == "failed"
    assert list(task_states(run).values()) == ["failed"]
    assert alive(sim) == []


def test_execution_timeout_while_deferred_fails_the_task_and_destroys_the_instance(example_dag, sim):
    """Airflow times each run of the task's code on its own; a deferred wait must carry execution_timeout."""
    started = time.monotonic()
    run = run_into_execution_timeout(example_dag("gpm_deferred_job_execution_timeout"))
    assert AIRFLOW_2 or run.state == "failed", task_states(run)
    assert list(task_states(run).values()) == ["failed"], task_states(run)
    assert time.monotonic() - started < 60  # the job sleeps 120 s: it did not run to its end
    (instance,) = sim.state()["instances"]
    # Its job was stopped by the destroy (no exit status yet, or SIGTERM's 143), never ran to exit 0.
    assert instance["destroyed"] and sim.onstart_result(instance["id"])["exit_code"] in (None, 143)
    assert alive(sim) == []


def test_deferring_passes_what_is_left_of_execution_timeout_as_timeout_and_trigger_deadline(sim):
    from datetime import UTC, datetime, timedelta

    from airflow_gpumarket._compat import TaskDeferred

    op = job(command="sleep 60", deferrable=True, execution_timeout=timedelta(seconds=60))
    ctx = context()
    start = datetime.now(UTC) - timedelta(seconds=10)
    ctx["ti"].start_date = start  # this try started 10 s ago
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    assert deferred.value.timeout.total_seconds() == pytest.approx(50, abs=5)
    # The trigger's own deadline is the earlier of max_runtime's and execution_timeout's.
    assert deferred.value.trigger.watch["deadline"] == pytest.approx(start.timestamp() + 60, abs=1)
    op.session.kill()  # the deferred try still holds it: on_kill destroys it
    assert alive(sim) == []


def test_failure_callback_destroys_what_the_task_rented_when_airflow_fails_it_elsewhere(sim):
    """A lost worker: the scheduler fails the task after its heartbeat timeout and the DAG processor runs the
    task's failure callbacks on a freshly parsed operator; no provider code ran in the dead worker."""
    from airflow_gpumarket.operators.guard import destroy_rentals_on_failure

    seen = []
    ctx = context()
    dead = job(command="sleep 60")
    label = lifecycle.make_label(task_key(dead, ctx), time.time() + 3600)
    made = dead.hook.create_instance(cheapest_offers(1)[0]["id"], image="img", label=label)["new_contract"]
    other = dead.hook.create_instance(cheapest_offers(2)[1]["id"], image="img", label="someone-else")["new_contract"]

    parsed = job(command="sleep 60", on_failure_callback=seen.append)
    assert parsed.on_failure_callback == [seen.append, destroy_rentals_on_failure]  # the user's first, kept
    for callback in parsed.on_failure_callback:
        callback({**ctx, "task": parsed})
    assert seen and [i["id"] for i in alive(sim)] == [other]
    parsed.hook.destroy_instance(other)
    assert made not in [i["id"] for i in alive(sim)]


def test_the_worker_keeps_the_jobs_lease_alive_through_the_label(sim):
    op = job(command="sleep 3", keepalive=3)  # renewed once less than 2 s of the lease is left
    result = op.execute(context())
    assert result["job_status"] == "succeeded"
    renewals = [r for r in sim.requests() if r["method"] == "PUT" and r["status"] == 200 and r["key"] != "instance"]
    assert renewals, "the lease was never renewed"
    assert alive(sim) == []


def _trigger_failure(error: str) -> tuple[str, str, type[BaseException]]:
    """How Airflow resumes a task whose trigger timed out or crashed: next_method, its error, what it raises."""
    if AIRFLOW_2:
        from airflow.exceptions import TaskDeferralError

        reason = "Trigger/execution timeout" if error == "timeout" else "Trigger failure"
        return "__fail__", reason, TaskDeferralError
    from airflow.models.trigger import TRIGGER_FAIL_REPR, TriggerFailureReason
    from airflow.sdk.exceptions import TaskDeferralError, TaskDeferralTimeout

    if error == "timeout":
        return TRIGGER_FAIL_REPR, TriggerFailureReason.TRIGGER_TIMEOUT, TaskDeferralTimeout
    return TRIGGER_FAIL_REPR, "Trigger failure", TaskDeferralError


@pytest.mark.parametrize("error", ["timeout", "trigger crashed"])
def test_deferred_task_whose_trigger_times_out_or_crashes_destroys_the_instance(sim, error):
    """execution_timeout while deferred with no triggerer running (or a crashed trigger) fails the task through
    Airflow's __fail__ path, which never reaches execute_complete: Airflow then runs the task's failure callbacks,
    and the renting operator's own one destroys what the task rented."""
    from airflow_gpumarket._compat import TaskDeferred

    ctx = context()
    with pytest.raises(TaskDeferred):
        job(command="sleep 60", deferrable=True).execute(ctx)
    assert len(alive(sim)) == 1
    next_method, reason, expected = _trigger_failure(error)
    resumed = job(command="sleep 60", deferrable=True)  # Airflow resumes on a fresh operator object
    with pytest.raises(expected):
        resumed.resume_execution(next_method, {"error": reason}, ctx)
    for callback in resumed.on_failure_callback:  # what Airflow does next when no retry is left
        callback({**ctx, "task": resumed})
    assert alive(sim) == []


@pytest.mark.parametrize("paced", [True, False], ids=["paced machine-wide", "unpaced, as from many hosts"])
def test_live_destroy_storm_destroys_everything_without_giving_up(sim, monkeypatch, paced):
    """Many mapped tasks failing at once share one DELETE budget (1 per 3 s, no burst, penalties on refusal).
    Paced machine-wide (``rate_limit_scale``), the destroys take turns and draw no 429; unpaced (hosts that share
    one address see no common slot file), they draw 429s and keep trying until every one is done.

    The clock runs 30x and the hook's waits are scaled down 30x with it (1-16 s become 0.033-0.53 s), so this is
    the live situation, compressed."""
    import concurrent.futures
    import json

    speed = 30.0
    conn = json.loads(sim.connection_env()["AIRFLOW_CONN_GPUMARKET_DEFAULT"])
    conn["extra"] = {"retry_min_wait": 1 / speed, "retry_max_wait": 60 / speed, "max_retries": 5, "timeout": 5}
    conn["extra"]["rate_limit_scale"] = sim.rate_limit_scale  # the creates below run at the fixture's speed
    monkeypatch.setenv("AIRFLOW_CONN_GPUMARKET_DEFAULT", json.dumps(conn))
    hook = GpuMarketHook()
    made = [
        hook.create_instance(o["id"], image="img", label=f"storm-{o['id']}")["new_contract"] for o in cheapest_offers(8)
    ]
    sim.set_speed(speed)
    # Paced as for a budget half the bucket's compressed one: slots 0.32 s of real time apart against the bucket's
    # 0.1 s, so that a request delayed by a loaded machine (make test runs two legs at once) still lands after it.
    conn["extra"]["rate_limit_scale"] = speed / 2 if paced else 0
    monkeypatch.setenv("AIRFLOW_CONN_GPUMARKET_DEFAULT", json.dumps(conn))
    monkeypatch.setattr("airflow_gpumarket.api.retry.RATE_LIMIT_BACKOFF_CAP_SECONDS", 16 / speed)
    monkeypatch.setattr("airflow_gpumarket.api.retry.RATE_LIMIT_PATIENCE_SECONDS", 900 / speed)

    with concurrent.futures.ThreadPoolExecutor(len(made)) as pool:
        results = list(pool.map(lambda i: GpuMarketHook().destroy_instance(i), made))

    assert all(r.get("success") for r in results)
    assert alive(sim) == []
    refused = sum(1 for r in sim.state()["requests"] if r["status"] == 429 and r["method"] == "DELETE")
    assert (refused == 0) if paced else (refused > 0)


def test_a_bid_below_the_min_bid_fails_the_task_and_leaves_nothing_billing(sim):
    """The service makes the instance (stopped, billing storage) and answers success=false with its id: the hook
    destroys it before the task fails."""
    offer = cheapest_offers(1)[0]
    task = job(offer_filters={"id": {"eq": offer["id"]}}, price=offer["min_bid"] / 2)

    with pytest.raises(Exception, match="yet made instance .* It has been destroyed: nothing bills"):
        task.execute(context())

    assert alive(sim) == []
    assert [i["actual_status"] for i in sim.state()["instances"]] == ["stopped"]
