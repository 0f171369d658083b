"""``gpumarket-sim``: run the simulated marketplace until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import logging
import math
import signal
import sys
import threading
from collections.abc import Sequence

from gpumarket_simulator.server import CONNECTION_ENV


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gpumarket-sim",
        description="A local, spec-faithful GPU marketplace for demos, tests and CI (see docs/simulator.md).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on; 0 picks a free one (default)")
    parser.add_argument("--api-key", default=None, help="the account key (default: derived from --seed)")
    parser.add_argument(
        "--speed", type=float, default=60.0, help="simulated seconds per real second (default 60; 0 freezes)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the world and its outcomes (default 0)")
    parser.add_argument(
        "--execute-onstart",
        action="store_true",
        help="run onstart scripts as local processes (off by default)",
    )
    parser.add_argument("--world", default=None, metavar="FILE", help="JSON world file replacing parts of the world")
    parser.add_argument(
        "--profile",
        choices=("live", "spec"),
        default="live",
        help="live (default): the service as it answers today; spec: exactly the published API reference",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR",
        help="directory for instance disks and cloud buckets (default: a temporary directory)",
    )
    parser.add_argument(
        "--no-rate-limits",
        dest="rate_limits",
        action="store_false",
        default=None,
        help="turn off the live profile's per-endpoint rate limits",
    )
    parser.add_argument(
        "--credit",
        type=float,
        default=None,
        metavar="DOLLARS",
        help="the account's starting credit (default: the world file's, else 100)",
    )
    args = parser.parse_args(argv)
    if args.credit is not None and not math.isfinite(args.credit):
        parser.error("--credit must be a finite number of dollars")
    if args.speed < 0:
        parser.error("--speed must be >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="gpumarket-sim %(levelname)s %(name)s: %(message)s")
    from gpumarket_simulator.server import MarketSimulator

    try:
        sim = MarketSimulator(
            speed=args.speed,
            seed=args.seed,
            api_key=args.api_key,
            execute_onstart=args.execute_onstart,
            world=args.world,
            host=args.host,
            port=args.port,
            profile=args.profile,
            rate_limits=args.rate_limits,
            data_dir=args.data_dir,
            credit=args.credit,
        )
        sim.start()
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"gpumarket-sim: {exc}", file=sys.stderr)
        return 2

    stop = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    print(f"gpumarket-sim listening on {sim.url}  {CONNECTION_ENV}={sim.conn_uri}", flush=True)
    # Details go to stderr: a caller that reads only the first line may close stdout.
    print(
        f"  api key: {sim.api_key}  speed: {args.speed:g}x  seed: {args.seed}  "
        f"onstart: {'executed' if args.execute_onstart else 'not executed'}  data: {sim.data_dir}  "
        f"admin: {sim.url}/_sim/state",
        file=sys.stderr,
        flush=True,
    )
    try:
        while not stop.wait(0.5):
            pass
    finally:
        sim.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
