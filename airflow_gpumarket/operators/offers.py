"""Offer choice as pure functions: the search for the next offer, the one to rent from its answer, its worst case.

Nothing here sends a request: ``RentalSession.rent`` runs the search and creates on the offer chosen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import api, bidding, budgets

if TYPE_CHECKING:
    from airflow_gpumarket.lifecycle import Attempts
    from airflow_gpumarket.offer_cost import CostModel
    from airflow_gpumarket.operators.spec import RentalSpec

#: Offers a search asks for beyond those tried and the machines lost, so that an untried one is among them.
SEARCH_MARGIN = 10
#: Offers an expected-cost choice ranks (the cheapest per hour of the search): a faster or steadier host among them
#: may be the cheaper way to finish.
RANKED_OFFERS = 50


def search_for(spec: RentalSpec, attempts: Attempts, avoided: int = 0) -> dict[str, Any] | None:
    """The search (``hook.search_offers``' arguments) that finds the next offer; None when the pinned one was tried.

    A pinned offer is searched for by its id too: its price must be known before its worst case is reserved.
    ``avoided``: how many machines host memory skips, so that the search reaches past them.
    """
    pinned = spec.pinned_offer()
    if pinned in attempts.tried:
        return None
    margin = RANKED_OFFERS if spec.offer_choice == "expected_cost" else SEARCH_MARGIN
    return {
        "filters": spec.offer_filters if pinned is None else {"id": {"eq": pinned}},
        "offer_type": "bid" if bids(spec, attempts) else spec.offer_type,
        "order": spec.offer_order or [["dph_total", "asc"]],
        "limit": len(attempts.tried) + len(attempts.lost_machines) + avoided + margin,
    }


def ordered(
    offers: Sequence[Mapping[str, Any]],
    spec: RentalSpec,
    attempts: Attempts,
    *,
    avoided: Mapping[int, Any],
    model: CostModel | None,
) -> tuple[list[Mapping[str, Any]], list[str], int]:
    """The offers in the order they are tried, the task log's lines on the choice, and how many host memory skipped.

    Offers on machines in host memory (``avoided``) are left out. With a ``model`` (``offer_choice="expected_cost"``)
    the offers that have ``terms`` are ranked by their expected cost (``offer_cost``), at the price they would be
    rented at; else the search's order stands.
    """
    kept = [offer for offer in offers if offer.get("machine_id") is None or offer.get("machine_id") not in avoided]
    skipped = len(offers) - len(kept)
    lines: list[str] = []
    if model is not None:
        from airflow_gpumarket import offer_cost

        priced = {}
        for offer in kept:
            price = terms(offer, spec, attempts)[0]
            if price is not None:
                priced[offer.get("id")] = (offer, {**offer, "dph_total": price})
        ranked = offer_cost.rank_offers([pair[1] for pair in priced.values()], model)
        if ranked:
            lines = offer_cost.choice_log(ranked)
        kept = [priced[cost.offer_id][0] for cost in ranked]
    if skipped:
        lines.append(
            f"{skipped} matching offer(s) skipped: their machines failed a rental of this account recently (host "
            "memory: `airflow gpumarket hosts` lists them, `--clear ID` forgets one)"
        )
    return kept, lines, skipped


def bids(spec: RentalSpec, attempts: Attempts) -> bool:
    """Whether the next rental bids (interruptible, and not fallen back to on demand)."""
    return spec.interruptible and not attempts.on_demand


def next_offer(
    offers: Sequence[Mapping[str, Any]], spec: RentalSpec, attempts: Attempts
) -> tuple[Mapping[str, Any] | None, float | None, str]:
    """The offer to rent among ``offers`` (a search's answer) and its bid (None on demand); or no offer, and why.

    The first whose ``terms`` give a price.
    """
    skipped = ""
    for offer in offers:
        price, bid, said = terms(offer, spec, attempts)
        if said is not None:
            skipped = said
        if price is not None:
            return offer, bid, ""
    pinned = spec.pinned_offer()
    if pinned is not None and not skipped and all(offer.get("id") != pinned for offer in offers):
        kind = "bid" if bids(spec, attempts) else spec.offer_type
        why = f"offer_id {pinned} is not found by a search for it ({kind}): it is taken or no longer listed"
        return None, None, why + ", and its price cannot be known before renting"
    return None, None, "no further matching offer" + (f" (the last one refused: {skipped})" if skipped else "")


def terms(
    offer: Mapping[str, Any], spec: RentalSpec, attempts: Attempts
) -> tuple[float | None, float | None, str | None]:
    """The price and bid (None on demand) ``offer`` would be rented at, or a None price; and what its bid or its
    refusal said (None: nothing).

    Never an offer tried already, one on a machine a preemption took, one without a price, or one above ``max_dph``.
    """
    if offer.get("id") in attempts.tried or offer.get("rentable") is False:
        return None, None, None
    if offer.get("machine_id") is not None and offer.get("machine_id") in attempts.lost_machines:
        return None, None, None  # a preemption took this machine: never again
    if not api.is_positive_number(offer.get("dph_total")):
        return None, None, f"offer {offer.get('id')} shows no price (dph_total), so its worst case cannot be reserved"
    bid, said = None, None
    if bids(spec, attempts):
        bid, said = bidding.bid_for(offer, spec.bidding.max_bid)
        if bid is None:
            return None, None, said
    price = bid if bid is not None else offer["dph_total"]
    if spec.max_dph is not None and price > spec.max_dph:
        return None, None, said
    return price, bid, said


def gpu_count(offer: Mapping[str, Any]) -> int:
    """The GPUs the offer promises, which the job wrapper's preflight looks for (0: none checked)."""
    count = offer.get("num_gpus")
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0


def worst_case(spec: RentalSpec, offer: Mapping[str, Any], bid: float | None) -> budgets.WorstCase:
    """The most a rental of ``offer`` may cost: its price over its lease, disk included, capped by max_cost."""
    return budgets.worst_case(
        hourly_price=spec.reserved_price(offer.get("dph_total"), bid) or 0.0,
        seconds=spec.lease_seconds(),
        disk_gb=spec.disk_gb(),
        storage_price_per_gb_month=offer.get("storage_cost"),
        max_cost=spec.max_cost,
        overshoot_seconds=spec.poll_interval,
    )
