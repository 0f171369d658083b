"""P6: the embedded simulator must not be the bottleneck of the provider's own benchmarks.

Measures, against the ``gpumarket-sim`` console script running in its own process (as users run it):

- start-up: from launching the process to the first answered API request (median of several runs);
- throughput: ``GET /api/v0/instances/{id}/`` from a couple of client threads sharing nothing but the server,
  each with its own ``requests.Session`` (keep-alive), median of several runs.

The figure is meant to measure the server, so the client is kept lean: ``trust_env = False`` (no proxy or
.netrc lookups, which cost more than the simulator's own work on every request) and one prepared request sent
again and again. On a 2-core machine the client threads, bound by the GIL, are still the slower side.

Profile: ``live``, the one ``gpumarket-sim`` serves without flags and the one the other benchmarks and the tests
run against, with its per-endpoint buckets off (``--no-rate-limits``): P6 is what a request costs the server, not
the live service's pacing (with the buckets on, ``get_instance`` passes 2 requests per simulated second and the
rest are refused). The start-up probe therefore reads the live profile's instance list, ``GET /api/v1/instances/``
(its ``/api/v0/instances/`` answers 410, as the live service does).

Usage: ``.venv/bin/python bench/bench_simulator.py [--runs 5] [--seconds 3] [--threads 2] [--quick]``

``--quick`` is a smoke run (one start-up, one half-second throughput run; about 3 s) that prints the same lines and
fails on an error only, never on a missed goal: ``make bench-quick`` runs it so that the script cannot rot unseen.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

import requests

API_KEY = "bench-key"
#: The default profile, named on purpose, with its buckets off (see the module docstring).
PROFILE_ARGS = ("--profile", "live", "--no-rate-limits")
#: The live profile's instance list.
LIST_PATH = "/api/v1/instances/"


def sim_command() -> list[str]:
    script = shutil.which("gpumarket-sim", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "gpumarket_simulator.cli"]


def launch(speed: float = 60.0) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [*sim_command(), "--port", "0", "--api-key", API_KEY, "--speed", str(speed), *PROFILE_ARGS],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    first = process.stdout.readline()
    if "listening on " not in first:
        process.kill()
        raise RuntimeError(f"unexpected first line from gpumarket-sim: {first!r}")
    url = first.split("listening on ", 1)[1].split()[0]
    return process, url


def stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()


def measure_startup() -> float:
    t0 = time.perf_counter()
    process, url = launch()
    try:
        response = requests.get(f"{url}{LIST_PATH}", headers={"Authorization": f"Bearer {API_KEY}"})
        response.raise_for_status()
        return time.perf_counter() - t0
    finally:
        stop(process)


def measure_throughput(url: str, instance_id: int, seconds: float, threads: int) -> float:
    counts = [0] * threads
    errors: list[str] = []
    start = threading.Barrier(threads + 1)
    deadline = [0.0]

    def client(slot: int) -> None:
        session = requests.Session()
        session.trust_env = False
        session.headers["Authorization"] = f"Bearer {API_KEY}"
        prepared = session.prepare_request(requests.Request("GET", f"{url}/api/v0/instances/{instance_id}/"))
        try:
            session.send(prepared).raise_for_status()  # open the keep-alive connection before timing
        except Exception as exc:  # the barrier below must not wait forever for a thread that died here
            errors.append(f"first request: {exc}")
            start.abort()
            return
        start.wait()
        n = 0
        while time.perf_counter() < deadline[0]:
            response = session.send(prepared)
            if response.status_code != 200:
                errors.append(f"HTTP {response.status_code}: {response.text[:80]}")
                break
            n += 1
        counts[slot] = n

    workers = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    deadline[0] = time.perf_counter() + seconds
    t0 = time.perf_counter()
    with contextlib.suppress(threading.BrokenBarrierError):  # a client failed before the start: reported below
        start.wait()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"requests failed during the benchmark: {errors[:3]}")
    return sum(counts) / elapsed


def rent_one(url: str) -> int:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    found = requests.post(f"{url}/api/v0/bundles/", json={"limit": 1}, headers=headers)
    found.raise_for_status()
    offer_id = found.json()["offers"][0]["id"]
    created = requests.put(f"{url}/api/v0/asks/{offer_id}/", json={"image": "bench"}, headers=headers)
    created.raise_for_status()
    return int(created.json()["new_contract"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny sizes, fails on errors only")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.seconds = 1, 0.5

    startups = [measure_startup() for _ in range(args.runs)]

    process, url = launch(speed=0)
    try:
        instance_id = rent_one(url)
        repeats = 1 if args.quick else max(3, args.runs // 2)
        rates = [measure_throughput(url, instance_id, args.seconds, args.threads) for _ in range(repeats)]
    finally:
        stop(process)

    rate = statistics.median(rates)
    startup = statistics.median(startups)
    print(f"P6 simulator throughput: {rate:.0f} req/s (goal: >= 1000)")
    print(f"P6 simulator start-up: {startup:.2f} s (goal: < 1 s)")
    runs = ", ".join(f"{r:.0f}" for r in rates)
    starts = ", ".join(f"{s:.2f}" for s in startups)
    print(f"   ({args.threads} client threads, {args.seconds:g} s a run; {runs} req/s; start-ups {starts} s)")
    if args.quick:  # tiny samples on a machine busy with other work say nothing about the goals
        return 0
    return 0 if rate >= 1000 and startup < 1 else 1


if __name__ == "__main__":
    sys.exit(main())
