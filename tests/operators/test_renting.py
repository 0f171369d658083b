"""The renting operators' loop (operators/renting.py) with a fake hook: offers tried one after another, a host that
never runs given up, the durable task state store, deferral and its resumption, execution timeouts, and the wait
for the bid after a preemption.

The simulator tests (tests/integration) run the same paths end to end; these pin down the operator's own decisions
(which instance, when, with which message) without a server. ``renting_fakes`` has the fake hook's scripts.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from bad_input import refused_at_parse_time

from airflow_gpumarket import lifecycle, outcome
from airflow_gpumarket._compat import AirflowException, AirflowTaskTimeout, TaskDeferred
from airflow_gpumarket.exceptions import GpuMarketServerError, GpuMarketValidationError
from airflow_gpumarket.lifecycle import task_key
from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator
from airflow_gpumarket.operators.spec import RentalSpec

from .renting_fakes import DONE, EXIT_0, BidMarketHook, Clock, FakeHook, ctx, fired, job, use_clock

OK = {"offer_filters": {"gpu_name": {"eq": "RTX 4090"}}, "image": "pytorch/pytorch"}
CREATE = GpuMarketCreateInstanceOperator
CASES = [
    # (operator, arguments, the argument the message must name)
    (CREATE, {"offer_filters": {}}, "image"),
    (CREATE, {"image": "x"}, "offer_id"),
    (CREATE, {**OK, "runtype": "ssh-direct"}, "runtype"),
    (CREATE, {**OK, "runtype": "SSH"}, "runtype"),
    (CREATE, {**OK, "target_state": "paused"}, "target_state"),
    (CREATE, {**OK, "env": "-e A=1 -p 22:22"}, "env"),
    (CREATE, {**OK, "env": ["A=1"]}, "env"),
    (CREATE, {**OK, "env": {"EPOCHS": 3}}, "env"),
    (CREATE, {**OK, "env": {"-p 8080": "1"}}, "env"),
    (CREATE, {**OK, "env": {"-p 8080:8080": 1}}, "env"),
    (CREATE, {**OK, "env": {"-p 70000:8000": "1"}}, "env"),
    (CREATE, {**OK, "onstart": "x" * 4049}, "onstart"),
    (CREATE, {**OK, "onstart": "echo hi", "runtype": "args"}, "onstart"),
    (CREATE, {**OK, "args_str": "--epochs 3"}, "args_str"),
    (CREATE, {**OK, "args_str": "--epochs 3", "runtype": "ssh"}, "args_str"),
    (CREATE, {**OK, "price": 0}, "price"),
    (CREATE, {**OK, "price": -0.2}, "price"),
    (CREATE, {**OK, "price": "cheap"}, "price"),
    (CREATE, {**OK, "disk": 0}, "disk"),
    (CREATE, {**OK, "disk": "8GB"}, "disk"),
    (CREATE, {**OK, "volume_info": 5}, "volume_info"),
    (CREATE, {**OK, "volume_info": {"volume_id": 5}}, "volume_info.mount_path"),
    (CREATE, {**OK, "volume_info": {"mount_path": "/data"}}, "volume_info.volume_id"),
    (CREATE, {**OK, "volume_info": {"volume_id": 5, "mount_path": "data"}}, "volume_info.mount_path"),
    (CREATE, {**OK, "volume_info": {"volume_id": 5, "mount_path": "/d", "size": 1}}, "volume_info"),
    (CREATE, {**OK, "use_jupyter_lab": "yes"}, "use_jupyter_lab"),
    (CREATE, {**OK, "python_utf8": 1}, "python_utf8"),
    (CREATE, {**OK, "lang_utf8": "true"}, "lang_utf8"),
    (CREATE, {**OK, "cancel_unavail": "no"}, "cancel_unavail"),
    (CREATE, {**OK, "vm": "false"}, "vm"),
    (CREATE, {**OK, "image": ""}, "image"),
    (CREATE, {**OK, "template_hash_id": ""}, "template_hash_id"),
    (CREATE, {**OK, "jupyter_dir": ""}, "jupyter_dir"),
    (CREATE, {**OK, "image_login": "user:token@registry"}, "image_login"),
    (CREATE, {**OK, "max_dph": 0}, "max_dph"),
    (CREATE, {**OK, "max_dph": -1}, "max_dph"),
    (CREATE, {**OK, "boot_timeout": 0}, "boot_timeout"),
    (CREATE, {**OK, "boot_timeout": timedelta(seconds=-5)}, "boot_timeout"),
    (CREATE, {**OK, "poll_interval": 0}, "poll_interval"),
    (CREATE, {**OK, "max_offer_attempts": 0}, "max_offer_attempts"),
    (CREATE, {**OK, "offer_id": 0, "offer_filters": None}, "offer_id"),
    (CREATE, {**OK, "offer_id": "abc", "offer_filters": None}, "offer_id"),
    (CREATE, {**OK, "offer_filters": {"gpu_name": "RTX 4090"}}, "offer_filters['gpu_name']"),
    (CREATE, {**OK, "offer_filters": {"gpu_name": {"in": "RTX 4090"}}}, "offer_filters['gpu_name']"),
    (CREATE, {**OK, "offer_filters": {"num_gpus": {"gte": 1, "eq": 2}}}, "offer_filters['num_gpus']"),
    (CREATE, {**OK, "offer_filters": {"limit": {"eq": 3}}}, "offer_filters"),
    (CREATE, {**OK, "offer_order": [["dph_total", "down"]]}, "order['dph_total']"),
    (CREATE, {**OK, "offer_order": ["dph_total"]}, "order"),
    (CREATE, {**OK, "offer_type": "spot"}, "offer_type"),
    (CREATE, {**OK, "command": "python train.py", "onstart": "echo"}, "onstart"),
    (CREATE, {**OK, "command": "python train.py", "runtype": "args"}, "runtype"),
]
FIRST_RUN = "gpumarket: job started\nepoch 1\n"  # a preempted run: no exit status line
RESUMED_RUN = "gpumarket: job started\nepoch 1\nepoch 2\n" + EXIT_0
FILTERS = {"gpu_name": {"eq": "RTX 4090"}}
LABEL = "afgm-0123456789ab-1"


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
    key = task_key(op, ctx())
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
    hook.create_instance(1, label=lifecycle.make_label(task_key(op, ctx()), time.time() + 600))
    used = store or FakeStateStore()
    result = op.execute({**ctx(try_number=2), "task_state_store": used})
    assert result["instance_id"] == 1001 and len(hook.instances) == 1 and hook.alive() == []
    if store is None:
        assert used.calls == []  # durable=False: the store is never asked
    else:
        assert "The task state store failed" in task_log()


def test_deferring_creates_then_defers_and_a_failed_event_destroys():
    hook = FakeHook({1: ["running"]})
    with pytest.raises(TaskDeferred) as deferred:
        job(hook, deferrable=True).execute(ctx())
    assert deferred.value.kwargs is None  # the rental travels once: in the trigger and back in its event
    event = fired(deferred, outcome.EventKind.JOB_FAILED, actual_status="stopped")
    with pytest.raises(AirflowException, match="failed"):
        job(hook, deferrable=True).execute_complete(ctx(), event)  # Airflow resumes on a fresh operator object
    assert hook.alive() == []


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
    event = fired(deferred, outcome.EventKind.TIMEOUT, actual_status="running")
    with pytest.raises(AirflowTaskTimeout, match="execution_timeout .* elapsed"):
        job(hook, deferrable=True, execution_timeout=timedelta(seconds=60)).execute_complete(ctx(), event)
    assert hook.alive() == []


def test_rule_a_bid_refused_at_create_because_the_minimum_rose_tries_the_next_offer(task_log):
    hook = BidMarketHook({1: ["running"], 2: [None, "running", DONE]}, destroy_worked=True)
    result = job(hook, interruptible=True).execute(ctx())
    assert result["job_status"] == "succeeded"
    assert [i["offer_id"] for i in hook.instances.values()] == [1, 2] and hook.alive() == []
    assert "Offer 1 refused the bid of $0.21/h" in task_log()


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
    # The job's own limit (boot_timeout + max_runtime after creation) passes at once...
    op = job(hook, execution_timeout=timedelta(seconds=30), boot_timeout=0.001, max_runtime=0.001)
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
    event = fired(deferred, outcome.EventKind.TIMEOUT, actual_status="running", log_tail=["epoch 7 of 9"])
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
    clock = use_clock(monkeypatch)
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


# --- Bad input, refused when the DAG is parsed -------------------------------------------------------------
test_bad_input_is_refused_at_parse_time_naming_the_argument = refused_at_parse_time(CASES)


def test_a_creation_field_is_one_line_of_the_api_table():
    """The renting operators take every creation field of api.CREATION_FIELDS by name (keyword-only, so
    default_args and expand() know them), documented, besides the one templated ``instance`` dict."""
    import inspect

    from airflow_gpumarket import api
    from airflow_gpumarket.operators.renting import GpuMarketRentingBaseOperator

    keywords = inspect.signature(GpuMarketRentingBaseOperator.__init__).parameters
    fields = {
        name
        for name, p in keywords.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and name in api.CREATION_FIELD_NAMES
    }
    assert fields == set(api.CREATION_FIELD_NAMES)
    assert all(keywords[name].default is None for name in fields)  # not given: the instance dict's value stands
    assert all(f":param {name}:" in (GpuMarketRentingBaseOperator.__doc__ or "") for name in fields)
    assert not set(api.CREATION_FIELD_NAMES) & set(GpuMarketRentingBaseOperator.template_fields)
    assert "instance" in GpuMarketRentingBaseOperator.template_fields


# --- The creation fields: one templated instance dict, each field also taken by name (the Databricks way) ------
def test_a_field_given_by_name_wins_over_the_same_field_in_the_dict():
    op = GpuMarketCreateInstanceOperator(
        task_id="t", offer_filters=FILTERS, instance={"image": "a/old", "disk": 40}, image="b/new"
    )
    assert op.instance == {"cancel_unavail": True, "image": "b/new", "disk": 40}


def test_cancel_unavail_defaults_to_true_and_may_be_turned_off_either_way():
    by_name = GpuMarketCreateInstanceOperator(task_id="a", offer_filters=FILTERS, image="i", cancel_unavail=False)
    in_dict = GpuMarketCreateInstanceOperator(
        task_id="b", offer_filters=FILTERS, instance={"image": "i", "cancel_unavail": False}
    )
    assert by_name.instance["cancel_unavail"] is False and in_dict.instance["cancel_unavail"] is False


@pytest.mark.parametrize("instance", ['{"image": "i"}', [("image", "i")], 3])
def test_an_instance_that_is_not_a_dict_is_refused_naming_instance(instance):
    with pytest.raises(GpuMarketValidationError, match="^instance: must be a dict of the spec's creation fields"):
        GpuMarketCreateInstanceOperator(task_id="t", offer_filters=FILTERS, instance=instance)


def test_a_label_in_the_dict_is_refused_the_operator_writes_it():
    with pytest.raises(GpuMarketValidationError, match="^instance: has a 'label': the operator writes the label"):
        GpuMarketCreateInstanceOperator(task_id="t", offer_filters=FILTERS, instance={"image": "i", "label": "x"})


def test_a_key_the_spec_does_not_name_is_refused_at_parse_time_even_beside_jinja():
    """A templated typed field puts the body's check off until rendering; the names are still checked at once."""
    with pytest.raises(GpuMarketValidationError, match="^gpu_count: is not a creation field of the spec"):
        GpuMarketCreateInstanceOperator(
            task_id="t", offer_filters=FILTERS, instance={"image": "i", "disk": "{{ params.d }}", "gpu_count": 2}
        )


def test_a_bad_value_in_the_dict_is_refused_at_parse_time_naming_the_field():
    with pytest.raises(GpuMarketValidationError, match="^runtype: "):
        GpuMarketCreateInstanceOperator(
            task_id="t", offer_filters=FILTERS, instance={"image": "i", "runtype": "ssh-direct"}
        )


def test_the_dict_is_the_one_rendered_template_field_and_its_values_render():
    op = GpuMarketCreateInstanceOperator(
        task_id="t",
        offer_filters=FILTERS,
        image="{{ params.image }}",
        instance={"jupyter_dir": "/data/{{ params.run }}", "env": {"RUN": "{{ params.run }}"}},
    )
    op.render_template_fields({"params": {"image": "pytorch/pytorch", "run": "r1"}})
    assert op.instance == {
        "cancel_unavail": True,
        "image": "pytorch/pytorch",
        "jupyter_dir": "/data/r1",
        "env": {"RUN": "r1"},
    }
    RentalSpec.of(op)


def test_default_args_give_creation_fields_by_name():
    from airflow.providers.common.compat.sdk import DAG

    with DAG("d", schedule=None, default_args={"image": "from/default-args", "disk": 20}):
        op = GpuMarketCreateInstanceOperator(task_id="t", offer_filters=FILTERS, disk=30)
    assert op.instance["image"] == "from/default-args" and op.instance["disk"] == 30


def test_a_mapped_task_may_expand_over_a_creation_field_by_name():
    from airflow.providers.common.compat.sdk import DAG

    with DAG("d", schedule=None):
        mapped = GpuMarketRunJobOperator.partial(task_id="t", offer_filters=FILTERS, command="echo").expand(
            image=["a/one", "b/two"]
        )
    assert mapped.expand_input.value == {"image": ["a/one", "b/two"]}
