"""`make demo`: rent a GPU on the embedded simulator with a real Airflow DAG, run work on it, destroy it.

1. An Airflow home under ./.airflow (ignored by git; ./.airflow/airflow2 when run with Airflow 2.11, as
   `make demo-airflow2` does) with its SQLite database, created on first use.
2. `gpumarket-sim --execute-onstart` on a free loopback port, with its clock sped up.
3. `airflow dags test example_gpumarket_training` against it.
4. A summary from the simulator's ledger: offer rented, instance, what the job printed, duration, cost, and the
   number of instances still alive (must be 0).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
AIRFLOW_2 = version("apache-airflow").startswith("2.")  # `make demo` runs 3.3.2; run from .venv-airflow2 for 2.11
# `make test-wheel` runs the demo from a clean install of the wheel, in an Airflow home of its own.
AIRFLOW_HOME = Path(
    os.environ.get("GPUMARKET_DEMO_HOME") or (ROOT / ".airflow" / "airflow2" if AIRFLOW_2 else ROOT / ".airflow")
)
DAG_ID = "example_gpumarket_training"
SPEED = "60"  # simulated seconds per real second: a 1-5 minute boot takes 1-5 seconds
LOG_LINE = re.compile(
    # Airflow 2.11: "[2026-01-01T00:00:00.000+0000] {file.py:12} INFO - message"
    r"\[\d{4}-\d\d-\d\dT(?P<time>\d\d:\d\d:\d\d)\.\d+[+-]\d{4}\] \{[^}]*\} (?P<level>\w+) - (?P<message>.*)"
    if AIRFLOW_2
    # Airflow 3: "2026-01-01T00:00:00.000000Z [info     ] message [logger] loc=..."
    else r"T(?P<time>\d\d:\d\d:\d\d)\.\d+Z \[(?P<level>\w+)\s*\] (?P<message>.*?) \[airflow"
)


def airflow_env(conn_uri: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        AIRFLOW_HOME=str(AIRFLOW_HOME),
        AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "example_dags" / f"{DAG_ID}.py"),  # parse the demo's DAG alone
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__UNIT_TEST_MODE="False",
        GPUMARKET_POLL_INTERVAL="1",
    )
    if conn_uri:
        env["AIRFLOW_CONN_GPUMARKET_DEFAULT"] = conn_uri
    return env


def step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def main() -> int:
    started = time.time()
    AIRFLOW_HOME.mkdir(parents=True, exist_ok=True)
    if not (AIRFLOW_HOME / "airflow.db").exists():
        step(f"Creating the Airflow metadata database in {AIRFLOW_HOME}/ (first run only)")
        subprocess.run(
            [str(BIN / "airflow"), "db", "migrate"], env=airflow_env(), check=True, stdout=subprocess.DEVNULL
        )

    step("Starting the embedded marketplace simulator (gpumarket-sim --execute-onstart)")
    sim = subprocess.Popen(
        [str(BIN / "gpumarket-sim"), "--port", "0", "--speed", SPEED, "--seed", "7", "--execute-onstart"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        first_line = sim.stdout.readline().strip() if sim.stdout else ""
        print(f"    {first_line}")
        url = next(word for word in first_line.split() if word.startswith("http://"))
        conn_uri = first_line.split("AIRFLOW_CONN_GPUMARKET_DEFAULT=", 1)[1].split()[0]

        step(f"Running the DAG {DAG_ID} with `airflow dags test`")
        log_path = AIRFLOW_HOME / "demo-dag-test.log"
        with open(log_path, "w") as log:
            result = subprocess.run(
                [str(BIN / "airflow"), "dags", "test", DAG_ID],
                env=airflow_env(conn_uri),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        interesting = ("Renting offer", "Created instance", "status", "job", "Destroyed", "Failover", "rror")
        for line in log_path.read_text().splitlines():
            match = LOG_LINE.search(line)
            if match and match["level"].lower() != "debug" and any(word in match["message"] for word in interesting):
                print(f"    {match['time']}  {match['message']}")
        summary(url, result.returncode, started, log_path)
        alive = [i for i in get_json(f"{url}/_sim/state")["instances"] if not i.get("destroyed")]
        return 0 if result.returncode == 0 and not alive else 1
    finally:
        sim.terminate()
        sim.wait(timeout=10)


def summary(url: str, returncode: int, started: float, log_path: Path) -> None:
    state = get_json(f"{url}/_sim/state")
    instances = state["instances"]
    offers = {o["id"]: o for o in state.get("offers", [])}
    step("Summary (from the simulator's ledger)")
    print(f"    DAG run:            {'succeeded' if returncode == 0 else f'FAILED (see {log_path})'}")
    for inst in instances:
        offer = offers.get(inst.get("offer_id"), {})
        print(
            f"    instance {inst['id']}:        offer {inst.get('offer_id')} ({offer.get('gpu_name', '?')}, "
            f"${offer.get('dph_total', '?')}/h), "
            + ("destroyed" if inst.get("destroyed") else f"STILL ALIVE in status {inst.get('actual_status')!r}")
        )
        print(
            f"      billed:           {inst.get('compute_seconds', 0):.0f} s compute, "
            f"{inst.get('storage_seconds', 0):.0f} s storage (simulated), cost ${inst.get('cost', 0):.4f}"
        )
        output = (inst.get("onstart") or {}).get("output") if isinstance(inst.get("onstart"), dict) else None
        if output is None:
            try:
                output = get_json(f"{url}/_sim/instances/{inst['id']}/onstart").get("output")
            except Exception:  # older simulators: the output is optional in the summary
                output = None
        if output:
            print("      the job printed:")
            for line in output.strip().splitlines()[-12:]:
                print(f"        | {line}")
    alive = [i for i in instances if not i.get("destroyed")]
    print(f"    wall-clock time:    {time.time() - started:.1f} s")
    print(f"    instances alive:    {len(alive)} (must be 0)")


if __name__ == "__main__":
    sys.exit(main())
