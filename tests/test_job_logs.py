"""The job's output read through overlapping tails: each line once, bounded memory, secrets masked, exit status."""

from __future__ import annotations

import logging

import pytest
from fake_flows import FlowsOverMethods

from airflow_gpumarket import job_logs
from airflow_gpumarket.exceptions import GpuMarketNotFoundError, GpuMarketRateLimitError, GpuMarketServerError
from airflow_gpumarket.job_logs import LogFollower, LogPump, Redactor


def tail(log: list[str], n: int) -> list[str]:
    return log[-n:]


def test_successive_overlapping_tails_give_each_line_once():
    follower, log, got = LogFollower(window=5), [], []
    for i in range(23):
        log.append(f"step {i}")
        if i % 3 == 0:
            got += follower.take(tail(log, 5))
    got += follower.take(tail(log, 5))
    assert got == [f"step {i}" for i in range(23)]


def test_a_read_with_nothing_new_adds_nothing():
    follower = LogFollower(window=10)
    assert follower.take(["a", "b"]) == ["a", "b"]
    assert follower.take(["a", "b"]) == []
    assert follower.take(["a", "b", "c"]) == ["c"]


def test_repeated_identical_lines_are_matched_by_the_longest_overlap():
    follower = LogFollower(window=10)
    assert follower.take(["tick", "tick"]) == ["tick", "tick"]
    assert follower.take(["tick", "tick", "tick", "done"]) == ["tick", "done"]


def test_a_log_that_grew_past_a_whole_tail_between_reads_is_reported_as_skipped():
    follower = LogFollower(window=3)
    follower.take(["1", "2", "3"])
    assert follower.skipped is False
    assert follower.take(["7", "8", "9"]) == ["7", "8", "9"]
    assert follower.skipped is True


def test_memory_is_bounded_by_the_window():
    follower = LogFollower(window=50)
    log: list[str] = []
    for i in range(5000):
        log.append(f"line {i}")
        follower.take(tail(log, 50))
    assert len(follower._seen) == 50
    assert follower.recent(3) == ["line 4997", "line 4998", "line 4999"]


def test_a_line_still_being_written_waits_for_its_end_except_in_the_final_read():
    assert job_logs.split_lines("a\nb\npart", complete_only=True) == ["a", "b"]
    assert job_logs.split_lines("a\nb\npart", complete_only=False) == ["a", "b", "part"]
    assert job_logs.split_lines("a\r\nb\n", complete_only=True) == ["a", "b"]
    assert job_logs.split_lines("x" * 5000 + "\n", complete_only=True) == ["x" * job_logs.MAX_LINE_CHARS]


def test_exit_status_is_read_from_the_wrappers_last_status_line():
    assert job_logs.exit_status(["gpumarket: job started", "boom", "gpumarket: job exited with status 3"]) == 3
    assert job_logs.exit_status(["echo gpumarket: job exited with status 9 (not at line start)"]) is None
    assert job_logs.exit_status(["no status here"]) is None


def test_failure_detail_names_the_exit_status_and_the_last_lines():
    lines = [f"l{i}" for i in range(30)] + ["gpumarket: job exited with status 3"]
    detail = job_logs.failure_detail(lines, 3)
    assert "exit status 3" in detail
    assert "l29" in detail and "l10" in detail and "l9\n" not in detail  # the last 20 lines only
    assert job_logs.failure_detail([], None) == ""


def test_redactor_masks_given_secrets_keys_known_by_digest_and_container_api_key_values():
    key = "4f" * 24
    redact = Redactor(secrets=["account-key-123456"], digests=[job_logs.key_digest(key)])
    text = f"k={key} acct=account-key-123456 CONTAINER_API_KEY=abc123 sha={'0' * 40}\n"
    out = redact(text)
    assert key not in out and "account-key-123456" not in out and "abc123" not in out
    assert "0" * 40 in out  # a token whose digest is not known stays


def pump_with(interval: float = 30.0) -> LogPump:
    return LogPump(7, interval, window=100)


def test_reads_are_due_one_interval_apart_starting_one_interval_after_the_job_started():
    pump = pump_with(30)
    assert pump.due(1000.0) is False
    assert pump.due(1029.0) is False
    assert pump.due(1030.0) is True
    pump.read(1030.0, "a\n")
    assert pump.due(1059.0) is False
    assert pump.due(1060.0) is True


def test_interval_zero_reads_nothing():
    pump = pump_with(0)
    assert pump.off and not pump.due(10**9)


def test_rate_limited_reads_back_off_and_a_working_read_restores_the_interval():
    pump = pump_with(30)
    pump.due(0.0)
    assert pump.failed(30.0, GpuMarketRateLimitError("429", status_code=429)) is not None
    assert not pump.due(89.0) and pump.due(90.0)  # 60 s
    assert pump.failed(90.0, GpuMarketRateLimitError("429", status_code=429)) is None  # reported once
    assert not pump.due(209.0) and pump.due(210.0)  # 120 s
    pump.read(210.0, "")
    assert pump.due(240.0)


def test_a_server_without_the_logs_endpoint_turns_reading_off():
    pump = pump_with(30)
    assert "not asking again" in (pump.failed(30.0, GpuMarketNotFoundError("404", status_code=404)) or "")
    assert pump.off and not pump.due(10**9)


def test_read_prefixes_lines_with_the_instance_and_reports_skips():
    pump = LogPump(7, 30.0, window=2)
    assert pump.read(0.0, "a\nb\n") == ["[instance 7] a", "[instance 7] b"]
    out = pump.read(30.0, "y\nz\n")
    assert out[0].startswith("[instance 7] ... (lines in between were not read") and out[1:] == [
        "[instance 7] y",
        "[instance 7] z",
    ]


def test_a_pump_tells_the_last_lines_the_exit_status_and_whether_the_log_was_read_to_its_end():
    pump = pump_with()
    pump.read(0.0, "boom\ngpumarket: job exited with status 3\n", final=True)
    assert pump.tail() == ["boom", "gpumarket: job exited with status 3"]
    assert pump.follower.exit_status == 3 and not pump.off
    pump.failed(1.0, GpuMarketServerError("503"), final=True)
    assert pump.off  # a preemption is never concluded from a log not read


class LogsHook(FlowsOverMethods):
    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.calls: list[dict] = []

    def get_instance_logs(self, instance_id, **kwargs):
        self.calls.append({"instance_id": instance_id, **kwargs})
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_forward_writes_new_lines_and_reports_a_failed_read_once(caplog):
    log = logging.getLogger("test.forward")
    pump = LogPump(7, 30.0, key_digest="d" * 64)
    hook = LogsHook("a\n", GpuMarketServerError("503", status_code=503), GpuMarketServerError("503"), "a\nb\n")
    with caplog.at_level(logging.INFO, logger="test.forward"):
        for _ in range(4):
            hook.run_flow(job_logs.forward_flow(hook, pump, log))
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == [
        "[instance 7] a",
        "[instance 7] b",
    ]
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert hook.calls[0] == {
        "instance_id": 7,
        "tail": 1000,
        "retry": False,
        "key_digests": ("d" * 64,),
    }


@pytest.mark.parametrize("interval", [-1, "30", float("nan")])
def test_a_bad_log_interval_is_refused_at_parse_time(interval):
    from airflow_gpumarket.exceptions import GpuMarketValidationError
    from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

    with pytest.raises(GpuMarketValidationError, match="log_interval"):
        GpuMarketRunJobOperator(task_id="t", offer_id=1, image="i", command="true", log_interval=interval)


def test_the_final_read_gets_the_hooks_retries_and_periodic_reads_one_try():
    hook = LogsHook("a\n", "a\n")
    pump = LogPump(7, 30.0)
    hook.run_flow(job_logs.forward_flow(hook, pump, logging.getLogger("test.forward")))
    hook.run_flow(job_logs.forward_flow(hook, pump, logging.getLogger("test.forward"), final=True))
    assert [call["retry"] for call in hook.calls] == [False, True]


def test_a_python_jobs_result_line_is_shown_by_its_size_only():
    from airflow_gpumarket import python_job

    line = python_job.marker("0123456789ab") + " eyJhIjogMX0="
    (shown,) = LogPump(7, 30.0).read(0.0, line + "\n")
    assert "return value" in shown and "eyJhIjogMX0=" not in shown


def test_rule_a_wait_after_a_preemption_shows_only_what_follows_the_lines_an_earlier_wait_showed():
    earlier = ["gpumarket: job started", "run 1", "checkpointed"]
    log = [*earlier, "Terminated", "gpumarket: job started", "run 1", "resumed"]
    assert LogFollower(shown=earlier).take(log) == ["Terminated", "gpumarket: job started", "run 1", "resumed"]
    assert LogFollower(shown=["not in this log"]).take(log) == log  # nothing is lost when they cannot be found
    follower = LogFollower(shown=earlier)
    follower.take(log)
    assert follower.take([*log, "done"]) == ["done"]  # later reads overlap as usual


@pytest.mark.parametrize(
    ("since", "first_read_at", "marked"),
    [
        (1000.0, 1005.0, False),  # a fresh rental that booted before the first read: no earlier wait read its log
        (1000.0, 1030.0, True),  # one log interval after its creation: an earlier wait may have shown lines
        (None, 1005.0, True),  # when the rental began is not known, the lines may repeat
    ],
)
def test_rule_only_a_wait_that_may_follow_an_unrecorded_one_marks_its_first_lines(since, first_read_at, marked):
    pump = LogPump(7, 30.0, since=since)
    pump.began(True, first_read_at)
    printed = "".join(f"line {i}\n" for i in range(1, 26))
    lines = pump.read(first_read_at + 30, printed)
    assert any("found the job already running" in line for line in lines) is marked
    assert len([line for line in lines if "] line " in line]) == (job_logs.RESUMED_WAIT_LINES if marked else 25)


def test_rule_an_exit_status_among_the_lines_an_earlier_wait_showed_is_the_jobs():
    shown = [
        "gpumarket: the staged data did not arrive within 5 s; the job does not start",
        "gpumarket: job exited with status 75",
    ]
    pump = LogPump(7, 30.0, shown=shown)
    assert pump.read(0.0, "\n".join(shown) + "\n", final=True) == []  # nothing shown twice
    assert pump.follower.exit_status == 75 and pump.tail() == shown
