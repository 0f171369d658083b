"""The budget ledger in a database: reservations made in one transaction, never past a budget."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from sqlalchemy import create_engine

from airflow_gpumarket import budgets, ledger

NOW = 1_790_000_000.0
DAILY = budgets.Limits(day=1.0)


@pytest.fixture
def engine(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path}/airflow.db", connect_args={"timeout": 60})
    yield engine
    engine.dispose()


def ask(worst=0.10, *, dag_id="fanout", run_id="r1", map_index=0, limits=DAILY, available=None):
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
        limits=limits,
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
            won.append(ledger.reserve(engine, ask(map_index=index), now=NOW))
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
    first = ledger.reserve(engine, ask(worst=0.9), now=NOW)
    ledger.attach(engine, "gpumarket_default", first, 42)
    cost = ledger.settle(engine, "gpumarket_default", instance_id=42, now=NOW + 600)  # 10 min at $0.36/h
    assert cost == pytest.approx(0.06)
    ledger.reserve(engine, ask(worst=0.9), now=NOW + 600)  # 0.06 + 0.9 fits in $1 now
    assert ledger.settle(engine, "gpumarket_default", instance_id=42, now=NOW + 900) is None  # settled once


def test_a_create_that_made_nothing_releases_its_reservation(engine):
    reservation = ledger.reserve(engine, ask(worst=1.0), now=NOW)
    assert ledger.settle(engine, "gpumarket_default", reservation_id=reservation, now=NOW) == 0.0
    ledger.reserve(engine, ask(worst=1.0), now=NOW)


def test_another_connection_cannot_settle_a_reservation(engine):
    reservation = ledger.reserve(engine, ask(worst=1.0), now=NOW)
    assert ledger.settle(engine, "someone_else", reservation_id=reservation, now=NOW) is None


def test_the_run_budget_counts_only_the_dag_run(engine):
    limits = budgets.Limits(run=0.25)
    ledger.reserve(engine, ask(worst=0.2, limits=limits), now=NOW)
    with pytest.raises(ledger.BudgetRefused, match="run budget"):
        ledger.reserve(engine, ask(worst=0.1, limits=limits), now=NOW)
    ledger.reserve(engine, ask(worst=0.1, limits=limits, run_id="r2"), now=NOW)


def test_the_credit_check_counts_every_dag_still_renting_on_the_connection(engine):
    ledger.reserve(engine, ask(worst=0.6, dag_id="a", limits=None, available=1.0), now=NOW)
    with pytest.raises(ledger.BudgetRefused, match="credit is"):
        ledger.reserve(engine, ask(worst=0.5, dag_id="b", limits=None, available=1.0), now=NOW)


def test_a_request_from_json_names_the_field_that_is_wrong():
    body = ask().to_json()
    assert ledger.Request.from_json(body) == ask()
    with pytest.raises(ValueError, match="worst must be a number"):
        ledger.Request.from_json({**body, "worst": "a lot"})
    with pytest.raises(ValueError, match="dag_id must be a non-empty string"):
        ledger.Request.from_json({**body, "dag_id": ""})


def test_a_rental_is_settled_on_the_services_clock_when_both_ends_are_known(engine):
    # A simulator whose clock runs 20x: ten real seconds are 200 of the service's, and it bills those.
    reservation = ledger.reserve(engine, dataclasses.replace(ask(worst=0.9), started=5000.0), now=NOW)
    ledger.attach(engine, "gpumarket_default", reservation, 8)
    cost = ledger.settle(engine, "gpumarket_default", instance_id=8, now=NOW + 10, ended=5200.0)
    assert cost == pytest.approx(0.36 * 200 / 3600, abs=1e-4)


def test_a_credit_below_zero_is_a_refusal_not_a_malformed_request(engine):
    body = {**ask(limits=None).to_json(), "available": -0.42}
    with pytest.raises(ledger.BudgetRefused, match=r"credit is -\$0.42"):
        ledger.reserve(engine, ledger.Request.from_json(body), now=NOW)
