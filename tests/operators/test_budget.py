"""The renting task's part of budgets (operators/budget.py), with the ledger and the service faked."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from sqlalchemy import create_engine

from airflow_gpumarket import budgets, ledger, outcome
from airflow_gpumarket._compat import AirflowException, TaskDeferred
from airflow_gpumarket.operators import budget as budget_module
from airflow_gpumarket.operators import signed_routes
from airflow_gpumarket.operators.failures import GpuMarketBudgetExceeded

from .renting_fakes import DONE, FakeHook, ctx, fired, job

LOG = logging.getLogger("test")
WORST = budgets.WorstCase(amount=0.1, hourly=1.0, seconds=360)
T0 = 1000.0  # the service's time just before the create


class Ledger:
    """A ledger client that records calls; ``refuse`` or ``down`` make reserve fail; the try rented ``last`` times."""

    def __init__(self, refuse: str | None = None, down: bool = False, last: int = 0) -> None:
        self.refuse, self.down, self.last, self.calls = refuse, down, last, []

    def last_attempt(self, **task_try):
        self.calls.append(("last_attempt", task_try))
        if self.down:
            raise AirflowException("The budget ledger at http://api/gpumarket/ledger did not answer")
        return self.last

    def reserve(self, request):
        self.calls.append(("reserve", request))
        if self.refuse:
            raise ledger.BudgetRefused(self.refuse)
        return ledger.Reservation(7, budgets.Limits(day=1.0), ["gpumarket_budgets['other'] is skipped"])

    def attach(self, conn_id, reservation_id, instance_id):
        self.calls.append(("attach", reservation_id, instance_id))

    def settle(self, conn_id, *, reservation_id=None, instance_id=None, ended=None, cost=None):
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


@pytest.fixture
def direct(tmp_path, monkeypatch):
    """The ledger in a fresh database, reached as Airflow 2 tasks reach it."""
    engine = create_engine(f"sqlite:///{tmp_path}/airflow.db")
    monkeypatch.setattr(budget_module, "ledger_client", lambda hook: budget_module._Direct(engine))
    yield engine
    engine.dispose()


def test_a_reservation_carries_the_task_instance_its_attempt_its_team_and_the_credit(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=LOG.name)  # an Airflow 2.11 task run earlier may leave it at WARNING
    client = Ledger()
    keeper(monkeypatch, client, credit=25.0).reserve(WORST, started=T0)
    ((_, task_try), (_, request)) = client.calls
    assert task_try == {
        "conn_id": "gpumarket_default",
        "dag_id": "fanout",
        "run_id": "r1",
        "task_id": "job",
        "map_index": 0,
        "try_number": 2,
    }
    assert (request.dag_id, request.run_id, request.task_id, request.map_index, request.try_number) == (
        "fanout",
        "r1",
        "job",
        0,
        2,
    )
    assert request.attempt == 1 and request.team == "nlp" and request.available == 25.0
    assert (request.worst, request.hourly, request.seconds) == (0.1, 1.0, 360)
    # The budgets the ledger applied, and its warnings, are in the task's log.
    assert "DAG budgets: {'day': 1.0}" in caplog.text and "gpumarket_budgets['other'] is skipped" in caplog.text


def test_each_create_of_a_try_reserves_under_an_attempt_of_its_own_counted_on_after_a_resume(monkeypatch):
    client = Ledger(last=2)  # the try rented twice before it deferred
    task = keeper(monkeypatch, client)
    task.reserve(WORST, started=T0)
    task.reserve(WORST, started=T0)
    attempts = [call[1].attempt for call in client.calls if call[0] == "reserve"]
    assert attempts == [3, 4] and [call[0] for call in client.calls].count("last_attempt") == 1


def test_a_refused_reservation_fails_the_task_with_the_ledgers_sentence(monkeypatch):
    with pytest.raises(GpuMarketBudgetExceeded, match="The day budget of DAG 'fanout'"):
        keeper(monkeypatch, Ledger(refuse="The day budget of DAG 'fanout' is $1.00: ...")).reserve(WORST, started=T0)


def test_a_malformed_budgets_variable_fails_before_renting_naming_the_key(monkeypatch, direct):
    task = keeper(monkeypatch, budget_module._Direct(direct), variable='{"fanout": {"day": "lots"}}')
    with pytest.raises(GpuMarketBudgetExceeded, match=r"gpumarket_budgets\['fanout'\].day must be a number"):
        task.reserve(WORST, started=T0)
    assert ledger.entries(direct, since=0) == []


def test_a_malformed_entry_for_another_dag_is_one_warning_and_this_dag_rents(monkeypatch, direct, caplog):
    variable = '{"fanout": {"day": 1}, "typo_dag": {"day": "lots"}}'
    keeper(monkeypatch, budget_module._Direct(direct), variable=variable).reserve(WORST, started=T0)
    (entry,) = ledger.entries(direct, since=0)
    assert entry["reserved"] == WORST.amount
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "gpumarket_budgets['typo_dag'].day must be a number" in warning


@pytest.mark.parametrize("edited", ['{"*": {"day": "5"}}', "{not json", '{"*": {"day": 0.0001}}'])
def test_a_resumed_task_keeps_its_reservation_whatever_the_variable_became(monkeypatch, direct, edited):
    monkeypatch.setenv("AIRFLOW_VAR_GPUMARKET_BUDGETS", '{"*": {"day": 5}}')
    hook = FakeHook({1: ["running", DONE]})
    with pytest.raises(TaskDeferred) as deferred:
        job(hook, deferrable=True).execute(ctx())
    (reserved,) = ledger.entries(direct, since=0)
    monkeypatch.setenv("AIRFLOW_VAR_GPUMARKET_BUDGETS", edited)  # while the job runs in the triggerer
    event = fired(deferred, outcome.EventKind.JOB_SUCCEEDED, actual_status="stopped")
    result = job(hook, deferrable=True).execute_complete(ctx(), event)  # a new Budget: it reads no Variable
    assert result["job_status"] == "succeeded" and hook.alive() == []
    (settled,) = ledger.entries(direct, since=0)
    assert settled["id"] == reserved["id"] and settled["cost"] is not None


def test_a_ledger_out_of_reach_fails_the_task_only_when_a_budget_depends_on_it(monkeypatch):
    with pytest.raises(AirflowException, match="did not answer"):
        keeper(monkeypatch, Ledger(down=True), variable='{"fanout": {"day": 1}}').reserve(WORST, started=T0)
    with pytest.raises(GpuMarketBudgetExceeded, match=r"gpumarket_budgets\['\*'\]"):
        keeper(monkeypatch, Ledger(down=True), variable='{"*": {"day": "1"}}').reserve(WORST, started=T0)
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
    assert client.calls[2:] == [("attach", 7, 41), ("reserve", client.calls[3][1]), ("settle", 7, None)]


def test_an_instance_found_by_label_after_an_unanswered_create_settles_the_pending_reservation(monkeypatch):
    client = Ledger()
    task = keeper(monkeypatch, client)
    task.reserve(WORST, started=T0)
    task.ended(99)  # the failure path found it by its label and destroyed it
    assert client.calls[2:] == [("attach", 7, 99), ("settle", None, 99)]


def test_settling_never_raises_on_a_failure_path(monkeypatch, caplog):
    def broken(hook):
        raise RuntimeError("no ledger here")

    monkeypatch.setattr(budget_module, "ledger_client", broken)
    budget_module.settle_ended(SimpleNamespace(), "c", 5, LOG)
    assert "Could not settle the budget reservation of instance 5" in caplog.text


def test_a_reservation_is_attached_once_when_on_kill_ends_the_rental_during_the_attach(monkeypatch):
    """on_kill (another thread) may end the rental while the task attaches its reservation: one attach, never None."""
    from airflow_gpumarket.operators.budget import Budget

    attached: list = []
    budget = Budget(None, logging.getLogger("test"), {}, dag_id="d", task_id="t", conn_id="c")
    budget.reservation_id = 41  # reserved before the create

    class Client:
        def attach(self, conn_id, reservation_id, instance_id):
            attached.append(reservation_id)
            if len(attached) == 1:
                budget.created(instance_id)  # on_kill's ended(), arriving mid-attach

    monkeypatch.setattr(budget_module, "ledger_client", lambda hook: Client())
    budget.created(7)
    assert attached == [41] and budget.reservation_id is None


class Wire:
    """``requests.post`` answering each call in turn: an exception is raised, a (status, detail) pair is the reply."""

    def __init__(self, *answers) -> None:
        self.answers, self.sent = list(answers), []

    def __call__(self, url, data=None, headers=None, timeout=None):
        import json

        import requests

        self.sent.append((url, headers["X-GpuMarket-Nonce"], data, timeout))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        reply = requests.Response()
        reply.status_code, reply._content = answer[0], json.dumps({"detail": answer[1]}).encode()
        return reply


def routes(monkeypatch, *answers):
    import requests

    from airflow_gpumarket.operators.host_memory_client import ApiServerHostMemory

    wire = Wire(*answers)
    monkeypatch.setattr(requests, "post", wire)
    return wire, budget_module._ApiServer("http://api", "key"), ApiServerHostMemory("http://api", "key", "conn")


def test_a_route_that_did_not_answer_is_asked_again_with_a_new_nonce_then_named_with_the_ledger_url_option(
    monkeypatch,
):
    import requests

    lost = [requests.ConnectionError("reset")] * signed_routes.TRIES
    wire, ledger_routes, hosts = routes(monkeypatch, *lost, *lost)
    with pytest.raises(AirflowException, match=r"ledger at http://api/gpumarket/ledger did not answer.*ledger_url"):
        ledger_routes.last_attempt(conn_id="conn")
    with pytest.raises(AirflowException, match=r"Host memory at http://api/gpumarket/hosts did not answer.*ledger_url"):
        hosts.avoided()
    nonces = [nonce for _, nonce, _, _ in wire.sent]
    assert len(nonces) == len(set(nonces)) == 2 * signed_routes.TRIES
    assert {timeout for *_, timeout in wire.sent} == {signed_routes.TIMEOUT_SECONDS}


def test_a_400_from_either_route_is_a_validation_error_naming_the_field(monkeypatch):
    from airflow_gpumarket.exceptions import GpuMarketValidationError

    _, ledger_routes, hosts = routes(
        monkeypatch, (400, "worst must be a number"), (400, "ttl_seconds: must be a number of seconds > 0, got 0")
    )
    with pytest.raises(GpuMarketValidationError) as worst:
        ledger_routes.last_attempt(conn_id="conn")
    with pytest.raises(GpuMarketValidationError) as ttl:
        hosts.avoided()
    assert (worst.value.field, worst.value.problem) == ("worst", "must be a number")
    assert ttl.value.field == "ttl_seconds" and ttl.value.problem.startswith("must be a number of seconds")


def test_a_409_is_the_ledgers_budget_refusal_and_other_refusals_name_who_refused(monkeypatch):
    _, ledger_routes, hosts = routes(monkeypatch, (409, "the day budget is spent"), (409, "busy"), (401, "unsigned"))
    with pytest.raises(ledger.BudgetRefused, match="day budget is spent"):
        ledger_routes.last_attempt(conn_id="conn")
    with pytest.raises(AirflowException, match="Host memory at http://api/gpumarket/hosts refused the request: busy"):
        hosts.avoided()
    with pytest.raises(AirflowException, match="budget ledger at http://api/gpumarket/ledger refused .*: unsigned"):
        ledger_routes.last_attempt(conn_id="conn")


def test_a_ledger_that_refuses_the_request_as_malformed_is_a_ledger_out_of_reach(monkeypatch):
    from airflow_gpumarket.exceptions import GpuMarketValidationError

    class Skewed(Ledger):
        def last_attempt(self, **task_try):
            raise GpuMarketValidationError("attempt", "must be an integer")

    keeper(monkeypatch, Skewed(), credit=5.0).reserve(WORST, started=T0)  # no budget: rent on, with a warning
    with pytest.raises(GpuMarketValidationError, match="attempt"):
        keeper(monkeypatch, Skewed(), variable='{"fanout": {"day": 1}}').reserve(WORST, started=T0)
