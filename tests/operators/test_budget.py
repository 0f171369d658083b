"""The renting task's part of budgets (operators/budget.py), with the ledger and the service faked."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from airflow_gpumarket import budgets, ledger
from airflow_gpumarket._compat import AirflowException
from airflow_gpumarket.operators import budget as budget_module
from airflow_gpumarket.operators.failures import GpuMarketBudgetExceeded

LOG = logging.getLogger("test")
WORST = budgets.WorstCase(amount=0.1, hourly=1.0, seconds=360)
T0 = 1000.0  # the service's time just before the create


class Ledger:
    """A ledger client that records calls; ``refuse`` or ``down`` make reserve fail."""

    def __init__(self, refuse: str | None = None, down: bool = False) -> None:
        self.refuse, self.down, self.calls = refuse, down, []

    def reserve(self, request):
        self.calls.append(("reserve", request))
        if self.down:
            raise AirflowException("The budget ledger at http://api/gpumarket/ledger did not answer")
        if self.refuse:
            raise ledger.BudgetRefused(self.refuse)
        return 7

    def attach(self, conn_id, reservation_id, instance_id):
        self.calls.append(("attach", reservation_id, instance_id))

    def settle(self, conn_id, *, reservation_id=None, instance_id=None, ended=None):
        self.calls.append(("settle", reservation_id, instance_id))
        return 0.01


def keeper(monkeypatch, client: Ledger, *, variable=None, credit=None) -> budget_module.Budget:
    monkeypatch.setattr(budget_module, "ledger_client", lambda hook: client)
    if variable is None:
        monkeypatch.delenv("AIRFLOW_VAR_GPUMARKET_BUDGETS", raising=False)
    else:
        monkeypatch.setenv("AIRFLOW_VAR_GPUMARKET_BUDGETS", variable)
    hook = SimpleNamespace(account=lambda: SimpleNamespace(available=credit))
    context = {
        "run_id": "r1",
        "ti": SimpleNamespace(map_index=0, try_number=2),
        "dag": SimpleNamespace(tags=["team:nlp"]),
    }
    return budget_module.Budget(hook, LOG, context, dag_id="fanout", task_id="job", conn_id="gpumarket_default")


def test_a_reservation_carries_the_task_instance_its_team_its_budgets_and_the_credit(monkeypatch):
    client = Ledger()
    keeper(monkeypatch, client, variable='{"fanout": {"day": 1}}', credit=25.0).reserve(WORST, started=T0)
    ((_, request),) = client.calls
    assert (request.dag_id, request.run_id, request.task_id, request.map_index, request.try_number) == (
        "fanout",
        "r1",
        "job",
        0,
        2,
    )
    assert request.team == "nlp" and request.limits == budgets.Limits(day=1.0) and request.available == 25.0
    assert (request.worst, request.hourly, request.seconds) == (0.1, 1.0, 360)


def test_a_refused_reservation_fails_the_task_with_the_ledgers_sentence(monkeypatch):
    with pytest.raises(GpuMarketBudgetExceeded, match="The day budget of DAG 'fanout'"):
        keeper(monkeypatch, Ledger(refuse="The day budget of DAG 'fanout' is $1.00: ...")).reserve(WORST, started=T0)


def test_a_malformed_budgets_variable_fails_before_renting_naming_the_key(monkeypatch):
    with pytest.raises(GpuMarketBudgetExceeded, match=r"gpumarket_budgets\['fanout'\].day must be a number"):
        keeper(monkeypatch, Ledger(), variable='{"fanout": {"day": "lots"}}')


def test_a_ledger_out_of_reach_fails_the_task_only_when_a_budget_depends_on_it(monkeypatch):
    with pytest.raises(AirflowException, match="did not answer"):
        keeper(monkeypatch, Ledger(down=True), variable='{"fanout": {"day": 1}}').reserve(WORST, started=T0)
    keeper(monkeypatch, Ledger(down=True), credit=5.0).reserve(WORST, started=T0)  # no budget: a warning, and rent
    with pytest.raises(GpuMarketBudgetExceeded, match="credit is \\$0.05"):
        keeper(monkeypatch, Ledger(down=True), credit=0.05).reserve(WORST, started=T0)  # the credit, still checked


def test_the_created_instance_is_attached_and_a_create_that_made_nothing_is_released(monkeypatch):
    client = Ledger()
    task = keeper(monkeypatch, client)
    task.reserve(WORST, started=T0)
    task.created(41)
    task.reserve(WORST, started=T0)
    task.not_created()
    assert client.calls[1:] == [("attach", 7, 41), ("reserve", client.calls[2][1]), ("settle", 7, None)]


def test_an_instance_found_by_label_after_an_unanswered_create_settles_the_pending_reservation(monkeypatch):
    client = Ledger()
    task = keeper(monkeypatch, client)
    task.reserve(WORST, started=T0)
    task.ended(99)  # the failure path found it by its label and destroyed it
    assert client.calls[1:] == [("attach", 7, 99), ("settle", None, 99)]


def test_settling_never_raises_on_a_failure_path(monkeypatch, caplog):
    def broken(hook):
        raise RuntimeError("no ledger here")

    monkeypatch.setattr(budget_module, "ledger_client", broken)
    budget_module.settle_ended(SimpleNamespace(), "c", 5, LOG)
    assert "Could not settle the budget reservation of instance 5" in caplog.text
