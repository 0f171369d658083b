"""The GPU rentals page as server-rendered HTML.

It shows the account's credit and runway and the machines it avoids (to who may see them), live rentals, orphans (with a
destroy button for those who may), spend per DAG, per run and per rental, and spend per day and DAG as an inline SVG
chart. A figure is the
service's charge where it has one, else an estimate marked "≈ … est.". Money is rounded here only, to 4 decimals (2
for the credit). No JavaScript and no assets: the page works inside the Airflow UI's sandboxed iframe (which allows no
dialogs, so the page asks for a destroy's confirmation itself) and behind a reverse proxy (relative URLs only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from decimal import ROUND_HALF_UP, Decimal
from html import escape
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow_gpumarket import api, lifecycle
from airflow_gpumarket.ui.account_charges import LONGEST_RUNWAY_DAYS, RUNWAY_DAYS, Balance, Unowned, dollars
from airflow_gpumarket.ui.spend import Figure, LiveRental, Spend, Total, ti_text, utc_text

if TYPE_CHECKING:
    from airflow_gpumarket.host_memory import Memory

#: Bar colours of the chart, one per DAG in turn.
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
CHART_HEIGHT, BAR_WIDTH, GAP = 160, 28, 10
#: How money is shown: costs to a hundredth of a cent (a short job on a cheap offer costs fractions of a cent), the
#: credit to the cent.
COST_PLACES, CREDIT_PLACES = Decimal("0.0001"), Decimal("0.01")
#: Rentals listed one by one under the spend; the JSON has them all.
MAX_RENTAL_ROWS = 200
#: A mapped task's indexes shown beside a service that it used; more are elided.
MAX_USER_INDEXES = 10
#: The estimate's mark, as the legend explains it.
ESTIMATE_LEGEND = "≈ … est."

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1rem;color:#1a1a1a}
table{border-collapse:collapse;margin:.5rem 0 1.5rem;font-size:.9rem}
th,td{border-bottom:1px solid #ddd;padding:.3rem .6rem;text-align:left;vertical-align:top}
th{background:#f4f4f4} td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.target{background:#fff6cc} .muted{color:#666} .error{color:#a00}
form.inline{display:inline} button{cursor:pointer} .est{font-style:italic;color:#6a4a00}
.confirm{border:2px solid #a00;background:#fff3f3;padding:.6rem 1rem;margin:1rem 0;max-width:60rem}
"""


def _rate(row: LiveRental) -> str:
    """What a rental bills per hour now: its disk alone while it does not run."""
    if row.status == api.STATUS_RUNNING or row.status is None:
        return f"{_money(row.billing_now)}/h"
    if row.billing_now is None:
        return "disk only"
    return f"{_money(row.billing_now)}/h<br><span class=muted>disk only</span>"


def _money(value: float | Decimal | None, places: Decimal = COST_PLACES) -> str:
    """Dollars rounded half up to ``places`` (the only rounding of a figure): "$1,234.5678", "-$0.0100", "—"."""
    exact = dollars(value)
    if exact is None:
        return "—"
    shown = exact.quantize(places, ROUND_HALF_UP)
    return f"{'-' if shown < 0 else ''}${abs(shown):,}"


def _signed(value: Decimal | None) -> str:
    return "—" if value is None else ("+" if value >= 0 else "") + _money(value)


def _estimate(value: float | Decimal | None) -> str:
    return "—" if value is None else f'<span class="est">≈ {_money(value)} est.</span>'


def _figure(figure: Figure, *, beside: bool = True) -> str:
    """A rental's cost: its actual (``beside``: over its estimate and the difference), else its estimate, marked."""
    if figure.charged is None:
        return _estimate(figure.estimate)
    actual = f'<span class="actual">{_money(figure.actual)}</span>'
    if figure.partial:
        return f"{actual}<br><span class=muted>charges of the window's days only</span>"
    if figure.estimate is None or not beside:
        return actual
    return f"{actual}<br><span class=muted>est. {_money(figure.estimate)}, {_signed(figure.difference)}</span>"


def _total(total: Total) -> str:
    return _estimate(total.amount) if total.estimated_rentals == total.rentals else _money(total.amount)


def _total_cells(total: Total) -> str:
    """A total's cells: spend (marked when all estimated), its estimated part, actual minus estimate."""
    part = (
        "—"
        if not total.estimated_rentals
        else f"{_estimate(total.estimated)} ({total.estimated_rentals} of {total.rentals})"
    )
    return (
        f'<td class="num">{_total(total)}</td><td class="num">{part}</td>'
        f'<td class="num">{_signed(total.difference)}</td>'
    )


def _duration(seconds: float | None) -> str:
    return "—" if seconds is None else lifecycle.format_duration(seconds)


def _task_cell(row: LiveRental) -> str:
    if row.owner is None:
        return '<span class="muted">not recorded</span>'
    tried = row.recorded.record.get("try_number") if row.recorded else None
    return (
        f"{escape(ti_text(row.owner))}{'' if tried is None else f' (try {int(tried)})'}"
        f"<br><span class=muted>{escape(row.task_state or 'state unknown')}"
        f"{' · from its label' if row.by_label else ''}</span>{_users(row)}"
    )


def _users(row: LiveRental) -> str:
    """The tasks that reached the rental as a service, by task id (a mapped task's indexes together)."""
    if not row.used_by:
        return ""
    indexes: dict[str, set[int]] = {}
    for _, _, task_id, map_index in row.used_by:
        indexes.setdefault(task_id, set()).update([map_index] if map_index >= 0 else [])
    shown = []
    for task_id, found in sorted(indexes.items()):
        listed = ", ".join(str(i) for i in sorted(found)[:MAX_USER_INDEXES])
        more = ", …" if len(found) > MAX_USER_INDEXES else ""
        shown.append(f"{task_id}[{listed}{more}]" if found else task_id)
    return f"<br><span class=muted>used by {escape(', '.join(shown))}</span>"


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
            f'<td class="num">{_rate(row)}</td>'
            f'<td class="num">{_duration(row.uptime_seconds)}</td>'
            f'<td class="num cost">{_figure(row.figure)}</td>'
            f"<td>{_task_cell(row)}</td>"
            + (f"<td>{escape(row.orphan_reason or '')}</td><td>{destroy_button(row)}</td>" if row.orphan_reason else "")
            + "</tr>"
        )
    return "".join(out)


def _runway(balance: Balance) -> str:
    runway = balance.runway
    if runway is None or runway.burn is None:
        return '<span class="muted">— (the service gave no charges)</span>' if runway else "—"
    if not runway.burn:
        return f"no spend in the {RUNWAY_DAYS} full UTC days before today"
    if runway.days is None:
        return "—"
    if not runway.days:
        return "0 days: the credit is spent"
    if runway.runs_out_at is None:
        return f"more than {LONGEST_RUNWAY_DAYS} days"
    return f"{runway.days.quantize(Decimal('0.1'), ROUND_HALF_UP)} days (until about {utc_text(runway.runs_out_at)})"


def accounts_html(balances: list[Balance] | None) -> str:
    """Each connection's credit and runway; for who may not see them (``None``), a line saying who may."""
    if balances is None:
        return (
            '<p class="muted">The account\'s credit and runway, and the machines it avoids, are shown to users who '
            "may read every DAG.</p>"
        )
    if not balances:
        return ""
    rows = "".join(
        f'<tr id="balance-{escape(b.conn_id)}"><td>{escape(b.conn_id)}</td>'
        f'<td class="num">{_money(b.runway.available if b.runway else None, CREDIT_PLACES)}</td>'
        f'<td class="num">{_money(b.runway.burn if b.runway else None)}</td>'
        f'<td class="num">{_money(b.runway.daily if b.runway else None)}</td>'
        f"<td>{_runway(b)}"
        + (f'<br><span class="muted">{escape(b.problem)}</span>' if b.problem else "")
        + "</td></tr>"
        for b in balances
    )
    return (
        "<h2>Account</h2><table><tr><th>Connection</th><th>Credit left</th>"
        f"<th>Charged, last {RUNWAY_DAYS} full days</th><th>Per day</th><th>Runway at that rate</th></tr>{rows}</table>"
    )


def budgets_html(rows: Iterable[tuple[str, Any, list[Any]]]) -> str:
    """Each budgeted DAG's budgets with what is spent, reserved and left in the current UTC windows."""
    cells = []
    for dag_id, limit, rooms in rows:
        if limit.run is not None:
            cells.append(
                f"<tr><td>{escape(dag_id)}</td><td>run</td><td class=num>{_money(limit.run)}</td>"
                '<td colspan=3 class="muted">per DAG run</td></tr>'
            )
        cells += [
            f"<tr><td>{escape(dag_id)}</td><td>{h.period}</td><td class=num>{_money(h.limit)}</td>"
            f"<td class=num>{_money(h.spent)}</td><td class=num>{_money(h.reserved)}</td>"
            f"<td class=num>{_money(h.left)}</td></tr>"
            for h in rooms
        ]
    if not cells:
        return ""
    return (
        "<h2>Budgets</h2><table><tr><th>DAG</th><th>Window (UTC)</th><th>Budget</th><th>Spent</th><th>Reserved</th>"
        "<th>Left</th></tr>" + "".join(cells) + "</table>"
        '<p class="muted">From the gpumarket_budgets Variable and the budget ledger: spent is what settled rentals '
        "cost, reserved the worst case of rentals still open. A rental whose worst case exceeds what is left is "
        "refused.</p>"
    )


def avoided_html(avoided: list[tuple[tuple[str, ...], Memory]] | None, now: float) -> str:
    """The machines the accounts avoid (host memory) and how to forget one; for who may not see them (``None``),
    nothing: the account section already says who may."""
    if avoided is None:
        return ""
    head = f"<h2>Avoided machines ({len(avoided)})</h2>"
    clear = (
        '<p class="muted">Renting tasks skip these machines until their memory expires. To let them choose one '
        "again sooner: <code>airflow gpumarket hosts --conn-id CONN --clear MACHINE_ID</code> (or "
        "<code>--clear-all</code>).</p>"
    )
    if not avoided:
        return head + '<p class="muted">No machine is avoided: no rental failed on a host lately.</p>'
    rows = "".join(
        f'<tr id="avoided-{m.machine_id}"><td>{m.machine_id}</td><td>{escape(", ".join(conn_ids))}</td>'
        f"<td>{escape(m.reason)}</td><td>{escape(m.detail) or '—'}</td>"
        f'<td class="num">{m.failures}</td><td>{utc_text(m.remembered_at)}</td>'
        f'<td class="num">{_duration(m.expires_at - now)}</td></tr>'
        for conn_ids, m in avoided
    )
    return (
        f"{head}<table><tr><th>Machine</th><th>Connection</th><th>Why</th><th>Detail</th><th>Failures</th>"
        f"<th>Remembered</th><th>Expires in</th></tr>{rows}</table>{clear}"
    )


def _rentals_spent(spend: Spend) -> str:
    if not spend.rows:
        return ""
    rows = "".join(
        f'<tr id="spend-{r.span.instance_id}"><td>{r.span.instance_id}</td>'
        f"<td>{escape(ti_text(r.span.owner)) if r.span.owner else ''}</td>"
        f"<td>{utc_text(r.span.created_at) if r.span.created_at is not None else '—'}</td>"
        f'<td class="num cost">{_figure(r.figure, beside=False)}</td>'
        f'<td class="num">{_money(r.figure.estimate)}</td><td class="num">{_signed(r.figure.difference)}</td></tr>'
        for r in spend.rows[:MAX_RENTAL_ROWS]
    )
    more = len(spend.rows) - MAX_RENTAL_ROWS
    return (
        "<h3>Each rental</h3><table><tr><th>Instance</th><th>DAG / run / task</th><th>Created</th><th>Cost</th>"
        f"<th>Estimate</th><th>Actual − estimate</th></tr>{rows}</table>"
        + (f'<p class="muted">… and {more} more in <a href="api/rentals">api/rentals</a>.</p>' if more > 0 else "")
    )


def _unowned(unowned: Unowned | None) -> str:
    if unowned is None:
        return ""
    ids = ", ".join(str(i) for i in unowned.instance_ids[:10]) + (", …" if len(unowned.instance_ids) > 10 else "")
    line = (
        f'<p id="unowned">Charges of instances no task recorded: {_money(unowned.instances)}'
        + (f" (instance {ids})" if ids else "")
        + ". They are in no DAG's spend.</p>"
    )
    if unowned.other:
        line += f"<p>Charges of no instance (volumes, serverless): {_money(unowned.other)}.</p>"
    return line


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
    notes: Iterable[str] = (),
    balances: list[Balance] | None = None,
    unowned: Unowned | None = None,
    avoided: list[tuple[tuple[str, ...], Memory]] | None = None,
    now: float = 0.0,
    budgets: Iterable[tuple[str, Any, list[Any]]] = (),
) -> str:
    """The whole page.

    ``can_destroy`` says whether the user may destroy an orphan (may edit its DAG); ``confirm``: the orphan whose
    Destroy was pressed, asked about at the top of the page; ``notes``: lines about the figures (a service without
    charges); ``balances``: each connection's credit and runway, None for a user who may not see them; ``unowned``:
    the charges no DAG's rental takes, for who may see them; ``avoided``: the machines the accounts avoid, for who may
    see them, whose expiries count from ``now`` (this host's time).
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
    runs = sorted(spend.runs.items(), key=lambda kv: -kv[1].amount)
    estimated = f" ({_money(spend.estimated)} of it estimated)" if spend.estimated else ""
    return "".join(
        [
            "<!doctype html><html><head><meta charset=utf-8><title>GPU rentals</title>",
            f"<style>{_STYLE}</style></head><body><h1>GPU rentals</h1>",
            *(f'<p class="error">{escape(e)}</p>' for e in errors),
            *(f'<p class="note">{escape(n)}</p>' for n in notes),
            f"<p><strong>{escape(message)}</strong></p>" if message else "",
            confirmation(confirm) if confirm is not None and confirm.orphan_reason and can_destroy(confirm) else "",
            accounts_html(balances),
            f"<h2>Live rentals ({len(running)})</h2>",
            f"<table>{head}<th>DAG / run / task</th></tr>{_rental_rows(running, target, destroy_button)}</table>"
            if running
            else '<p class="muted">Nothing is rented.</p>',
            f"<h2>Orphans ({len(orphans)})</h2>",
            f"<table>{head}<th>DAG / run / task</th><th>Why</th><th></th></tr>"
            f"{_rental_rows(orphans, target, destroy_button)}</table>"
            if orphans
            else '<p class="muted">No orphans: every instance with the provider\'s label has a running task.</p>',
            avoided_html(avoided, now),
            budgets_html(budgets),
            f"<h2>Spend, last {days} days: {_money(spend.total)} over {spend.rentals} rental(s){estimated}</h2>",
            '<form method="get" action=""><label>Window (days) <input name="days" type="number" min="1" max="90" '
            f'value="{days}"></label> <button type="submit">Show</button></form>',
            chart_svg(spend.per_day),
            "<table><tr><th>DAG</th><th>Spend</th><th>Of it estimated (rentals)</th><th>Actual − estimate</th></tr>"
            + "".join(
                f"<tr><td>{escape(d)}</td>{_total_cells(t)}</tr>"
                for d, t in sorted(spend.dags.items(), key=lambda kv: -kv[1].amount)
            )
            + "</table>",
            "<table><tr><th>DAG</th><th>Run</th><th>Spend</th><th>Of it estimated (rentals)</th>"
            "<th>Actual − estimate</th></tr>"
            + "".join(f"<tr><td>{escape(d)}</td><td>{escape(r)}</td>{_total_cells(t)}</tr>" for (d, r), t in runs)
            + "</table>",
            _rentals_spent(spend),
            _unowned(unowned),
            f"<p>{spend.unknown_cost} rental(s) ended with no end recorded (destroyed outside Airflow) and no charge: "
            "their cost is not in these figures.</p>"
            if spend.unknown_cost
            else "",
            '<p class="muted">A figure is what the service charged for the instance over the window\'s days (UTC, '
            f'its charges per instance and day) where it charged the rental; <span class="est">{ESTIMATE_LEGEND}'
            "</span> marks an estimate where it did not: the offer's price or the bid, from when the renting task "
            "first saw the instance running (else from its start) until it saw it stopped or it was destroyed, on the "
            "service's clock, plus its disk from its start; live rentals from their start. Estimates leave out "
            "bandwidth, which charges include. Actual − estimate compares the two where both exist. The service posts "
            "charges some time after they accrue, so a live or just-ended rental's actual can be short of what it "
            f"will cost. Shown at {utc_text(spend.window_end)}, on the service's clock.</p></body></html>",
        ]
    )
