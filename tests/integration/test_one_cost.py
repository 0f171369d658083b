"""One cost, one clock: what a task says a rental cost is what its budget settles at, on the service's clock.

With a service that lists charges, the figure is the service's charge for the instance, read once it is gone: the task
log, the task's return value, the rental's record and the budget's settlement all agree with the simulator's ledger,
whatever the simulator's speed. Without charges, each says it is an estimate on the service's clock.
"""

from __future__ import annotations

import json

import pytest

from airflow_gpumarket import budgets

from .conftest import alive
from .test_budgets import reservations
from .test_interruptible import run_to_the_end
from .test_money_safety import context, job


@pytest.fixture
def service(request, sim, monkeypatch):
    """The simulator the task rents from: the suite's (600x), or one of its own at another speed or profile."""
    speed, profile = request.param
    if (speed, profile) == (600, "live"):
        yield sim
        return
    from gpumarket_simulator import MarketSimulator

    with MarketSimulator(speed=speed, seed=11, execute_onstart=True, profile=profile) as own:
        for name, value in own.connection_env().items():
            conn = json.loads(value)
            conn["extra"] |= {"retry_min_wait": 0.01, "retry_max_wait": 0.05, "max_retries": 6, "timeout": 2}
            monkeypatch.setenv(name, json.dumps(conn))
        yield own


def ledger_cost(service) -> float:
    (instance,) = service.state()["instances"]
    return instance["cost"]


@pytest.mark.parametrize("service", [(60, "live"), (600, "live")], indirect=True, ids=["60x", "600x"])
@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_rule_one_cost_the_task_log_result_and_settlement_are_the_services_charge(service, deferrable, task_log):
    op = job(command="echo ok", deferrable=deferrable)
    result = run_to_the_end(op) if deferrable else op.execute(context())
    charged = ledger_cost(service)
    assert result["cost_kind"] == "charged" and result["cost"] == pytest.approx(charged, rel=0.05)
    (entry,) = reservations()
    assert entry["cost"] == budgets.round_up(result["cost"])
    log = task_log()
    assert f"cost ${result['cost']:.4f}, charged by the service" in log
    assert f"settled at ${entry['cost']:.4f} (what it cost)" in log
    assert alive(service) == []


@pytest.mark.parametrize("service", [(600, "spec")], indirect=True, ids=["spec"])
def test_rule_without_charges_the_cost_is_an_estimate_on_the_services_clock_and_says_so(service, task_log):
    result = job(command="echo ok").execute(context())
    (instance,) = service.state()["instances"]
    assert result["cost_kind"] == "estimated" and result["cost"] == result["estimated_cost"] > 0
    (entry,) = reservations()
    assert entry["cost"] == budgets.round_up(result["cost"])
    assert "estimated on the service's clock" in task_log()
    assert alive(service) == []


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_rule_one_cost_after_a_preemption_the_result_and_the_ledger_cover_every_rental_at_its_charge(
    sim, deferrable, task_log
):
    """The preempted instance, kept stopped as the checkpoint's source (disk bills, compute does not), settles at its
    charge, not at its price over its whole life; the task's result sums both rentals, each with its own figure."""
    from .test_durable_data import CKPT, EPOCHS
    from .test_interruptible import Outbidder

    op = job(command=EPOCHS, interruptible=True, checkpoint_dir=CKPT, max_runtime=600, deferrable=deferrable)
    with Outbidder(sim, times=1, marker=" done"):
        result = run_to_the_end(op) if deferrable else op.execute(context())
    assert result["job_status"] == "succeeded"
    charged = {i["id"]: i["cost"] for i in sim.state()["instances"]}
    assert len(charged) == 2 and alive(sim) == []
    assert {r["instance_id"]: r["cost"] for r in result["rentals"]} == pytest.approx(charged, rel=0.01, abs=1e-6)
    assert [r["cost_kind"] for r in result["rentals"]] == ["charged", "charged"]
    assert result["cost_kind"] == "charged" and result["cost"] == pytest.approx(sum(charged.values()), rel=0.01)
    settled = {e["instance_id"]: e["cost"] for e in reservations()}
    assert settled == {i: budgets.round_up(c) for i, c in charged.items()}
    log = task_log()
    assert f"cost ${result['cost']:.4f}, charged by the service over 2 rentals" in log
    assert "(the last at $" in log  # the one rate shown is the last rental's
    # What `airflow gpumarket spend` and the page's spend read: the service's charges, attributed through the ledger.
    from airflow_gpumarket import spend_report
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    hook = GpuMarketHook()
    now = sim.now()  # a new hook has not learnt the service's clock yet, and this one runs 600x
    report = spend_report.build(hook.charges(now - 86400, now + 60), reservations(), start=now - 86400, end=now + 60)
    assert not report.leaked and float(report.recorded) == pytest.approx(result["cost"], rel=0.01)


def test_rule_an_instance_the_failure_callback_destroys_is_settled_at_what_the_service_charged(sim):
    """A lost worker's rental, stopped for hours before Airflow gives up on the task: the callback, which holds no
    rental of its own, settles it at the service's charge (its disk while stopped), not at its price over its life."""
    from airflow_gpumarket._compat import TaskDeferred
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
    from airflow_gpumarket.operators.guard import destroy_rentals_on_failure

    with pytest.raises(TaskDeferred):
        job(command="sleep 600", deferrable=True).execute(context())  # the worker dies while the trigger waits
    (instance,) = alive(sim)
    hook = GpuMarketHook()
    hook.stop_instance(instance["id"])
    sim.advance(3 * 3600)
    parsed = job(command="sleep 600", deferrable=True)  # what the DAG processor parsed
    destroy_rentals_on_failure({**context(), "task": parsed})
    assert alive(sim) == []
    charged = sum(c.amount for c in hook.charges(0, sim.now() + 60) if c.instance_id == instance["id"])
    (entry,) = reservations()
    assert charged > 0 and entry["cost"] == pytest.approx(charged, rel=0.01, abs=0.0001), (entry, charged)
