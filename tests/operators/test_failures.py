"""What a command that exited before its instance was seen running means (operators/failures.py)."""

from __future__ import annotations

import pytest

from airflow_gpumarket.job_logs import LogEnd
from airflow_gpumarket.operators.failures import GpuMarketJobFailed, ended_unseen
from airflow_gpumarket.outcome import EventKind, WaitOutcome

STOPPED = WaitOutcome(EventKind.NEVER_RUNS, actual_status="stopped")


def end(status: int) -> LogEnd:
    lines = ["gpumarket: job started", "step 1", f"gpumarket: job exited with status {status}"]
    return LogEnd(lines, status)


def test_rule_a_job_that_ended_unseen_is_judged_as_a_job_not_failed_over_from():
    succeeded = ended_unseen(True, 7, end(0), STOPPED)
    assert succeeded.kind is EventKind.JOB_SUCCEEDED and succeeded.exit_status == 0
    failed = ended_unseen(True, 7, end(3), STOPPED)
    assert failed.kind is EventKind.JOB_FAILED and failed.exit_status == 3 and "step 1" in failed.log_tail


def test_rule_another_command_that_ended_unseen_fails_the_task_naming_its_exit_status():
    with pytest.raises(GpuMarketJobFailed, match="instance 7 exited before the instance was seen running") as raised:
        ended_unseen(False, 7, end(3), STOPPED)
    assert raised.value.exit_status == 3 and "step 1" in str(raised.value)
