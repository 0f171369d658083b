"""GpuMarketInstanceStatusTrigger: serialize() mirrors __init__, events follow the lifecycle rules, on_kill
destroys what the task rented."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import re
import threading
import time
from types import SimpleNamespace

import pytest

from airflow_gpumarket import _compat, job_logs, lifecycle, outcome, waiting
from airflow_gpumarket.exceptions import GpuMarketAuthError, GpuMarketNotFoundError, GpuMarketServerError
from airflow_gpumarket.triggers import instances as trigger_module
from airflow_gpumarket.triggers.instances import GpuMarketInstanceStatusTrigger
from airflow_gpumarket.waiting import Observation

from .fakes import FakeAsyncHook, _run


@pytest.fixture(params=[True, False], ids=["shared-poller", "naive"])
def shared(request):
    return request.param


@pytest.fixture
def make_trigger(shared):
    """A trigger of instance 7; the watch's fields may be given one by one, ``key_digest`` as the rental's."""

    def make(**kw):
        watch = {name: kw.pop(name) for name in list(kw) if name in waiting.Watch().to_dict()}
        if "key_digest" in kw:
            kw["rental"] = {**kw.get("rental", {}), "key_digest": kw.pop("key_digest")}
        kw.setdefault("instance_id", 7)
        kw.setdefault("poll_interval", 0)
        kw.setdefault("shared_poller", shared)
        return GpuMarketInstanceStatusTrigger(watch=watch, **kw)

    return make


def rebuilt(trigger: GpuMarketInstanceStatusTrigger) -> GpuMarketInstanceStatusTrigger:
    """The trigger as the triggerer makes it again from its row."""
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)(**kwargs)


def test_serialize_round_trip_mirrors_init_and_carries_the_wait_as_one_value():
    watch = waiting.Watch(
        wait_for=lifecycle.WAIT_JOB,
        boot_deadline=100.0,
        deadline=200.0,
        max_runtime=60.0,
        label="afgm-0123456789ab-1900000000",
        keepalive=900.0,
        lease_cap=1_900_003_600.0,
        hold_bid_up_to=0.3,
        shown_lines=["epoch 1"],
    )
    trigger = GpuMarketInstanceStatusTrigger(
        instance_id=7,
        gpumarket_conn_id="c",
        watch=watch.to_dict(),
        rental={"instance_id": 7, "key_digest": "ab" * 32},
        poll_interval=3.5,
        log_interval=30.0,
        destroy_on_kill=True,
        shared_poller=False,
    )
    path, kwargs = trigger.serialize()
    assert rebuilt(trigger).serialize() == (path, kwargs)
    assert set(kwargs) == set(inspect.signature(GpuMarketInstanceStatusTrigger.__init__).parameters) - {
        "self",
        "legacy",
    }
    assert len(kwargs) <= 8 and waiting.Watch.from_dict(kwargs["watch"]) == watch


def test_a_trigger_row_written_by_the_previous_version_resumes_with_its_wait_and_rental(monkeypatch):
    """A task deferred before an upgrade: its row holds the watch's fields one by one and ``resume``."""
    old_row = {
        "instance_id": 7,
        "gpumarket_conn_id": "c",
        "wait_for": lifecycle.WAIT_JOB,
        "target_status": "running",
        "poll_interval": 0,
        "boot_deadline": None,
        "deadline": None,
        "max_runtime": 60.0,
        "running_since": None,
        "destroy_on_kill": True,
        "dph_total": 0.4,
        "label": "afgm-0123456789ab-1900000000",
        "keepalive": None,
        "lease_cap": None,
        "shared_poller": False,
        "log_interval": 0.0,
        "key_digest": "ab" * 32,
        "outbid_wait_until": None,
        "cost_deadline": None,
        "hold_bid_up_to": None,
        "shown_lines": None,
        "resume": {"instance_id": 7, "created_at": 1.0},
    }
    trigger = GpuMarketInstanceStatusTrigger(**old_row)
    assert trigger.watch["max_runtime"] == 60.0 and trigger.watch["wait_for"] == lifecycle.WAIT_JOB
    assert trigger.rental == old_row["resume"] and trigger.destroy_on_kill
    assert rebuilt(trigger).serialize() == trigger.serialize()
    event = _run(trigger, FakeAsyncHook(["running", "stopped"]), monkeypatch)
    assert event["status"] == outcome.EventKind.JOB_FAILED and event["resume"] == old_row["resume"]
    with pytest.raises(TypeError, match="colour"):
        GpuMarketInstanceStatusTrigger(**old_row, colour="red")


def test_waits_through_provisioning_and_loading_until_running(make_trigger, monkeypatch):
    hook = FakeAsyncHook([None, "loading", "loading", "running"])
    before = time.time()
    event = _run(make_trigger(), hook, monkeypatch)
    running_at = event.pop("running_at")  # the service's time of the first read that found it running
    assert event.pop("read_at") >= running_at  # the service's time of the last read
    assert event == {"status": outcome.EventKind.REACHED, "actual_status": "running", "instance_id": 7}
    assert hook.reads == 4 and before <= running_at <= time.time()


@pytest.mark.parametrize("status", ["exited", "unknown", "offline"])
def test_fails_fast_on_statuses_that_never_run(make_trigger, monkeypatch, status):
    event = _run(make_trigger(), FakeAsyncHook([None, status]), monkeypatch)
    assert event["status"] == outcome.EventKind.NEVER_RUNS and event["actual_status"] == status


def test_job_mode_gone_is_success_and_stopped_is_failure(make_trigger, monkeypatch):
    ok = _run(
        make_trigger(wait_for=lifecycle.WAIT_JOB), FakeAsyncHook(["running", GpuMarketNotFoundError("x")]), monkeypatch
    )
    assert ok["status"] == outcome.EventKind.JOB_SUCCEEDED
    bad = _run(make_trigger(wait_for=lifecycle.WAIT_JOB), FakeAsyncHook(["running", "stopped"]), monkeypatch)
    assert bad.pop("running_at") <= bad.pop("stopped_at") <= bad.pop("read_at")  # the service's times of the reads
    assert bad == {"status": outcome.EventKind.JOB_FAILED, "actual_status": "stopped", "instance_id": 7}


def test_job_output_is_forwarded_while_it_runs_and_a_failure_event_has_the_tail(make_trigger, monkeypatch, task_log):
    hook = FakeAsyncHook(["loading", "running", "running", "running", "stopped"])
    hook.log_texts = ["a\n", "a\nb\n", "a\nb\nboom\ngpumarket: job exited with status 3\n"]
    trigger = make_trigger(wait_for=lifecycle.WAIT_JOB, log_interval=1e-9, key_digest="cd" * 32)
    event = _run(trigger, hook, monkeypatch)
    assert event["exit_status"] == 3 and event["log_tail"][-2:] == ["boom", "gpumarket: job exited with status 3"]
    assert "exit status 3" in outcome.from_event({**event, "resume": None})[0].describe()
    forwarded = re.findall(r"\[instance 7\] (\S+)", task_log())
    assert forwarded == ["a", "b", "boom", "gpumarket:"]
    assert hook.log_reads[0] == {"tail": 1000, "retry": False, "key_digests": ("cd" * 32,)}


def test_a_job_that_stopped_its_instance_after_exit_zero_succeeds_with_every_line_for_the_resumed_task(
    make_trigger, monkeypatch, task_log
):
    """The final read's lines travel in the event (Airflow may close the trigger's log file before lines logged
    just before the event reach it); the resumed task logs them."""
    hook = FakeAsyncHook(["loading", "running", "stopped"])  # a 3-second job: no read happened while it ran
    hook.log_texts = ["gpumarket: job started\none\ntwo\nthree\ngpumarket: job exited with status 0\n"]
    event = _run(make_trigger(wait_for=lifecycle.WAIT_JOB, log_interval=30), hook, monkeypatch)
    assert event["status"] == outcome.EventKind.JOB_SUCCEEDED and event["actual_status"] == "stopped"
    assert event["exit_status"] == 0 and hook.destroyed == []  # the resumed task destroys it
    assert [re.sub(r"^\[instance 7\] ", "", line) for line in event["final_lines"]] == [
        "gpumarket: job started",
        "one",
        "two",
        "three",
        "gpumarket: job exited with status 0",
    ]
    assert "[instance 7] one" not in task_log()
    assert hook.log_reads == [{"tail": 1000, "retry": True, "key_digests": ()}]


def test_the_final_lines_an_event_carries_are_capped_and_say_what_was_left_out():
    lines = [f"[instance 7] line {i}" for i in range(job_logs.EVENT_FINAL_LINES + 5)]
    lines[-1] += "x" * 10_000
    held = job_logs.held_for_the_task(lines, 7)
    assert held[0] == "[instance 7] ... (5 earlier lines of the last read not shown)"
    assert held[1] == "[instance 7] line 5" and len(held) == job_logs.EVENT_FINAL_LINES + 1
    assert len(held[-1]) == job_logs.EVENT_LINE_CHARS
    assert job_logs.held_for_the_task(lines[:3], 7) == lines[:3]


@pytest.mark.parametrize(("first", "marked"), [("running", True), ("loading", False)])
def test_a_wait_that_finds_the_job_running_says_how_many_lines_may_repeat(
    make_trigger, monkeypatch, task_log, first, marked
):
    """A triggerer restart makes a new trigger, which cannot know what the old one forwarded: when the job was
    already running at its first read, its first log read shows the log's last lines only, saying they may
    repeat; later reads are new lines only, each once."""
    hook = FakeAsyncHook([first, "running", "running", "stopped"])
    hook.log_texts = ["a\nb\n", "a\nb\nc\n", "a\nb\nc\ngpumarket: job exited with status 0\n"]
    event = _run(make_trigger(wait_for=lifecycle.WAIT_JOB, log_interval=1e-9), hook, monkeypatch)
    found = re.findall(r"\[instance 7\] (.*)", task_log() + "\n".join(event.get("final_lines", [])))
    lines = [re.split(r"\s{2,}| \[airflow_gpumarket", line)[0] for line in found]  # without the log's decoration
    notes = [line for line in lines if line.startswith("(this wait found the job already running")]
    job_lines = [line for line in lines if not line.startswith("(")]
    assert job_lines == ["a", "b", "c", "gpumarket: job exited with status 0"]
    assert len(notes) == (1 if marked else 0)
    if marked:
        assert lines.index(notes[0]) == 0 and "the 2 lines below" in notes[0] and "0 earlier lines" in notes[0]


def test_a_wait_that_finds_the_job_running_repeats_at_most_its_last_few_lines(make_trigger, monkeypatch, task_log):
    hook = FakeAsyncHook(["running", "running", "stopped"])
    printed = "".join(f"line {i}\n" for i in range(1, 101))
    hook.log_texts = [printed, printed + "line 101\n", printed + "line 101\ngpumarket: job exited with status 0\n"]
    event = _run(make_trigger(wait_for=lifecycle.WAIT_JOB, log_interval=1e-9), hook, monkeypatch)
    text = task_log() + "\n".join(event.get("final_lines", []))
    shown = re.findall(r"\[instance 7\] (line \d+)", text)
    assert shown == [f"line {i}" for i in range(81, 102)]  # the last 20 of the first read, then each new line
    assert "80 earlier lines are not shown again" in text


def test_an_unreadable_final_log_is_not_a_success_and_says_what_was_lost(make_trigger, monkeypatch, task_log):
    hook = FakeAsyncHook(["running", "stopped"])
    hook.log_texts = [GpuMarketServerError("logs: HTTP 503 after retries", status_code=503)]
    event = _run(make_trigger(wait_for=lifecycle.WAIT_JOB, log_interval=30), hook, monkeypatch)
    assert event["status"] == outcome.EventKind.JOB_FAILED and event["exit_status"] is None
    assert "no exit status could be read" in outcome.from_event(event)[0].describe()
    assert "The final read of the log of instance 7 failed after retries" in task_log()


def test_job_output_is_not_read_with_log_interval_zero_nor_after_success(make_trigger, monkeypatch):
    hook = FakeAsyncHook(["running", "stopped"])
    event = _run(make_trigger(wait_for=lifecycle.WAIT_JOB), hook, monkeypatch)
    assert "log_tail" not in event and hook.log_reads == []
    hook = FakeAsyncHook(["running", "running", GpuMarketNotFoundError("gone")])
    _run(make_trigger(wait_for=lifecycle.WAIT_JOB, log_interval=3600), hook, monkeypatch)
    assert hook.log_reads == []


def test_job_mode_max_runtime_counts_from_the_first_running_read(make_trigger, monkeypatch):
    trigger = make_trigger(wait_for=lifecycle.WAIT_JOB, max_runtime=0.0)
    hook = FakeAsyncHook([None, "loading", "loading", "running"])
    event = _run(trigger, hook, monkeypatch)
    assert event["status"] == outcome.EventKind.TIMEOUT and event["limit"] == outcome.MAX_RUNTIME
    assert hook.reads == 4  # the boot's reads did not count against it


def test_job_watch_keeps_the_lease_alive_through_the_label(make_trigger, monkeypatch):
    """A lease about to run out is moved keepalive ahead (never past the cap), and gone within it is success."""
    now = time.time()
    trigger = make_trigger(
        wait_for=lifecycle.WAIT_JOB,
        label=lifecycle.make_label("0123456789ab", now + 100),
        keepalive=900.0,
        lease_cap=now + 3600,
    )
    hook = FakeAsyncHook(["running", "running", GpuMarketNotFoundError("x")])
    assert _run(trigger, hook, monkeypatch)["status"] == outcome.EventKind.JOB_SUCCEEDED
    ((instance_id, label),) = hook.labels  # renewed once: the renewed lease is far from due on the next read
    assert instance_id == 7 and lifecycle.lease_of(label) == pytest.approx(now + 900, abs=5)


def test_job_gone_after_the_lease_expired_is_reported_as_unknown_not_success(make_trigger, monkeypatch):
    trigger = make_trigger(wait_for=lifecycle.WAIT_JOB, label=lifecycle.make_label("0123456789ab", time.time() - 5))
    event = _run(trigger, FakeAsyncHook(["running", GpuMarketNotFoundError("x")]), monkeypatch)
    assert event["status"] == outcome.EventKind.LEASE_EXPIRED
    assert "outcome is unknown" in outcome.from_event(event)[0].describe()


def test_transient_errors_after_the_hooks_retries_keep_polling(make_trigger, monkeypatch):
    hook = FakeAsyncHook(["loading", GpuMarketServerError("503", status_code=503), "running"])
    assert _run(make_trigger(), hook, monkeypatch)["status"] == outcome.EventKind.REACHED
    assert hook.reads == 3


def test_non_retryable_error_ends_with_an_error_event(make_trigger, monkeypatch):
    event = _run(make_trigger(), FakeAsyncHook([GpuMarketAuthError("refused", status_code=401)]), monkeypatch)
    assert event["status"] == outcome.EventKind.ERROR and "refused" in event["message"]


def test_deadline_ends_waiting(make_trigger, monkeypatch):
    event = _run(make_trigger(deadline=0.0), FakeAsyncHook(["running"]), monkeypatch)
    assert event["status"] == outcome.EventKind.REACHED  # reaching the target wins over a deadline in the same read
    event = _run(make_trigger(boot_deadline=0.0), FakeAsyncHook(["loading"]), monkeypatch)
    assert event["status"] == outcome.EventKind.BOOT_TIMEOUT


def test_on_kill_destroys_the_rented_instance_of_a_task_marked_failed(make_trigger, monkeypatch):
    hook = FakeAsyncHook(["running"])
    trigger = make_trigger(destroy_on_kill=True)
    trigger.task_instance = TI
    monkeypatch.setattr(trigger, "_hook", lambda: hook)
    monkeypatch.setattr(trigger_module, "_task_instance_now", lambda ti: ("failed", None, None))
    asyncio.run(trigger.on_kill())
    assert hook.destroyed == [7] and hook.closed


@pytest.mark.parametrize(("state", "destroyed"), [("deferred", []), ("failed", [7])])
def test_rule_on_kill_after_a_user_action_cancel_destroys_only_a_task_a_person_took_out_of_deferral(
    make_trigger, monkeypatch, state, destroyed
):
    """Airflow 3.3's triggerer cancels with its user-action message on a hand-over to another triggerer too.

    As the triggerer does: the running trigger is cancelled, then on_kill is awaited. Still deferred: a hand-over, the
    instance is kept; marked failed: destroyed.
    """
    hook = FakeAsyncHook(["running"])
    trigger = make_trigger(destroy_on_kill=True, wait_for=lifecycle.WAIT_JOB)
    trigger.task_instance = TI
    monkeypatch.setattr(trigger, "_hook", lambda: hook)
    monkeypatch.setattr(trigger_module, "_task_instance_now", lambda ti: (state, None, None))

    async def cancelled_by_user_action():
        async def run():
            async for _ in trigger.run():
                raise AssertionError("a running job fires no event")

        running = asyncio.ensure_future(run())
        while hook.reads < 3:
            await asyncio.sleep(0.01)
        running.cancel("user action")
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await trigger.on_kill()

    asyncio.run(cancelled_by_user_action())
    assert hook.destroyed == destroyed


def test_on_kill_without_a_task_instance_to_read_leaves_the_instance_to_its_lease(make_trigger, monkeypatch):
    hook = FakeAsyncHook(["running"])
    trigger = make_trigger(destroy_on_kill=True)
    monkeypatch.setattr(trigger, "_hook", lambda: hook)
    said = []
    monkeypatch.setattr(trigger.log, "warning", lambda message, *args: said.append(message % args))
    asyncio.run(trigger.on_kill())
    assert hook.destroyed == [] and said == ["No task instance to read: instance 7 left to its lease"]


def test_rule_a_deferred_task_marked_failed_writes_its_rentals_end_from_the_trigger(make_trigger, monkeypatch):
    from airflow_gpumarket.ui import records

    written = []
    monkeypatch.setattr(records, "write_end", lambda ti, record: written.append((ti, record)))
    hook = FakeAsyncHook(["running"])
    trigger = make_trigger(destroy_on_kill=True)
    monkeypatch.setattr(trigger, "_hook", lambda: hook)
    trigger.task_instance = TI
    monkeypatch.setattr(trigger_module, "_task_instance_now", lambda ti: ("failed", None, None))
    trigger._current = trigger._wait()
    trigger._current.running_at = 1234.0  # the service's time of its first read that found the instance running
    asyncio.run(trigger.on_kill())
    ((ti, record),) = written
    assert ti is TI and record["instance_id"] == 7 and record["end_only"] and record["running_at"] == 1234.0
    assert record["ended_at"] == pytest.approx(time.time(), abs=5)  # the hook's clock offset: none here


def test_on_kill_of_a_sensor_trigger_leaves_the_instance_alone(make_trigger, monkeypatch):
    hook = FakeAsyncHook(["running"])
    trigger = make_trigger(destroy_on_kill=False)
    monkeypatch.setattr(trigger, "_hook", lambda: hook)
    asyncio.run(trigger.on_kill())
    assert hook.destroyed == []


AIRFLOW_2 = _compat.is_airflow_2()
TI = SimpleNamespace(dag_id="d", run_id="r", task_id="t", map_index=-1, try_number=1)


@pytest.fixture(params=[False, True], ids=["before-3.3", "3.3+"])
def calls_on_kill(request, monkeypatch):
    """Whether the triggerer calls on_kill (Airflow 3.3+) or only cleanup (2.11 and 3.0-3.2), on any installed
    Airflow: the rules are the provider's, only the state read differs (tested on its own below)."""
    monkeypatch.setattr(_compat, "triggerer_calls_on_kill", lambda: request.param)
    return request.param


def _clean_up(trigger, monkeypatch, read_now) -> FakeAsyncHook:
    """Run the trigger's cleanup as a triggerer does (task_instance set), its task instance read by ``read_now``:
    the hook, to see what it destroyed."""
    hook = FakeAsyncHook(["running"])
    trigger.task_instance = TI
    monkeypatch.setattr(trigger, "_hook", lambda: hook)
    monkeypatch.setattr(trigger_module, "_task_instance_now", read_now)
    asyncio.run(trigger.cleanup())
    return hook


@pytest.mark.parametrize(
    ("now", "destroy_on_kill", "destroyed_without_on_kill"),
    [
        (("failed", 1, "execute_complete"), True, True),  # a user marked the deferred task failed
        ((None, 1, None), True, True),  # cleared, not yet rerun
        (None, True, True),  # its DAG run was deleted
        (("deferred", 1, "execute_complete"), True, False),  # the triggerer stopped or handed the trigger on
        (("scheduled", 1, "execute_complete"), True, False),  # another triggerer's copy fired (HA hand-over)
        (("scheduled", 1, "__fail__"), True, False),  # the deferral timed out: the task's failure path has it
        (("running", 2, None), True, False),  # cleared and rerun: the new try adopts the instance
        (("failed", 2, None), True, False),  # ... and that try already failed: its own failure path destroyed
        (("success", 1, "execute_complete"), True, False),  # may be a resumed task that handed the instance over
        (("failed", 1, "execute_complete"), False, False),  # a sensor's trigger: the instance is not the task's
        # Airflow 3.0-3.2 tell the state only: no try number, no next method
        (("failed", None, None), True, True),
        ((None, None, None), True, True),
        (("deferred", None, None), True, False),
        (("scheduled", None, None), True, False),
        (("running", None, None), True, False),
        (("up_for_retry", None, None), True, False),
        (("success", None, None), True, False),
    ],
)
def test_cleanup_destroys_only_when_a_user_took_the_task_out_of_deferral_before_airflow_3_3(
    make_trigger, monkeypatch, calls_on_kill, now, destroy_on_kill, destroyed_without_on_kill
):
    """Before 3.3 no triggerer calls a trigger's on_kill; from 3.3 cleanup runs where nothing may be destroyed."""
    hook = _clean_up(make_trigger(destroy_on_kill=destroy_on_kill), monkeypatch, lambda ti: now)
    assert hook.destroyed == ([7] if destroyed_without_on_kill and not calls_on_kill else [])


@pytest.mark.parametrize(
    ("now", "destroy_on_kill", "destroyed"),
    [(("failed", None, None), True, True), (("deferred", None, None), True, False), ((None, None, None), True, True)]
    + [(("scheduled", None, None), True, False), (("failed", None, None), False, False), (None, True, True)],
)
def test_on_kill_follows_the_same_rule_as_cleanup(make_trigger, monkeypatch, now, destroy_on_kill, destroyed):
    """3.3+'s on_kill: marked failed, cleared or deleted destroys; still deferred (a hand-over) or resumed keeps."""
    hook = FakeAsyncHook(["running"])
    trigger = make_trigger(destroy_on_kill=destroy_on_kill)
    trigger.task_instance = TI
    monkeypatch.setattr(trigger, "_hook", lambda: hook)
    monkeypatch.setattr(trigger_module, "_task_instance_now", lambda ti: now)
    asyncio.run(trigger.on_kill())
    assert hook.destroyed == ([7] if destroyed else [])


def test_cleanup_after_the_trigger_fired_never_destroys(make_trigger, monkeypatch, calls_on_kill):
    """After an event the task instance resumes: the instance is the task's again, whatever happens next."""
    hook = FakeAsyncHook(["running"])
    trigger = make_trigger(destroy_on_kill=True)
    trigger.task_instance = TI
    assert _run(trigger, hook, monkeypatch)["status"] == outcome.EventKind.REACHED
    monkeypatch.setattr(trigger_module, "_task_instance_now", lambda ti: ("failed", 1, "execute_complete"))
    asyncio.run(trigger.cleanup())
    assert hook.destroyed == []


def test_cleanup_leaves_the_instance_to_its_lease_when_the_state_cannot_be_read(
    make_trigger, monkeypatch, calls_on_kill
):
    def unreadable(ti):
        raise RuntimeError("database is locked")

    assert _clean_up(make_trigger(destroy_on_kill=True), monkeypatch, unreadable).destroyed == []


def test_cleanup_leaves_the_instance_to_its_lease_when_the_state_read_hangs(make_trigger, monkeypatch):
    """A triggerer shutting down may never answer: cleanup gives up after STATE_READ_TIMEOUT and keeps it."""
    monkeypatch.setattr(_compat, "triggerer_calls_on_kill", lambda: False)
    monkeypatch.setattr(trigger_module, "STATE_READ_TIMEOUT", 0.05)
    released = threading.Event()

    def hangs(ti):  # longer than STATE_READ_TIMEOUT; asyncio.run then waits for this thread to end
        released.wait(0.5)
        return ("failed", 1, None)

    try:
        assert _clean_up(make_trigger(destroy_on_kill=True), monkeypatch, hangs).destroyed == []
    finally:
        released.set()


def test_a_cleanup_cancelled_again_half_way_still_destroys(make_trigger, monkeypatch):
    """3.2's triggerer cancels a dropped trigger again on each pass of its loop: the read and the destroy go on."""
    monkeypatch.setattr(_compat, "triggerer_calls_on_kill", lambda: False)
    hook = FakeAsyncHook(["running"])
    trigger = make_trigger(destroy_on_kill=True)
    trigger.task_instance = TI
    monkeypatch.setattr(trigger, "_hook", lambda: hook)
    reading, cancelled = threading.Event(), threading.Event()

    def read_answered_after_the_second_cancel(ti):
        reading.set()
        cancelled.wait(5)
        return ("failed", None, None)

    monkeypatch.setattr(trigger_module, "_task_instance_now", read_answered_after_the_second_cancel)

    async def cancelled_twice():
        cleaning = asyncio.ensure_future(trigger.cleanup())
        while not reading.is_set():
            await asyncio.sleep(0.01)
        cleaning.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await cleaning
        cancelled.set()
        while trigger_module._CLEANUPS:  # the triggerer's loop goes on running it
            await asyncio.sleep(0.01)

    asyncio.run(cancelled_twice())
    assert hook.destroyed == [7]


@pytest.mark.skipif(AIRFLOW_2, reason="Airflow 2.11's triggerer reads the metadata database (tested below)")
@pytest.mark.parametrize(
    ("ti", "answer", "now"),
    [
        (TI, {"r": {"t": "failed"}}, ("failed", None, None)),
        (TI, {"r": {"t": None}}, (None, None, None)),  # cleared
        (TI, {}, None),  # its DAG run is gone
        (TI, {"r": {}}, None),  # the task left the DAG's run
        (SimpleNamespace(**{**vars(TI), "map_index": 0}), {"r": {"t_0": "deferred"}}, ("deferred", None, None)),
    ],
)
def test_cleanup_reads_the_task_instance_state_through_the_task_sdk_on_airflow_3(monkeypatch, ti, answer, now):
    """Airflow 3.0-3.2: the same call the standard provider's WorkflowTrigger makes (GetTaskStates through the
    triggerer's supervisor), keyed by run id, then task id (``<task_id>_<map_index>`` when mapped)."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
    from airflow.utils.state import TaskInstanceState

    asked = []

    def get_task_states(**kw):
        asked.append(kw)
        return {run: {k: (TaskInstanceState(v) if v else v) for k, v in tasks.items()} for run, tasks in answer.items()}

    monkeypatch.setattr(RuntimeTaskInstance, "get_task_states", staticmethod(get_task_states))
    assert trigger_module._task_instance_now(ti) == now
    assert asked == [dict(dag_id="d", map_index=ti.map_index, task_ids=["t"], run_ids=["r"])]


@pytest.mark.parametrize(
    ("by_a_user", "now", "destroyed"),
    [
        (True, ("failed", 1, "execute_complete"), [7]),
        (True, ("deferred", 1, None), []),  # 3.3's triggerer cancels "by user action" on a hand-over too
        (False, ("deferred", 1, None), []),
    ],
    ids=["marked-failed", "handed-over", "triggerer-stopping"],
)
def test_the_installed_triggerer_cancelling_a_trigger_destroys_only_for_a_user(
    make_trigger, monkeypatch, by_a_user, now, destroyed
):
    """The installed Airflow's own TriggerRunner.run_trigger, cancelled as its update loop cancels a trigger whose
    task instance a user took out of deferral (3.3+ says so in the cancel message and calls on_kill; 2.11 and
    3.0-3.2 call cleanup, which reads the state), or as a stopping triggerer cancels every trigger."""
    from airflow.jobs.triggerer_job_runner import TriggerRunner

    hook = FakeAsyncHook(["loading"])  # never running: the trigger waits until it is cancelled
    trigger = make_trigger(destroy_on_kill=True)
    monkeypatch.setattr(trigger, "_hook", lambda: hook)
    monkeypatch.setattr(trigger_module, "_task_instance_now", lambda ti: now)
    runner = TriggerRunner()
    if AIRFLOW_2:
        runner.set_trigger_logging_metadata(SimpleNamespace(**vars(TI), trigger_timeout=None), 1, trigger)
    else:
        trigger.task_instance = SimpleNamespace(**vars(TI), id="0199-ti", context_carrier=None)
    runner.triggers[1] = {"name": "d/r/t/-1/1 (ID 1)", "events": 0}
    message = getattr(importlib.import_module(TriggerRunner.__module__), "_USER_ACTION_CANCEL_MSG", None)

    async def run_then_cancel():
        running = asyncio.create_task(runner.run_trigger(1, trigger))
        while hook.reads < 3 and not running.done():
            await asyncio.sleep(0)
        assert not running.done(), running.exception()
        running.cancel(message if by_a_user else None)
        with contextlib.suppress(asyncio.CancelledError):
            await running

    asyncio.run(run_then_cancel())
    assert hook.destroyed == destroyed


@pytest.mark.skipif(not AIRFLOW_2, reason="Airflow 3's triggerer has no metadata database to read")
def test_cleanup_reads_the_task_instance_from_airflow_2_metadata_database(airflow_db):
    from datetime import UTC, datetime

    from airflow.models.dag import DAG
    from airflow.operators.empty import EmptyOperator
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunType

    dag = DAG("gpm_cleanup_state", start_date=datetime(2026, 1, 1, tzinfo=UTC), schedule=None)
    EmptyOperator(task_id="wait", dag=dag)
    when = datetime.now(UTC)
    run = dag.create_dagrun(
        state="running",
        run_id=f"r-{when.timestamp()}",
        execution_date=when,
        run_type=DagRunType.MANUAL,
        data_interval=(when, when),
    )
    ti = run.get_task_instance("wait")
    for state in ("deferred", "failed"):
        with create_session() as session:
            ti.set_state(state, session=session)
        assert trigger_module._task_instance_now(ti) == (state, ti.try_number, None)
    assert trigger_module._task_instance_now(SimpleNamespace(**{**vars(TI), "dag_id": "no_such_dag"})) is None


def test_resume_state_is_returned_in_every_event(make_trigger, monkeypatch):
    event = _run(make_trigger(rental={"instance_id": 7}), FakeAsyncHook(["running"]), monkeypatch)
    assert event["resume"] == {"instance_id": 7}


def test_rule_a_holding_trigger_raises_the_bid_when_the_machines_min_bid_rises_and_hands_it_back(
    make_trigger, monkeypatch
):
    hook = FakeAsyncHook(["running", "running", "running", "reached"])
    hook.bids = {"bid_price": 0.21, "min_bid": 0.205}  # half the margin eaten
    trigger = make_trigger(wait_for=lifecycle.WAIT_STATUS, target_status="reached", hold_bid_up_to=0.3)
    event = _run(trigger, hook, monkeypatch)
    assert hook.bid_changes == [(7, round(0.205 * 1.05, 4))]  # once: the next reads show the raised bid
    assert event["status"] == "reached" and event["bid"] == round(0.205 * 1.05, 4)


def test_a_trigger_that_holds_nothing_never_changes_a_bid(make_trigger, monkeypatch):
    hook = FakeAsyncHook(["running", "reached"])
    hook.bids = {"bid_price": 0.21, "min_bid": 0.3}
    event = _run(make_trigger(wait_for=lifecycle.WAIT_STATUS, target_status="reached"), hook, monkeypatch)
    assert hook.bid_changes == [] and "bid" not in event


# --- one trigger run by two triggerers at once ---------------------------------------------------------------------


def _ticks(n: int, *, ended: bool = False) -> str:
    return "".join(f"tick {i}\n" for i in range(1, n + 1)) + ("gpumarket: job exited with status 0\n" if ended else "")


def test_rule_two_copies_of_one_trigger_show_each_line_of_the_job_once(make_trigger, monkeypatch, task_log):
    """Airflow may run one trigger on two triggerers at once (a hand-over under load): copy B starts while copy A
    still reads. What each copy forwards and what the event that resumes the task carries hold each line once,
    whichever copy's event Airflow takes."""
    record: dict[str, object] = {}
    monkeypatch.setattr(trigger_module.task_xcom, "get_value", lambda ti, key: record.get(key))
    monkeypatch.setattr(trigger_module.task_xcom, "set_value", lambda ti, key, value: record.__setitem__(key, value))
    copies = {}
    for name in ("A", "B"):
        hook = FakeAsyncHook(["running"])
        trigger = make_trigger(wait_for=lifecycle.WAIT_JOB, log_interval=10.0)
        trigger.task_instance = TI
        copies[name] = (trigger, trigger._wait(), hook)

    def step(name, status, now, log):
        trigger, wait, hook = copies[name]
        hook.log_texts = [log]
        return asyncio.run(trigger._step(hook, wait, Observation(status=status, at=now), now))

    assert step("A", "loading", 0.0, _ticks(0)) is None  # A sees the instance boot
    assert step("A", "running", 1.0, _ticks(0)) is None  # and the job start
    assert step("A", "running", 11.0, _ticks(5)) is None  # then shows ticks 1-5
    assert step("B", "running", 12.0, _ticks(6)) is None  # B takes the trigger over: the job is running
    assert step("A", "running", 21.0, _ticks(8)) is None  # A has not noticed yet: ticks 6-8
    assert step("B", "running", 22.0, _ticks(9)) is None  # B's first read: tick 9 only
    events = [step(name, "stopped", 30.0, _ticks(10, ended=True)) for name in ("A", "B")]

    forwarded = re.findall(r"\[instance 7\] (tick \d+)", task_log())
    for event in events:  # the resumed task shows one event's lines: either is whole and repeats nothing
        assert event.kind is outcome.EventKind.JOB_SUCCEEDED
        held = [re.sub(r"^\[instance 7\] ", "", line) for line in event.final_lines]
        assert forwarded + [line for line in held if line.startswith("tick")] == [f"tick {i}" for i in range(1, 11)]
    assert "may repeat" not in task_log()  # B knew what A had shown: nothing is shown twice, so nothing is said
    assert len(forwarded) == 9  # A showed ticks 1-8 and B tick 9 while the job ran


def test_an_unreachable_record_of_lines_shown_is_said_once_and_the_wait_goes_on(make_trigger, monkeypatch, task_log):
    def unreachable(ti, key, *value):
        raise ConnectionError("api-server down")

    monkeypatch.setattr(trigger_module.task_xcom, "get_value", unreachable)
    monkeypatch.setattr(trigger_module.task_xcom, "set_value", unreachable)
    hook = FakeAsyncHook(["running", "running", "running", "stopped"])
    hook.log_texts = [_ticks(1), _ticks(2), _ticks(3, ended=True)]
    trigger = make_trigger(wait_for=lifecycle.WAIT_JOB, log_interval=1e-9)
    trigger.task_instance = TI
    event = _run(trigger, hook, monkeypatch)
    assert event["status"] == outcome.EventKind.JOB_SUCCEEDED and event["exit_status"] == 0
    assert task_log().count("Could not reach the record of the job's lines shown") == 1


def test_a_record_of_lines_shown_that_fails_once_is_read_again(make_trigger, monkeypatch):
    """A triggerer's supervisor may stall for half a minute: one failed read does not turn sharing off for good."""
    answers = [TimeoutError(), ["tick 1"]]

    def get_value(ti, key):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(trigger_module.task_xcom, "get_value", get_value)
    trigger = make_trigger(wait_for=lifecycle.WAIT_JOB, log_interval=10.0)
    trigger.task_instance = TI
    read = trigger._shared_record

    assert asyncio.run(read(trigger_module.task_xcom.get_value, "k")) is None and trigger._shares_lines()
    assert asyncio.run(read(trigger_module.task_xcom.get_value, "k")) == ["tick 1"]
