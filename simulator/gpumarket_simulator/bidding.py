"""The simulator's bid market: what other renters bid for each machine, and how that moves.

An offer's ``min_bid`` is the price that wins its machine now: the host's floor (``MIN_BID_SHARE`` of the
on-demand price) or the highest competing bid, whichever is higher. Competing bids are set by hand through the
admin surface, or move on their own once drift is on: every ``interval`` simulated seconds each machine's
competing bid takes a random multiplicative step (a log-normal one of scale ``volatility``), kept between half
the floor and the on-demand price (nobody bids more for an interruptible machine than renting it outright costs).
The steps draw from a stream of their own, seeded by the world's seed, so a run with the same requests sees the
same prices.

What a moving price does to the instances is the world's business (``World.settle_bid``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpumarket_simulator.rules import is_number

if TYPE_CHECKING:
    from gpumarket_simulator.offers import Offer

#: An offer's floor for an interruptible rental, as a share of its on-demand dph_total (the simulator's choice;
#: public reports show bid floors well below the on-demand price).
MIN_BID_SHARE = 0.4
#: Where a drifting competing bid starts, and its bounds, as multiples of the floor.
DRIFT_START, DRIFT_LOW = 1.0, 0.5


@dataclass(frozen=True)
class Drift:
    interval: float
    volatility: float
    #: The simulated time of the first step's origin: steps fall at since + k * interval.
    since: float

    def view(self) -> dict[str, float]:
        return {"interval": self.interval, "volatility": self.volatility}


def parse_drift(value: Any) -> tuple[float, float] | None:
    """Parse a bid drift: ``null`` (no drift) or ``{"interval": seconds > 0, "volatility": 0 < v <= 2}``.

    Raises ValueError naming the field otherwise.
    """
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"interval", "volatility"}:
        raise ValueError('drift must be null or {"interval": seconds, "volatility": number}')
    interval: Any = value.get("interval")
    volatility: Any = value.get("volatility")
    if not is_number(interval) or interval <= 0:
        raise ValueError(f"drift.interval must be a number of simulated seconds > 0, got {interval!r}")
    if not is_number(volatility) or not 0 < volatility <= 2:
        raise ValueError(f"drift.volatility must be a number above 0 and at most 2, got {volatility!r}")
    return float(interval), float(volatility)


class BidMarket:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.drift: Drift | None = None
        self._rng = random.Random(f"gpumarket-bids-{seed}")

    def set_drift(self, drift: tuple[float, float] | None, now: float) -> None:
        self.drift = None if drift is None else Drift(drift[0], drift[1], now)

    def steps_due(self, since: float, until: float) -> list[float]:
        """The drift's step times in (since, until]."""
        d = self.drift
        if d is None or until <= since:
            return []
        first = math.floor((since - d.since) / d.interval) + 1
        last = math.floor((until - d.since) / d.interval)
        return [d.since + k * d.interval for k in range(max(first, 1), last + 1)]

    def step(self, offers: Iterable[Offer]) -> None:
        """One drift step: every machine's competing bid moves."""
        assert self.drift is not None
        for offer in sorted(offers, key=lambda o: o.id):
            # The competing bid as a multiple of the machine's floor: where it is now, or where drift starts.
            level = DRIFT_START if offer.competing_bid is None else offer.competing_bid / offer.floor_bid
            level *= math.exp(self._rng.gauss(0.0, self.drift.volatility))
            offer.competing_bid = round(offer.floor_bid * min(max(level, DRIFT_LOW), 1.0 / MIN_BID_SHARE), 4)
