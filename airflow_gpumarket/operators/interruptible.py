"""Interruptible (bid) rentals: the policy a renting operator is given, the bid it makes for an offer, and what a
preemption leads to.

A bid instance rents a machine below its on-demand price until a higher bid takes the machine: the market stops it
(its processes killed, its disk kept; storage bills on). How the provider tells that stop from the job's own is
``lifecycle.preempted``: the job wrapper prints its exit status line before it stops its instance, so a bid
instance stopped with a log read to its end and no such line was stopped by the market.

After a preemption (``on_preemption``):

- ``"failover"`` (default): the preempted instance is destroyed (the destroy answered, or the task fails), then
  another offer is searched (never on a machine a preemption took) and rented under the same label key, so two
  are never alive at once. The job runs again from the start with ``GPUMARKET_ATTEMPT`` (1, 2, ...) and
  ``GPUMARKET_PREEMPTIONS`` in its environment; resuming from a checkpoint is the job's business.
- ``"wait"``: the stopped instance is left for ``max_outbid_wait`` to win its machine back (the market restarts it
  and its onstart script runs again, on the same disk, with the same environment); after that, failover.

After ``max_preemptions`` the task fails with a sentence saying so, or rents on demand from then on with
``fallback_on_demand=True``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.utils import duration_seconds

#: The bid is the offer's ``min_bid`` plus this share of it, so that the smallest rise of the winning price does
#: not outbid the instance at once; never above the cap (``max_bid``, and the offer's on-demand ``dph_total``).
BID_MARGIN = 0.05
ON_PREEMPTION = ("failover", "wait")
DEFAULT_MAX_OUTBID_WAIT = timedelta(minutes=10)
#: Environment variables every interruptible job gets: which run of the job this is (1 for the first) and how many
#: preemptions came before it.
ATTEMPT_ENV = "GPUMARKET_ATTEMPT"
PREEMPTIONS_ENV = "GPUMARKET_PREEMPTIONS"


@dataclass(frozen=True)
class BidPolicy:
    """How an interruptible rental bids and what it does when preempted (checked when the DAG is parsed)."""

    max_bid: float | None = None
    max_preemptions: int = 3
    on_preemption: str = "failover"
    max_outbid_wait: float = DEFAULT_MAX_OUTBID_WAIT.total_seconds()
    fallback_on_demand: bool = False

    @classmethod
    def parse(
        cls,
        *,
        max_bid: Any,
        max_preemptions: Any,
        on_preemption: Any,
        max_outbid_wait: timedelta | float,
        fallback_on_demand: Any,
    ) -> BidPolicy:
        if max_bid is not None:
            api.require_positive_number("max_bid", max_bid)
        api.require_non_negative_int("max_preemptions", max_preemptions)
        if on_preemption not in ON_PREEMPTION:
            raise GpuMarketValidationError(
                "on_preemption", f"must be one of {', '.join(map(repr, ON_PREEMPTION))}, got {on_preemption!r}"
            )
        api.require_bool("fallback_on_demand", fallback_on_demand)
        return cls(
            max_bid=None if max_bid is None else float(max_bid),
            max_preemptions=max_preemptions,
            on_preemption=on_preemption,
            max_outbid_wait=duration_seconds("max_outbid_wait", max_outbid_wait, zero_ok=True),
            fallback_on_demand=fallback_on_demand,
        )


def bid_for(offer: Mapping[str, Any], max_bid: float | None) -> tuple[float | None, str]:
    """(the bid for ``offer`` in $/h, "") or (None, why no bid is made on it).

    The bid is ``min_bid`` plus ``BID_MARGIN``, capped by ``max_bid`` and by the offer's on-demand ``dph_total``
    (a bid above the on-demand price buys nothing). An offer without a ``min_bid`` or a price, or whose minimum is
    above the cap, gets no bid: a bid is never made without a price."""
    min_bid: Any = offer.get("min_bid")
    on_demand = offer.get("dph_total")
    if not _is_price(min_bid):
        return None, f"offer {offer.get('id')} shows no min_bid"
    caps: list[float] = [cap for cap in (max_bid, on_demand) if _is_price(cap)]  # type: ignore[misc]
    if not caps:
        return None, f"offer {offer.get('id')} shows no on-demand price to cap the bid (set max_bid)"
    cap = min(caps)
    if min_bid > cap:
        return None, f"offer {offer.get('id')}'s min_bid ${min_bid}/h is above the cap ${cap}/h"
    return round(min(min_bid * (1 + BID_MARGIN), cap), 4), ""


def job_env(env: Any, *, preemptions: int) -> dict[str, str]:
    """The creation's ``env`` with the run's attempt number and the preemptions before it."""
    return {**(env or {}), ATTEMPT_ENV: str(preemptions + 1), PREEMPTIONS_ENV: str(preemptions)}


def _is_price(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0
