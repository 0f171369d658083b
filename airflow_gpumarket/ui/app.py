"""The GPU rentals page's FastAPI app, mounted by the plugin in Airflow 3.1+'s api-server at ``/gpumarket``.

Airflow does not protect a plugin's endpoints: each route here asks Airflow's auth manager itself. An anonymous
request gets 401. A rental is shown only to users who may read its DAG (from its record, else from its label), asked
about that DAG; an orphan is destroyable only by users who may edit it. An instance that no DAG can be found for is
shown to, and destroyable by, only users who may read, respectively edit, every DAG, asked DAG by DAG (the FAB auth
manager answers a question that names no DAG with "may list DAGs"). So are what is account-wide: the credit left,
the runway, and the charges no DAG's rental takes. Connections are not filtered by Airflow's connection permission:
the page never shows a connection's details, only the id an instance was listed through.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlencode, urlparse

from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import FastAPI, Form, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from airflow_gpumarket import lifecycle
from airflow_gpumarket.exceptions import GpuMarketError, GpuMarketNotFoundError
from airflow_gpumarket.ui import account_charges, page, sources, spend

if TYPE_CHECKING:
    from airflow_gpumarket.host_memory import Memory

DEFAULT_DAYS, MAX_DAYS = 7, 90
log = logging.getLogger(__name__)
Days = Annotated[int, Query(ge=1, le=MAX_DAYS)]


class _Access:
    """What one user may see and do, asked of Airflow's auth manager once per request."""

    def __init__(self, user: Any) -> None:
        from airflow.api_fastapi.app import get_auth_manager
        from airflow.utils.session import create_session

        self.user = user
        self.manager = get_auth_manager()
        with create_session() as session:
            every_dag = sources.all_dag_ids(session)
        self.readable: set[str] = set(self.manager.get_authorized_dag_ids(user=user, method="GET"))
        editable = set(self.manager.get_authorized_dag_ids(user=user, method="PUT"))
        self.reads_all = bool(every_dag) and every_dag <= self.readable
        self.edits_all = bool(every_dag) and every_dag <= editable
        self._edits: dict[str, bool] = {}

    def sees(self, dag_id: str | None) -> bool:
        return self.reads_all if dag_id is None else dag_id in self.readable

    def may_destroy(self, row: spend.LiveRental) -> bool:
        if not row.orphan_reason:
            return False
        if row.dag_id is None:
            return bool(self.edits_all)
        if row.dag_id not in self._edits:
            from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

            self._edits[row.dag_id] = self.manager.is_authorized_dag(
                method="PUT", details=DagDetails(id=row.dag_id), user=self.user
            )
        return self._edits[row.dag_id]


@dataclass
class _View:
    """What the page shows one user."""

    live: list[spend.LiveRental]
    totals: spend.Spend
    errors: list[str] = field(default_factory=list)
    #: Lines about the figures that are no error (a service without charges).
    notes: list[str] = field(default_factory=list)
    #: Connections whose service gave no charges (no such endpoint): their rentals are estimated.
    no_charges: list[str] = field(default_factory=list)
    #: Each connection's credit and runway; None for a user who may not read every DAG.
    balances: list[account_charges.Balance] | None = None
    #: The charges no DAG's rental takes; None for a user who may not read every DAG, or without charges.
    unowned: account_charges.Unowned | None = None
    #: The machines the accounts avoid (host memory), with their connections; None for a user who may not read every
    #: DAG.
    avoided: list[tuple[tuple[str, ...], Memory]] | None = None
    #: This host's time the view was read at (host memory's clock).
    now: float = 0.0
    #: The budgeted DAGs this user reads, with their budgets' headroom (``sources.budgets_in_force``).
    budgets: list[tuple[str, Any, list[Any]]] = field(default_factory=list)


def _view(access: _Access, days: int) -> _View:
    now = time.time()
    since = now - days * 86400
    seen_all = sources.gather(since, now)
    charges = seen_all.charges
    live = [r for r in seen_all.live if _belongs(r, access)]
    alive_costs = {r.instance_id: r.cost_so_far for r in seen_all.live}
    seen = [s for s in seen_all.spans if s.owner is not None and access.sees(s.owner[0])]
    shown_at = now + max(seen_all.clock_offsets.values(), default=0.0)  # the rows' clock: the service's
    view = _View(
        live,
        spend.spend(seen, alive_costs, since, shown_at, charges),
        seen_all.errors,
        no_charges=seen_all.no_charges,
        now=now,
    )
    conn_ids, no_charges = seen_all.conn_ids, seen_all.no_charges
    if no_charges:
        view.notes.append(_no_charges_note(no_charges, every=len(no_charges) == len(conn_ids)))
    try:
        view.budgets = [b for b in sources.budgets_in_force(now) if access.sees(b[0])]
    except ValueError as exc:  # budgets.BudgetConfigError: a malformed Variable, named
        view.errors.append(str(exc))
    if access.reads_all:  # account-wide: only for who may read every DAG
        owned = {s.instance_id for s in seen_all.spans if s.owner} | {r.instance_id for r in seen_all.live if r.owner}
        view.unowned = account_charges.unowned(charges, owned, since) if seen_all.charges_of else None
        offsets = seen_all.clock_offsets
        view.balances = [_balance(c, seen_all.charges_of.get(c), now + offsets.get(c, 0.0)) for c in conn_ids]
        view.avoided = sources.avoided_machines(conn_ids, now, view.errors)
    return view


def _no_charges_note(conn_ids: list[str], *, every: bool) -> str:
    which = ("connection " if len(conn_ids) == 1 else "connections ") + ", ".join(repr(c) for c in conn_ids)
    if every:
        return f"The service gave no charges ({which}: no charges endpoint), so every figure is an estimate."
    return f"The service gave no charges for {which} (no charges endpoint), so their rentals are estimated."


def _balance(conn_id: str, charges: list[Any] | None, service_now: float) -> account_charges.Balance:
    try:
        available = sources.account(conn_id).available
    except GpuMarketNotFoundError:
        return account_charges.Balance(conn_id, None, "the service has no account endpoint")
    except GpuMarketError as exc:
        return account_charges.Balance(conn_id, None, f"could not read the account: {exc}")
    if available is None:
        return account_charges.Balance(
            conn_id, account_charges.runway(None, charges, service_now), "the service sent no credit"
        )
    return account_charges.Balance(conn_id, account_charges.runway(available, charges, service_now))


def _listed(live: list[spend.LiveRental], conn_id: str | None, instance_id: int | None) -> spend.LiveRental | None:
    """The page's row of one instance of one connection, if the service listed it."""
    return next((r for r in live if r.instance_id == instance_id and r.conn_id == conn_id), None)


def _belongs(row: spend.LiveRental, access: _Access) -> bool:
    """Whether an instance is on the page for this user.

    It is when its owner's DAG is readable; one with no owner only when it has this provider's label (an orphan) and the
    user reads every DAG. Instances made by hand are not the page's business.
    """
    if row.owner is not None:
        return access.sees(row.dag_id)
    return row.orphan_reason is not None and access.sees(None)


def create_app() -> FastAPI:
    from airflow_gpumarket.ui import history_api, host_memory_api, ledger_api

    app = FastAPI(title="GPU rentals", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(ledger_api.router)
    app.include_router(host_memory_api.router)
    app.include_router(history_api.router)

    @app.get("/", response_class=HTMLResponse)
    def rentals_page(
        user: GetUserDep,
        days: Days = DEFAULT_DAYS,
        instance: int | None = None,
        destroyed: int | None = None,
        destroy: int | None = None,
        conn: str | None = None,
    ) -> HTMLResponse:
        access = _Access(user)
        view = _view(access, days)
        asked = _listed(view.live, conn, destroy)
        if destroy is not None and (asked is None or not asked.orphan_reason or not access.may_destroy(asked)):
            refused = f"Instance {destroy} is not an orphan you may destroy (any more): nothing was destroyed."
            view.errors.append(refused)
        html = page.render(
            live=view.live,
            spend=view.totals,
            days=days,
            target=destroy if asked is not None else instance,
            can_destroy=access.may_destroy,
            errors=view.errors,
            message=None if destroyed is None else f"Instance {destroyed} was destroyed.",
            confirm=asked,
            notes=view.notes,
            balances=view.balances,
            unowned=view.unowned,
            avoided=view.avoided,
            now=view.now,
            budgets=view.budgets,
        )
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    @app.get("/api/rentals")
    def rentals_json(user: GetUserDep, days: Days = DEFAULT_DAYS) -> Any:
        """The page's data as JSON (what the page shows this user)."""
        access = _Access(user)
        view = _view(access, days)
        totals = view.totals
        return JSONResponse(
            {
                "live": [_row_json(r, access) for r in view.live],
                "spend": {
                    "total": totals.total,
                    "actual": float(totals.actual),
                    "estimated": float(totals.estimated),
                    "rentals": totals.rentals,
                    "per_dag": totals.per_dag,
                    "dags": [{"dag_id": d, **_total_json(t)} for d, t in totals.dags.items()],
                    "per_run": [{"dag_id": d, "run_id": r, **_total_json(t)} for (d, r), t in totals.runs.items()],
                    "per_day": totals.per_day,
                    "per_rental": [_rental_json(r) for r in totals.rows],
                    "unknown_cost": totals.unknown_cost,
                },
                "no_charges": view.no_charges,
                "unattributed": None if view.unowned is None else _unowned_json(view.unowned),
                "accounts": None if view.balances is None else [_balance_json(b) for b in view.balances],
                "avoided_machines": None
                if view.avoided is None
                else [{"conn_ids": list(names), **m.to_json()} for names, m in view.avoided],
                "budgets": [
                    {"dag_id": dag_id, "run": limit.run, "windows": [{**vars(h), "left": h.left} for h in rooms]}
                    for dag_id, limit, rooms in view.budgets
                ],
                "notes": view.notes,
                "errors": view.errors,
            }
        )

    @app.post("/orphans/{conn_id}/{instance_id}/destroy")
    def destroy_orphan(
        request: Request,
        conn_id: str,
        instance_id: int,
        user: GetUserDep,
        confirm: Annotated[str, Form()] = "",
        days: Days = DEFAULT_DAYS,
    ) -> RedirectResponse:
        _same_origin(request)
        if confirm != str(instance_id):
            raise HTTPException(400, f"confirm must repeat the instance id ({instance_id}) to destroy it")
        access = _Access(user)
        sources.forget_listing(conn_id)  # decide on a fresh listing, not a cached one
        row = _listed(_view(access, days).live, conn_id, instance_id)
        if row is None or not row.orphan_reason:
            raise HTTPException(409, f"instance {instance_id} is not an orphan you can see (any more): not destroyed")
        if not access.may_destroy(row):
            raise HTTPException(403, f"you may not edit DAG {row.dag_id or '(every DAG)'}: not destroyed")
        from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

        hook = GpuMarketHook(conn_id)
        try:
            hook.destroy_instance(instance_id)
        except GpuMarketError as exc:
            raise HTTPException(502, f"destroying instance {instance_id} failed: {exc}") from None
        sources.forget_listing(conn_id)
        sources.record_end(row, hook, f"GPU rentals page ({getattr(user, 'get_name', lambda: 'a user')()})")
        _settle(hook, conn_id, instance_id, row.started_at)
        # Relative to this route (…/gpumarket/orphans/<conn>/<id>/destroy): back to the page behind any proxy.
        return RedirectResponse("../../../?" + urlencode({"days": days, "destroyed": instance_id}), status_code=303)

    return app


def _settle(hook: Any, conn_id: str, instance_id: int, started: Any) -> None:
    """The destroyed instance's budget reservation, if any, becomes what it cost: its charge, when one is posted."""
    from airflow import settings

    from airflow_gpumarket import ledger
    from airflow_gpumarket.operators.cost import charged_since

    ended = hook.service_now()
    try:
        spent = charged_since(hook, instance_id, started, ended)
        ledger.settle(settings.engine, conn_id, now=time.time(), instance_id=instance_id, ended=ended, cost=spent)
    except Exception:  # noqa: BLE001 - the page's destroy succeeded; the reservation stays at its worst case
        log.exception("Could not settle the budget reservation of instance %s", instance_id)


def _same_origin(request: Request) -> None:
    """Whether a destroy comes from the page itself: a browser's Origin (or Referer) names this host.

    Another site's form cannot use the user's Airflow cookie to destroy instances (cross-site request forgery).
    """
    origin = request.headers.get("origin") or request.headers.get("referer")
    if origin is None:
        return  # not a browser's cross-site form (those send Origin): an API client with its own token
    hosts = {request.headers.get("host"), request.headers.get("x-forwarded-host")}  # directly, or via a proxy
    if urlparse(origin).netloc not in hosts:
        raise HTTPException(403, "a destroy must come from the GPU rentals page itself (cross-site request refused)")


def _row_json(row: spend.LiveRental, access: _Access) -> dict[str, Any]:
    recorded = row.recorded
    owner = row.owner or (None, None, None, None)
    return {
        "conn_id": row.conn_id,
        "instance_id": row.instance_id,
        "status": row.status,
        "offer_id": row.offer_id,
        "gpu_name": row.gpu_name,
        "hourly_price": row.hourly_price,
        "billing_now": row.billing_now,
        "uptime_seconds": row.uptime_seconds,
        "cost_so_far": row.cost_so_far,
        **_figure_json(row.figure),
        "actual_partial": row.started_before_window and row.charged is not None,
        "dag_id": owner[0],
        "run_id": owner[1],
        "task_id": owner[2],
        "map_index": owner[3],
        "owner_from": "record" if recorded else "label" if row.owner else None,
        "try_number": recorded.record.get("try_number") if recorded else None,
        "task_state": row.task_state,
        "orphan": row.orphan_reason,
        "used_by": [{"task_id": ti[2], "map_index": ti[3]} for ti in row.used_by],
        "lease_until": (lifecycle.parse_label(row.label) or (None, None))[1],
        "may_destroy": access.may_destroy(row),
    }


def _dollars(value: Decimal | None) -> float | None:
    """An exact sum as a JSON number (the nearest float: the one rounding, here or on the page)."""
    return None if value is None else float(value)


def _figure_json(figure: spend.Figure) -> dict[str, Any]:
    return {
        "actual": _dollars(figure.actual),
        "estimate": _dollars(figure.estimate),
        "difference": _dollars(figure.difference),
        "source": figure.source,
        "charged_until": figure.charged.until if figure.charged else None,
    }


def _total_json(total: spend.Total) -> dict[str, Any]:
    return {
        "spend": float(total.amount),
        "actual": float(total.actual),
        "estimated": float(total.estimated),
        "difference": _dollars(total.difference),
        "rentals": total.rentals,
        "estimated_rentals": total.estimated_rentals,
    }


def _rental_json(row: spend.RentalSpend) -> dict[str, Any]:
    owner = row.span.owner or (None, None, None, None)
    return {
        "instance_id": row.span.instance_id,
        "dag_id": owner[0],
        "run_id": owner[1],
        "task_id": owner[2],
        "map_index": owner[3],
        "created_at": row.span.created_at,
        "ended_at": row.span.ended_at,
        "spend": _dollars(row.figure.amount),
        **_figure_json(row.figure),
    }


def _unowned_json(unowned: account_charges.Unowned) -> dict[str, Any]:
    return {
        "instances": float(unowned.instances),
        "instance_ids": list(unowned.instance_ids),
        "other": float(unowned.other),
    }


def _balance_json(balance: account_charges.Balance) -> dict[str, Any]:
    runway = balance.runway
    return {
        "conn_id": balance.conn_id,
        "available": _dollars(runway.available) if runway else None,
        "burn_days": account_charges.RUNWAY_DAYS,
        "burn": _dollars(runway.burn) if runway else None,
        "burn_per_day": _dollars(runway.daily) if runway else None,
        "runway_days": _dollars(runway.days) if runway else None,
        "runs_out_at": runway.runs_out_at if runway else None,
        "problem": balance.problem,
    }
