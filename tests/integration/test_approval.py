"""An approval above a price (approval_above) against the simulator: asked in the UI, then rented or refused.

Airflow's human-in-the-loop request is written through the Task SDK, which a test has no supervisor for: the write
is recorded here instead, and the answer is given as Airflow gives it to the resumed task.
"""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from airflow_gpumarket import _compat
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.operators.approval import DO_NOT_RENT
from airflow_gpumarket.operators.failures import GpuMarketApprovalRefused

from .conftest import AIRFLOW_2, alive
from .test_money_safety import healthy_market, job  # noqa: F401 (an autouse fixture)


def context() -> dict:
    ti = SimpleNamespace(id="0190f5a0-0000-7000-8000-000000000001", try_number=1, map_index=-1)
    return {"run_id": "run-1", "ti": ti, "task_instance": ti}


@pytest.fixture
def asked(monkeypatch) -> list[dict]:
    """The human-in-the-loop requests the task wrote."""
    from airflow.sdk.execution_time import hitl

    written: list[dict] = []
    monkeypatch.setattr(hitl, "upsert_hitl_detail", lambda **request: written.append(request))
    return written


def answer(chosen: list[str]) -> dict:
    return {
        "chosen_options": chosen,
        "params_input": {},
        "responded_at": datetime.now(UTC),
        "responded_by_user": {"id": "7", "name": "ana"},
    }


def asks(op) -> BaseException:
    """The task asks a person and waits, having rented nothing."""
    with pytest.raises(_compat.pauses()) as waiting:
        op.execute(context())
    return waiting.value


ON_AIRFLOW_3 = pytest.mark.skipif(AIRFLOW_2, reason="human-in-the-loop is Airflow 3.1's")


@pytest.mark.skipif(not AIRFLOW_2, reason="Airflow 2.11 only")
def test_rule_on_airflow_2_approval_above_is_refused_at_parse_time_naming_the_version():
    with pytest.raises(GpuMarketValidationError, match="approval_above.*needs Airflow 3.1 or later"):
        job(approval_above=5)


@ON_AIRFLOW_3
def test_rule_a_rental_under_approval_above_is_rented_without_asking(sim, asked):
    result = job(approval_above=100.0).execute(context())
    assert result["job_status"] == "succeeded" and asked == [] and alive(sim) == []


@ON_AIRFLOW_3
def test_rule_a_rental_above_approval_above_asks_first_and_granted_rents(sim, asked, task_log):
    op = job(approval_above=0.0001)
    waiting = asks(op)
    assert sim.state()["instances"] == [] and getattr(waiting, "method_name", None) == "execute_after_approval"
    (request,) = asked
    rent, refuse = request["options"]
    assert rent.startswith("Rent, worst case up to $") and refuse == DO_NOT_RENT
    assert request["defaults"] == [DO_NOT_RENT]  # no answer in time: not rented
    shown = ("**Offer**", "**Worst case** reserved in the budget", "**DAG budgets**", "**DAG spend, last 7 days**")
    assert all(words in request["body"] for words in shown), request["body"]
    result = op.execute_after_approval(context(), answer([rent]))
    assert result["job_status"] == "succeeded" and len(sim.state()["instances"]) == 1
    assert "Approved by ana" in task_log() and alive(sim) == []


@ON_AIRFLOW_3
@pytest.mark.parametrize(
    "event",
    [answer([DO_NOT_RENT]), {"error": "no answer", "error_type": "timeout"}],
    ids=["refused", "timed-out"],
)
def test_rule_a_refused_or_unanswered_approval_fails_having_rented_nothing(sim, asked, event):
    op = job(approval_above=0.0001)
    asks(op)
    with pytest.raises(GpuMarketApprovalRefused, match="nothing was rented"):
        op.execute_after_approval(context(), event)
    assert sim.state()["instances"] == []


@ON_AIRFLOW_3
def test_a_bad_approval_above_is_refused_at_parse_time():
    with pytest.raises(GpuMarketValidationError, match="approval_above"):
        job(approval_above=-1)
    with pytest.raises(GpuMarketValidationError, match="approval_timeout"):
        job(approval_above=5, approval_timeout=0)
