"""The GPU rentals page as HTML (ui/page.py): what it shows is escaped, and a destroy is offered only to who may."""

from __future__ import annotations

from airflow_gpumarket.ui import page
from airflow_gpumarket.ui.spend import TaskState, live_rentals, spans, spend

from .rows import LABEL, NOW, row


def test_the_page_escapes_what_it_shows_and_offers_a_destroy_only_to_who_may():
    instance = {"id": 1, "actual_status": "running", "label": LABEL, "dph_total": 0.5, "start_date": NOW - 60}
    odd = row(run_id="<img src=x onerror=alert(1)>")
    (orphan,) = live_rentals([("c", instance)], {1: odd}, {odd.ti_key: TaskState("success")}, NOW)
    totals = spend(spans([odd]), {1: orphan.cost_so_far}, NOW - 86400, NOW)
    for allowed in (True, False):
        may = lambda _, a=allowed: a  # noqa: E731
        html = page.render(live=[orphan], spend=totals, days=1, target=1, can_destroy=may)
        assert "<img src=x" not in html and "&lt;img src=x" in html
        assert ('name="destroy" value="1"><button type="submit">Destroy…</button>' in html) is allowed
        assert "orphans/c/1/destroy" not in html  # the POST only from the confirmation
        asked = page.render(live=[orphan], spend=totals, days=1, target=1, can_destroy=may, confirm=orphan)
        assert ('<form class="inline" method="post" action="orphans/c/1/destroy?days=1">' in asked) is allowed
        assert "<script" not in asked and "onsubmit" not in asked  # the UI's sandboxed frame allows no dialogs
    assert page.chart_svg({}) == "" and "<svg" in page.chart_svg(totals.per_day)


def test_rule_a_service_is_shown_with_the_tasks_that_used_it():
    instance = {"id": 1, "actual_status": "running", "label": LABEL, "dph_total": 0.5, "start_date": NOW - 60}
    setup = row()
    (served,) = live_rentals([("c", instance)], {1: setup}, {setup.ti_key: TaskState("success")}, NOW)
    served.used_by = tuple((setup.dag_id, setup.run_id, "embed", i) for i in (2, 0, 1)) + (
        (setup.dag_id, setup.run_id, "<gather>", -1),
    )
    html = page.render(
        live=[served], spend=spend([], {}, NOW - 86400, NOW), days=1, target=1, can_destroy=lambda _: False
    )
    assert "used by &lt;gather&gt;, embed[0, 1, 2]</span>" in html
    served.used_by = tuple((setup.dag_id, setup.run_id, "embed", i) for i in range(12))
    html = page.render(
        live=[served], spend=spend([], {}, NOW - 86400, NOW), days=1, target=1, can_destroy=lambda _: False
    )
    assert "used by embed[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, …]</span>" in html


def test_the_avoided_machines_show_why_and_until_when_escaped_and_how_to_forget_one():
    from airflow_gpumarket.host_memory import Memory

    flaky = Memory(11, "preflight", "<b>expected 2 GPUs</b>", NOW - 600, NOW + 3600, 3)
    html = page.avoided_html([(("prod", "prod_copy"), flaky)], NOW)
    assert '<tr id="avoided-11"><td>11</td><td>prod, prod_copy</td><td>preflight</td>' in html
    assert "&lt;b&gt;expected 2 GPUs&lt;/b&gt;" in html and "<b>" not in html
    assert '<td class="num">3</td><td>2027-01-15 07:50 UTC</td><td class="num">1h00m00s</td>' in html
    assert "airflow gpumarket hosts --conn-id CONN --clear MACHINE_ID" in html
    empty = page.avoided_html([], NOW)
    assert "Avoided machines (0)" in empty and "No machine is avoided" in empty
    assert page.avoided_html(None, NOW) == ""  # who may not see the account: the account's section says who may
