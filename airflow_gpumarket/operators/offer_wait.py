"""A renting task's wait for an offer: its arguments' rules, and what the task does when a search finds nothing.

With ``wait_for_offer``, a try whose first search finds nothing it can rent defers until an offer it has not seen
appears (``GpuMarketOfferWaitTrigger``), then searches again through the usual offer choice, host memory and budget;
the wait counts from the try's start. When it ends with nothing rented, ``on_no_offer`` says what follows: ``"fail"``
(the default), or ``"rent_on_demand"``: the try rents on demand, never as a bid, up to ``fallback_max_dph``.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.utils import duration_seconds, try_started

ON_NO_OFFER = ("fail", "rent_on_demand")


def checked(
    wait_for_offer: timedelta | float | None,
    on_no_offer: str,
    fallback_max_dph: float | None,
    *,
    deferrable: bool,
    offer_id: Any,
) -> float | None:
    """``wait_for_offer`` in seconds (None: no wait), once the three arguments agree; refused naming the one wrong."""
    api.require_choice("on_no_offer", on_no_offer, ON_NO_OFFER)
    if (on_no_offer == "rent_on_demand") != (fallback_max_dph is not None):
        raise GpuMarketValidationError(
            "fallback_max_dph",
            "is the cap of the on-demand rental that on_no_offer='rent_on_demand' makes: give both or neither",
        )
    if fallback_max_dph is not None:
        api.require_positive_number("fallback_max_dph", fallback_max_dph)
    if wait_for_offer is None:
        if on_no_offer != "fail":
            raise GpuMarketValidationError("on_no_offer", "says what follows a wait_for_offer: give one")
        return None
    seconds = duration_seconds("wait_for_offer", wait_for_offer)
    if not deferrable:
        raise GpuMarketValidationError(
            "wait_for_offer", "waits in the triggerer, holding no worker: set deferrable=True"
        )
    if offer_id is not None:
        raise GpuMarketValidationError("wait_for_offer", "waits for offers matching offer_filters: drop offer_id")
    return seconds


def after_no_offer(op: Any, context: Any, exc: Any) -> None:
    """A search found nothing ``op`` could rent (``exc``, a ``GpuMarketNoWorkingOffer``): defer until an offer appears,
    or, the wait over, fail or turn the try to on-demand renting up to ``fallback_max_dph`` (then rent again)."""
    from airflow_gpumarket.operators.failures import GpuMarketNoWorkingOffer
    from airflow_gpumarket.operators.session import RentalSession
    from airflow_gpumarket.triggers.offer_wait import GpuMarketOfferWaitTrigger

    if op.wait_for_offer is None or exc.unmatched is None or op._fell_back:
        raise exc
    deadline = try_started(context, op._started_at or time.time()) + op.wait_for_offer
    left = deadline - time.time()
    if left > 0:
        op.log.info("No offer to rent yet: waiting up to %.0f s more for one, in the triggerer", left)
        limit = op._execution_deadline(context)  # execution_timeout ends the wait too: nothing is held
        op.defer(
            trigger=GpuMarketOfferWaitTrigger(
                **exc.unmatched,
                deadline=deadline,
                gpumarket_conn_id=op.gpumarket_conn_id,
                poll_interval=op.poll_interval,
            ),
            method_name="execute_after_wait",
            timeout=None if limit is None else timedelta(seconds=max(0.0, limit - time.time())),
        )
    waited = timedelta(seconds=round(op.wait_for_offer))
    if op.on_no_offer == "fail":
        raise GpuMarketNoWorkingOffer(f"No offer it could rent appeared within wait_for_offer ({waited}). {exc}")
    op.log.warning(
        "No offer it could rent appeared within wait_for_offer (%s): renting on demand up to $%s/h "
        "(on_no_offer='rent_on_demand')",
        waited,
        op.fallback_max_dph,
    )
    op.spec = op.spec._replace(offer_type="ondemand", interruptible=False, max_dph=op.fallback_max_dph)
    op.session = RentalSession(op.hook, op.log, op.spec, context, task=op)
    op._fell_back = True
