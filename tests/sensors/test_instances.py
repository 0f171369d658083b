"""GpuMarketInstanceStatusSensor with a mocked hook: one poke per read, judged by waiting.Watch."""

from __future__ import annotations

import pytest
from bad_input import refused_at_parse_time
from fake_flows import FlowsOverMethods

from airflow_gpumarket._compat import AirflowFailException, TaskDeferred
from airflow_gpumarket.exceptions import GpuMarketAuthError, GpuMarketServerError
from airflow_gpumarket.sensors.instances import GpuMarketInstanceStatusSensor

GONE = "404"

CASES = [
    # (operator, arguments, the argument the message must name)
    (GpuMarketInstanceStatusSensor, {"instance_id": "abc"}, "instance_id"),
    (GpuMarketInstanceStatusSensor, {"instance_id": 3, "target_status": ""}, "target_status"),
    (GpuMarketInstanceStatusSensor, {"instance_id": 3, "poke_interval": 0}, "poke_interval"),
]


class Reads(FlowsOverMethods):
    """find_instance answers: a status (None while the service has none yet), GONE, or an exception to raise."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.log_text = ""
        self.log_reads = 0

    def get_instance_logs(self, instance_id, **kwargs):
        self.log_reads += 1
        return self.log_text

    def find_instance(self, instance_id):
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return None if answer == GONE else {"id": instance_id, "actual_status": answer}


def sensor(*answers, **kwargs) -> GpuMarketInstanceStatusSensor:
    op = GpuMarketInstanceStatusSensor(task_id="wait", instance_id={"instance_id": 7}, **kwargs)
    op.__dict__["hook"] = Reads(*answers)
    return op


def pokes(op: GpuMarketInstanceStatusSensor, n: int) -> list[bool]:
    return [op.poke({}) for _ in range(n)]


def test_waits_through_boot_until_the_target_status():
    assert pokes(sensor(None, "loading", "running"), 3) == [False, False, True]


def test_a_status_that_never_becomes_running_fails_at_once_naming_it():
    op = sensor("loading", "offline")
    assert op.poke({}) is False
    with pytest.raises(AirflowFailException, match="instance 7 ended in status 'offline'"):
        op.poke({})


def test_an_instance_that_disappears_fails_the_wait():
    with pytest.raises(AirflowFailException, match="instance 7 no longer exists"):
        sensor(GONE).poke({})


def test_job_mode_gone_after_running_is_success_and_stopped_is_failure():
    assert pokes(sensor("running", GONE, wait_for_job=True), 2) == [False, True]
    op = sensor("running", "stopped", wait_for_job=True)
    op.hook.log_text = "gpumarket: job exited with status 1\n"
    assert op.poke({}) is False
    with pytest.raises(AirflowFailException, match="the job on instance 7 failed"):
        op.poke({})
    op = sensor("running", "stopped", wait_for_job=True)  # no exit status line: not a success either
    assert op.poke({}) is False
    with pytest.raises(AirflowFailException, match="no exit status could be read"):
        op.poke({})


def test_job_mode_failure_names_the_exit_status_and_the_jobs_last_lines():
    op = sensor("running", "stopped", wait_for_job=True)
    op.hook.log_text = "loss nan at step 7\ngpumarket: job exited with status 3\n"
    assert op.poke({}) is False
    with pytest.raises(AirflowFailException, match="(?s)exit status 3.*loss nan at step 7"):
        op.poke({})


def test_job_mode_with_log_interval_zero_reads_no_log():
    op = sensor("running", "stopped", wait_for_job=True, log_interval=0)
    op.poke({})
    with pytest.raises(AirflowFailException):
        op.poke({})
    assert op.hook.log_reads == 0


def test_job_mode_a_host_that_fails_before_running_is_not_a_job_failure():
    with pytest.raises(AirflowFailException, match="never becomes running"):
        sensor("exited", wait_for_job=True).poke({})


def test_a_transient_error_pokes_again_and_a_refusal_fails():
    op = sensor(GpuMarketServerError("HTTP 503 after retries", status_code=503), "running")
    assert pokes(op, 2) == [False, True]
    with pytest.raises(GpuMarketAuthError):
        sensor(GpuMarketAuthError("HTTP 401: bad key", status_code=401)).poke({})


def test_deferrable_mode_hands_the_same_wait_to_the_trigger():
    op = sensor(wait_for_job=True, deferrable=True, poke_interval=5, timeout=60)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({})
    trigger = deferred.value.trigger
    assert (trigger.instance_id, trigger.watch["wait_for"], trigger.poll_interval) == (7, "job", 5.0)
    assert trigger.destroy_on_kill is False  # a sensor watches an instance it did not rent
    assert trigger.watch["deadline"] is not None


# --- Bad input, refused when the DAG is parsed -------------------------------------------------------------
test_bad_input_is_refused_at_parse_time_naming_the_argument = refused_at_parse_time(CASES)
