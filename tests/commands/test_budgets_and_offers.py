"""``airflow gpumarket budgets`` and ``offers``: a DAG's headroom from the ledger, and what a task would rent."""

from __future__ import annotations

import json
import re

import pytest
from integration.conftest import AIRFLOW_2, alive, task_states

from airflow_gpumarket import ledger

FILTERS = json.dumps({"num_gpus": {"gte": 1}})


def budgets_variable(monkeypatch, value: dict) -> None:
    monkeypatch.setenv("AIRFLOW_VAR_GPUMARKET_BUDGETS", json.dumps(value))


def table_rows(out: str, header_start: str) -> list[list[str]]:
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[first + 1 :]:
        if not line.strip():
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


# --- budgets ------------------------------------------------------------------------------------------------------
def test_budgets_shows_spent_reserved_and_left_per_window_from_the_ledger(example_dag, sim, run, monkeypatch):
    from airflow import settings

    budgets_variable(monkeypatch, {"gpm_ui_job": {"day": 50.0, "run": 10.0}, "idle_dag": {"month": 20.0}})
    done = example_dag("gpm_ui_job").test()
    assert done.state == "success", task_states(done)
    (entry,) = ledger.entries(settings.engine, since=0)
    code, out, err = run("budgets")
    assert code == 0, err
    rows = {(r[0], r[1]): r[2:] for r in table_rows(out, "DAG")}
    spent = f"${entry['cost']:.4f}"
    assert rows[("gpm_ui_job", "day")] == ["$50.0000", spent, "$0.0000", f"${50.0 - entry['cost']:.4f}"]
    assert rows[("gpm_ui_job", "run")] == ["$10.0000", "-", "-", "per run"]
    assert rows[("idle_dag", "month")] == ["$20.0000", "$0.0000", "$0.0000", "$20.0000"]
    # The GPU rentals page's Budgets section reads the same figures.
    import time

    from airflow_gpumarket.ui import sources

    shown = {dag_id: rooms for dag_id, _, rooms in sources.budgets_in_force(time.time())}
    (day,) = shown["gpm_ui_job"]
    assert (day.period, day.limit, day.spent, day.reserved) == ("day", 50.0, entry["cost"], 0.0)
    assert alive(sim) == []


def test_rule_budgets_flags_a_budgeted_dag_that_airflow_does_not_know_and_shows_open_reservations(
    example_dag, sim, run, monkeypatch
):
    budgets_variable(monkeypatch, {"gpm_ui_jbo": {"day": 5.0}})  # a typo: gpm_ui_job rents without a budget
    dag = example_dag("gpm_ui_job")
    if AIRFLOW_2:  # Airflow 3's dag.test() records the DAG among those Airflow knows; 2.11's does not
        dag.sync_to_db()
    done = dag.test()
    assert done.state == "success", task_states(done)
    code, out, err = run("budgets")
    assert code == 0, err
    assert "note: gpumarket_budgets budgets DAG 'gpm_ui_jbo', which no DAG Airflow knows has" in out
    rows = {r[0]: r[1:] for r in table_rows(out, "DAG")}
    assert rows["gpm_ui_job"][1] == "no budget" and rows["gpm_ui_job"][3] == "$0.0000"  # nothing left open
    assert "'gpm_ui_job'" not in out


def test_budgets_names_a_malformed_variable(sim, run, monkeypatch):
    monkeypatch.setenv("AIRFLOW_VAR_GPUMARKET_BUDGETS", "{not json")
    code, _, err = run("budgets")
    assert code == 1 and "gpumarket_budgets is not valid JSON" in err


# --- offers -------------------------------------------------------------------------------------------------------
def test_offers_lists_matches_cheapest_first_with_their_worst_case(sim, run):
    code, out, err = run("offers", "--filters", FILTERS, "--max-runtime", "60", "--limit", "3")
    assert code == 0, err
    rows = table_rows(out, "OFFER")
    assert len(rows) == 3
    prices = [float(r[2]) for r in rows]
    assert prices == sorted(prices)
    # The lease a job reserves for: boot_timeout (15 min) + max_runtime (60) + the lease margin (15): 1.5 h.
    assert "over 1.5 h" in out
    for row, price in zip(rows, prices, strict=True):
        assert float(row[5].lstrip("$")) >= round(price * 1.5, 4) and row[6] == "-"
    assert not [r for r in sim.requests() if r.get("op") == "create_instance"]  # looking rents nothing


def test_offers_refuses_a_misspelt_filter_naming_the_closest_field(sim, run):
    code, _, err = run("offers", "--filters", json.dumps({"gpu_nmae": {"eq": "RTX 3090"}}))
    assert code == 2 and "gpu_name" in err


@pytest.mark.parametrize(("day", "verdict"), [(0.01, "refused"), (1000.0, "allowed")])
def test_offers_for_a_dags_task_says_whether_its_budget_allows_each(sim, run, monkeypatch, day, verdict):
    budgets_variable(monkeypatch, {"gpm_log_exit3_sync": {"day": day}})
    code, out, err = run("offers", "--dag", "gpm_log_exit3_sync", "--task", "job", "--limit", "2")
    assert code == 0, err
    assert [r[6] for r in table_rows(out, "OFFER")] == [verdict, verdict]
    assert ("The first refusal: The day budget of DAG 'gpm_log_exit3_sync'" in out) == (verdict == "refused")


@pytest.mark.parametrize("filters", [(), ("--filters", FILTERS)], ids=["its-filters", "given-filters"])
def test_rule_offers_for_a_task_whose_deadline_is_known_only_when_it_runs_lists_its_offers(sim, run, filters):
    """The nightly example's deadline is a callable of the run's context: offers are judged without it, and said so."""
    code, out, err = run("offers", "--dag", "example_gpumarket_nightly_deadline", "--task", "fine_tune", *filters)
    assert code == 0, err
    assert "deadline is known only when the task runs" in out and table_rows(out, "OFFER")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (("--dag", "gpm_log_exit3_sync"), "give --dag and --task together"),
        ((), "give --filters JSON"),
        (("--filters", "{bad"), "--filters is not valid JSON"),
        (("--dag", "no_such_dag", "--task", "job"), "DAG 'no_such_dag' is not in the DAGs folder"),
        (("--dag", "gpm_log_exit3_sync", "--task", "nope"), "has no task 'nope'"),
    ],
)
def test_offers_bad_input_is_one_line_and_exit_2(sim, run, argv, words):
    code, _, err = run("offers", *argv)
    assert code == 2 and words in err
