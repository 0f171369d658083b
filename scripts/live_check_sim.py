"""`make live-check-sim`: the live acceptance suite (tests/live) against `gpumarket-sim --local` instead of the service.

Starts the simulator as a user would for their own DAGs (onstart executed), gives its connection to the suite in
GPUMARKET_LIVE_CONN with its sample integration, runs the suite, then reads the simulator's own state: how many
instances were rented and how many are alive (must be 0). Exits with the suite's status, or 1 when any is alive.
Arguments after the script's own go to pytest; GPUMARKET_LIVE_* variables already set are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
#: The simulator's integration that the suite copies a file out to and back from (its default world has it).
INTEGRATION = "training-data"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speed", default="10", help="the simulator's speed (default 10, as --local)")
    parser.add_argument("--poll-interval", default="1", help="GPUMARKET_LIVE_POLL_INTERVAL (default 1 s)")
    args, pytest_args = parser.parse_known_args(argv)
    sim = subprocess.Popen(
        [str(BIN / "gpumarket-sim"), "--local", "--port", "0", "--speed", args.speed, "--seed", "44"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        first = sim.stdout.readline() if sim.stdout else ""
        url, _, conn = first.partition("listening on ")[2].partition("  ")
        conn = conn.partition("=")[2].strip()
        if not conn:
            print(f"live-check-sim: gpumarket-sim did not start: {first.strip()!r}", file=sys.stderr)
            return 1
        env = dict(os.environ)
        env.setdefault("GPUMARKET_LIVE_INTEGRATION", INTEGRATION)
        env.setdefault("GPUMARKET_LIVE_POLL_INTERVAL", args.poll_interval)
        env["GPUMARKET_LIVE_CONN"] = conn
        print(f"live-check-sim: gpumarket-sim --local at {url} (speed {args.speed})", flush=True)
        status = subprocess.call(
            [str(BIN / "python"), "-m", "pytest", "tests/live", "-m", "live", "-p", "no:cacheprovider", *pytest_args],
            cwd=ROOT,
            env=env,
        )
        with urllib.request.urlopen(f"{url}/_sim/state", timeout=10) as answer:
            instances = json.load(answer)["instances"]
        alive = [i["id"] for i in instances if not i.get("destroyed")]
        print(f"SIM: {len(instances)} instance(s) rented, {len(alive)} alive{f' {alive}' if alive else ''}")
        return 1 if alive else status
    finally:
        sim.terminate()
        sim.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
