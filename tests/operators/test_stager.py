"""The stager's reading of a cloud copy: the service shows progress only in ``status_msg``, about 30 s late."""

from __future__ import annotations

import logging

import pytest

from airflow_gpumarket import api, staging
from airflow_gpumarket.operators import copies
from airflow_gpumarket.operators import stager as stager_module
from airflow_gpumarket.operators.stager import Stager

from .renting_fakes import Clock

FINISHED = api.CLOUD_COPY_FINISHED


class CopyHook:
    """Answers each read of instance 7 with the next message, on a service clock that the task's clock drives."""

    def __init__(self, clock: Clock, messages: list[str]) -> None:
        self.clock, self.messages = clock, list(messages)
        self.started: list[dict] = []
        self.cancelled: list[int] = []

    def service_now(self) -> float:
        return self.clock.now

    def find_instance(self, instance_id: int) -> dict:
        message = self.messages.pop(0) if len(self.messages) > 1 else self.messages[0]
        return {"id": instance_id, "actual_status": "stopped", "status_msg": message}

    def start_cloud_copy(self, instance_id: int, integration_id: int, **body) -> dict:
        self.started.append(body)
        return {"success": True}

    def cancel_cloud_copy(self, instance_id: int) -> dict:
        self.cancelled.append(instance_id)
        return {"success": True}

    def cloud_integration(self, name: str) -> dict:
        return {"id": 1, "name": name}


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(stager_module, "time", clock)
    monkeypatch.setattr(copies, "time", clock)
    return clock


def stager_for(hook, **plan) -> Stager:
    plan = staging.make_plan(
        checkpoint_dir="/ckpt",
        checkpoint_uri="b/ckpt",
        cloud_integration="s3",
        inputs=None,
        outputs=plan.get("outputs"),
        on_restore_failure="restart",
        staging_timeout=plan.get("staging_timeout", 600.0),
    )
    stager = Stager(
        hook,
        logging.getLogger("test"),
        plan,
        poll_interval=10.0,
        source_lease=3600.0,
        key="0123456789ab",
        stop_if_killed=lambda instance_id: None,
        end_source=lambda instance_id: None,
    )
    stager.resolve()  # the integration named "s3" is id 1
    return stager


def test_rule_a_finished_message_unchanged_since_before_the_copy_is_trusted_only_after_twice_the_lag(clock):
    # The read before the copy, then one every 10 s: "Finished" of the copy before never changes.
    hook = CopyHook(clock, [FINISHED])
    stager = stager_for(hook)
    started = clock.now
    stager.save(7)
    assert hook.started[0]["src"] == "/ckpt/" and hook.started[0]["dst"] == "b/ckpt/"
    assert 2 * staging.STATUS_MSG_LAG_SECONDS <= clock.now - started < 2 * staging.STATUS_MSG_LAG_SECONDS + 10


def test_rule_a_changed_message_ends_the_wait_once_the_lag_has_passed(clock):
    hook = CopyHook(clock, [FINISHED, *["Cloud Copy Operation: 50%"] * 4, FINISHED])
    stager = stager_for(hook)
    started = clock.now
    stager.save(7)
    assert staging.STATUS_MSG_LAG_SECONDS <= clock.now - started < 2 * staging.STATUS_MSG_LAG_SECONDS


def test_rule_no_reading_is_trusted_before_the_services_lag_has_passed(clock):
    hook = CopyHook(clock, ["Outbid", "Cloud Copy Operation Failed: denied", FINISHED])
    stager = stager_for(hook)
    started = clock.now
    stager.save(7)
    assert clock.now - started >= staging.STATUS_MSG_LAG_SECONDS


def test_rule_an_output_copy_that_fails_is_reported_with_the_services_words(clock):
    hook = CopyHook(clock, ["", "Cloud Copy Operation: 10%", "Cloud Copy Operation Failed: 403 Forbidden"])
    stager = stager_for(hook, outputs={"/out": "r/out"})
    lost = stager.stage_out(7)
    assert lost == {"/out": "'r/out': the service says 'Cloud Copy Operation Failed: 403 Forbidden'"}


def test_rule_a_copy_past_staging_timeout_is_cancelled_and_reported(clock):
    hook = CopyHook(clock, ["", "Cloud Copy Operation: 10%"])
    stager = stager_for(hook, outputs={"/out": "r/out"}, staging_timeout=120.0)
    lost = stager.stage_out(7)
    assert "did not end within staging_timeout (120 s)" in lost["/out"]
    assert hook.cancelled == [7]
