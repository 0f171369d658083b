"""P1 triggerer scale: N instance triggers in one asyncio event loop, as in one triggerer process.

For N = 1, 100, 1000, the shared poller (default) and the naive pattern (one GET per trigger per interval, as
official providers' triggers do) are measured side by side against the simulator, which runs in its own process
(so CPU and memory are the triggers' own) and enforces a per-key rate limit on instance reads. Instances boot at
spread-out times (the simulator draws 60-300 simulated seconds each).

Prints per case: requests per poll interval, 429s received, detection delay of the running transition (p50/p99,
seconds after the instance became running), CPU seconds, peak RSS growth. Each case runs in a fresh process.

    python bench/bench_triggerer.py            # all cases
    python bench/bench_triggerer.py --case 1000 shared
    python bench/bench_triggerer.py --quick    # smoke run: N=10 only, same lines, fails on errors only
    python bench/bench_triggerer.py --ha       # P1-HA only (about 5 minutes)
    python bench/bench_triggerer.py --iso      # P1-iso only (under a minute)

Profile: ``live``, chosen on purpose for every case, so that the shared poller walks the paged
``GET /api/v1/instances/`` (25 ids a page) as it does against the service today (``spec`` would measure the v0
fallback, a path no user of the live service takes). Its published buckets are off while the instances are
created; then the default cases keep them off and put the bench's own bucket in place, one per-key token bucket of
``RATE`` reads/s on every endpoint (a fault rule, real time), so that the goal can be stated as ``POLL + N / RATE``,
and the client's list budget (``api.retry.LIST_RATE_PER_SECOND``, the published 0.5/s) is set to that same ``RATE``: the
client paces its page walk by the budget of the service it talks to. The ``--live`` cases turn the published
per-endpoint buckets on instead (list 0.5 requests/s, no burst, refilled on the simulated clock, which runs at 1x
there) and leave the client's budget as published.

P1-HA (``--ha`` alone, and after the default cases): 300 waits on one key under the published buckets (simulator at
10x), split over 1, 2 and 3 triggerer-like processes on this machine, each with its own shared poller; once with
the list slots booked machine-wide (``airflow_gpumarket.pacing``, as shipped) and once, as the baseline, with each
process pacing alone (a slot folder of its own). Detection delays are in simulated seconds.

P1-iso (``--iso`` alone, and after the default cases): 200 waits of one process beside 20 job waits whose every step
takes 5 s, against the same 20 taking no time, alternated three times: a slow trigger must not hold up the others'
detection.

Exits non-zero when a case fails (its stderr's last lines are printed on stderr), so that ``make bench`` and
``make bench-quick`` fail with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import aclosing
from pathlib import Path

import requests

SPEED = 60.0  # a 60-300 s boot takes 1-5 real seconds
POLL = 1.0  # seconds between polls (the spec recommends 10; scaled with the clock)
LIVE_POLL = 10.0  # the spec's recommended interval, at the real rate
RATE = 20.0  # the simulator's per-key budget for instance reads, requests per second
CAPACITY = 20
SIZES = (1, 100, 1000)
#: --quick: one small size, both modes (about 6 s a case).
QUICK_SIZES = (10,)
#: Live cases: the simulator's published per-endpoint buckets (0.5 list calls/s, ...) at the real rate, so the
#: clock runs at 1x and boots take their real 1-5 minutes.
LIVE_SPEED = 1.0
LIVE_CASES = ((10, "live-shared"), (1000, "live-shared"))
#: P1-HA: the waits, the processes they are split over, the clock (the published buckets scale with it).
HA_N = 300
HA_PROCESSES = (1, 2, 3)
HA_SPEED = 10.0
HA_QUICK_N = 10
#: P1-iso: the waits measured, beside this many triggers of the same process whose every step takes ISO_STEP seconds
#: (a log read, a lease renewal or a bid held up by a slow answer), against none slow in the same sitting.
ISO_N = 200
ISO_SLOW = 20
ISO_STEP = 5.0
ISO_QUICK = (10, 2)
#: P1-iso's alternated sittings (one of each case per sitting); the medians are reported.
ISO_SITTINGS = 3


def start_simulator(n: int, live_limits: bool = False, speed: float | None = None) -> tuple[subprocess.Popen, str, str]:
    # A billion dollars of credit: a thousand instances must not run the account dry (the $0 stop) mid-case.
    world = {"offers": [{"id": i + 1, "gpu_name": "RTX 4090", "dph_total": 0.5} for i in range(n)], "credit": 1e9}
    path = Path(tempfile.mkdtemp(prefix="gpm-bench-")) / "world.json"
    path.write_text(json.dumps(world))
    speed = speed or (LIVE_SPEED if live_limits else SPEED)
    # The live profile, on purpose (see the module docstring). Set-up creates the instances with its buckets off;
    # run_case then puts the bench's own bucket in place, or (a live case) turns the published ones on.
    cmd = [sys.executable, "-m", "gpumarket_simulator.cli", "--port", "0", "--speed", str(speed)]
    cmd += ["--profile", "live", "--no-rate-limits", "--world", str(path)]
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline() if process.stdout else ""
    url = next(word for word in line.split() if word.startswith("http://"))
    key = line.split("gpumarket://:", 1)[1].split("@", 1)[0]
    return process, url, key


def rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    return 0


def run_case(n: int, mode: str) -> dict:
    """One P1 case: ``mode`` is shared, naive, live-shared, or iso-<k>-<s> (the shared poller beside k job waits of
    s seconds a step)."""
    live = mode.startswith("live-")
    slow, step = (int(mode.split("-")[1]), float(mode.split("-")[2])) if mode.startswith("iso-") else (0, 0.0)
    speed = LIVE_SPEED if live else SPEED
    process, url, key = start_simulator(n + slow, live_limits=live)
    try:
        os.environ["AIRFLOW_CONN_GPUMARKET_DEFAULT"] = json.dumps(
            {"conn_type": "gpumarket", "host": url, "password": key, "extra": {"max_retries": 8}}
        )
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {key}"
        made = [
            session.put(f"{url}/api/v0/asks/{i + 1}/", json={"image": "bench", "label": f"b{i}"}).json()["new_contract"]
            for i in range(n + slow)
        ]
        ids, slow_ids = made[:n], made[n:]
        if live:
            session.put(f"{url}/_sim/rate-limits", json={"enabled": True}).raise_for_status()
        else:
            rule = {
                "endpoint": "*",
                "kind": "rate_limit",
                "capacity": CAPACITY,
                "per_second": RATE,
                "retry_after": True,
            }
            session.put(f"{url}/_sim/faults", json={"rules": [rule]}).raise_for_status()
        sim_t0, real_t0 = session.get(f"{url}/_sim/state").json()["now"], time.time()
        log_start = len(session.get(f"{url}/_sim/state").json()["requests"])

        from airflow_gpumarket import api
        from airflow_gpumarket.triggers.instances import GpuMarketInstanceStatusTrigger

        # The client's list budget is that of the service it talks to: the published one, which runs with the
        # simulator's clock (live cases), or the bench's own bucket (default cases; the published buckets are off).
        api.retry.LIST_RATE_PER_SECOND = api.retry.LIST_RATE_PER_SECOND * speed if live else RATE

        seen: dict[int, float] = {}

        async def watch(instance_id: int) -> None:
            trigger = GpuMarketInstanceStatusTrigger(
                instance_id=instance_id, poll_interval=LIVE_POLL if live else POLL, shared_poller=(mode != "naive")
            )
            async with aclosing(trigger.run()) as events:
                async for _event in events:
                    seen[instance_id] = time.time()
                    return

        rss_before = rss_kb("VmRSS")
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        started = time.time()

        class SlowSteps(GpuMarketInstanceStatusTrigger):
            """A job's wait whose every step takes ``step`` seconds more: a slow answer on its own path."""

            async def _step(self, *args, **kwargs):
                await asyncio.sleep(step)
                return await super()._step(*args, **kwargs)

        async def slow_wait(instance_id: int) -> None:
            trigger = SlowSteps(instance_id=instance_id, poll_interval=POLL, watch={"wait_for": "job"})
            async with aclosing(trigger.run()) as events:
                async for _event in events:
                    return

        async def all_triggers() -> None:
            slow_waits = [asyncio.ensure_future(slow_wait(i)) for i in slow_ids]
            await asyncio.sleep(0)  # the slow ones subscribe first
            try:
                await asyncio.wait_for(asyncio.gather(*(watch(i) for i in ids)), timeout=900)
            finally:
                for waiting in slow_waits:
                    waiting.cancel()
                await asyncio.gather(*slow_waits, return_exceptions=True)

        asyncio.run(all_triggers())
        elapsed = time.time() - started
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
        state = session.get(f"{url}/_sim/state").json()
        reads = [r for r in state["requests"][log_start:] if r["path"].startswith(("/api/v0/instances", "/api/v1/"))]
        interval = LIVE_POLL if live else POLL
        running_at = {i["id"]: i["first_running_at"] for i in state["instances"]}
        delays = sorted(seen[i] - (real_t0 + (running_at[i] - sim_t0) / speed) for i in ids)
        return {
            "n": n,
            "mode": mode,
            "requests_per_interval": len(reads) / max(1, math.ceil(elapsed / interval)),
            "requests": len(reads),
            "429s": sum(1 for r in reads if r["status"] == 429),
            "p50": statistics.median(delays),
            "p99": delays[min(len(delays) - 1, int(len(delays) * 0.99))],
            "cpu_s": (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime),
            "rss_growth_mb": (rss_kb("VmHWM") - rss_before) / 1024,
            "elapsed_s": elapsed,
        }
    finally:
        process.terminate()
        process.wait(timeout=10)


def watch_in_this_process(url: str, key: str, ids: list[int], speed: float) -> dict[int, float]:
    """One triggerer-like process of P1-HA: the shared poller watching ``ids``; when each was seen running."""
    os.environ["AIRFLOW_CONN_GPUMARKET_DEFAULT"] = json.dumps(
        {"conn_type": "gpumarket", "host": url, "password": key, "extra": {"max_retries": 8}}
    )
    from airflow_gpumarket import api
    from airflow_gpumarket.triggers.instances import GpuMarketInstanceStatusTrigger

    api.retry.LIST_RATE_PER_SECOND *= speed  # the published budget runs with the simulator's clock
    seen: dict[int, float] = {}

    async def watch(instance_id: int) -> None:
        trigger = GpuMarketInstanceStatusTrigger(instance_id=instance_id, poll_interval=LIVE_POLL / speed)
        async with aclosing(trigger.run()) as events:
            async for _event in events:
                seen[instance_id] = time.time()
                return

    async def all_triggers() -> None:
        await asyncio.wait_for(asyncio.gather(*(watch(i) for i in ids)), timeout=900)

    asyncio.run(all_triggers())
    return seen


def run_ha_case(n: int, processes: int, shared_pacing: bool, speed: float = 10.0) -> dict:
    """P1-HA: ``n`` deferred waits on one key under the published buckets, split over ``processes`` triggerer-like
    processes (each with its own shared poller), their list slots booked machine-wide or (the baseline) each
    process pacing itself as if it owned the key."""
    process, url, key = start_simulator(n, speed=speed)
    pacing_dirs = [tempfile.mkdtemp(prefix="gpm-pacing-") for _ in range(processes)]
    try:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {key}"
        ids = [
            session.put(f"{url}/api/v0/asks/{i + 1}/", json={"image": "bench", "label": f"b{i}"}).json()["new_contract"]
            for i in range(n)
        ]
        session.put(f"{url}/_sim/rate-limits", json={"enabled": True}).raise_for_status()
        sim_t0, real_t0 = session.get(f"{url}/_sim/state").json()["now"], time.time()
        log_start = len(session.get(f"{url}/_sim/state").json()["requests"])
        seen: dict[int, float] = {}
        with contextlib.ExitStack() as files:
            children = []
            for k in range(processes):
                env = dict(os.environ, GPUMARKET_PACING_DIR=pacing_dirs[0 if shared_pacing else k])
                share = json.dumps(ids[k::processes])
                cmd = [sys.executable, __file__, "--ha-child", url, key, share, str(speed)]
                # Output to files, not pipes: a child whose pipe filled up while this process waited on another
                # would stall (measured: 17-20 s without a round, the p99 of its share 4x).
                out = files.enter_context(tempfile.TemporaryFile("w+"))
                err = files.enter_context(tempfile.TemporaryFile("w+"))
                children.append((subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env), out, err))
            for child, out, err in children:
                child.wait(timeout=1200)
                out.seek(0)
                err.seek(0)
                if child.returncode != 0:
                    raise RuntimeError(f"a watching process failed ({child.returncode}): {err.read().strip()[-800:]}")
                seen.update({int(i): t for i, t in json.loads(out.read().strip().splitlines()[-1]).items()})
        state = session.get(f"{url}/_sim/state").json()
        lists = [r for r in state["requests"][log_start:] if r["path"].startswith(("/api/v0/instances", "/api/v1/"))]
        running_at = {i["id"]: i["first_running_at"] for i in state["instances"]}
        # Simulated seconds between an instance becoming running and its trigger seeing it.
        delays = sorted((seen[i] - real_t0) * speed - (running_at[i] - sim_t0) for i in ids)
        return {
            "p50": statistics.median(delays),
            "p99": delays[min(len(delays) - 1, int(len(delays) * 0.99))],
            "429s": sum(1 for r in lists if r["status"] == 429),
            "lists": len(lists),
        }
    finally:
        process.terminate()
        process.wait(timeout=10)


def run_ha(sizes: tuple[int, ...], n: int, speed: float, pacings: tuple[bool, ...] = (True, False)) -> int:
    print(
        f"# P1-HA: {n} waits on one key under the published buckets (list 0.5/s, no burst), simulator at "
        f"{speed:g}x, poll {LIVE_POLL:g} simulated s; seconds are simulated; each line beside one process"
    )
    failed = 0
    for shared in pacings:
        one: dict | None = None
        for processes in sizes:
            try:
                r = run_ha_case(n, processes, shared, speed)
            except Exception as exc:  # noqa: BLE001 - report the case, go on with the others
                print(f"P1-HA processes={processes} {'shared' if shared else 'own'} pacing: FAILED ({exc})")
                failed += 1
                continue
            one = one or r
            print(
                f"P1-HA {processes} process(es), {'pacing shared by the machine' if shared else 'each pacing alone'}"
                f": detection p50 {r['p50']:.0f} s p99 {r['p99']:.0f} s ({r['p99'] / max(one['p99'], 1e-9):.2f}x one "
                f"process), {r['429s']} 429s ({r['429s'] / max(one['429s'], 1):.2f}x), {r['lists']} list calls "
                "(goal with 2-3 processes: p99 <= 1.3x, 429s <= 1.2x one process's)"
            )
    return failed


def run_iso(n: int, slow: int, sittings: int = ISO_SITTINGS) -> int:
    """P1-iso: detection of ``n`` waits beside ``slow`` job waits of ISO_STEP seconds a step, against the same
    job waits taking no time, alternated ``sittings`` times; medians of each."""
    calm: list[dict] = []
    held: list[dict] = []
    for _ in range(sittings):
        for mode, into in ((f"iso-{slow}-0", calm), (f"iso-{slow}-{ISO_STEP:g}", held)):
            r = run_in_child(n, mode)
            if r is None:
                print(f"P1-iso N={n}: FAILED")
                return 1
            into.append(r)

    def median(runs: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    ratio = median(held, "p99") / max(median(calm, "p99"), 1e-9)
    print(
        f"P1-iso {n} waits beside {slow} job waits taking {ISO_STEP:g} s a step, against the same taking none "
        f"(medians of {sittings} alternated sittings): detection p99 {median(held, 'p99'):.2f} s against "
        f"{median(calm, 'p99'):.2f} s, {ratio:.2f}x (goal <= 1.1x); p50 {median(held, 'p50'):.2f} s against "
        f"{median(calm, 'p50'):.2f} s; list calls {median(held, 'requests'):.0f} against {median(calm, 'requests'):.0f}"
    )
    return 0


def run_in_child(n: int, mode: str) -> dict | None:
    """One case in a fresh process; None (with the child's last stderr lines on stderr) when it failed."""
    out = subprocess.run([sys.executable, __file__, "--case", str(n), mode], capture_output=True, text=True)
    if out.returncode == 0:
        lines = out.stdout.strip().splitlines()
        try:
            return json.loads(lines[-1])
        except (IndexError, ValueError):
            pass
    print(f"P1 case N={n} {mode} failed (exit status {out.returncode}); its last stderr lines:", file=sys.stderr)
    for line in out.stderr.strip().splitlines()[-15:]:
        print(f"    {line}", file=sys.stderr)
    return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", nargs=2, metavar=("N", "MODE"))
    parser.add_argument("--live", action="store_true", help="only the cases under the live profile's buckets")
    parser.add_argument("--quick", action="store_true", help="a smoke run: N=10 only, same lines")
    parser.add_argument("--ha", action="store_true", help="only P1-HA: the waits split over 1, 2, 3 processes")
    parser.add_argument("--iso", action="store_true", help="only P1-iso: waits beside slow triggers")
    parser.add_argument("--ha-child", nargs=4, metavar=("URL", "KEY", "IDS", "SPEED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(int(args.case[0]), args.case[1])))
        return 0
    if args.ha_child:
        url, key, ids, speed = args.ha_child
        print(json.dumps(watch_in_this_process(url, key, json.loads(ids), float(speed))))
        return 0
    if args.ha:
        return 1 if run_ha(HA_PROCESSES, HA_N, HA_SPEED) else 0
    if args.iso:
        return run_iso(ISO_N, ISO_SLOW)
    failed = 0
    if args.live:
        print(f"# P1 live: the published buckets (list 0.5/s, no burst), poll {LIVE_POLL:g} s, clock 1x")
        for n, mode in LIVE_CASES:
            r = run_in_child(n, mode)
            if r is None:
                print(f"P1 live N={n}: FAILED")
                failed += 1
                continue
            print(
                f"P1 live N={n} shared poller: {r['requests_per_interval']:.1f} list calls/interval "
                f"({r['requests']} in {r['elapsed_s']:.0f} s), {r['429s']} 429s, detection p50 {r['p50']:.1f} s "
                f"p99 {r['p99']:.1f} s, RSS +{r['rss_growth_mb']:.1f} MB"
            )
        return 1 if failed else 0
    print(
        f"# P1: live profile without its buckets; poll interval {POLL:g} s, rate limit {RATE:g} reads/s per key "
        f"(the client's list budget too), clock {SPEED:g}x, one process each"
    )
    for n in QUICK_SIZES if args.quick else SIZES:
        for mode in ("shared", "naive"):
            r = run_in_child(n, mode)
            if r is None:
                print(f"P1 triggers N={n} {mode}: FAILED")
                failed += 1
                continue
            bound = POLL + n / RATE
            print(
                f"P1 triggers N={n} {mode}: {r['requests_per_interval']:.1f} requests/interval, {r['429s']} 429s, "
                f"detection p50 {r['p50']:.2f} s p99 {r['p99']:.2f} s, CPU {r['cpu_s']:.2f} s, "
                f"RSS +{r['rss_growth_mb']:.1f} MB (goal at N=1000: 0 429s, p99 <= {bound:g} s, RSS <= +100 MB)"
            )
    failed += run_iso(*ISO_QUICK, sittings=1) if args.quick else run_iso(ISO_N, ISO_SLOW)
    if args.quick:  # boots of 1-5 s at 60x; the machine-wide pacing only
        failed += run_ha((1, 2), HA_QUICK_N, SPEED, pacings=(True,))
    else:
        failed += run_ha(HA_PROCESSES, HA_N, HA_SPEED)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
