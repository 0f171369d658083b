"""P16: processes on one API key and one client address, pacing through one folder or each its own.

Task pods under the KubernetesExecutor each have a temp folder of their own, so each paces its calls as if it
owned the key, while the live service keeps one bucket per key and client address (pods behind one egress address
share it). This runs ``--processes`` processes that each list the instances ``--calls`` times through the hook
against an embedded simulator with the live buckets on (list: 0.5 per second, no burst, a penalty token per
refusal), first with one ``GPUMARKET_PACING_DIR`` for all (processes of one machine), then with one each (pods).
It prints the wall time for all calls (process starts included) and the 429s the simulator answered, medians of
``--runs`` sittings of both settings, and their ratio.

Usage: ``.venv/bin/python bench/bench_pacing_pods.py [--processes 4] [--calls 6] [--runs 3] [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpumarket_simulator import MarketSimulator

#: The simulator's clock speed: its buckets refill this much faster, and the connection's rate_limit_scale says so.
SPEED = 10.0
CHILD = """
from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
hook = GpuMarketHook()
for _ in range({calls}):
    hook.list_instances()
"""


def run(sim: MarketSimulator, processes: int, calls: int, shared: bool) -> tuple[float, int]:
    """Seconds until every process made its calls, and the 429s answered meanwhile."""
    sim.set_rate_limits(True)  # empties the buckets and the count of refusals
    base = Path(tempfile.mkdtemp(prefix="gpm-p16-"))
    env = {**os.environ, **sim.connection_env()}
    started = time.monotonic()
    children = []
    for n in range(processes):
        folder = base / ("shared" if shared else f"pod-{n}")
        children.append(
            subprocess.Popen(
                [sys.executable, "-c", CHILD.format(calls=calls)],
                env={**env, "GPUMARKET_PACING_DIR": str(folder)},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    if any(child.wait() != 0 for child in children):
        raise RuntimeError("P16: a process failed")
    seconds = time.monotonic() - started
    return seconds, sum(sim._market.rate_limits.refused().values())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--calls", type=int, default=6)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a smoke run: two processes, two calls each, once")
    args = parser.parse_args()
    processes, calls, runs = (2, 2, 1) if args.quick else (args.processes, args.calls, args.runs)
    shared, own = [], []
    with MarketSimulator(speed=SPEED, seed=5, profile="live") as sim:
        for _ in range(runs):
            shared.append(run(sim, processes, calls, shared=True))
            own.append(run(sim, processes, calls, shared=False))
    one_folder = (statistics.median(s[0] for s in shared), statistics.median(s[1] for s in shared))
    own_folders = (statistics.median(o[0] for o in own), statistics.median(o[1] for o in own))
    budget = processes * calls / 0.5 / SPEED  # the key's list budget, in real seconds
    print(
        f"P16 {processes} processes x {calls} instance lists on one key and address (budget {budget:.1f} s at "
        f"{SPEED:g}x; medians of {runs}): one pacing folder {one_folder[0]:.1f} s, {one_folder[1]:g} 429s; a folder "
        f"per pod {own_folders[0]:.1f} s, {own_folders[1]:g} 429s ({own_folders[0] / one_folder[0]:.2f}x the time)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
