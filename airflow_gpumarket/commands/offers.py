"""``airflow gpumarket offers``: what a filter, or a DAG's renting task, would rent now, at what worst case.

The offers are searched and ordered as the renting task searches them (``operators.chooser``: the same search, the
offers that contradict a filter left out, ``max_dph`` and bids applied), and each one's worst case is the amount its
rental would reserve. With ``--dag``, the DAG's budgets in the ledger say whether that reservation would be allowed.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

from airflow_gpumarket import budgets, lifecycle
from airflow_gpumarket.commands.common import EXIT_BAD_INPUT, EXIT_OK, CommandError, command, hook, table
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.utils import is_templated


def _filters(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CommandError(
            f"--filters is not valid JSON ({exc}). Fix: quote it whole, e.g. "
            f'--filters \'{{"num_gpus": {{"gte": 1}}}}\'.',
            EXIT_BAD_INPUT,
        ) from None


def _task(dag_id: str, task_id: str) -> Any:
    """The renting task ``task_id`` of DAG ``dag_id``, from the DAGs folder."""
    from airflow import settings

    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 2.11 and 3.0
        from airflow.models.dagbag import DagBag  # type: ignore[no-redef]

    dag = DagBag(dag_folder=settings.DAGS_FOLDER).get_dag(dag_id)
    if dag is None:
        raise CommandError(f"DAG {dag_id!r} is not in the DAGs folder ({settings.DAGS_FOLDER}).", EXIT_BAD_INPUT)
    if not dag.has_task(task_id):
        raise CommandError(f"DAG {dag_id!r} has no task {task_id!r}.", EXIT_BAD_INPUT)
    task = dag.get_task(task_id)
    if not getattr(task, "rents_instances", False):
        raise CommandError(f"task {task_id!r} of DAG {dag_id!r} does not rent instances.", EXIT_BAD_INPUT)
    return task


def spec_of(args: Any) -> Any:
    """The renting arguments the offers are judged by: the named task's, or a job's with ``--filters``."""
    from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator
    from airflow_gpumarket.operators.spec import RentalSpec

    filters = _filters(args.filters)
    try:
        if args.dag is not None:
            task = _task(args.dag, args.task)
            changes: dict[str, Any] = {} if filters is None else {"offer_filters": filters}
            deadline = getattr(task, "deadline", None)
            if callable(deadline) or is_templated(deadline):
                changes["deadline"] = None
                print("note: deadline is known only when the task runs: offers are judged as if it had not passed")
            return RentalSpec.of(task, **changes)
        runtime = {} if args.max_runtime is None else {"max_runtime": timedelta(minutes=args.max_runtime)}
        job = GpuMarketRunJobOperator(task_id="offers", offer_filters=filters, image="-", command="true", **runtime)
        return RentalSpec.of(job)
    except GpuMarketValidationError as exc:
        hint = " (a templated argument is rendered only when the task runs: give --filters)" if args.dag else ""
        raise CommandError(f"{exc}{hint}", EXIT_BAD_INPUT) from None


@command
def offers(args: Any) -> int:
    """Print the matching offers in the order the task would try them, with their worst case and the budget's say."""
    from airflow_gpumarket.commands.budgets import entries
    from airflow_gpumarket.operators import chooser

    if (args.dag is None) != (args.task is None):
        raise CommandError("give --dag and --task together (a renting task), or --filters alone.", EXIT_BAD_INPUT)
    if args.dag is None and args.filters is None:
        raise CommandError(
            "give --filters JSON, or --dag and --task to use a renting task's arguments.", EXIT_BAD_INPUT
        )
    if args.limit < 1:
        raise CommandError(f"--limit must be at least 1, got {args.limit}.", EXIT_BAD_INPUT)
    spec = spec_of(args)
    reader = hook(args.conn_id)
    attempts = lifecycle.Attempts()
    search = chooser.search_for(spec, attempts)
    assert search is not None  # no offer was tried yet
    search["limit"] = max(search["limit"], args.limit + chooser.SEARCH_MARGIN)
    listed = reader.search_offers(search.pop("filters"), **search)
    found, lines, _ = chooser.ordered(listed, spec, attempts, avoided={}, model=None)
    limits, totals = None, {}
    if args.dag is not None:
        from airflow_gpumarket.commands.budgets import dag_limits

        limits = dag_limits({args.dag})[args.dag]
        totals = budgets.used(entries([args.conn_id]), dag_id=args.dag, run_id="", now=time.time())
    rows, refused = [], None
    for offer in found[: args.limit]:
        price, bid, said = chooser.offer_terms(offer, spec, attempts)
        if price is None:
            rows.append(_row(offer, None, None, said or "not rented: above max_dph"))
            continue
        worst = chooser.worst_case(spec, offer, bid)
        why = None if args.dag is None else budgets.refusal(limits, totals, worst.amount, dag_id=args.dag)
        refused = refused or why
        verdict = "-" if args.dag is None else ("refused" if why else "allowed")
        rows.append(_row(offer, price if bid is None else f"{bid} (bid)", worst.amount, verdict))
    for line in lines:
        print(f"note: {line}")
    if not rows:
        print("No offer matches now.")
        return EXIT_OK
    print(table(("OFFER", "GPUS", "$/H", "RELIABILITY", "MACHINE", "WORST CASE", "BUDGET"), rows))
    print(
        f"\nWORST CASE: what renting the offer reserves in the budget ledger (its price and disk over "
        f"{spec.lease_seconds / 3600:.1f} h{', capped by max_cost' if spec.max_cost else ''})."
    )
    if refused:
        print(f"The first refusal: {refused}")
    return EXIT_OK


def _row(offer: Any, price: Any, worst: float | None, verdict: str) -> tuple:
    gpus = f"{offer.get('num_gpus', '?')} x {offer.get('gpu_name', '?')}"
    reliability = offer.get("reliability2", offer.get("reliability"))
    shown = f"{reliability:.3f}" if isinstance(reliability, float) else reliability
    return (
        offer.get("id"),
        gpus,
        price,
        shown,
        offer.get("machine_id"),
        None if worst is None else f"${worst:.4f}",
        verdict,
    )
