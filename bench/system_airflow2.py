"""A real Airflow 2.11 deployment (scheduler and triggerer as separate processes) against the simulator, for the
one guarantee that works differently there: Airflow 2.11 never calls a trigger's ``on_kill``, so a deferred task
marked failed is seen by the trigger's ``cleanup``, which must destroy then and only then.

Run with the 2.11 environment: ``make system-airflow2`` (about 3 minutes). Three scenarios:

- ``mark_failed_deferred``: the job defers; the task is marked failed the way 2.11's UI does it
  (``DAG.set_task_instance_state``); the instance must be destroyed within 30 s.
- ``triggerer_stop``: the job defers; the triggerer gets SIGTERM (its triggers' ``cleanup`` runs with the task
  still deferred) and is started again 5 s later; the job must run to its end (exit code 0) and succeed on the
  instance it had.
- ``lost_worker`` (then, alone): ``kill -9`` of a running job's task processes, ``retries=0``; the failure
  callback that 2.11's DAG processor runs must destroy the instance within 120 s.

SQLite with 2.11's SequentialExecutor (2.11 refuses SQLite with any other executor): enough here, as the first
two tasks spend their time deferred and the third runs alone. Processes, simulator and its admin surface are
``tests/system/deployment.py``'s. Prints one ``SYS2`` line per scenario and ``SYS2 alive_total``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

from tests.system.deployment import BIN, HEARTBEAT_TIMEOUT, Processes, Simulator, start_simulator

COMPONENTS = ("scheduler", "triggerer")
JOB_RUNNING = 3  # seconds the lost worker's job runs before its task processes are killed
TRIGGERER_DOWN = 5  # seconds between the triggerer's SIGTERM and its restart, as in a rolling restart
DAGS = """
from datetime import datetime
from airflow.providers.common.compat.sdk import DAG
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

for name, command, deferrable in (
    ("mark_failed_deferred", "sleep 600", True),
    ("triggerer_stop", "sleep 45", True),
    ("lost_worker", "sleep 100000", False),
):
    with DAG(f"sys2_{name}", start_date=datetime(2026, 1, 1), schedule=None, catchup=False):
        GpuMarketRunJobOperator(task_id="job", offer_filters={"gpu_name": {"eq": f"sys-{name}"}}, image="img",
                                command=command, deferrable=deferrable, poll_interval=2, retries=0)
"""
SCENARIOS = ("mark_failed_deferred", "triggerer_stop", "lost_worker")


def main() -> int:
    home = Path(tempfile.mkdtemp(prefix="gpm-system-airflow2-"))
    (home / "dags").mkdir()
    (home / "dags" / "sys2_dags.py").write_text(textwrap.dedent(DAGS))
    world = {
        "offers": [{"id": 800_000 + n, "gpu_name": f"sys-{name}", "dph_total": 1.0} for n, name in enumerate(SCENARIOS)]
    }
    (home / "world.json").write_text(json.dumps(world))
    processes = Processes(home)
    try:
        sim, conn_uri = start_simulator(processes, home / "world.json")
        env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # the executor runs `airflow tasks run`
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "SequentialExecutor",
            "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "5",
            # 2.11's name for what 3.x calls task_instance_heartbeat_timeout (300 s by default), as in make system
            "AIRFLOW__SCHEDULER__SCHEDULER_ZOMBIE_TASK_THRESHOLD": str(HEARTBEAT_TIMEOUT),
            "AIRFLOW_CONN_GPUMARKET_DEFAULT": conn_uri,
        }
        os.environ.update(env)  # this process reads the same metadata database
        subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True)
        for component in COMPONENTS:
            processes.start(component, [str(BIN / "airflow"), component], env, f"{component}.log")
        print(f"SYS2 Airflow home {home}; simulator at {sim.url}", flush=True)

        from airflow.models.dagbag import DagBag

        bag = DagBag(str(home / "dags"), include_examples=False)
        subprocess.run([str(BIN / "airflow"), "dags", "reserialize"], env=env, check=True, capture_output=True)
        for name in SCENARIOS[:2]:  # lost_worker holds the SequentialExecutor: it runs once these two are done
            _trigger(env, name)

        _wait(
            lambda: all(_state(f"sys2_{n}") == "deferred" for n in SCENARIOS[:2]), 180, "both tasks deferred", processes
        )
        marked = time.time()
        from airflow.utils.state import TaskInstanceState

        bag.get_dag("sys2_mark_failed_deferred").set_task_instance_state(
            task_id="job", run_id="run", state=TaskInstanceState.FAILED
        )
        destroyed = _wait(lambda: _destroyed_at(sim, "sys-mark_failed_deferred"), 60, "the marked task's destroy")
        print(
            f"SYS2 mark_failed_deferred: destroyed {destroyed - marked:.1f} s after the mark (goal: <= 30 s)"
            if destroyed
            else "SYS2 mark_failed_deferred: NOT destroyed within 60 s",
            flush=True,
        )
        triggerer = processes.started["triggerer"]
        triggerer.send_signal(signal.SIGTERM)
        triggerer.wait(timeout=60)
        time.sleep(TRIGGERER_DOWN)
        processes.start("triggerer", [str(BIN / "airflow"), "triggerer"], env, "triggerer.log")

        outcome = _wait(
            lambda: _state("sys2_triggerer_stop") in ("success", "failed") and _state("sys2_triggerer_stop"),
            240,
            "triggerer_stop's end",
            processes,
        )
        rentals = _instances(sim, "sys-triggerer_stop")
        # Gone is success for a job, so a wrong destroy would pass as one: the job itself must have run to its end.
        exit_code = sim.get(f"/_sim/instances/{rentals[0]['id']}/onstart").get("exit_code") if rentals else None
        print(
            f"SYS2 triggerer_stop: task {outcome}, {len(rentals)} instance(s) rented, job exit code {exit_code} "
            "(goal: success, 1, 0)",
            flush=True,
        )

        # The worker lost: kill -9 of `airflow tasks run` and its task process while the job runs; 2.11's scheduler
        # hears from the executor that the task died and its DAG processor runs the failure callbacks.
        _trigger(env, "lost_worker")
        _wait(
            lambda: [i for i in _instances(sim, "sys-lost_worker") if i.get("actual_status") == "running"],
            180,
            "lost_worker's instance running",
            processes,
        )
        time.sleep(JOB_RUNNING)  # the job past its start, as a worker is lost mid-job
        for process in psutil.process_iter(["cmdline"]):
            if "sys2_lost_worker" in " ".join(process.info["cmdline"] or []):
                process.kill()
        killed = time.time()
        gone = _wait(lambda: _destroyed_at(sim, "sys-lost_worker"), 180, "lost_worker's destroy", processes)
        # The callback runs inside Airflow's failure handling, before the failed state is written.
        lost_state = _wait(lambda: _state("sys2_lost_worker") == "failed" and "failed", 60, "lost_worker's TI failed")
        print(
            f"SYS2 lost_worker: TI {lost_state}, destroyed {gone - killed:.1f} s after the kill -9 (goal: <= 120 s)"
            if gone
            else f"SYS2 lost_worker: TI {lost_state}, NOT destroyed within 180 s of the kill -9",
            flush=True,
        )
        alive = [i for i in _instances(sim, None) if not i.get("destroyed")]
        print(f"SYS2 alive_total: {len(alive)} (goal: 0)", flush=True)
        ok = (
            destroyed
            and outcome == "success"
            and len(rentals) == 1
            and exit_code == 0
            and gone
            and lost_state == "failed"
            and not alive
        )
        return 0 if ok else 1
    finally:
        processes.stop_all()  # the process groups and what left them (DAG processors, onstart scripts)


def _trigger(env: dict, name: str) -> None:
    for command in (["dags", "unpause", f"sys2_{name}"], ["dags", "trigger", f"sys2_{name}", "-r", "run"]):
        subprocess.run([str(BIN / "airflow"), *command], env=env, check=True, capture_output=True)


def _wait(condition, timeout: float, what: str, processes: Processes | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = processes.died(COMPONENTS + ("simulator",)) if processes else {}
        if dead:
            raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}; see its log")
        value = condition()
        if value:
            return value
        time.sleep(0.5)  # a look every half second: destroy times are read from the simulator's clock
    print(f"SYS2 timed out waiting for {what}", flush=True)
    return None


def _state(dag_id: str) -> str | None:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.query(TaskInstance.state).filter_by(dag_id=dag_id, task_id="job").one_or_none()
    return None if row is None else row[0]


def _instances(sim: Simulator, gpu_name: str | None) -> list[dict]:
    return [i for i in sim.refresh() if gpu_name is None or i.get("gpu_name") == gpu_name]


def _destroyed_at(sim: Simulator, gpu_name: str) -> float | None:
    """Real epoch second when the simulator destroyed the scenario's instance, None while it is alive."""
    instances = _instances(sim, gpu_name)
    if not instances or not instances[0].get("destroyed"):
        return None
    return sim.real_time(instances[0]["destroyed_at"])


if __name__ == "__main__":
    sys.exit(main())
