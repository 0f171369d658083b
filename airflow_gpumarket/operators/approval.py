"""An approval above a price: a renting task whose worst case exceeds ``approval_above`` asks a person first.

The question goes to the Airflow UI through Airflow's human-in-the-loop requests (3.1+): the offer, the worst case
the budget would reserve, each of the DAG's budgets with what is left, and what the DAG's rentals cost over the last
7 days. On 3.3 the task waits in ``awaiting_input``; on 3.1 and 3.2 it defers to the standard provider's trigger.
Either way it holds no worker slot and nothing that bills. "Rent" resumes it: it searches again and rents an offer
whose worst case is at most the amount approved (a dearer one asks again). "Do not rent", and a timeout (whose
default answer is that), fail it having rented nothing.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import Any

from airflow_gpumarket import api
from airflow_gpumarket._compat import airflow_version
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.utils import duration_seconds

#: The answers offered; the first names the amount approved, which the resumed task reads back.
RENT, DO_NOT_RENT = "Rent, worst case up to ${amount:.4f}", "Do not rent"
_APPROVED = re.compile(r"^Rent, worst case up to \$(\d+(?:\.\d+)?)$")
#: Days of the DAG's spend the question shows.
SPEND_DAYS = 7


class ApprovalNeeded(Exception):  # noqa: N818 - not an error: the task asks before it rents
    """The next offer's worst case is above what was approved: ask before renting it."""

    def __init__(self, pick: Any) -> None:
        super().__init__(f"approval needed for offer {pick.offer.get('id')}")
        self.pick = pick


def checked(approval_above: float | None, approval_timeout: timedelta | float) -> tuple[float | None, float]:
    """``approval_above`` and ``approval_timeout`` in seconds, refused naming the one that is wrong."""
    timeout = duration_seconds("approval_timeout", approval_timeout)
    if approval_above is None:
        return None, timeout
    api.require_non_negative_number("approval_above", approval_above)
    if airflow_version() < (3, 1):
        raise GpuMarketValidationError(
            "approval_above",
            "asks a person in the Airflow UI (human-in-the-loop), which needs Airflow 3.1 or later: drop it or upgrade",
        )
    return float(approval_above), timeout


def check(op: Any, pick: Any) -> None:
    """Raise ``ApprovalNeeded`` when ``pick``'s worst case is above ``approval_above`` and above what was approved."""
    threshold = getattr(op, "approval_above", None)
    if threshold is None:
        return
    if pick.worst.amount > max(threshold, getattr(op, "_approved_up_to", None) or 0.0):
        raise ApprovalNeeded(pick)


def ask(op: Any, context: Any, pick: Any) -> None:
    """Put the question to a person in the Airflow UI and wait for the answer, holding nothing."""
    from airflow.sdk.execution_time.hitl import upsert_hitl_detail

    worst = pick.worst
    options = [RENT.format(amount=worst.amount), DO_NOT_RENT]
    subject = f"Rent a GPU for {op.dag_id}.{op.task_id}: worst case ${worst.amount:.4f}?"
    ti = context["task_instance"] if "task_instance" in context else context["ti"]
    upsert_hitl_detail(
        ti_id=ti.id, options=options, subject=subject, body=_body(op, pick), defaults=[DO_NOT_RENT], multiple=False
    )
    op.log.warning("%s Asked in the Airflow UI; waiting up to %.0f s for an answer", subject, op.approval_timeout)
    timeout = timedelta(seconds=op.approval_timeout)
    if airflow_version() >= (3, 3):
        from airflow.sdk.exceptions import TaskAwaitingInput

        raise TaskAwaitingInput(method_name="execute_after_approval", timeout=timeout)
    from airflow.providers.standard.triggers.hitl import HITLTrigger
    from airflow.sdk.timezone import utcnow

    op.defer(
        trigger=HITLTrigger(
            ti_id=ti.id,
            options=options,
            params={},
            defaults=[DO_NOT_RENT],
            multiple=False,
            timeout_datetime=utcnow() + timeout,
        ),
        method_name="execute_after_approval",
    )


def answered(op: Any, event: Any) -> None:
    """The person's answer: the amount approved (kept on ``op``), else the task's failure, nothing rented."""
    from airflow_gpumarket.operators.failures import GpuMarketApprovalRefused

    if not isinstance(event, dict) or "error" in event:
        kind = event.get("error_type") if isinstance(event, dict) else None
        why = "nobody answered in time" if kind == "timeout" else f"the request failed ({event!r})"
        raise GpuMarketApprovalRefused(f"The rental was not approved: {why}; nothing was rented.")
    chosen = event.get("chosen_options") or []
    found = _APPROVED.match(chosen[0]) if len(chosen) == 1 and isinstance(chosen[0], str) else None
    who = (
        (event.get("responded_by_user") or {}).get("name") if isinstance(event.get("responded_by_user"), dict) else None
    )
    if found is None:
        raise GpuMarketApprovalRefused(
            f"The rental was not approved: {who or 'the approver'} answered {chosen!r}; nothing was rented."
        )
    op._approved_up_to = float(found.group(1))
    op.log.info("Approved by %s: a worst case up to $%s", who or "a person", found.group(1))


def _body(op: Any, pick: Any) -> str:
    """The question's details: the offer, the worst case, the DAG's budgets and its recent spend (Markdown)."""
    offer = pick.offer
    lines = [
        f"**Offer** {offer.get('id')}: {offer.get('num_gpus')} x {offer.get('gpu_name')} at "
        f"${offer.get('dph_total')}/h on machine {offer.get('machine_id')} (reliability {offer.get('reliability')})",
        f"**Worst case** reserved in the budget: {pick.worst.describe()}",
        f"**Asked because** it is above approval_above (${op.approval_above:.4f})",
    ]
    lines += _budget_lines(op)
    return "\n\n".join(lines)


def _budget_lines(op: Any) -> list[str]:
    """The DAG's budgets with what is left, and its spend over the last ``SPEND_DAYS`` days; what cannot be read is
    said so (the question is still asked)."""
    from airflow_gpumarket import budgets, ledger
    from airflow_gpumarket.operators.budget import ledger_client

    now = time.time()
    try:
        found = [ledger.entry_of(r) for r in ledger_client(op.hook).entries(op.gpumarket_conn_id, now - 31 * 86400)]
        limits, _ = ledger.dag_budgets(op.dag_id, ledger.budgets_variable())
    except Exception as exc:  # noqa: BLE001 - a question without these lines is still worth asking
        return [f"**Budgets** could not be read ({exc})"]
    mine = [e for e in found if e.dag_id == op.dag_id]
    spent = sum(e.amount for e in mine if not e.open and e.created_at >= now - SPEND_DAYS * 86400)
    rooms = [] if limits is None else budgets.headroom(limits, found, dag_id=op.dag_id, now=now)
    shown = [f"{r.period}: ${r.left:.4f} left of ${r.limit:.4f}" for r in rooms] or ["none set"]
    return [f"**DAG budgets** {'; '.join(shown)}", f"**DAG spend, last {SPEND_DAYS} days** ${spent:.4f}"]
