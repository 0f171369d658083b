"""Budgets against the simulator: a rental that does not fit is refused before anything is rented, and a job that
reaches max_cost is destroyed within one poll interval."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime

import pytest
from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket import ledger
from airflow_gpumarket.operators.failures import GpuMarketBudgetExceeded

from .conftest import POLL, alive
from .test_money_safety import cheapest_offers, context, job


def budgets_variable(monkeypatch, value: dict) -> None:
    monkeypatch.setenv("AIRFLOW_VAR_GPUMARKET_BUDGETS", json.dumps(value))


def in_dag(dag_id: str, **kwargs):
    with DAG(dag_id=dag_id, start_date=datetime(2026, 1, 1), schedule=None):
        return job(**kwargs)


def reservations() -> list[dict]:
    from airflow import settings

    return ledger.entries(settings.engine, since=0)


def test_rule_a_rental_over_the_dag_budget_fails_before_anything_is_rented(sim, monkeypatch, task_log):
    budgets_variable(monkeypatch, {"budget_dag": {"day": 0.01}})
    with pytest.raises(GpuMarketBudgetExceeded, match=r"The day budget of DAG 'budget_dag' is \$0.01") as caught:
        in_dag("budget_dag").execute(context())
    assert "worst case" in str(caught.value) and "Nothing was rented" in str(caught.value)
    assert sim.state()["instances"] == []
    assert reservations() == []
    assert "Renting offer" not in task_log()  # the refusal says nothing was rented: no line said otherwise


def test_rule_a_rental_within_the_budget_is_reserved_then_settled_at_what_it_cost(sim, monkeypatch):
    budgets_variable(monkeypatch, {"*": {"day": 50.0}})
    result = in_dag("settled_dag", max_runtime=600).execute(context())
    (entry,) = reservations()
    assert entry["instance_id"] == result["instance_id"] and entry["dag_id"] == "settled_dag"
    assert entry["cost"] is not None and 0 <= entry["cost"] <= entry["reserved"]
    assert alive(sim) == []


def test_rule_a_job_reaching_max_cost_is_destroyed_within_one_poll_interval(sim, monkeypatch, task_log):
    operator = in_dag("capped_dag", command="sleep 100000", max_cost=0.0001)
    started = time.time()
    with pytest.raises(GpuMarketBudgetExceeded, match=r"reached max_cost=\$0.0001: it cost "):
        operator.execute(context())
    (entry,) = reservations()
    deadline = entry["created_at"] + 0.0001 / entry["hourly"] * 3600
    destroyed = [r for r in sim.requests() if r["method"] == "DELETE" and r["status"] == 200]
    assert destroyed and alive(sim) == []
    # The task's own clock: the destroy came within one poll interval (plus the read and the destroy) of the deadline.
    assert time.time() - deadline < POLL + 2.0, (started, deadline)
    assert entry["cost"] is not None


def test_rule_max_cost_counts_no_compute_while_the_instance_boots(sim):
    """The service bills no compute while an instance loads: max_cost is reached on what it bills, not during boot."""
    (cheapest,) = cheapest_offers(1)
    max_cost = cheapest["dph_total"] * 30 / 3600  # thirty seconds of compute; boots here take one to five minutes
    operator = job(offer_id=int(cheapest["id"]), command="sleep 100000", max_cost=max_cost)
    sim.set_speed(60)  # a poll is one simulated second: the stop comes soon after the estimate reaches max_cost
    try:
        with pytest.raises(GpuMarketBudgetExceeded, match=r"reached max_cost=\$[\d.]+: it cost ") as caught:
            operator.execute(context())
    finally:
        sim.set_speed(600)
    (instance,) = sim.state()["instances"]
    assert instance["first_running_at"] is not None, "stopped while it booted"
    quoted = float(re.search(r"it cost (?:about )?\$([\d.]+)", str(caught.value))[1])
    assert quoted >= max_cost * 0.95, (max_cost, str(caught.value))
    assert alive(sim) == []


def test_rule_a_rental_that_would_overdraw_the_account_fails_before_renting(sim):
    sim.set_credit(0.05)  # below any job's worst case here (its price over a 6.5-hour lease)
    with pytest.raises(GpuMarketBudgetExceeded, match=r"The account's credit is \$0.05") as caught:
        job().execute(context())
    assert "stop at $0" in str(caught.value)
    assert sim.state()["instances"] == []


def test_rule_the_services_stop_at_zero_credit_fails_the_job_naming_the_credit_and_leaves_nothing_alive(sim):
    import threading

    from .test_money_safety import wait_until

    def spend_it_all() -> None:  # as another team's jobs would, once this job runs
        wait_until(lambda: any(i["actual_status"] == "running" for i in sim.state()["instances"]))
        sim.set_credit(0.001)  # the simulator's clock runs 600x: spent within a second

    market = threading.Thread(target=spend_it_all, daemon=True)
    market.start()
    with pytest.raises(GpuMarketBudgetExceeded, match="credit ran out") as caught:
        job(command="sleep 100000").execute(context())
    market.join(30)
    said = str(caught.value)
    assert "$-" not in said and " left), and the service stopped every instance" in said  # one clause, no "$-0.00"
    assert sim.account()["stops"], "the simulator never stopped at $0"
    assert alive(sim) == []


def test_rule_the_worst_case_counts_the_disk_at_the_offers_storage_cost(sim):
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    result = job(disk=200, max_runtime=600).execute(context())
    (offer,) = GpuMarketHook().search_offers({"id": {"eq": result["offer_id"]}})
    (entry,) = reservations()
    assert offer["storage_cost"] > 0
    assert entry["hourly"] == pytest.approx(result["dph_total"] + 200 * offer["storage_cost"] / 720, abs=1e-6)


def test_rule_a_deferred_task_marked_failed_ends_its_rental_and_settles_its_reservation(sim, monkeypatch):
    """The trigger's on_kill ends the rental through the same function as the task: destroyed, then settled."""
    import asyncio
    from types import SimpleNamespace

    from airflow_gpumarket._compat import TaskDeferred
    from airflow_gpumarket.triggers import instances as trigger_module

    budgets_variable(monkeypatch, {"*": {"day": 50.0}})
    with pytest.raises(TaskDeferred) as deferred:
        in_dag("marked_dag", command="sleep 100000", deferrable=True).execute(context())
    (held,) = reservations()
    assert held["cost"] is None and held["instance_id"] == deferred.value.trigger.instance_id
    trigger = deferred.value.trigger
    trigger.task_instance = SimpleNamespace(try_number=1, dag_id="marked_dag", task_id="job", run_id="r", map_index=-1)
    monkeypatch.setattr(trigger_module, "_task_instance_now", lambda ti: ("failed", 1, "execute_complete"))
    asyncio.run(trigger._destroy_if_left_by_a_user())
    assert alive(sim) == []
    (settled,) = reservations()
    assert settled["cost"] is not None and 0 <= settled["cost"] < held["reserved"]  # its estimate, not its worst case


def test_rule_a_task_on_a_service_whose_clock_runs_faster_says_a_rental_may_cost_more_than_its_worst_case(
    sim, task_log
):
    """The suite's simulator runs 600x, and its connection says so (rate_limit_scale): said once per try."""
    in_dag("budget_dag").execute(context())
    assert task_log().count("The service's clock runs 600x this host's") == 1
    assert alive(sim) == []
