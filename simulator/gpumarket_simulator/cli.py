"""``gpumarket-sim``: run the simulated marketplace until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import logging
import math
import os
import shlex
import signal
import sys
import threading
from collections.abc import Sequence

from gpumarket_simulator.server import CONNECTION_ENV

#: Simulated seconds per real second, by default: a 1-5 minute boot takes 1-5 seconds.
DEFAULT_SPEED = 60.0
#: The speed of ``--local``: boots take seconds, and what a job bills stays near what the live service would bill.
LOCAL_SPEED = 10.0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gpumarket-sim",
        description="A local, spec-faithful GPU marketplace for demos, tests and CI (see docs/simulator.md).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on; 0 picks a free one (default)")
    parser.add_argument("--api-key", default=None, help="the account key (default: derived from --seed)")
    parser.add_argument(
        "--speed",
        type=float,
        default=None,
        help=f"simulated seconds per real second (default {DEFAULT_SPEED:g}, with --local {LOCAL_SPEED:g}; 0 freezes)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the world and its outcomes (default 0)")
    parser.add_argument(
        "--execute-onstart",
        action="store_true",
        help="run onstart scripts as local processes (off by default)",
    )
    parser.add_argument(
        "--local",
        action="store_true",
        help=f"for your own DAGs: onstart executed, speed {LOCAL_SPEED:g}, and the Airflow settings printed",
    )
    parser.add_argument(
        "--env-file",
        default=None,
        metavar="FILE",
        help="also write the Airflow settings to FILE as export lines (for `source FILE`)",
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
    if args.speed is None:
        args.speed = LOCAL_SPEED if args.local else DEFAULT_SPEED
    if args.speed < 0:
        parser.error("--speed must be >= 0")
    args.execute_onstart = args.execute_onstart or args.local
    return args


def airflow_settings(conn_uri: str) -> dict[str, str]:
    """What an Airflow run of one's own DAG needs to rent from this simulator: its connection."""
    return {CONNECTION_ENV: conn_uri}


def _recipe(settings: dict[str, str], env_file: str | None) -> str:
    """The steps another shell follows to run one's own DAG here, with absolute paths: they work from any folder."""
    exports = [f"export {name}={shlex.quote(value)}" for name, value in settings.items()]
    load = [f"source {shlex.quote(os.path.abspath(env_file))}"] if env_file else exports
    # The environment this simulator runs in has Airflow and the provider beside it: the other shell needs it too.
    activate = [f"source {shlex.quote(sys.prefix)}/bin/activate"] if sys.prefix != sys.base_prefix else []
    home = shlex.quote(os.path.join(os.getcwd(), ".airflow-sim"))
    steps = [
        *((line, "") for line in activate + load),
        (f"export AIRFLOW_HOME={home}", "a throwaway Airflow home, or your own"),
        ("export AIRFLOW__CORE__DAGS_FOLDER=$AIRFLOW_HOME/dags", "put your DAG's file in this folder"),
        ("export AIRFLOW__CORE__LOAD_EXAMPLES=False", "without Airflow's example DAGs"),
        ('mkdir -p "$AIRFLOW__CORE__DAGS_FOLDER"', ""),
        ("airflow db migrate", "once per Airflow home"),
        ("airflow dags test <your_dag_id>", ""),
    ]
    width = max(len(command) for command, _ in steps) + 2
    lines = "".join(f"    {command:<{width}}# {note}\n" if note else f"    {command}\n" for command, note in steps)
    return f"  To run your own DAG against it, in another shell:\n{lines}"


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
    settings = airflow_settings(sim.conn_uri)
    if args.env_file:
        try:
            with open(args.env_file, "w") as out:
                out.writelines(f"export {name}={shlex.quote(value)}\n" for name, value in settings.items())
        except OSError as exc:
            sim.close()
            print(f"gpumarket-sim: --env-file {args.env_file}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    print(f"gpumarket-sim listening on {sim.url}  {CONNECTION_ENV}={sim.conn_uri}", flush=True)
    # Details go to stderr: a caller that reads only the first line may close stdout.
    print(
        f"  api key: {sim.api_key}  speed: {args.speed:g}x  seed: {args.seed}  "
        f"onstart: {'executed' if args.execute_onstart else 'not executed'}  data: {sim.data_dir}  "
        f"admin: {sim.url}/_sim/state",
        file=sys.stderr,
        flush=True,
    )
    if args.local or args.env_file:
        print(_recipe(settings, args.env_file), file=sys.stderr, end="", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        sim.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
