"""The budget ledger's concurrency rules on PostgreSQL, where production keeps it: what tests/test_ledger.py shows on
SQLite, whose single write lock serialises everything, shown again where transactions really overlap."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Column, MetaData, Table, create_engine, inspect

from airflow_gpumarket import ledger

from .postgres import Postgres

pytestmark = pytest.mark.system

NOW = 1_790_000_000.0
THREADS = 16


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    postgres = Postgres(Path(tmp_path_factory.mktemp("postgres")) / "postgres.log")
    postgres.start()
    yield postgres
    postgres.stop()


@pytest.fixture
def engine(server: Postgres, monkeypatch: pytest.MonkeyPatch):
    """An empty ledger in the server's database; DAG ``fanout`` may spend $1 a day."""
    monkeypatch.setenv("AIRFLOW_VAR_GPUMARKET_BUDGETS", '{"fanout": {"day": 1.0}}')
    engine = create_engine(server.url, pool_size=THREADS, max_overflow=0)
    ledger.metadata.drop_all(engine)
    ledger._ready.clear()
    yield engine
    engine.dispose()


def ask(*, map_index: int = 0, worst: float = 0.10) -> ledger.Request:
    return ledger.Request(conn_id="gpumarket_default", dag_id="fanout", run_id="r1", task_id="job",
                          map_index=map_index, try_number=1, worst=worst, seconds=3600.0, hourly=0.36)  # fmt: skip


def at_once(count: int, work: Callable[[int], object]) -> list[object]:
    """``work(0..count-1)`` in threads released together; what each returned or raised."""
    results: list[object] = [None] * count
    start = threading.Barrier(count)

    def run(index: int) -> None:
        start.wait()
        try:
            results[index] = work(index)
        except Exception as exc:  # noqa: BLE001 - the test reads what each one met
            results[index] = exc

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_rule_identical_reservations_at_once_make_one_row(engine):
    ledger.ensure_tables(engine)
    answers = at_once(THREADS, lambda _: ledger.reserve(engine, ask(), now=NOW).id)
    assert len(set(answers)) == 1 and isinstance(answers[0], int), answers
    assert len(ledger.entries(engine, since=0)) == 1


def test_rule_reservations_at_once_never_take_the_last_dollar_twice(engine):
    ledger.ensure_tables(engine)
    answers = at_once(THREADS, lambda index: ledger.reserve(engine, ask(map_index=index, worst=0.25), now=NOW).id)
    assert sum(isinstance(a, int) for a in answers) == 4, answers
    assert all(isinstance(a, int | ledger.BudgetRefused) for a in answers), answers


def test_rule_a_table_of_the_previous_version_is_migrated_by_processes_at_once(engine, server):
    old = MetaData()
    columns = [
        Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
        for c in ledger.RESERVATIONS.columns
        if c.name not in ("attempt", "idempotency_key")
    ]
    Table(ledger.RESERVATIONS.name, old, *columns)
    old.create_all(engine)
    migrate = (  # as each api-server worker does on its first ledger request
        "from sqlalchemy import create_engine\n"
        "from airflow_gpumarket import ledger\n"
        f"ledger.ensure_tables(create_engine({server.url!r}))\n"
    )
    workers = [subprocess.Popen([sys.executable, "-c", migrate], stderr=subprocess.PIPE, text=True) for _ in range(4)]
    errors = [(worker.returncode, err[-600:]) for worker in workers if (err := worker.communicate(timeout=120)[1])]
    assert all(code == 0 for code, _ in errors), errors
    assert {"attempt", "idempotency_key"} <= {c["name"] for c in inspect(engine).get_columns("gpumarket_reservation")}
    assert ledger.reserve(engine, ask(), now=NOW).id == ledger.reserve(engine, ask(), now=NOW).id


def test_rule_a_nonce_sent_at_once_by_many_is_accepted_once(engine):
    firsts = at_once(THREADS, lambda _: ledger.first_use(engine, "n" * 32, stamp=NOW, now=NOW))
    assert firsts.count(True) == 1 and firsts.count(False) == THREADS - 1, firsts
