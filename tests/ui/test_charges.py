"""The GPU rentals page's money rules (ui/spend.py, ui/account_charges.py, ui/page.py): a rental costs what the
service charged where it charged it, else its estimate, marked; the difference of the two; the charges no DAG takes;
the runway."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from airflow_gpumarket import api
from airflow_gpumarket.ui import page
from airflow_gpumarket.ui.account_charges import DAY, day_start, merged_charges, runway, unowned
from airflow_gpumarket.ui.spend import TaskState, charge_live, live_rentals, spans, spend

from .rows import LABEL, NOW, row

TODAY = day_start(NOW)
MONTH = NOW - 30 * DAY  # a window that holds every charge below


def charge(instance_id: int | None, amount, *, days_ago: int = 0, source: str | None = None) -> api.Charge:
    """One day's charge as the service's JSON gives it (a gpu, storage and bandwidth breakdown)."""
    start = TODAY - days_ago * DAY
    return api.parse_charge(
        {
            "type": "instance" if instance_id is not None else "volume",
            "source": source or f"instance-{instance_id}",
            "amount": amount,
            "start": start,
            "end": start + DAY,
            "items": [{"type": "gpu", "amount": amount}, {"type": "storage", "amount": 0}],
        }
    )


def render(totals, live=(), **extra) -> str:
    return page.render(live=list(live), spend=totals, days=30, target=None, can_destroy=lambda _: False, **extra)


def row_of(html: str, row_id: str) -> str:
    """One table row of the page."""
    found = re.search(rf'<tr id="{row_id}"[^>]*>.*?</tr>', html)
    assert found, f"no row {row_id}"
    return found.group(0)


def test_rule_a_charged_rental_costs_its_charges_summed_exactly_and_rounded_only_when_shown():
    rentals = [row(1), row(2, run_id="run-2", created_at=NOW - 10 * DAY)]
    charges = [charge(1, 0.1), charge(1, "0.2", days_ago=1)]  # amounts as numbers or strings, as the JSON has them
    charges += [charge(2, 0.1, days_ago=d) for d in range(10)]  # ten times 0.1: 0.9999999999999999 as floats
    result = spend(spans(rentals), {}, MONTH, NOW, charges)
    by_id = {r.span.instance_id: r.figure for r in result.rows}
    assert (by_id[1].actual, by_id[2].actual) == (Decimal("0.3"), Decimal("1.0"))
    assert by_id[1].source == by_id[2].source == "charges"
    assert result.per_run == {("train_dag", "run-1"): 0.3, ("train_dag", "run-2"): 1.0}  # exactly: no float drift
    assert result.per_dag == {"train_dag": 1.3} and result.total == 1.3 and result.estimated == 0
    assert sum(sum(day.values()) for day in result.per_day.values()) == pytest.approx(1.3)  # on the days charged
    assert len(result.per_day) == 10
    html = render(result)
    assert '<span class="actual">$1.0000</span>' in row_of(html, "spend-2")
    assert "over 2 rental(s)</h2>" in html and "of it estimated" not in html


def test_rule_money_is_shown_rounded_half_up_to_a_hundredth_of_a_cent_and_the_credit_to_the_cent():
    assert page._money(Decimal("0.00005")) == "$0.0001" and page._money(0.00004) == "$0.0000"
    assert page._money(Decimal("1234.56785")) == "$1,234.5679" and page._money(None) == "—"
    assert page._money(Decimal("-0.015"), page.CREDIT_PLACES) == "-$0.02"
    assert page._signed(Decimal("0.05")) == "+$0.0500" and page._signed(Decimal("-0.05")) == "-$0.0500"


def test_rule_a_rental_the_service_did_not_charge_shows_its_estimate_marked_as_one():
    rentals = [row(1, cost=0.01), row(2, run_id="run-2", cost=0.01)]  # each 0.5 $/h for 60 s
    result = spend(spans(rentals), {}, MONTH, NOW, [charge(1, 0.25)])
    figures = {r.span.instance_id: r.figure for r in result.rows}
    assert figures[2].source == "estimate" and figures[2].actual is None
    assert figures[2].estimate == Decimal("0.008333")
    assert result.runs[("train_dag", "run-2")].estimated_rentals == 1
    dag = result.dags["train_dag"]
    assert (dag.actual, dag.estimated, dag.rentals, dag.estimated_rentals) == (
        Decimal("0.25"),
        Decimal("0.008333"),
        2,
        1,
    )
    html = render(result)
    assert '<td class="num cost"><span class="est">≈ $0.0083 est.</span></td>' in row_of(html, "spend-2")
    assert "est." not in row_of(html, "spend-1").replace("est. $0.0083", "")  # its estimate beside, unmarked
    assert '<span class="est">≈ $0.0083 est.</span> (1 of 2)' in html  # the DAG's estimated part
    assert "($0.0083 of it estimated)</h2>" in html and "≈ … est.</span> marks an estimate" in html
    # Nothing charged at all (a service without charges): every total is an estimate, marked.
    html = render(spend(spans(rentals), {}, MONTH, NOW))
    assert '<td class="num"><span class="est">≈ $0.0167 est.</span></td>' in html


def test_rule_the_difference_is_actual_minus_estimate_where_both_exist():
    rentals = [
        row(1, cost=0.01),  # estimated 0.008333, charged 0.01
        row(2, run_id="run-2", created_at=NOW - 7200),  # gone with no end recorded: charged, but no estimate
        row(3, run_id="run-3", cost=0.01),  # estimated, not charged
    ]
    result = spend(spans(rentals), {}, MONTH, NOW, [charge(1, 0.01), charge(2, 0.4)])
    figures = {r.span.instance_id: r.figure for r in result.rows}
    assert figures[1].difference == Decimal("0.001667")
    assert figures[2].difference is None and figures[2].amount == Decimal("0.4") and result.unknown_cost == 0
    assert figures[3].difference is None
    assert result.dags["train_dag"].difference == Decimal("0.001667")  # over the rentals with both figures
    assert result.runs[("train_dag", "run-3")].difference is None
    assert "+$0.0017" in render(result)
    # A live row: charged 0.2 so far of an estimated 0.25 (0.5 $/h for half an hour).
    listed = {"id": 1, "actual_status": "running", "label": LABEL, "dph_total": 0.5, "start_date": NOW - 1800}
    (live,) = live_rentals([("c", listed)], {1: row()}, {row().ti_key: TaskState("running")}, NOW)
    charge_live([live], [charge(1, 0.2)], NOW - DAY)
    assert (live.figure.actual, live.figure.estimate, live.figure.difference) == (
        Decimal("0.2"),
        Decimal("0.25"),
        Decimal("-0.05"),
    )
    assert "est. $0.2500, -$0.0500" in row_of(render(result, [live]), "rental-1")
    # Started before the window's first day: its charges there are not its whole cost, so no difference.
    (old,) = live_rentals([("c", {**listed, "start_date": NOW - 3 * DAY})], {}, {}, NOW)
    charge_live([old], [charge(1, 0.2), charge(1, 5.0, days_ago=2)], NOW - DAY)
    assert old.figure.actual == Decimal("0.2") and old.figure.partial and old.figure.difference is None
    assert "charges of the window's days only" in row_of(render(result, [old]), "rental-1")


def test_rule_charges_count_over_the_windows_days_and_go_to_the_latest_rental_of_their_instance():
    rentals = [row(1, created_at=NOW - 3600, cost=0.01), row(1, run_id="run-0", created_at=NOW - 7200, cost=0.01)]
    charges = [charge(1, 0.5), charge(1, 9.0, days_ago=3)]  # the second is before a two-day window's first day
    result = spend(spans(rentals), {}, NOW - DAY, NOW, charges)
    assert result.runs[("train_dag", "run-1")].actual == Decimal("0.5")
    assert result.runs[("train_dag", "run-0")].estimated_rentals == 1  # an id given again: not its charges


def test_rule_charges_of_instances_no_task_owns_are_counted_apart():
    charges = [charge(1, 0.3), charge(99, 0.7), charge(98, 0.1, days_ago=40), charge(None, 0.05, source="volume-5")]
    found = unowned(charges, owned={1}, window_start=MONTH)
    assert (found.instances, found.instance_ids, found.other) == (Decimal("0.7"), (99,), Decimal("0.05"))
    html = render(spend([], {}, MONTH, NOW), unowned=found)
    assert "Charges of instances no task recorded: $0.7000 (instance 99)" in html and "$0.0500" in html
    # Two connections of one account read the same charges: each counts once; another account's count too.
    assert merged_charges([charges, list(charges)]) == charges
    assert merged_charges([charges[:1] * 2, charges]) == charges[:1] * 2 + charges[1:]


def test_rule_the_runway_is_the_credit_over_the_mean_daily_charges_of_the_last_seven_full_days():
    charges = [charge(1, float(d), days_ago=d) for d in range(1, 8)]  # 1 + ... + 7 = 28 dollars: 4 a day
    charges += [charge(1, 50.0), charge(1, 100.0, days_ago=8), charge(None, "0.07", days_ago=3, source="volume-5")]
    found = runway(10.0, charges, NOW)
    assert (found.burn, found.daily) == (Decimal("28.07"), Decimal("28.07") / 7)
    assert found.days == Decimal(10) / (Decimal("28.07") / 7)
    assert found.runs_out_at == pytest.approx(NOW + float(found.days) * DAY)
    plain = runway(10.0, charges[:7], NOW)
    assert plain.days == Decimal("2.5") and plain.runs_out_at == NOW + 2.5 * DAY
    from airflow_gpumarket.ui.account_charges import Balance

    def text(r):
        return page.accounts_html([Balance("c", r)])

    assert "$10.00" in text(plain) and "2.5 days (until about " in text(plain)
    assert "no spend in the 7 full UTC days before today" in text(
        runway(10.0, [charge(1, 50.0)], NOW)
    )  # today's only: not full
    assert runway(10.0, [], NOW).days is None
    assert "the service gave no charges" in text(runway(10.0, None, NOW))
    assert "0 days: the credit is spent" in text(runway(-1.0, charges, NOW))
    assert "shown to users who may read every DAG" in page.accounts_html(None)


def test_a_runway_of_centuries_is_shown_without_a_date():
    from airflow_gpumarket.ui.account_charges import Balance

    found = runway(1e9, [charge(1, 0.01, days_ago=1)], NOW)  # a simulator's endless credit
    assert found.runs_out_at is None
    assert "more than 36500 days" in page.accounts_html([Balance("c", found)])
