"""The market over simulated time: offers that come and go, prices that follow the day's demand, seeded.

A swing is stateless: whether an offer is listed and what it costs are functions of the seed, the offer and the
time, so the same seed gives the same market whatever was asked of the simulator, and its clock may jump.

- Time is cut into slots (``slot`` seconds, an hour by default). In each slot an offer is listed with probability
  ``listed`` (times one minus ``amplitude`` half the demand swing: busy hours list fewer), drawn from a hash of
  (seed, offer, slot). An *appearance* is a run of listed slots.
- Demand follows the day, highest at ``peak_hour`` UTC: a price is its base times ``1 + amplitude * d``, ``d`` going
  from -1 (the quietest hour) to +1 (the peak). Bids follow, their floor being a share of the price.
- An offer an instance of ours rents keeps its listing and price until that instance is destroyed: a contract's
  price does not move. One taken by someone else (``vanish``) stays taken.

No public figure gives the marketplace's availability or its daily swing; the presets are assumptions, named as
such where a figure uses them (``PRESETS``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpumarket_simulator.offers import Offer

if TYPE_CHECKING:
    from gpumarket_simulator.world import World

#: Named settings: (listed, amplitude). Calm: most offers listed, prices within 10 %; typical: half listed, 25 %;
#: tight: a fifth listed, 40 % (a launch week's scramble for one GPU model).
PRESETS = {"calm": (0.8, 0.1), "typical": (0.5, 0.25), "tight": (0.2, 0.4)}
FIELDS = frozenset({"preset", "listed", "amplitude", "slot", "peak_hour", "offers"})


@dataclass
class Swing:
    seed: int
    listed: float = 0.5
    amplitude: float = 0.25
    slot: float = 3600.0
    peak_hour: float = 14.0
    #: The offers that swing, with their price and listing before any swing (restored when swings stop).
    origin: dict[int, tuple[float, bool]] = field(default_factory=dict)

    def demand(self, at: float) -> float:
        """The day's demand at ``at`` (epoch seconds): +1 at the peak hour, -1 twelve hours from it."""
        hour = (at % 86400) / 3600
        return math.cos(2 * math.pi * (hour - self.peak_hour) / 24)

    def is_listed(self, offer_id: int, at: float) -> bool:
        slot = math.floor(at / self.slot)
        digest = hashlib.sha256(f"{self.seed}:{offer_id}:{slot}".encode()).digest()
        draw = int.from_bytes(digest[:8], "big") / 2**64
        chance = self.listed * (1 - self.amplitude * (self.demand(slot * self.slot) + 1) / 2)
        return draw < chance

    def price(self, offer_id: int, at: float) -> float:
        return round(self.origin[offer_id][0] * (1 + self.amplitude * self.demand(at)), 4)

    def apply(self, offers: Iterable[Offer], at: float) -> None:
        """Each swinging offer's listing and price at ``at``; one of ours rents, or another renter took, stays."""
        for offer in offers:
            if offer.id not in self.origin or offer.rented_by is not None:
                continue
            offer.listed = self.is_listed(offer.id, at)
            offer.dph_total = self.price(offer.id, at)

    def view(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "listed": self.listed,
            "amplitude": self.amplitude,
            "slot": self.slot,
            "peak_hour": self.peak_hour,
            "offers": sorted(self.origin),
        }


def set_swing(world: World, value: Any, now: float) -> dict[str, Any] | None:
    """Offers come and go and prices follow demand from ``now`` on (``value``: see ``parse``); what is in force."""
    swing = parse(value, world.seed, world.offers, world.swing)
    if swing is None:
        restore(world.swing, world.offers)
    world.swing = swing
    if swing is None:
        return None
    swing.apply(world.offers.values(), now)
    return swing.view()


def restore(swing: Swing | None, offers: dict[int, Offer]) -> None:
    """Swings stop: each offer not rented now gets its price and listing from before them back."""
    for offer_id, (price, listed) in (swing.origin if swing else {}).items():
        offer = offers[offer_id]
        if offer.rented_by is None:
            offer.dph_total, offer.listed = price, listed


def parse(value: Any, seed: int, offers: dict[int, Offer], before: Swing | None = None) -> Swing | None:
    """A swing from its JSON (``null``: none); ValueError naming the field that is wrong.

    ``before``: the swing in force, whose record of each offer's price before any swing is kept.
    """
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - FIELDS:
        raise ValueError(f"swing must be null or an object with some of {sorted(FIELDS)}")
    preset = value.get("preset", "typical")
    if preset not in PRESETS:
        raise ValueError(f"swing.preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    listed, amplitude = PRESETS[preset]
    listed = _number(value, "listed", listed, 0.0, 1.0)
    amplitude = _number(value, "amplitude", amplitude, 0.0, 0.9)
    slot = _number(value, "slot", 3600.0, 1.0, 86400.0 * 7)
    peak_hour = _number(value, "peak_hour", 14.0, 0.0, 24.0)
    ids = value.get("offers")
    if ids is None:
        ids = [o.id for o in offers.values() if o.rented_by is None]
    if not isinstance(ids, list) or any(not isinstance(i, int) or isinstance(i, bool) or i not in offers for i in ids):
        raise ValueError("swing.offers must be a list of the ids of existing offers")
    kept = before.origin if before else {}
    origin = {i: kept.get(i, (offers[i].dph_total, offers[i].listed)) for i in ids}
    return Swing(seed, listed, amplitude, slot, peak_hour, origin)


def _number(value: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    found = value.get(name, default)
    if isinstance(found, bool) or not isinstance(found, int | float) or not low <= found <= high:
        raise ValueError(f"swing.{name} must be a number from {low:g} to {high:g}, got {found!r}")
    return float(found)
