"""GpuMarketRunJobOperator (operators/run_job.py): a job's outcome read from its log and its instance's status, the
instance destroyed after the final read, the lease kept alive while the job runs, and the arguments it refuses."""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta

import pytest
from bad_input import refused_at_parse_time

from airflow_gpumarket import lifecycle, outcome
from airflow_gpumarket._compat import AirflowException, TaskDeferred
from airflow_gpumarket.exceptions import GpuMarketServerError, GpuMarketValidationError
from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator
from airflow_gpumarket.operators.spec import RentalSpec

from .renting_fakes import DONE, EXIT_0, GONE, FakeHook, ctx, fired, job, use_clock

OK = {"offer_filters": {"gpu_name": {"eq": "RTX 4090"}}, "image": "pytorch/pytorch"}
JOB = GpuMarketRunJobOperator
CASES = [
    # (operator, arguments, the argument the message must name)
    (JOB, {**OK, "command": "python train.py", "durable": "yes"}, "durable"),
    (JOB, {**OK, "command": "python train.py", "runtype": "args"}, "runtype"),
    (JOB, {**OK, "command": ""}, "command"),
    (JOB, {**OK, "command": "x", "onstart": "y"}, "onstart"),
    (JOB, {**OK, "command": "x", "max_runtime": 0}, "max_runtime"),
    (JOB, {**OK, "command": "x", "keepalive": 0}, "keepalive"),
    (JOB, {**OK, "command": "x", "keepalive": 20, "poll_interval": 10}, "keepalive"),
    (JOB, {**OK, "command": "x", "env": {"A": None}}, "env"),
    (JOB, {**OK, "command": "echo " + "y" * 9000 + "".join(str(i) for i in range(3000))}, "command"),
    # Renting well (offer choice, preflight, host memory, deadline)
    (JOB, {**OK, "command": "x", "offer_choice": "cheapest"}, "offer_choice"),
    (
        JOB,
        {"offer_filters": {"gpu_nmae": {"eq": "RTX 3090"}}, "image": "x", "command": "x"},
        "offer_filters['gpu_nmae']",
    ),
    (JOB, {**OK, "command": "x", "extra_filter_fields": [1]}, "extra_filter_fields"),
    (JOB, {**OK, "command": "x", "offer_choice": None}, "offer_choice"),
    (JOB, {"offer_id": 7, "image": "x", "command": "x", "offer_choice": "expected_cost"}, "offer_choice"),
    (JOB, {**OK, "command": "x", "expected_runtime": 0}, "expected_runtime"),
    (JOB, {**OK, "command": "x", "expected_runtime": "1h"}, "expected_runtime"),
    (JOB, {**OK, "command": "x", "image_size_gb": -2}, "image_size_gb"),
    (JOB, {**OK, "command": "x", "offer_choice": "expected_cost", "transfer_gb": -1}, "transfer_gb"),
    (JOB, {**OK, "command": "x", "offer_choice": "expected_cost", "transfer_gb": "10"}, "transfer_gb"),
    (JOB, {**OK, "command": "x", "offer_choice": "expected_cost", "transfer_gb": {"down": 3}}, "transfer_gb"),
    (JOB, {**OK, "command": "x", "transfer_gb": 20}, "transfer_gb"),
    (JOB, {**OK, "command": "x", "preflight": 5}, "preflight"),
    (JOB, {**OK, "command": "x", "preflight": ["nvidia-smi"]}, "preflight"),
    (JOB, {**OK, "command": "x", "preflight": "  "}, "preflight"),
    (GpuMarketCreateInstanceOperator, {**OK, "onstart": "x", "preflight": "nvidia-smi"}, "preflight"),
    (JOB, {**OK, "command": "x", "avoid_failed_hosts": "no"}, "avoid_failed_hosts"),
    (JOB, {**OK, "command": "x", "interruptible": True, "deadline": "2099-01-01T06:00"}, "deadline"),  # no zone
    (JOB, {**OK, "command": "echo ${#X}"}, "command"),  # Jinja reads a comment that never ends
    (JOB, {**OK, "command": "x", "interruptible": True, "deadline": datetime(2099, 1, 1)}, "deadline"),
    (JOB, {**OK, "command": "x", "interruptible": True, "deadline": timedelta(0)}, "deadline"),
    (JOB, {**OK, "command": "x", "interruptible": True, "deadline": "06:00"}, "deadline"),
    (JOB, {**OK, "command": "x", "deadline": timedelta(hours=6)}, "deadline"),
]
FILTERS = {"gpu_name": {"eq": "RTX 4090"}}
LABEL = "afgm-0123456789ab-1"


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
    assert "m=DELETE" in RentalSpec.of(op).job_script("https://api.example.com")  # the wrapper's destroy on success
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


def test_a_job_found_gone_after_its_lease_expired_is_not_a_success(monkeypatch):
    use_clock(monkeypatch)
    hook = FakeHook({1: ["running", "running", "running", GONE]})

    def refuse(instance_id, label):
        raise GpuMarketServerError("label_instance: HTTP 503 after retries", status_code=503)

    hook.label_instance = refuse  # nothing renews the lease of 3 minutes written at creation
    op = job(hook, keepalive=180, poll_interval=60)
    with pytest.raises(AirflowException, match="outcome is unknown"):
        op.execute(ctx())  # gone at the read 4 minutes after creation


def test_the_worker_renews_the_lease_through_the_label(monkeypatch):
    clock = use_clock(monkeypatch)
    hook = FakeHook({1: ["running"] * 12 + [DONE]})
    op = job(hook, keepalive=timedelta(minutes=3), poll_interval=60)
    assert op.execute(ctx())["job_status"] == "succeeded"
    leases = [lifecycle.lease_of(label) for _, label in hook.labels]
    assert len(leases) >= 3 and leases == sorted(leases)  # renewed again and again, never backwards
    assert leases[-1] >= clock.now - 60  # still ahead at the last read that saw the job running


def test_a_resumed_job_that_succeeded_reports_its_cost_from_the_rental_in_the_event():
    hook = FakeHook({1: ["running"]})
    with pytest.raises(TaskDeferred) as deferred:
        job(hook, deferrable=True).execute(ctx())
    renewed = lifecycle.make_label("0" * 12, time.time() + 900)
    event = fired(deferred, outcome.EventKind.JOB_SUCCEEDED, label=renewed, actual_status="stopped", exit_status=0)
    result = job(hook, deferrable=True).execute_complete(ctx(), event)
    assert result["job_status"] == "succeeded" and result["dph_total"] == 0.5 and result["offer_id"] == 1
    assert hook.alive() == []  # the job stopped its instance; the resumed task destroyed it
    assert result["label"] == renewed  # the trigger's latest renewal, not the label written at creation


# --- Bad input, refused when the DAG is parsed -------------------------------------------------------------
test_bad_input_is_refused_at_parse_time_naming_the_argument = refused_at_parse_time(CASES)


def test_run_job_defaults_to_an_onstart_runtype_and_wraps_the_command():
    op = JOB(task_id="t", **OK, command="python train.py")
    body = RentalSpec.of(op).creation_body(label="afgm-0123456789ab-1", base_url="http://127.0.0.1:1")
    assert body["runtype"] == "ssh_proxy"
    assert "python train.py" in body["onstart"] and "CONTAINER_API_KEY" in body["onstart"]
    assert "http://127.0.0.1:1/api/v0/instances/" in body["onstart"]


def test_a_command_stands_for_onstart_and_makes_runtype_default_to_ssh_proxy():
    op = GpuMarketRunJobOperator(task_id="t", offer_filters=FILTERS, instance={"image": "i"}, command="python t.py")
    assert op.instance["runtype"] == "ssh_proxy"
    assert "python t.py" in RentalSpec.of(op).creation_body(label=LABEL, base_url="http://h")["onstart"]


def test_a_command_with_an_onstart_in_the_dict_is_refused_naming_onstart():
    with pytest.raises(GpuMarketValidationError, match="^onstart: give command .* or onstart, not both"):
        GpuMarketRunJobOperator(
            task_id="t", offer_filters=FILTERS, instance={"image": "i", "onstart": "echo"}, command="echo"
        )


def test_rule_a_job_deferred_with_log_reads_starts_the_record_of_lines_its_triggers_show():
    """The trigger's copies read that record before their first log read: it exists before the first copy starts."""
    from airflow_gpumarket.triggers.instances import shown_key

    pushed = {}
    context = ctx()
    context["ti"].xcom_push = lambda key, value: pushed.__setitem__(key, value)
    hook = FakeHook({1: ["running"]})
    with pytest.raises(TaskDeferred) as deferred:
        job(hook, deferrable=True, log_interval=30).execute(context)
    assert pushed[shown_key(deferred.value.trigger.instance_id)] == []


def test_rule_a_command_jinja_cannot_read_fails_the_dag_file_naming_the_line_and_the_fix():
    args = {"task_id": "job", "offer_filters": {}, "image": "img"}
    with pytest.raises(GpuMarketValidationError, match=r"line 2 does not parse .*\{% raw %\}") as caught:
        GpuMarketRunJobOperator(command='echo "{{ ds }}"\necho "${#HF_TOKEN} characters"', **args)
    assert caught.value.field == "command"
    kept = GpuMarketRunJobOperator(command='{% raw %}echo "${#HF_TOKEN}"{% endraw %} {{ ds }} ${HOME}', **args)
    assert kept.command.startswith("{% raw %}")  # rendered when the task runs, as before
