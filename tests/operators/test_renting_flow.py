"""The renting flow with a mocked hook: every path that must destroy what the task rented, and the ones that must not.

The simulator tests (tests/integration) run the same paths end to end; these pin down the operator's own decisions
(which instance, when, with which message) without a server. Each instance has a script of statuses that its
successive reads return; ``GONE`` means the read and the list agree it no longer exists; ``DONE`` is a job that
exited 0 and stopped its instance (the job wrapper's way when the task reads the log), its log ending in status 0.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from fake_flows import FlowsOverMethods

from airflow_gpumarket import lifecycle
from airflow_gpumarket._compat import AirflowException, AirflowTaskTimeout, TaskDeferred
from airflow_gpumarket.exceptions import GpuMarketCreateRefusedError, GpuMarketServerError
from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
from airflow_gpumarket.operators.guard import destroy_rentals_on_failure
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

GONE = "gone"
DONE = "done"
EXIT_0 = "gpumarket: job exited with status 0\n"


class FakeHook(FlowsOverMethods):
    """Offers 1..n; instances 1001, 1002, ... whose reads follow ``scripts[offer_id]`` (the last entry repeats)."""

    def __init__(self, scripts: dict[int, list], *, destroy_fails: bool = False) -> None:
        self.scripts = scripts
        self.instances: dict[int, dict] = {}
        self.reads: dict[int, list] = {}
        self.destroyed: list[int] = []
        self.labels: list[tuple[int, str]] = []
        self.destroy_fails = destroy_fails
        self.settings = SimpleNamespace(base_url="https://api.example.com")
        self.log_text = ""  # what every logs read answers
        self.log_reads: list[tuple[int, bool]] = []  # (instance id, daemon log)

    def search_offers(self, filters, *, offer_type="ondemand", order=None, limit=None):
        return [{"id": offer_id, "dph_total": 0.5, "gpu_name": "RTX 4090"} for offer_id in self.scripts]

    def create_instance(self, offer_id, **body):
        instance_id = 1000 + len(self.instances) + 1
        self.instances[instance_id] = {"id": instance_id, "offer_id": offer_id, "label": body.get("label")}
        self.reads[instance_id] = list(self.scripts[offer_id])
        return {"success": True, "new_contract": instance_id}

    def _status(self, instance_id):
        script = self.reads[instance_id]
        status = script.pop(0) if len(script) > 1 else script[0]
        if status == DONE:
            if not self.log_text.endswith(EXIT_0):
                self.log_text += EXIT_0
            return "stopped"
        return status

    def find_instance(self, instance_id):
        if instance_id in self.destroyed:
            return None
        status = self._status(instance_id)
        return None if status == GONE else {**self.instances[instance_id], "actual_status": status}

    def list_instances(self, *, label=None, ids=None):
        alive = [i for i in self.instances.values() if i["id"] not in self.destroyed]
        return [i for i in alive if label is None or i["label"] == label]

    def label_instance(self, instance_id, label):
        self.labels.append((instance_id, label))
        self.instances[instance_id]["label"] = label
        return {"success": True}

    def destroy_instance(self, instance_id):
        if self.destroy_fails:
            raise GpuMarketServerError("destroy_instance: HTTP 503 after retries", status_code=503)
        already = instance_id in self.destroyed
        self.destroyed.append(instance_id)
        return {"success": True, "already_gone": already}

    def get_instance_logs(self, instance_id, *, tail=None, daemon_logs=None, retry=True, key_digests=()):
        self.log_reads.append((instance_id, bool(daemon_logs)))
        return self.log_text

    def alive(self) -> list[int]:
        return [i for i in self.instances if i not in self.destroyed]


def ctx(try_number: int = 1) -> dict:
    ti = SimpleNamespace(try_number=try_number, map_index=-1, start_date=datetime.now(UTC))
    return {"run_id": "run-1", "ti": ti}


def job(hook: FakeHook, **kwargs) -> GpuMarketRunJobOperator:
    kwargs.setdefault("command", "python train.py")
    kwargs.setdefault("poll_interval", 0.001)
    op = GpuMarketRunJobOperator(task_id="job", offer_filters={"num_gpus": {"gte": 1}}, image="img", **kwargs)
    op.__dict__["hook"] = hook  # the cached_property, replaced
    return op


def test_job_that_exits_zero_succeeds_and_its_stopped_instance_is_destroyed_after_the_final_read(task_log):
    hook = FakeHook({1: [None, "loading", "running", DONE]})
    hook.log_text = "gpumarket: job started\nepoch 1\nsaved model.pt\n"
    destroy = hook.destroy_instance
    hook.destroy_instance = lambda i: (hook.log_reads.append(("destroy", i)), destroy(i))[1]
    result = job(hook).execute(ctx())
    assert result["job_status"] == "succeeded"
    assert hook.log_reads == [(1001, False), ("destroy", 1001)] and hook.alive() == []
    log = task_log()
    assert "[instance 1001] epoch 1" in log and "[instance 1001] saved model.pt" in log


def test_with_log_interval_zero_a_job_that_exits_zero_destroys_itself_and_needs_no_destroy():
    hook = FakeHook({1: [None, "loading", "running", GONE]})
    op = job(hook, log_interval=0)
    assert "m=DELETE" in op._job_script("https://api.example.com")  # the wrapper's destroy on success
    result = op.execute(ctx())
    assert result["job_status"] == "succeeded" and hook.destroyed == [] and hook.log_reads == []


def test_a_job_stopped_without_a_readable_exit_status_is_not_a_success_and_is_destroyed(task_log):
    hook = FakeHook({1: ["running", "stopped"]})

    def unreadable(instance_id, **kw):
        raise GpuMarketServerError("logs: HTTP 503 after retries", status_code=503)

    hook.get_instance_logs = unreadable
    with pytest.raises(AirflowException, match="no exit status could be read from its log"):
        job(hook).execute(ctx())
    assert hook.alive() == []
    assert "The final read of the log of instance 1001 failed after retries" in task_log()


def test_a_job_whose_instance_was_destroyed_by_someone_else_is_not_a_success():
    hook = FakeHook({1: ["running", GONE]})  # the wrapper stops after exit 0 here: gone is not its doing
    with pytest.raises(AirflowException, match="destroyed before the end of its job could be read"):
        job(hook).execute(ctx())


def test_job_that_fails_is_destroyed_and_fails_the_task():
    hook = FakeHook({1: ["running", "stopped"]})
    hook.log_text = "gpumarket: job exited with status 1\n"
    with pytest.raises(AirflowException, match="failed: the instance is in status 'stopped'.*exit status 1"):
        job(hook).execute(ctx())
    assert hook.destroyed == [1001] and hook.alive() == []


def test_a_failed_job_names_its_exit_status_and_last_lines_read_before_the_destroy():
    hook = FakeHook({1: ["running", "stopped"]})
    hook.log_text = "epoch 1 loss 0.9\nTraceback: boom\ngpumarket: job exited with status 3\n"
    destroy = hook.destroy_instance
    hook.destroy_instance = lambda i: (hook.log_reads.append(("destroy", i)), destroy(i))[1]
    with pytest.raises(AirflowException, match="(?s)exit status 3.*Traceback: boom"):
        job(hook, log_interval=3600).execute(ctx())
    assert hook.log_reads == [(1001, False), ("destroy", 1001)]


def test_the_jobs_output_reaches_the_task_log_while_it_runs_each_line_once(task_log):
    hook = FakeHook({1: ["running", "running", "running", "running", "stopped"]})
    texts = iter(["a\n", "a\nb\n", "a\nb\nc\n", "a\nb\nc\nd\n" + EXIT_0])
    hook.get_instance_logs = lambda instance_id, **kw: next(texts)
    job(hook, log_interval=0.001).execute(ctx())
    assert re.findall(r"\[instance 1001\] (\w+)", task_log()) == ["a", "b", "c", "d", "gpumarket"]


def test_log_interval_zero_reads_nothing_whether_the_job_succeeds_or_fails():
    hook = FakeHook({1: ["running", GONE]})
    job(hook, log_interval=0).execute(ctx())
    hook = FakeHook({1: ["running", "stopped"]})
    with pytest.raises(AirflowException):
        job(hook, log_interval=0).execute(ctx())
    assert hook.log_reads == []


def test_the_host_daemons_log_is_read_before_an_instance_that_never_ran_is_given_up():
    hook = FakeHook({1: [None, "offline"], 2: ["running", DONE]})
    hook.log_text = "machine 9 is offline\n"
    job(hook).execute(ctx())
    assert hook.log_reads == [(1001, True), (1002, False)]  # the daemon's log, then the job's final read


@pytest.mark.parametrize("fate", ["exited", "unknown", "offline"])
def test_host_that_never_runs_is_destroyed_before_the_next_offer_is_tried(fate):
    hook = FakeHook({1: [None, fate], 2: ["running", DONE]})
    result = job(hook).execute(ctx())
    assert result["instance_id"] == 1002 and hook.destroyed == [1001, 1002]


def test_boot_timeout_destroys_and_fails_over_and_the_last_failure_names_every_reason():
    hook = FakeHook({1: ["loading"], 2: ["loading"]})
    with pytest.raises(AirflowException, match=r"after trying 2 offer\(s\).*did not reach running") as caught:
        job(hook, boot_timeout=0.01, max_offer_attempts=2).execute(ctx())
    assert hook.destroyed == [1001, 1002] and hook.alive() == []
    assert "Nothing is left running" in str(caught.value)


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


def test_a_destroy_that_keeps_failing_fails_loudly_with_the_instance_id():
    hook = FakeHook({1: ["running", "stopped"]}, destroy_fails=True)
    with pytest.raises(AirflowException, match="DESTROY FAILED for instance 1001: it may still be billing"):
        job(hook).execute(ctx())


def test_a_job_found_gone_after_its_lease_expired_is_not_a_success():
    hook = FakeHook({1: ["running", GONE]})
    op = job(hook, keepalive=None, max_runtime=1)
    op._lease_seconds = lambda: -60  # the lease (boot + max_runtime + margin) ran out before the job ended
    with pytest.raises(AirflowException, match="outcome is unknown"):
        op.execute(ctx())


class Clock:
    """The operator module's clock: ``sleep`` moves time on at once (labels hold whole epoch seconds)."""

    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_the_worker_renews_the_lease_through_the_label(monkeypatch):
    from airflow_gpumarket.operators import renting

    clock = Clock()
    monkeypatch.setattr(renting, "time", clock)
    hook = FakeHook({1: ["running"] * 12 + [DONE]})
    op = job(hook, keepalive=timedelta(minutes=3), poll_interval=60)
    assert op.execute(ctx())["job_status"] == "succeeded"
    leases = [lifecycle.lease_of(label) for _, label in hook.labels]
    assert len(leases) >= 3 and leases == sorted(leases)  # renewed again and again, never backwards
    assert leases[-1] >= clock.now - 60  # still ahead at the last read that saw the job running


def test_retry_adopts_a_running_earlier_instance_and_destroys_the_other_leftovers():
    hook = FakeHook({1: ["running"], 2: ["running", DONE]})
    op = job(hook)
    key = op._rental_key(ctx())
    for offer_id in (1, 2):  # two instances of earlier tries (one a duplicate of an ambiguous create)
        hook.create_instance(offer_id, label=lifecycle.make_label(key, time.time() + 600))
    for instance in hook.instances.values():
        instance["actual_status"] = "running"
    result = op.execute(ctx(try_number=2))
    assert result["instance_id"] == 1002  # the newest is kept, the older destroyed
    assert hook.destroyed == [1001, 1002] and len(hook.instances) == 2  # nothing rented anew


class FakeStateStore:
    """context["task_state_store"] (Airflow 3.3+): get/set/delete, each call kept."""

    def __init__(self, values: dict | None = None, fails: bool = False) -> None:
        self.values = dict(values or {})
        self.calls: list[tuple] = []
        self.fails = fails

    def _call(self, *call):
        self.calls.append(call)
        if self.fails:
            raise RuntimeError("the state store's backend is down")

    def get(self, key, default=None):
        self._call("get", key)
        return self.values.get(key, default)

    def set(self, key, value, *, retention=None):
        self._call("set", key, value)
        self.values[key] = value

    def delete(self, key):
        self._call("delete", key)
        self.values.pop(key, None)


def test_rule_durable_a_rental_is_in_the_task_state_store_from_its_creation_to_its_end():
    hook = FakeHook({1: [None, "running", DONE]})
    store = FakeStateStore()
    result = job(hook).execute({**ctx(), "task_state_store": store})
    assert result["instance_id"] == 1001 and hook.alive() == []
    saved = [call for call in store.calls if call[0] == "set"]
    assert saved == [("set", "gpumarket_rental", {"instance_id": 1001, "label": saved[0][2]["label"], "offer_id": 1})]
    assert store.calls.index(saved[0]) < store.calls.index(("delete", "gpumarket_rental"))  # cleared at its end
    assert store.values == {}


def test_rule_durable_a_retry_reconnects_first_to_the_rental_in_the_task_state_store():
    hook = FakeHook({1: ["running", DONE], 2: ["running"]})
    op = job(hook)
    key = op._rental_key(ctx())
    for offer_id in (1, 2):  # try 1 saved 1001; 1002 is a duplicate its label also finds
        hook.create_instance(offer_id, label=lifecycle.make_label(key, time.time() + 600))
    store = FakeStateStore({"gpumarket_rental": {"instance_id": 1001, "label": None, "offer_id": 1}})
    result = op.execute({**ctx(try_number=2), "task_state_store": store})
    assert result["instance_id"] == 1001 and result["job_status"] == "succeeded"  # not the newest: the saved one
    assert hook.destroyed == [1002, 1001] and len(hook.instances) == 2  # nothing rented anew


@pytest.mark.parametrize("store", [None, FakeStateStore(fails=True)], ids=["durable=False", "store fails"])
def test_without_a_working_task_state_store_a_retry_adopts_by_the_label(store, task_log):
    hook = FakeHook({1: ["running", DONE]})
    op = job(hook, durable=store is not None)
    hook.create_instance(1, label=lifecycle.make_label(op._rental_key(ctx()), time.time() + 600))
    used = store or FakeStateStore()
    result = op.execute({**ctx(try_number=2), "task_state_store": used})
    assert result["instance_id"] == 1001 and len(hook.instances) == 1 and hook.alive() == []
    if store is None:
        assert used.calls == []  # durable=False: the store is never asked
    else:
        assert "The task state store failed" in task_log()


def earlier_try_left(hook: FakeHook, op, status: str, log_text: str) -> None:
    """Instance 1001, of try 1 whose worker died, on the last offer: in ``status``, its log ``log_text``."""
    hook.create_instance(max(hook.scripts), label=lifecycle.make_label(op._rental_key(ctx()), time.time() + 600))
    hook.instances[1001]["actual_status"] = status
    hook.log_text = log_text


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
    op = GpuMarketCreateInstanceOperator(task_id="make", offer_filters={"num_gpus": {"gte": 1}}, image="img")
    op.__dict__["hook"] = hook
    hook.get_instance = lambda instance_id: hook.find_instance(instance_id)  # the details it returns
    earlier_try_left(hook, op, "stopped", EXIT_0)
    assert op.execute(ctx(try_number=2))["instance_id"] == 1002
    assert hook.destroyed == [1001] and hook.log_reads == []


def fired(deferred: pytest.ExceptionInfo, kind: lifecycle.EventKind, **facts) -> dict:
    """The event the deferred task's trigger would send (it carries the rental back, as the trigger does)."""
    trigger = deferred.value.trigger
    return {"status": kind.value, "instance_id": trigger.instance_id, "resume": trigger.resume, **facts}


def test_deferring_creates_then_defers_and_a_failed_event_destroys():
    hook = FakeHook({1: ["running"]})
    with pytest.raises(TaskDeferred) as deferred:
        job(hook, deferrable=True).execute(ctx())
    assert deferred.value.kwargs is None  # the rental travels once: in the trigger and back in its event
    event = fired(deferred, lifecycle.EventKind.JOB_FAILED, actual_status="stopped")
    with pytest.raises(AirflowException, match="failed"):
        job(hook, deferrable=True).execute_complete(ctx(), event)  # Airflow resumes on a fresh operator object
    assert hook.alive() == []


def test_a_resumed_job_that_succeeded_reports_its_cost_from_the_rental_in_the_event():
    hook = FakeHook({1: ["running"]})
    with pytest.raises(TaskDeferred) as deferred:
        job(hook, deferrable=True).execute(ctx())
    renewed = lifecycle.make_label("0" * 12, time.time() + 900)
    event = fired(deferred, lifecycle.EventKind.JOB_SUCCEEDED, label=renewed, actual_status="stopped", exit_status=0)
    result = job(hook, deferrable=True).execute_complete(ctx(), event)
    assert result["job_status"] == "succeeded" and result["dph_total"] == 0.5 and result["offer_id"] == 1
    assert hook.alive() == []  # the job stopped its instance; the resumed task destroyed it
    assert result["label"] == renewed  # the trigger's latest renewal, not the label written at creation


@pytest.mark.parametrize(
    "event",
    [
        {"status": "job_failed", "instance_id": 1001},  # no rental in it
        {"status": "job_failed", "instance_id": 1001, "resume": {"rental": {}, "tried": [], "reasons": []}},
        {"status": "no such kind", "instance_id": 1001, "resume": {}},
    ],
)
def test_an_event_that_cannot_be_resumed_still_destroys_its_instance(event):
    hook = FakeHook({1: ["running"]})
    with pytest.raises(TaskDeferred):
        job(hook, deferrable=True).execute(ctx())
    with pytest.raises(AirflowException, match="Cannot resume waiting for instance 1001"):
        job(hook, deferrable=True).execute_complete(ctx(), event)
    assert hook.alive() == []


def test_a_deferred_wait_ended_by_execution_timeout_destroys_and_says_so():
    hook = FakeHook({1: ["running"]})
    op = job(hook, deferrable=True, execution_timeout=timedelta(seconds=60))
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx())
    event = fired(deferred, lifecycle.EventKind.TIMEOUT, actual_status="running")
    with pytest.raises(AirflowTaskTimeout, match="execution_timeout .* elapsed"):
        job(hook, deferrable=True, execution_timeout=timedelta(seconds=60)).execute_complete(ctx(), event)
    assert hook.alive() == []


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


def test_create_instance_operator_hands_over_a_running_instance_without_destroying_it():
    hook = FakeHook({1: [None, "running"]})
    op = GpuMarketCreateInstanceOperator(
        task_id="create", offer_filters={"num_gpus": {"gte": 1}}, image="img", poll_interval=0.001
    )
    op.__dict__["hook"] = hook
    hook.get_instance = lambda instance_id: {"ssh_host": "h", "ssh_port": 22}
    result = op.execute(ctx())
    assert result["instance_id"] == 1001 and hook.destroyed == []
    assert op._guard.instance_id is None  # a later on_kill has nothing of its own to destroy


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


# --- destroy paths without a server (issue 21) ------------------------------------------------------------------
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


class BidMarketHook(FakeHook):
    """Bid offers (min_bid 0.2); a create on offer 1 is refused: the machine's minimum rose above the bid since the
    search, and the service made the instance stopped. The hook destroyed it (``destroy_worked``) or could not."""

    def __init__(self, scripts: dict[int, list], *, destroy_worked: bool) -> None:
        super().__init__(scripts)
        self.destroy_worked = destroy_worked

    def search_offers(self, filters, *, offer_type="ondemand", order=None, limit=None):
        offers = super().search_offers(filters, offer_type=offer_type, order=order, limit=limit)
        return [{**o, "min_bid": 0.2, "machine_id": 500 + o["id"]} for o in offers]

    def create_instance(self, offer_id, **body):
        made = super().create_instance(offer_id, **body)
        if offer_id != 1:
            return made
        if self.destroy_worked:
            self.destroyed.append(made["new_contract"])
        raise GpuMarketCreateRefusedError(
            f"create_instance failed: the service answered success=false, yet made instance {made['new_contract']}",
            new_contract=made["new_contract"],
            destroyed=self.destroy_worked,
            operation="create_instance",
        )


def test_rule_a_bid_refused_at_create_because_the_minimum_rose_tries_the_next_offer(task_log):
    hook = BidMarketHook({1: ["running"], 2: [None, "running", DONE]}, destroy_worked=True)
    result = job(hook, interruptible=True).execute(ctx())
    assert result["job_status"] == "succeeded"
    assert [i["offer_id"] for i in hook.instances.values()] == [1, 2] and hook.alive() == []
    assert "Offer 1 refused the bid of $0.21/h" in task_log()


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


def test_airflow_timing_out_a_synchronous_wait_destroys_the_instance():
    """In the worker, Airflow raises AirflowTaskTimeout inside execute when execution_timeout elapses."""
    hook = FakeHook({1: ["running"]})
    reads = iter([{"id": 1001, "actual_status": "running"}])

    def read(instance_id):
        value = next(reads, None)
        if value is None:
            raise AirflowTaskTimeout("Timeout, PID: 1")
        return value

    hook.find_instance = read
    with pytest.raises(AirflowTaskTimeout):
        job(hook, execution_timeout=timedelta(seconds=30)).execute(ctx())
    assert hook.destroyed == [1001] and hook.alive() == []


def test_a_synchronous_wait_that_reaches_a_binding_execution_timeout_destroys_and_names_the_last_lines():
    hook = FakeHook({1: ["running"]})
    hook.log_text = "step 41\nstep 42\n"
    op = job(hook, execution_timeout=timedelta(seconds=30))
    op._limits = lambda rental: (time.time() - 1, None)  # the wait's own deadline passed...
    late = ctx()
    late["ti"].start_date = datetime.now(UTC) - timedelta(seconds=120)  # ...after execution_timeout's
    with pytest.raises(AirflowTaskTimeout, match="(?s)execution_timeout .* elapsed.*step 42"):
        op.execute(late)
    assert hook.destroyed == [1001] and hook.alive() == []


def test_deferring_with_no_execution_time_left_destroys_instead_of_deferring():
    hook = FakeHook({1: ["running"]})
    late = ctx()
    late["ti"].start_date = datetime.now(UTC) - timedelta(seconds=120)  # the try began 2 minutes ago
    with pytest.raises(AirflowTaskTimeout, match="execution_timeout"):
        job(hook, deferrable=True, execution_timeout=timedelta(seconds=60)).execute(late)
    assert hook.destroyed == [1001] and hook.alive() == []


def test_a_deferred_execution_timeout_names_the_jobs_last_lines():
    hook = FakeHook({1: ["running"]})
    op = job(hook, deferrable=True, execution_timeout=timedelta(seconds=60))
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx())
    event = fired(deferred, lifecycle.EventKind.TIMEOUT, actual_status="running", log_tail=["epoch 7 of 9"])
    with pytest.raises(AirflowTaskTimeout, match="(?s)execution_timeout .* elapsed.*epoch 7 of 9"):
        job(hook, deferrable=True, execution_timeout=timedelta(seconds=60)).execute_complete(ctx(), event)
    assert hook.alive() == []


def test_rule_a_resumed_job_that_ended_between_two_reads_of_a_wait_for_the_bid_succeeds_without_a_rerun(task_log):
    """on_preemption='wait': the market stops the bid instance mid-job, it wins its machine back, and the job runs
    again and ends (exit 0, the wrapper stops it) between two reads: every read of the wait sees it stopped."""
    hook = BidMarketHook({2: [None, "running", "stopped"], 3: ["running", DONE]}, destroy_worked=True)
    hook.log_text = "gpumarket: job started\nepoch 1\n"  # the preempted run: no exit status line
    reads = []
    find = hook.find_instance

    def find_instance(instance_id):
        found = find(instance_id)
        reads.append(found and found["actual_status"])
        if len(reads) == 4:  # the wait for the bid began: the resumed run starts, ends, and stops its instance
            hook.log_text += "gpumarket: job started\nepoch 1\nepoch 2\n" + EXIT_0
        return found

    hook.find_instance = find_instance
    result = job(hook, interruptible=True, on_preemption="wait", max_outbid_wait=0.05).execute(ctx())
    assert result["job_status"] == "succeeded" and result["instance_id"] == 1001
    assert list(hook.instances) == [1001] and hook.alive() == []  # no failover, no second run
    assert "epoch 2" in task_log() and reads[2:4] == ["stopped", "stopped"]


FIRST_RUN = "gpumarket: job started\nepoch 1\n"  # a preempted run: no exit status line
RESUMED_RUN = "gpumarket: job started\nepoch 1\nepoch 2\n" + EXIT_0


def resumed_unseen(hook: FakeHook, *, at_read: int, failing: int | None = None) -> list:
    """From read ``at_read`` of instance 1001 on, its resumed run has ended (exit 0) and stopped the instance,
    between two reads; read number ``failing`` fails after the hook's retries."""
    reads: list = []
    find = hook.find_instance

    def find_instance(instance_id):
        reads.append(instance_id)
        if len(reads) == failing:
            raise GpuMarketServerError("find_instance: HTTP 503 after retries", status_code=503)
        found = find(instance_id)
        if len(reads) == at_read:
            hook.log_text += RESUMED_RUN
        return found

    hook.find_instance = find_instance
    return reads


def wait_mode_job(hook: FakeHook, monkeypatch, **kwargs) -> tuple[GpuMarketRunJobOperator, Clock]:
    from airflow_gpumarket.operators import renting

    clock = Clock()
    monkeypatch.setattr(renting, "time", clock)
    kwargs = {"max_outbid_wait": 3600, "poll_interval": 10, "log_interval": 3600, **kwargs}
    return job(hook, interruptible=True, on_preemption="wait", **kwargs), clock


@pytest.mark.parametrize("shown", ["exited", "unknown", "offline"])
def test_rule_a_wait_for_the_bid_reads_the_log_when_the_instance_shows_a_failed_status(monkeypatch, task_log, shown):
    """Reads: boot, running, stopped (outbid), the status message, the wait's first read (still outbid); then the
    run resumes, exits 0 and stops its instance between two reads, and the service shows it as ``shown``."""
    hook = BidMarketHook({2: [None, "running", "stopped", "stopped", "stopped", shown]}, destroy_worked=True)
    hook.log_text = FIRST_RUN
    resumed_unseen(hook, at_read=6)
    op, _ = wait_mode_job(hook, monkeypatch)
    result = op.execute(ctx())
    assert result["job_status"] == "succeeded" and result["instance_id"] == 1001
    assert list(hook.instances) == [1001] and hook.alive() == []  # no failover, no second run


def test_rule_a_wait_for_the_bid_reads_the_log_and_ends_when_the_resumed_run_ended(monkeypatch, task_log):
    """Every read of the wait sees 'stopped'; the log's reads find the resumed run's exit 0 long before
    max_outbid_wait runs out."""
    hook = BidMarketHook({2: [None, "running", "stopped"]}, destroy_worked=True)
    hook.log_text = FIRST_RUN
    resumed_unseen(hook, at_read=6)
    op, clock = wait_mode_job(hook, monkeypatch, log_interval=30)
    started = clock.now
    result = op.execute(ctx())
    assert result["job_status"] == "succeeded" and list(hook.instances) == [1001] and hook.alive() == []
    assert clock.now - started < 120  # the wait ended at the log's next read, not after its 3600 s
    forwarded = [line for line in task_log().splitlines() if "[instance 1001] epoch" in line]
    assert ["epoch 1" in line for line in forwarded] == [True, True, False]  # each run's lines once


def test_rule_a_time_limit_read_after_the_job_ended_well_is_a_success(monkeypatch, task_log):
    """The resumed run exits 0 inside the job's limit (boot_timeout + max_runtime), unseen by any status read; the
    wait for the bid would run out after that limit, so the limit ends the wait, and the log says exit 0."""
    hook = BidMarketHook({2: [None, "running", "stopped"]}, destroy_worked=True)
    hook.log_text = FIRST_RUN
    resumed_unseen(hook, at_read=6)
    op, _ = wait_mode_job(hook, monkeypatch, boot_timeout=60, max_runtime=60)
    result = op.execute(ctx())
    assert result["job_status"] == "succeeded" and list(hook.instances) == [1001] and hook.alive() == []


def test_rule_a_failed_read_at_the_start_of_a_wait_for_the_bid_counts_no_second_preemption(monkeypatch, task_log):
    hook = BidMarketHook({2: [None, "running", "stopped"]}, destroy_worked=True)
    hook.log_text = FIRST_RUN
    resumed_unseen(hook, at_read=8, failing=5)  # the wait's first read fails after the hook's retries
    op, _ = wait_mode_job(hook, monkeypatch, log_interval=30, max_preemptions=1)
    result = op.execute(ctx())
    assert result["job_status"] == "succeeded" and result["preemptions"] == 1
    assert list(hook.instances) == [1001] and hook.alive() == []


@pytest.mark.parametrize("try_number", [1, 2])
def test_create_instance_operator_without_waiting_returns_right_after_creation_or_adoption(try_number):
    """wait_for_running=False: no status is read, whether this try rents or adopts what an earlier try rented."""
    hook = FakeHook({1: [None]})
    op = GpuMarketCreateInstanceOperator(
        task_id="create",
        offer_filters={"num_gpus": {"gte": 1}},
        image="img",
        wait_for_running=False,
        poll_interval=0.001,
        boot_timeout=0.05,
    )
    op.__dict__["hook"] = hook
    if try_number == 2:  # an earlier try of this task instance rented it, and its worker died
        earlier = hook.create_instance(1, label=lifecycle.make_label(op._rental_key(ctx()), time.time() + 3600))
        hook.instances[earlier["new_contract"]]["actual_status"] = "loading"
    result = op.execute(ctx(try_number))
    assert result["instance_id"] == 1001 and list(hook.instances) == [1001]
    assert hook.reads[1001] == [None] and hook.destroyed == []  # never read: the script was not consumed
