"""Interruptible (bid) rentals as pure rules: the policy, its bids, and what a preemption leads to.

Used by the renting operators and the trigger alike; no Airflow and no transport imports.

A bid wins its machine while it is at least the machine's ``min_bid``: the host's floor or the highest competing
bid, whichever is higher. Both the offer (when searched) and the instance (on every read) show it. A machine taken
by a higher bid stops the instance (its disk kept, storage billing on); ``lifecycle.preempted`` tells that stop from
the job's own by the job wrapper's exit status line. What follows is ``BidPolicy.after_preemption``'s answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from enum import Enum
from typing import Any, NamedTuple

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.utils import duration_seconds

#: A bid is the machine's ``min_bid`` plus this share of it, so that the smallest rise of the winning price does
#: not outbid the instance at once; never above the cap (``max_bid``, and the offer's on-demand ``dph_total``).
BID_MARGIN = 0.05
#: ``"min"``: bid once, ``BID_MARGIN`` over the offer's ``min_bid``. ``"hold"``: also raise the bid (up to the cap)
#: whenever the machine's ``min_bid`` eats half the margin, and after a preemption bid again to win it back.
BID_STRATEGIES = ("min", "hold")


def bid_cap(max_bid: float | None, on_demand: Any) -> float | None:
    """The most a bid may be: the lower of ``max_bid`` and the on-demand price.

    A bid above the on-demand price buys nothing. None when neither is known.
    """
    caps = [float(cap) for cap in (max_bid, on_demand) if api.is_positive_number(cap)]
    return min(caps) if caps else None


def bid_for(offer: Mapping[str, Any], max_bid: float | None) -> tuple[float | None, str]:
    """(the bid for ``offer`` in $/h, "") or (None, why no bid is made on it).

    The bid is ``min_bid`` plus ``BID_MARGIN``, capped (``bid_cap``). An offer without a ``min_bid`` or a price, or
    whose minimum is above the cap, gets no bid: a bid is never made without a price."""
    min_bid: Any = offer.get("min_bid")
    if not api.is_positive_number(min_bid):
        return None, f"offer {offer.get('id')} shows no min_bid"
    cap = bid_cap(max_bid, offer.get("dph_total"))
    if cap is None:
        return None, f"offer {offer.get('id')} shows no on-demand price to cap the bid (set max_bid)"
    if min_bid > cap:
        return None, f"offer {offer.get('id')}'s min_bid ${min_bid}/h is above the cap ${cap}/h"
    return round(min(min_bid * (1 + BID_MARGIN), cap), 4), ""


def above_cap(offer: Mapping[str, Any], max_bid: float | None) -> bool:
    """Whether ``offer``'s ``min_bid`` is above the most a bid on it may be, so no bid wins it."""
    min_bid, cap = offer.get("min_bid"), bid_cap(max_bid, offer.get("dph_total"))
    return api.is_positive_number(min_bid) and cap is not None and min_bid > cap


def held_bid(bid: float, min_bid: Any, cap: float) -> float | None:
    """The bid that holds a machine whose winning price is now ``min_bid``, or None.

    It is ``BID_MARGIN`` over ``min_bid`` once less than half that margin is left (or the bid lost), never above
    ``cap``. None when no raise is due, or when no bid up to the cap wins the machine.
    """
    if not api.is_positive_number(min_bid) or min_bid > cap or bid >= min_bid * (1 + BID_MARGIN / 2):
        return None
    raised = round(min(min_bid * (1 + BID_MARGIN), cap), 4)
    return raised if raised > bid else None


ON_PREEMPTION = ("failover", "wait")
DEFAULT_MAX_OUTBID_WAIT = timedelta(minutes=10)
#: Environment variables every interruptible job gets: which run of the job this is (1 for the first) and how many
#: preemptions came before it.
ATTEMPT_ENV = "GPUMARKET_ATTEMPT"
PREEMPTIONS_ENV = "GPUMARKET_PREEMPTIONS"


def job_env(env: Any, *, preemptions: int) -> dict[str, str]:
    """The creation's ``env`` with the run's attempt number and the preemptions before it."""
    return {**(env or {}), ATTEMPT_ENV: str(preemptions + 1), PREEMPTIONS_ENV: str(preemptions)}


class Next(str, Enum):  # noqa: UP042 - StrEnum is 3.11+; Airflow 2.11 runs on 3.10
    """What a preemption leads to."""

    WAIT = "wait"  # leave the stopped instance to win its machine back
    FAILOVER = "failover"  # destroy it, rent another machine, run the job again
    ON_DEMAND = "on_demand"  # destroy it, and rent on demand from now on
    FAIL = "fail"  # destroy it, and fail the task


class BidPolicy(NamedTuple):
    """How an interruptible rental bids and what it does when preempted (checked when the DAG is parsed)."""

    max_bid: float | None = None
    max_preemptions: int = 3
    on_preemption: str = "failover"
    max_outbid_wait: float = DEFAULT_MAX_OUTBID_WAIT.total_seconds()
    fallback_on_demand: bool = False
    bid_strategy: str = "min"

    @classmethod
    def parse(
        cls,
        *,
        max_bid: Any,
        max_preemptions: Any,
        on_preemption: Any,
        max_outbid_wait: timedelta | float,
        fallback_on_demand: Any,
        bid_strategy: Any = "min",
    ) -> BidPolicy:
        if max_bid is not None:
            api.require_positive_number("max_bid", max_bid)
        api.require_non_negative_int("max_preemptions", max_preemptions)
        if on_preemption not in ON_PREEMPTION:
            raise GpuMarketValidationError(
                "on_preemption", f"must be one of {', '.join(map(repr, ON_PREEMPTION))}, got {on_preemption!r}"
            )
        api.require_bool("fallback_on_demand", fallback_on_demand)
        if bid_strategy not in BID_STRATEGIES:
            raise GpuMarketValidationError(
                "bid_strategy", f"must be one of {', '.join(map(repr, BID_STRATEGIES))}, got {bid_strategy!r}"
            )
        return cls(
            max_bid=None if max_bid is None else float(max_bid),
            max_preemptions=max_preemptions,
            on_preemption=on_preemption,
            max_outbid_wait=duration_seconds("max_outbid_wait", max_outbid_wait, zero_ok=True),
            fallback_on_demand=fallback_on_demand,
            bid_strategy=bid_strategy,
        )

    def holds(self) -> bool:
        return self.bid_strategy == "hold"

    def hold_cap(self, bid: float | None, on_demand: Any) -> float | None:
        """The most a rental bidding ``bid`` may raise it to, or None when it does not hold its bid."""
        return bid_cap(self.max_bid, on_demand) if self.holds() and bid is not None else None

    def reserved_price(self, dph_total: Any, bid: float | None) -> float | None:
        """The compute price a rental is reserved and capped at: its price, or the cap a held bid may rise to."""
        if bid is None:
            return float(dph_total) if api.is_positive_number(dph_total) else None
        cap = self.hold_cap(bid, dph_total)
        return float(bid) if cap is None else max(float(bid), cap)

    def may_wait(self, preemptions: int, *, waited: bool) -> bool:
        """Whether the stopped instance may wait to win its machine back after preemption ``preemptions``.

        ``waited``: a wait for it ran out already.
        """
        return not waited and preemptions <= self.max_preemptions and self.max_outbid_wait > 0

    def after_preemption(
        self, preemptions: int, *, waited: bool, won_back: bool, on_demand: bool, bids: bool = True
    ) -> Next:
        """What preemption number ``preemptions`` leads to; ``won_back``: a bid placed since wins the machine.

        ``bids``: the job may still bid (a ``deadline`` may say no: then it neither waits nor bids again).
        """
        if bids and self.may_wait(preemptions, waited=waited) and (self.on_preemption == "wait" or won_back):
            return Next.WAIT
        if preemptions <= self.max_preemptions:
            return Next.FAILOVER if bids else Next.ON_DEMAND
        return Next.ON_DEMAND if self.fallback_on_demand and not on_demand else Next.FAIL
