"""Offer watching as pure rules: what a watcher searches, which offers match it, and when it fires.

A watcher fires when offers matching it *appear*: the first search that finds one after searches that found none
(or after the watcher started). It fires once per appearance, however many searches see the offers still there,
and again only after they have all gone and one came back. A search that failed is no news: it neither ends an
appearance nor starts one. Imported when a DAG file is parsed: standard library and the provider's rules only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_gpumarket import api

#: Offers one search asks for, cheapest first: the watcher's matches are among them.
SEARCH_LIMIT = 100


@dataclass(frozen=True)
class OfferWatch:
    """What one watcher looks for: the search's own filters, plus caps the service cannot filter on for it."""

    filters: Mapping[str, Any] = field(default_factory=dict)
    offer_type: str = "ondemand"
    max_dph: float | None = None
    min_reliability: float | None = None
    verified: bool | None = None
    min_direct_ports: int | None = None
    #: Offer fields newer than this provider that ``filters`` may name (as the renting operators take them).
    extra_filter_fields: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Names a bad field, operator or value, as the renting operators do.
        api.build_search_body(
            self.filters, offer_type=self.offer_type, extra_fields=self.extra_filter_fields, argument="offer_filters"
        )
        if self.min_reliability is not None:
            api.require_non_negative_number("min_reliability", self.min_reliability)
        if self.verified is not None:
            api.require_bool("verified", self.verified)
        if self.min_direct_ports is not None:
            api.require_non_negative_int("min_direct_ports", self.min_direct_ports)
        if self.max_dph is not None:
            api.require_positive_number("max_dph", self.max_dph)

    def search_filters(self) -> dict[str, Any]:
        """The filters sent: the user's, and the reliability, verification and port minimums as filter fields."""
        found = dict(self.filters)
        if self.min_reliability is not None:
            found["reliability"] = {"gte": self.min_reliability}
        if self.verified is not None:
            found["verified"] = {"eq": self.verified}
        if self.min_direct_ports is not None:
            found["direct_port_count"] = {"gte": self.min_direct_ports}
        return found

    def key(self) -> str:
        """What watchers that may share one search have in common (the search itself), as text."""
        return json.dumps({"filters": self.search_filters(), "type": self.offer_type}, sort_keys=True, default=str)

    def price_of(self, offer: Mapping[str, Any]) -> float | None:
        """What renting ``offer`` costs per hour for this watcher: its bid floor for bids, else its price."""
        price = offer.get("min_bid") if self.offer_type == "bid" else offer.get("dph_total")
        return float(price) if api.is_positive_number(price) else None

    def matching(self, offers: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The offers this watcher wants, cheapest first (the service's answer checked again here)."""
        wanted = []
        for offer in offers:
            price = self.price_of(offer)
            if price is None or (self.max_dph is not None and price > self.max_dph):
                continue
            if offer.get("rentable") is False or api.filter_mismatch(offer, self.search_filters()) is not None:
                continue
            wanted.append(offer)
        return sorted(wanted, key=lambda o: self.price_of(o) or 0.0)


@dataclass
class Appearances:
    """One watcher's view of the market over its searches: whether matching offers are there now."""

    present: bool = False

    def observe(self, watch: OfferWatch, offers: list[Mapping[str, Any]] | None, at: float) -> dict[str, Any] | None:
        """The event of an appearance, when this search's ``offers`` start one; None otherwise (``None``: the
        search failed)."""
        if offers is None:
            return None
        matches = watch.matching(offers)
        if not matches:
            self.present = False
            return None
        if self.present:
            return None
        self.present = True
        best = matches[0]
        return {
            "offer_id": best.get("id"),
            "price": watch.price_of(best),
            "offer_type": watch.offer_type,
            "machine_id": best.get("machine_id"),
            "gpu_name": best.get("gpu_name"),
            "num_gpus": best.get("num_gpus"),
            "reliability": best.get("reliability"),
            "matches": len(matches),
            "seen_at": at,
        }
