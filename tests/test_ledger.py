"""The budget ledger in a database: reservations made in one transaction, never past a budget."""

from __future__ import annotations

import dataclasses
import json
import threading
from importlib.metadata import version
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, Table, create_engine, inspect

from airflow_gpumarket import budgets, columns, ledger, signing

NOW = 1_790_000_000.0


def set_budgets(monkeypatch, value: dict | str) -> None:
    """The budgets Variable as the ledger reads it."""
    monkeypatch.setenv("AIRFLOW_VAR_GPUMARKET_BUDGETS", value if isinstance(value, str) else json.dumps(value))


@pytest.fixture(autouse=True)
def daily(monkeypatch):
    """DAG ``fanout`` may spend $1 a day; other DAGs have no budget."""
    set_budgets(monkeypatch, {"fanout": {"day": 1.0}})


@pytest.fixture
def engine(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path}/airflow.db", connect_args={"timeout": 60})
    yield engine
    engine.dispose()


def ask(worst=0.10, *, dag_id="fanout", run_id="r1", map_index=0, attempt=1, available=None):
    return ledger.Request(
        conn_id="gpumarket_default",
        dag_id=dag_id,
        run_id=run_id,
        task_id="job",
        map_index=map_index,
        try_number=1,
        worst=worst,
        seconds=3600.0,
        hourly=0.36,
        attempt=attempt,
        available=available,
    )


def test_reservations_are_refused_once_the_budget_is_taken(engine):
    for index in range(10):
        ledger.reserve(engine, ask(map_index=index), now=NOW)
    with pytest.raises(ledger.BudgetRefused, match=r"day budget of DAG 'fanout' is \$1.00: \$1.0000 is spent"):
        ledger.reserve(engine, ask(map_index=10), now=NOW)
    assert len(ledger.entries(engine, since=0)) == 10


def test_concurrent_reservations_never_take_the_last_dollar_twice(engine):
    ledger.ensure_tables(engine)
    won, refused = [], []

    def one(index: int) -> None:
        try:
            won.append(ledger.reserve(engine, ask(map_index=index), now=NOW).id)
        except ledger.BudgetRefused:
            refused.append(index)

    threads = [threading.Thread(target=one, args=(index,)) for index in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (len(won), len(refused)) == (10, 40)
    assert round(sum(row["reserved"] for row in ledger.entries(engine, since=0)), 6) <= 1.0


def test_a_settled_reservation_counts_what_the_rental_cost(engine):
    first = ledger.reserve(engine, ask(worst=0.9), now=NOW).id
    ledger.attach(engine, "gpumarket_default", first, 42)
    cost = ledger.settle(engine, "gpumarket_default", instance_id=42, now=NOW + 600)  # 10 min at $0.36/h
    assert cost == pytest.approx(0.06)
    ledger.reserve(engine, ask(worst=0.9, attempt=2), now=NOW + 600)  # 0.06 + 0.9 fits in $1 now


def test_a_settled_reservation_takes_the_cost_its_task_read_from_the_service(engine):
    first = ledger.reserve(engine, ask(worst=0.9), now=NOW).id
    ledger.attach(engine, "gpumarket_default", first, 43)
    assert ledger.settle(engine, "gpumarket_default", instance_id=43, now=NOW + 600, cost=0.01231) == 0.0124


def test_a_create_that_made_nothing_releases_its_reservation(engine):
    reservation = ledger.reserve(engine, ask(worst=1.0), now=NOW).id
    assert ledger.settle(engine, "gpumarket_default", reservation_id=reservation, now=NOW) == 0.0
    ledger.reserve(engine, ask(worst=1.0, attempt=2), now=NOW)


def test_another_connection_cannot_settle_a_reservation(engine):
    reservation = ledger.reserve(engine, ask(worst=1.0), now=NOW).id
    assert ledger.settle(engine, "someone_else", reservation_id=reservation, now=NOW) is None


def test_the_run_budget_counts_only_the_dag_run(engine, monkeypatch):
    set_budgets(monkeypatch, {"fanout": {"run": 0.25}})
    ledger.reserve(engine, ask(worst=0.2), now=NOW)
    with pytest.raises(ledger.BudgetRefused, match="run budget"):
        ledger.reserve(engine, ask(worst=0.1, attempt=2), now=NOW)
    ledger.reserve(engine, ask(worst=0.1, run_id="r2"), now=NOW)


def test_the_credit_check_counts_every_dag_still_renting_on_the_connection(engine):
    ledger.reserve(engine, ask(worst=0.6, dag_id="a", available=1.0), now=NOW)
    with pytest.raises(ledger.BudgetRefused, match="credit is"):
        ledger.reserve(engine, ask(worst=0.5, dag_id="b", available=1.0), now=NOW)


def test_a_request_from_json_names_the_field_that_is_wrong():
    body = ask().to_json()
    assert ledger.Request.from_json(body) == ask()
    with pytest.raises(ValueError, match="worst: must be a finite number"):
        ledger.Request.from_json({**body, "worst": "a lot"})
    with pytest.raises(ValueError, match="dag_id: must be a non-empty string"):
        ledger.Request.from_json({**body, "dag_id": ""})


def test_a_rental_is_settled_on_the_services_clock_when_both_ends_are_known(engine):
    # A simulator whose clock runs 20x: ten real seconds are 200 of the service's, and it bills those.
    reservation = ledger.reserve(engine, dataclasses.replace(ask(worst=0.9), started=5000.0), now=NOW).id
    ledger.attach(engine, "gpumarket_default", reservation, 8)
    cost = ledger.settle(engine, "gpumarket_default", instance_id=8, now=NOW + 10, ended=5200.0)
    assert cost == pytest.approx(0.36 * 200 / 3600, abs=1e-4)


def test_a_credit_below_zero_is_a_refusal_not_a_malformed_request(engine):
    body = {**ask(dag_id="no_budget").to_json(), "available": -0.42}
    with pytest.raises(ledger.BudgetRefused, match=r"credit is -\$0.42"):
        ledger.reserve(engine, ledger.Request.from_json(body), now=NOW)


def test_a_retried_reservation_answers_the_first_and_reserves_nothing_more(engine):
    first = ledger.reserve(engine, ask(worst=0.6), now=NOW)
    again = ledger.reserve(engine, ask(worst=0.6), now=NOW + 5)  # $1.20 would not fit: it is the same reservation
    assert again.id == first.id
    assert len(ledger.entries(engine, since=0)) == 1
    assert ledger.reserve(engine, ask(worst=0.3, attempt=2), now=NOW).id != first.id  # the try's next rental


def test_two_concurrent_identical_reservations_make_one_row(engine):
    ledger.ensure_tables(engine)
    answers: list[int] = []
    threads = [
        threading.Thread(target=lambda: answers.append(ledger.reserve(engine, ask(), now=NOW).id)) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 8 and len(set(answers)) == 1
    assert len(ledger.entries(engine, since=0)) == 1


def test_the_idempotency_key_is_the_connection_task_try_and_rental_attempt():
    keys = {
        ask().key,
        ask(attempt=2).key,
        ask(map_index=1).key,
        ask(run_id="r2").key,
        dataclasses.replace(ask(), try_number=2).key,
        dataclasses.replace(ask(), conn_id="other").key,
    }
    assert len(keys) == 6
    assert ask(worst=0.5, available=3.0).key == ask().key  # what it reserves is not who asks


def test_a_resumed_task_numbers_its_rentals_on_from_the_ledger(engine):
    task_try = {
        "conn_id": "gpumarket_default",
        "dag_id": "fanout",
        "run_id": "r1",
        "task_id": "job",
        "map_index": 0,
        "try_number": 1,
    }
    assert ledger.last_attempt(engine, **task_try) == 0
    ledger.reserve(engine, ask(attempt=1), now=NOW)
    ledger.reserve(engine, ask(attempt=2), now=NOW)
    ledger.reserve(engine, ask(attempt=1, map_index=3), now=NOW)  # another task instance
    assert ledger.last_attempt(engine, **task_try) == 2


def test_the_budgets_are_the_variables_as_the_ledger_reads_them(engine, monkeypatch):
    set_budgets(monkeypatch, {"fanout": {"day": 0.5}, "*": {"day": 100}})
    made = ledger.reserve(engine, ask(worst=0.4), now=NOW)
    assert made.limits == budgets.Limits(day=0.5) and made.warnings == []
    with pytest.raises(ledger.BudgetRefused, match=r"day budget of DAG 'fanout' is \$0.50"):
        ledger.reserve(engine, ask(worst=0.4, attempt=2), now=NOW)


def test_a_malformed_entry_for_another_dag_is_a_warning_and_this_dag_reserves(engine, monkeypatch):
    set_budgets(monkeypatch, {"fanout": {"day": 1.0}, "typo_dag": {"day": "10"}})
    made = ledger.reserve(engine, ask(), now=NOW)
    assert made.limits == budgets.Limits(day=1.0)
    (warning,) = made.warnings
    assert "gpumarket_budgets['typo_dag'].day must be a number" in warning


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"fanout": {"day": "10"}}, "gpumarket_budgets['fanout'].day"),
        ({"*": {"dya": 1}}, "gpumarket_budgets['*'] has unknown key(s) 'dya'"),
        ('{"fanout": {"day": 1}', "gpumarket_budgets is not valid JSON"),
    ],
)
def test_a_malformed_entry_that_applies_to_the_dag_refuses_before_reserving(engine, monkeypatch, value, named):
    set_budgets(monkeypatch, value)
    with pytest.raises(ledger.BudgetRefused, match="Nothing was rented") as caught:
        ledger.reserve(engine, ask(), now=NOW)
    assert named in str(caught.value)
    assert ledger.entries(engine, since=0) == []


def test_a_repeated_settle_answers_the_same_cost_and_changes_nothing(engine):
    reservation = ledger.reserve(engine, ask(worst=0.9), now=NOW).id
    ledger.attach(engine, "gpumarket_default", reservation, 42)
    ledger.attach(engine, "gpumarket_default", reservation, 42)
    first = ledger.settle(engine, "gpumarket_default", reservation_id=reservation, now=NOW + 600)
    assert ledger.settle(engine, "gpumarket_default", reservation_id=reservation, now=NOW + 900) == first
    assert ledger.settle(engine, "gpumarket_default", instance_id=42, now=NOW + 900) == first
    (entry,) = ledger.entries(engine, since=0)
    assert (entry["instance_id"], entry["cost"], entry["settled_at"]) == (42, first, NOW + 600)


def test_a_nonce_is_accepted_once_within_the_signatures_window_and_purged_after(engine):
    window = signing.MAX_AGE_SECONDS
    assert ledger.first_use(engine, "a" * 32, stamp=NOW, now=NOW)
    assert not ledger.first_use(engine, "a" * 32, stamp=NOW, now=NOW + window)
    assert ledger.first_use(engine, "b" * 32, stamp=NOW + window + 1, now=NOW + window + 1)  # purges "a"
    with engine.begin() as conn:
        assert [row.nonce for row in conn.execute(ledger.NONCES.select())] == ["b" * 32]


def test_a_reservations_table_of_the_previous_version_gets_the_idempotency_key(engine):
    old = MetaData()
    columns = [
        Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
        for c in ledger.RESERVATIONS.columns
        if c.name not in ("attempt", "idempotency_key")
    ]
    table = Table(ledger.RESERVATIONS.name, old, *columns)
    old.create_all(engine)
    row = {"conn_id": "gpumarket_default", "dag_id": "fanout", "run_id": "r0", "task_id": "job", "map_index": 0}
    with engine.begin() as conn:
        conn.execute(table.insert().values(**row, try_number=1, reserved=0.2, hourly=0.36, created_at=0, until=0))
    ledger.ensure_tables(engine)
    assert {"attempt", "idempotency_key"} <= {c["name"] for c in inspect(engine).get_columns(table.name)}
    made = ledger.reserve(engine, ask(), now=NOW)
    assert ledger.reserve(engine, ask(), now=NOW).id == made.id != 1
    assert len(ledger.entries(engine, since=0)) == 2


def _make_tables(url: str, start: Any) -> None:
    from sqlalchemy import create_engine

    start.wait()
    ledger.ensure_tables(create_engine(url))


def test_processes_that_make_the_tables_at_once_on_a_new_database_all_succeed(tmp_path):
    import multiprocessing

    context = multiprocessing.get_context("fork")
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    start = context.Event()
    makers = [context.Process(target=_make_tables, args=(url, start)) for _ in range(6)]
    for maker in makers:
        maker.start()
    start.set()
    for maker in makers:
        maker.join(60)
    assert [maker.exitcode for maker in makers] == [0] * 6


def test_a_creation_pass_that_meets_another_processs_table_is_run_again_until_the_limit(monkeypatch):
    from sqlalchemy.exc import OperationalError

    monkeypatch.setattr(ledger.time, "sleep", lambda seconds: None)
    passes = []

    def step(fails: int):
        passes.append(fails)
        if len(passes) <= fails:
            raise OperationalError("CREATE INDEX", {}, Exception("index already exists"))

    ledger.create_racing(lambda: step(2))
    assert len(passes) == 3
    passes.clear()
    with pytest.raises(OperationalError):
        ledger.create_racing(lambda: step(99))
    assert len(passes) == ledger.DDL_PASSES


@pytest.mark.parametrize("worst", [float("nan"), float("inf"), -0.01])
def test_rule_a_reservation_amount_is_finite_and_not_negative_wherever_it_is_made(worst):
    with pytest.raises(ValueError, match="worst: must be a finite number"):
        ask(worst=worst)


@pytest.mark.parametrize(("name", "value"), [("ended", float("nan")), ("cost", float("-inf")), ("cost", -1.0)])
def test_rule_a_settle_refuses_an_end_or_cost_that_is_not_finite(engine, name, value):
    made = ledger.reserve(engine, ask(), now=NOW)
    with pytest.raises(ValueError, match=f"{name}: must be a finite number"):
        ledger.settle(engine, "gpumarket_default", now=NOW, reservation_id=made.id, **{name: value})
    assert ledger.entries(engine, since=0)[0]["cost"] is None


def test_rule_a_settled_reservation_is_not_attached_to_another_instance(engine):
    made = ledger.reserve(engine, ask(), now=NOW)
    ledger.attach(engine, "gpumarket_default", made.id, 7)
    ledger.attach(engine, "gpumarket_default", made.id, 7)  # a retried attach: the same
    ledger.settle(engine, "gpumarket_default", now=NOW, instance_id=7, cost=0.05)
    with pytest.raises(ledger.Settled, match="final"):
        ledger.attach(engine, "gpumarket_default", made.id, 8)
    with pytest.raises(ledger.Unknown):
        ledger.attach(engine, "gpumarket_other", made.id, 8)
    assert ledger.entries(engine, since=0)[0]["instance_id"] == 7


def test_rule_a_settled_estimate_is_never_above_the_largest_amount_a_row_holds(engine):
    made = ledger.reserve(engine, dataclasses.replace(ask(), started=0.0, hourly=1e9), now=NOW)
    ledger.attach(engine, "gpumarket_default", made.id, 7)
    cost = ledger.settle(engine, "gpumarket_default", now=NOW, instance_id=7, ended=1e11)
    assert cost == columns.MAX_DOLLARS


@pytest.mark.skipif(version("apache-airflow").startswith("2."), reason="Airflow 3's Task SDK")
def test_in_an_airflow_3_task_the_budgets_are_read_through_the_task_sdk_without_a_deprecation_warning(monkeypatch):
    import warnings

    import airflow.sdk
    from airflow.sdk.execution_time import task_runner

    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", object(), raising=False)  # as in a task's process
    monkeypatch.setattr(airflow.sdk.Variable, "get", staticmethod(lambda key, default=None: f"{key}={default}"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert ledger.budgets_variable() == "gpumarket_budgets=None"
