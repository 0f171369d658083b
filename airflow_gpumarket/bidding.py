"""The bids of interruptible rentals as pure functions: the first bid on an offer, and the raised bid that keeps a
machine (or wins it back) under ``bid_strategy="hold"``. Used by the renting operators and the trigger alike; no
Airflow and no transport imports.

A bid wins its machine while it is at least the machine's ``min_bid``: the host's floor or the highest competing
bid, whichever is higher. Both the offer (when searched) and the instance (on every read) show it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_gpumarket import api

#: A bid is the machine's ``min_bid`` plus this share of it, so that the smallest rise of the winning price does
#: not outbid the instance at once; never above the cap (``max_bid``, and the offer's on-demand ``dph_total``).
BID_MARGIN = 0.05
#: ``"min"``: bid once, ``BID_MARGIN`` over the offer's ``min_bid``. ``"hold"``: also raise the bid (up to the cap)
#: whenever the machine's ``min_bid`` eats half the margin, and after a preemption bid again to win it back.
BID_STRATEGIES = ("min", "hold")


def bid_cap(max_bid: float | None, on_demand: Any) -> float | None:
    """The most a bid may be: ``max_bid`` and the on-demand price, whichever is lower (a bid above the on-demand
    price buys nothing); None when neither is known."""
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


def held_bid(bid: float, min_bid: Any, cap: float) -> float | None:
    """The bid that holds a machine whose winning price is now ``min_bid``: ``BID_MARGIN`` over it once less than
    half that margin is left (or the bid lost), never above ``cap``. None when no raise is due, or when no bid up
    to the cap wins the machine."""
    if not api.is_positive_number(min_bid) or min_bid > cap or bid >= min_bid * (1 + BID_MARGIN / 2):
        return None
    raised = round(min(min_bid * (1 + BID_MARGIN), cap), 4)
    return raised if raised > bid else None
