"""The GPU rentals page as server-rendered HTML.

It shows live rentals, orphans (with a destroy button for those who may), spend per DAG and per run, and spend per day
and DAG as an inline SVG chart. No JavaScript and no assets: the page works inside the Airflow UI's sandboxed iframe
(which allows no dialogs, so the page asks for a destroy's confirmation itself) and behind a reverse proxy (relative
URLs only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from html import escape
from urllib.parse import quote

from airflow_gpumarket import lifecycle
from airflow_gpumarket.ui.spend import LiveRental, Spend, ti_text, utc_text

#: Bar colours of the chart, one per DAG in turn.
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
CHART_HEIGHT, BAR_WIDTH, GAP = 160, 28, 10

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1rem;color:#1a1a1a}
table{border-collapse:collapse;margin:.5rem 0 1.5rem;font-size:.9rem}
th,td{border-bottom:1px solid #ddd;padding:.3rem .6rem;text-align:left;vertical-align:top}
th{background:#f4f4f4} td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.target{background:#fff6cc} .muted{color:#666} .error{color:#a00}
form.inline{display:inline} button{cursor:pointer}
.confirm{border:2px solid #a00;background:#fff3f3;padding:.6rem 1rem;margin:1rem 0;max-width:60rem}
"""


def _money(value: float | None) -> str:
    return "—" if value is None else f"${value:,.4f}"


def _duration(seconds: float | None) -> str:
    return "—" if seconds is None else lifecycle.format_duration(seconds)


def _task_cell(row: LiveRental) -> str:
    if row.owner is None:
        return '<span class="muted">not recorded</span>'
    tried = row.recorded.record.get("try_number") if row.recorded else None
    return (
        f"{escape(ti_text(row.owner))}{'' if tried is None else f' (try {int(tried)})'}"
        f"<br><span class=muted>{escape(row.task_state or 'state unknown')}"
        f"{' · from its label' if row.by_label else ''}</span>"
    )


def _rental_rows(rows: Iterable[LiveRental], target: int | None, destroy_button: Callable[[LiveRental], str]) -> str:
    out = []
    for row in rows:
        css = ' class="target"' if row.instance_id == target else ""
        out.append(
            f'<tr id="rental-{row.instance_id}"{css}><td>{row.instance_id}<br>'
            f"<span class=muted>{escape(row.conn_id)}</span></td>"
            f"<td>{escape(str(row.status))}</td>"
            f"<td>{escape(str(row.offer_id))}<br><span class=muted>{escape(str(row.num_gpus or ''))} "
            f"{escape(str(row.gpu_name or ''))}</span></td>"
            f'<td class="num">{_money(row.hourly_price)}/h</td>'
            f'<td class="num">{_duration(row.uptime_seconds)}</td>'
            f'<td class="num">{_money(row.cost_so_far)}</td>'
            f"<td>{_task_cell(row)}</td>"
            + (f"<td>{escape(row.orphan_reason or '')}</td><td>{destroy_button(row)}</td>" if row.orphan_reason else "")
            + "</tr>"
        )
    return "".join(out)


def chart_svg(per_day: dict[str, dict[str, float]]) -> str:
    """Stacked bars: one per day, a segment per DAG; a legend below. Empty string when there is nothing to plot."""
    if not per_day:
        return ""
    dags = sorted({dag for day in per_day.values() for dag in day})
    colour = {dag: PALETTE[i % len(PALETTE)] for i, dag in enumerate(dags)}
    top = max(sum(day.values()) for day in per_day.values()) or 1.0
    # Wide enough for the bars and for the longest DAG id in the legend (about 7 px a character at 12 px).
    width = max(len(per_day) * (BAR_WIDTH + GAP) + 80, 100 + 7 * max(len(dag) for dag in dags))
    legend_y = CHART_HEIGHT + 40
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{legend_y + 18 * len(dags)}" '
        f'aria-label="GPU spend per day and DAG"><title>GPU spend per day and DAG</title>',
        f'<text x="0" y="12" font-size="11">{_money(top)}</text>',
        f'<line x1="70" y1="{CHART_HEIGHT + 5}" x2="{width}" y2="{CHART_HEIGHT + 5}" stroke="#999"/>',
    ]
    for i, (day, amounts) in enumerate(per_day.items()):
        x, y = 75 + i * (BAR_WIDTH + GAP), CHART_HEIGHT + 5.0
        for dag in dags:
            if not amounts.get(dag):
                continue
            h = amounts[dag] / top * CHART_HEIGHT
            y -= h
            parts.append(
                f'<rect x="{x}" y="{y:.1f}" width="{BAR_WIDTH}" height="{h:.1f}" fill="{colour[dag]}">'
                f"<title>{escape(day)} {escape(dag)}: {_money(amounts[dag])}</title></rect>"
            )
        parts.append(f'<text x="{x}" y="{CHART_HEIGHT + 20}" font-size="10">{escape(day[5:])}</text>')
    for j, dag in enumerate(dags):
        y = legend_y + 18 * j
        parts.append(f'<rect x="75" y="{y - 10}" width="12" height="12" fill="{colour[dag]}"/>')
        parts.append(f'<text x="92" y="{y}" font-size="12">{escape(dag)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render(
    *,
    live: list[LiveRental],
    spend: Spend,
    days: int,
    target: int | None,
    can_destroy: Callable[[LiveRental], bool],
    errors: Iterable[str] = (),
    message: str | None = None,
    confirm: LiveRental | None = None,
) -> str:
    """The whole page.

    ``can_destroy`` says whether the user may destroy an orphan (may edit its DAG); ``confirm``: the orphan whose
    Destroy was pressed, asked about at the top of the page.
    """

    def destroy_button(row: LiveRental) -> str:
        if not can_destroy(row):
            return '<span class="muted">ask someone who may edit this DAG</span>'
        return (  # asks for the confirmation below; the POST comes from there
            f'<form class="inline" method="get" action=""><input type="hidden" name="days" value="{days}">'
            f'<input type="hidden" name="conn" value="{escape(row.conn_id)}">'
            f'<input type="hidden" name="destroy" value="{row.instance_id}"><button type="submit">Destroy…</button>'
            "</form>"
        )

    def confirmation(row: LiveRental) -> str:
        action = f"orphans/{quote(row.conn_id, safe='')}/{row.instance_id}/destroy?days={days}"
        return (
            f'<div class="confirm" id="confirm-destroy"><p><strong>Destroy instance {row.instance_id}</strong> '
            f"({escape(row.conn_id)}, {_money(row.cost_so_far)} so far: {escape(row.orphan_reason or '')})? "
            "Billing stops, and its disk and everything on it are lost.</p>"
            f'<form class="inline" method="post" action="{escape(action)}">'
            f'<input type="hidden" name="confirm" value="{row.instance_id}">'
            f'<button type="submit">Destroy instance {row.instance_id}</button></form> '
            f'<a href="?days={days}">Cancel</a></div>'
        )

    running = [r for r in live if not r.orphan_reason]
    orphans = [r for r in live if r.orphan_reason]
    head = "<tr><th>Instance</th><th>Status</th><th>Offer / GPU</th><th>Price</th><th>Uptime</th><th>Cost so far</th>"
    runs = sorted(spend.per_run.items(), key=lambda kv: -kv[1])
    return "".join(
        [
            "<!doctype html><html><head><meta charset=utf-8><title>GPU rentals</title>",
            f"<style>{_STYLE}</style></head><body><h1>GPU rentals</h1>",
            *(f'<p class="error">{escape(e)}</p>' for e in errors),
            f"<p><strong>{escape(message)}</strong></p>" if message else "",
            confirmation(confirm) if confirm is not None and confirm.orphan_reason and can_destroy(confirm) else "",
            f"<h2>Live rentals ({len(running)})</h2>",
            f"<table>{head}<th>DAG / run / task</th></tr>{_rental_rows(running, target, destroy_button)}</table>"
            if running
            else '<p class="muted">Nothing is rented.</p>',
            f"<h2>Orphans ({len(orphans)})</h2>",
            f"<table>{head}<th>DAG / run / task</th><th>Why</th><th></th></tr>"
            f"{_rental_rows(orphans, target, destroy_button)}</table>"
            if orphans
            else '<p class="muted">No orphans: every instance with the provider\'s label has a running task.</p>',
            f"<h2>Spend, last {days} days: {_money(spend.total)} over {spend.rentals} rental(s)</h2>",
            '<form method="get" action=""><label>Window (days) <input name="days" type="number" min="1" max="90" '
            f'value="{days}"></label> <button type="submit">Show</button></form>',
            chart_svg(spend.per_day),
            "<table><tr><th>DAG</th><th>Spend</th></tr>"
            + "".join(
                f'<tr><td>{escape(d)}</td><td class="num">{_money(v)}</td></tr>'
                for d, v in sorted(spend.per_dag.items(), key=lambda kv: -kv[1])
            )
            + "</table>",
            "<table><tr><th>DAG</th><th>Run</th><th>Spend</th></tr>"
            + "".join(
                f'<tr><td>{escape(d)}</td><td>{escape(r)}</td><td class="num">{_money(v)}</td></tr>'
                for (d, r), v in runs
            )
            + "</table>",
            f"<p>{spend.unknown_cost} rental(s) ended with no end recorded (destroyed outside Airflow): "
            "their cost is not in these figures.</p>"
            if spend.unknown_cost
            else "",
            "<p class=\"muted\">Costs are estimates on the service's clock: the offer's price or the bid, from when "
            "the renting task first saw the instance running (else from its start) until it saw it stopped or it was "
            "destroyed; live rentals from "
            "their start. Disk storage is not included, and the service's own charges can differ. "
            f"Shown at {utc_text(spend.window_end)}.</p></body></html>",
        ]
    )
