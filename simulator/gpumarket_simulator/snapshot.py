"""The simulated market's state as the admin surface dumps it (``GET /_sim/state``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpumarket_simulator.hosts import profile_view

if TYPE_CHECKING:
    from gpumarket_simulator.world import World


def world_state(world: World, now: float) -> dict[str, Any]:
    """The whole market as ``GET /_sim/state`` shows it (a valid world file, but for its state-only keys)."""
    return {
        "now": now,
        "seed": world.seed,
        "start_time": world.start_time,
        "user_id": world.user_id,
        "disk_price_per_gb_month": world.disk_price_per_gb_month,
        "list_limit": world.list_limit,
        "account": world.account.view(),
        "machines": [m.view() for m in world.machines.values()],
        "offers": [
            {
                **world.offer_view(o),
                "fate": o.fate,
                "rented_by": o.rented_by,
                "competing_bid": o.competing_bid,
                "gpu_check": o.gpu_check,
            }
            for o in world.offers.values()
        ],
        "bid_drift": None if world.bids.drift is None else world.bids.drift.view(),
        "market": profile_view(world.profile),
        "templates": [dict(t) for t in world.templates.values()],
        "instances": [i.admin_view() for i in world.instances.values()],
        "volume_asks": world.volume_listings.view(),
        **world.serverless.view(),
        "pending_price_increases": [dict(p) for p in world.price_increases.records],
        "api_keys": [dict(k) for k in world.api_keys],
        "cloud_integrations": [dict(c) for c in world.cloud_integrations],
        "tfa": world.two_factor.view(now),
    }
