"""The live service's rate limits (live profile): a token bucket per operation and per identity, no burst.

Published by the service: the instance list 0.5 requests/s, a change of an instance (PUT) 1/s, destroy 0.33/s;
public reports give create one per 4.5 s. The others are the simulator's own generous, finite choices. A bucket
holds one token (no burst) and refills on the simulated clock: at ``--speed 1`` these are the live rates, at
higher speeds they scale with time like everything else, and with a frozen clock only ``advance`` refills them.
A rejected request costs a penalty token, as the live service's buckets do: a client that keeps hammering
waits longer. The answer is the live service's plain-text 429, without Retry-After.
"""

from __future__ import annotations

import collections
import threading

RATES_PER_SECOND: dict[str, float] = {
    "list_instances": 0.5,
    "list_instances_v1": 0.5,
    "stop_instance": 1.0,
    "destroy_instance": 1 / 3,
    "create_instance": 1 / 4.5,
    "get_instance": 2.0,
    "search_offers": 1.0,
}
#: Everything not named above.
DEFAULT_RATE_PER_SECOND = 2.0
#: Tokens a rejected request takes on top (the bucket goes below zero).
PENALTY_TOKENS = 1.0
CAPACITY = 1.0
TOO_FREQUENT = "API requests too frequent"


class RateLimits:
    """Buckets keyed by (operation, method, API key, client address); thread-safe."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str, str, str], tuple[float, float]] = {}
        self._refused: collections.Counter[str] = collections.Counter()

    def clear(self) -> None:
        """Full buckets and no refusals counted."""
        with self._lock:
            self._buckets.clear()
            self._refused.clear()

    def refused(self) -> dict[str, int]:
        """How many requests were answered 429 since the last ``clear``, per operation.

        A fleet test counts these; the request log keeps only its last entries.
        """
        with self._lock:
            return dict(self._refused)

    def take(self, op: str, method: str, key: str, client: str, now: float) -> bool:
        """Take a token at simulated time ``now``; False when the request must be refused."""
        if not self.enabled:
            return True
        rate = RATES_PER_SECOND.get(op, DEFAULT_RATE_PER_SECOND)
        ident = (op, method, key, client)
        with self._lock:
            tokens, last = self._buckets.get(ident, (CAPACITY, now))
            tokens = min(CAPACITY, tokens + max(0.0, now - last) * rate)
            if tokens >= 1.0:
                self._buckets[ident] = (tokens - 1.0, now)
                return True
            self._buckets[ident] = (max(tokens - PENALTY_TOKENS, -PENALTY_TOKENS), now)
            self._refused[op] += 1
            return False
