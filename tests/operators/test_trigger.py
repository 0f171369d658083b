"""GpuMarketInstanceStatusTrigger: serialize() mirrors __init__, events follow the lifecycle rules, on_kill
destroys what the task rented."""

from __future__ import annotations

import asyncio
import importlib
import inspect

import pytest

from airflow_gpumarket import lifecycle
from airflow_gpumarket.exceptions import GpuMarketAuthError, GpuMarketNotFoundError, GpuMarketServerError
from airflow_gpumarket.triggers.instances import GpuMarketInstanceStatusTrigger


class FakeAsyncHook:
    """Answers get_instance from a script of statuses (an exception instance is raised)."""

    def __init__(self, script):
        self.script = list(script)
        self.reads = 0
        self.destroyed: list[int] = []
        self.closed = False

    async def get_instance(self, instance_id):
        self.reads += 1
        item = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(item, Exception):
            raise item
        return {"id": instance_id, "actual_status": item}

    async def destroy_instance(self, instance_id):
        self.destroyed.append(instance_id)
        return {"success": True}

    async def aclose(self):
        self.closed = True


def _run(trigger, hook, monkeypatch):
    monkeypatch.setattr(trigger, "_hook", lambda: hook)

    async def first_event():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(first_event())


def _trigger(**kw):
    kw.setdefault("instance_id", 7)
    kw.setdefault("poll_interval", 0)
    return GpuMarketInstanceStatusTrigger(**kw)


def test_serialize_round_trip_mirrors_init():
    trigger = GpuMarketInstanceStatusTrigger(
        instance_id=7,
        gpumarket_conn_id="c",
        wait_for=lifecycle.WAIT_JOB,
        target_status="running",
        poll_interval=3.5,
        boot_deadline=100.0,
        deadline=200.0,
        destroy_on_kill=True,
        dph_total=0.4,
    )
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (path, kwargs)
    assert set(kwargs) == set(inspect.signature(GpuMarketInstanceStatusTrigger.__init__).parameters) - {"self"}


def test_waits_through_provisioning_and_loading_until_running(monkeypatch):
    hook = FakeAsyncHook([None, "loading", "loading", "running"])
    event = _run(_trigger(), hook, monkeypatch)
    assert event == {"status": lifecycle.REACHED, "actual_status": "running", "instance_id": 7}
    assert hook.reads == 4 and hook.closed


@pytest.mark.parametrize("status", ["exited", "unknown", "offline"])
def test_fails_fast_on_statuses_that_never_run(monkeypatch, status):
    event = _run(_trigger(), FakeAsyncHook([None, status]), monkeypatch)
    assert event["status"] == lifecycle.NEVER_RUNS and event["actual_status"] == status


def test_job_mode_gone_is_success_and_stopped_is_failure(monkeypatch):
    ok = _run(
        _trigger(wait_for=lifecycle.WAIT_JOB), FakeAsyncHook(["running", GpuMarketNotFoundError("x")]), monkeypatch
    )
    assert ok["status"] == lifecycle.JOB_SUCCEEDED
    bad = _run(_trigger(wait_for=lifecycle.WAIT_JOB), FakeAsyncHook(["running", "stopped"]), monkeypatch)
    assert bad == {"status": lifecycle.JOB_FAILED, "actual_status": "stopped", "instance_id": 7}


def test_transient_errors_after_the_hooks_retries_keep_polling(monkeypatch):
    hook = FakeAsyncHook(["loading", GpuMarketServerError("503", status_code=503), "running"])
    assert _run(_trigger(), hook, monkeypatch)["status"] == lifecycle.REACHED
    assert hook.reads == 3


def test_non_retryable_error_ends_with_an_error_event(monkeypatch):
    event = _run(_trigger(), FakeAsyncHook([GpuMarketAuthError("refused", status_code=401)]), monkeypatch)
    assert event["status"] == lifecycle.ERROR and "refused" in event["message"]


def test_deadline_ends_waiting(monkeypatch):
    event = _run(_trigger(deadline=0.0), FakeAsyncHook(["running"]), monkeypatch)
    assert event["status"] == lifecycle.REACHED  # reaching the target wins over a deadline in the same read
    event = _run(_trigger(boot_deadline=0.0), FakeAsyncHook(["loading"]), monkeypatch)
    assert event["status"] == lifecycle.BOOT_TIMEOUT


def test_on_kill_destroys_the_rented_instance(monkeypatch):
    hook = FakeAsyncHook(["running"])
    trigger = _trigger(destroy_on_kill=True)
    monkeypatch.setattr(trigger, "_hook", lambda: hook)
    asyncio.run(trigger.on_kill())
    assert hook.destroyed == [7] and hook.closed


def test_on_kill_of_a_sensor_trigger_leaves_the_instance_alone(monkeypatch):
    hook = FakeAsyncHook(["running"])
    trigger = _trigger(destroy_on_kill=False)
    monkeypatch.setattr(trigger, "_hook", lambda: hook)
    asyncio.run(trigger.on_kill())
    assert hook.destroyed == []
