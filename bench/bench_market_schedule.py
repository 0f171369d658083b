"""P15: a nightly job scheduled by the market (an offer watcher, 06:00 fallback) vs a fixed cron at 06:00.

30 simulated nights on the simulator's heterogeneous market (its ``typical`` host preset: boot times, hosts that
fail), with the day's swing (``market_swing``) on its H100 offers, under three swing settings (``calm``, ``typical``,
``tight``). The job's data is ready at midnight UTC; it needs one H100 for an hour and must be done by 08:00. The
team pays at most ``cap`` (the 10th percentile of the H100 offers' base prices); when nothing is that cheap it rents
on demand up to ``fallback`` (1.5 times that), as ``on_no_offer="rent_on_demand"`` does.

- ``watcher``: from midnight the offer watcher's rules (``offer_watch``) run on a search every 5 minutes; the job
  starts at the first appearance of a match; at 06:00 without one, it starts anyway.
- ``cron``: the job starts at 06:00.

Either way the job rents as the task does: the cheapest match under the cap, else under the fallback, searched anew
after a host that does not run (a failed attempt, destroyed), while it can still finish by 08:00 (a retry, say).
Each attempt is a real rental on the simulator (search, create, boot on its clock, an hour of work, destroy), and
dollars are its ledger. The searches per hour per key come from the watcher's poll, and for 100 watchers from 100
``GpuMarketOfferTrigger`` run together on one key (the searches they make per interval, times the intervals in an
hour at the default ``poll_interval``).

Usage: ``.venv/bin/python bench/bench_market_schedule.py [--nights 30] [--quick]``; ``--quick`` (3 nights, the
typical setting) is ``make bench-quick``'s smoke run. Fails on an error, never on a missed goal.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

GPU = "H100 SXM"
HOUR, DAY = 3600.0, 86400.0
POLL = 300.0  # the watcher's poll_interval: the default
JOB_SECONDS = HOUR
BOOT_LIMIT = 20 * 60.0  # a host that is not running by then is destroyed and another tried
FALLBACK_HOUR = 6.0  # without a match by 06:00 UTC, the job starts anyway (the cron's hour too)
DEADLINE_HOUR = 8.0  # the job must be done by 08:00 UTC
SEARCH_LIMIT_PER_HOUR = 3600  # the provider's assumption: one search per second per key
WATCHERS = 100


@dataclass
class Tally:
    dollars: float = 0.0
    met: int = 0
    nights: int = 0
    failed_attempts: int = 0
    fallbacks: int = 0
    searches: int = 0
    watched_hours: float = 0.0
    starts: list[float] = field(default_factory=list)  # hours after midnight at which the job started


def night(sim: Any, hook: Any, strategy: str, start: float, cap: float, fallback: float, tally: Tally) -> None:
    """One night from midnight (``start``): when the job runs, on what, at what cost, and whether by the deadline."""
    from airflow_gpumarket.offer_watch import Appearances, OfferWatch

    watch = OfferWatch({"gpu_name": {"eq": GPU}}, max_dph=cap)
    six, deadline = start + FALLBACK_HOUR * HOUR, start + DEADLINE_HOUR * HOUR
    sim.advance(start - sim.now())
    if strategy == "watcher":
        seen = Appearances()
        while sim.now() < six and seen.observe(watch, search(hook, tally), sim.now()) is None:
            sim.advance(POLL)
        tally.watched_hours += (sim.now() - start) / HOUR
    sim.advance(max(0.0, (six if strategy == "cron" else sim.now()) - sim.now()))
    tally.nights += 1
    tally.starts.append((sim.now() - start) / HOUR)
    done = run_job(sim, hook, tally, cap=cap, fallback=fallback, latest=deadline - JOB_SECONDS - BOOT_LIMIT)
    if done is not None and done <= deadline:
        tally.met += 1


def search(hook: Any, tally: Tally) -> list:
    tally.searches += 1
    return hook.search_offers({"gpu_name": {"eq": GPU}}, order=[["dph_total", "asc"]], limit=100)


def run_job(sim: Any, hook: Any, tally: Tally, *, cap: float, fallback: float, latest: float) -> float | None:
    """Rent as the task would: the cheapest match under ``cap`` (else under ``fallback``, on demand), searched anew
    after each host that does not run (a failed attempt, destroyed), until one runs or ``latest`` passed; an hour's
    work; destroy. The simulator's time the job ended, or None."""
    from airflow_gpumarket.offer_watch import OfferWatch

    tried: set[int] = set()
    while sim.now() <= latest:
        offers = [o for o in search(hook, tally) if o["id"] not in tried]
        choices = OfferWatch({"gpu_name": {"eq": GPU}}, max_dph=cap).matching(offers)
        if not choices:
            choices = OfferWatch({"gpu_name": {"eq": GPU}}, max_dph=fallback).matching(offers)
            tally.fallbacks += bool(choices)
        if not choices:
            sim.advance(POLL)  # nothing to rent even at the fallback's price: wait for an offer
            continue
        offer = choices[0]
        tried.add(offer["id"])
        instance_id = hook.create_instance(offer["id"], image="train", disk=20)["new_contract"]
        began, status = sim.now(), None
        while sim.now() - began < BOOT_LIMIT and status not in ("running", "exited", "unknown", "offline"):
            sim.advance(30)
            status = (hook.find_instance(instance_id) or {}).get("actual_status")
        if status != "running":
            hook.destroy_instance(instance_id)
            tally.failed_attempts += 1
            tally.dollars += cost_of(sim, instance_id)
            continue
        sim.advance(JOB_SECONDS)
        ended = sim.now()
        hook.destroy_instance(instance_id)
        tally.dollars += cost_of(sim, instance_id)
        return ended
    return None


def cost_of(sim: Any, instance_id: int) -> float:
    return next(i["cost"] for i in sim.state()["instances"] if i["id"] == instance_id)


def nights(setting: str, strategy: str, count: int, seed: int) -> tuple[Tally, float, float]:
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
    from gpumarket_simulator import MarketSimulator

    world = {"market": {"preset": "typical"}, "credit": 1e6}
    with MarketSimulator(speed=0, seed=seed, world=world, rate_limits=False) as sim:
        (value,) = sim.connection_env().values()
        os.environ["AIRFLOW_CONN_GPUMARKET_DEFAULT"] = value
        hook = GpuMarketHook()
        h100 = [o for o in sim.state()["offers"] if o["gpu_name"] == GPU]
        prices = sorted(o["dph_total"] for o in h100)
        cap = round(prices[len(prices) // 10], 4)
        sim.set_market_swing({"preset": setting, "offers": [o["id"] for o in h100]})
        tally = Tally()
        first = sim.now() - sim.now() % DAY + DAY  # the next midnight UTC
        for n in range(count):
            night(sim, hook, strategy, first + n * DAY, cap, round(cap * 1.5, 4), tally)
        return tally, cap, round(cap * 1.5, 4)


def shared_searches(watchers: int, intervals: int = 4) -> float:
    """Searches per interval that ``watchers`` offer watchers on one key and one search make together."""
    from airflow_gpumarket.triggers.offers import GpuMarketOfferTrigger
    from gpumarket_simulator import MarketSimulator

    interval = 0.25
    with MarketSimulator(speed=600, seed=1) as sim:
        (value,) = sim.connection_env().values()
        os.environ["AIRFLOW_CONN_GPUMARKET_DEFAULT"] = value
        triggers = [
            GpuMarketOfferTrigger(offer_filters={"gpu_name": {"eq": GPU}}, poll_interval=interval)
            for _ in range(watchers)
        ]

        async def run() -> None:
            async def drain(trigger: Any) -> None:
                async for _ in trigger.run():
                    pass

            tasks = [asyncio.ensure_future(drain(t)) for t in triggers]
            await asyncio.sleep(interval * intervals)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run(run())
        made = sum(1 for r in sim.requests() if r["op"] == "search_offers")
    return made / intervals


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nights", type=int, default=30)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    import logging

    logging.getLogger().setLevel(logging.WARNING)  # the watchers' lines: one per appearance per watcher
    settings = ["typical"] if args.quick else ["calm", "typical", "tight"]
    count = 3 if args.quick else args.nights
    started = time.time()
    for setting in settings:
        found = {s: nights(setting, s, count, args.seed) for s in ("watcher", "cron")}
        (watcher, cap, fallback), (cron, _, _) = found["watcher"], found["cron"]
        for name, tally in (("watcher", watcher), ("cron", cron)):
            start = statistics.median(tally.starts) if tally.starts else float("nan")
            print(
                f"P15 {setting:<8} {name:<8} ${tally.dollars:8.2f} deadlines met {tally.met}/{tally.nights} "
                f"({100 * tally.met / max(1, tally.nights):.0f} %, goal 100 %), failed attempts "
                f"{tally.failed_attempts}, fallbacks {tally.fallbacks}, median start {start:4.1f} h after midnight"
            )
        print(
            f"P15 {setting:<8} watcher vs cron: dollars x{watcher.dollars / max(cron.dollars, 1e-9):.2f}; "
            f"cap ${cap}/h, fallback ${fallback}/h; the watcher searched {watcher.searches / count:.1f} times a "
            f"night ({HOUR / POLL:.0f}/h while it watched, {watcher.watched_hours / count:.1f} h a night)"
        )
    together = shared_searches(5 if args.quick else WATCHERS)
    hourly = together * HOUR / POLL
    print(
        f"P15 searches per hour per key: {WATCHERS if not args.quick else 5} watchers of one search made "
        f"{together:.1f} search(es) per interval, {hourly:.0f}/h at poll_interval={POLL:g} s (goal: within the "
        f"assumed {SEARCH_LIMIT_PER_HOUR}/h); {WATCHERS} distinct searches would make {WATCHERS * HOUR / POLL:.0f}/h"
    )
    print(f"P15 wall-clock time: {time.time() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
