"""`make system`: a system test of a real Airflow 3 deployment against the embedded simulator.

1. A fresh Airflow home under .airflow/system-<time> (ignored by git): PostgreSQL (tests/system/postgres.py, a
   throwaway server on a loopback port), DAGs from bench/system_dags, short heartbeat/trigger timeouts so the
   failure scenarios are quick.
2. `gpumarket-sim --execute-onstart` (its own process, clock at SPEED x), then the deployment's shape (`--shape`):
   production (default) is Redis, `airflow api-server`, two `scheduler`s, a `dag-processor`, two `triggerer`s
   and two `celery worker`s (CeleryExecutor); small is the LocalExecutor with one scheduler and one triggerer.
   Each process runs in its own process group, logging to files in the Airflow home.
3. The scenarios (GOALS below; `--scenarios a,b` runs some of them), one DAG each
   (bench/system_dags/system_dags.py), run concurrently where they do not interfere
   (triggerer_restart waits until no other scenario is deferred). Each rents only its own `sys-<scenario>` offers.
   They are driven through the api-server's REST API v2 (trigger, read the task instance, mark it failed), `ps`
   (psutil) to find and kill task processes, and the simulator's admin surface `/_sim/...`.
4. `SYS deployment: executor=... database=postgresql schedulers=N triggerers=N workers=N`, one line per scenario,
   `SYS <name>: PASS|FAIL billed_after_failure=<s> alive=<n> (goal: ...)`, and last
   `SYS: <passed>/<total> scenarios pass, <n> instances alive`. Nothing is destroyed by this script: it counts
   what is alive, stops the processes it started (also on failure or Ctrl-C), and exits non-zero if any scenario
   missed its goal.

    python -m bench.system                       # every scenario (make system)
    python -m bench.system --scenarios mark_failed_deferred,triggerer_restart

The Airflow is the one of the Python that runs the script: `make system-airflow32` runs the deferred scenarios
with Airflow 3.2, whose triggerer calls a trigger's cleanup and never its on_kill.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import psutil

from tests.system.deployment import (
    HEARTBEAT_TIMEOUT,
    PRODUCTION,
    ROOT,
    SMALL,
    SPEED,
    WORKER_CONCURRENCY,
    AirflowApi,
    Deployment,
    Shape,
    Simulator,
    Workload,
    interrupt_on_signals,
)

DAGS_FOLDER = ROOT / "bench" / "system_dags"
SUPERVISE_INTERVAL = 2.0  # seconds between two looks for components that died on their own
EXECUTION_TIMEOUT = 25  # the execution_timeout of the execution_timeout_* DAGs, seconds
TRIGGERER_DOWN = 10  # seconds between killing the triggerer and starting a new one
POSTGRES_DOWN = 10  # seconds PostgreSQL stays down in postgres_restart
TRIGGER_SPACING = 0.5  # seconds between the starts of two scenarios
RUN_BUDGET = 630  # seconds from the script's start until every wait gives up: with the teardown, under 12 minutes
FINISHED = {"success", "failed", "skipped", "upstream_failed", "removed"}
T = TypeVar("T")


# The scenarios, in the order they are reported; the DAG file has the same names (system_<name>, sys-<name>).
GOALS = {
    "deferred_happy": "deferred with no task process, the job's lines in the task log each once, success, 0 alive",
    "short_job_deferred": "a 3-second deferred job's three lines each once in the task log, success, 0 alive",
    "mark_failed_deferred": "destroyed <= 30 s after the PATCH, 0 alive",
    "mark_failed_running": "destroyed <= 30 s after the PATCH, 0 alive",
    "kill9_retry": "the rental in the task state store while the job runs; the retry reconnects through it, "
    "success on the only instance, 0 alive",
    "lost_worker": "destroyed <= 120 s after Airflow failed the TI, 0 alive",
    "lost_worker_mapped": "the same for a mapped @task.gpumarket (map index 0), 0 alive",
    "triggerer_restart": "success across a triggerer kill -9 and restart, 0 alive",
    "exit3": "TI failed, destroyed by the time it ended (<= 1 s), its output and 'exit status 3' in the task log",
    "exit3_deferred": "the same, deferred: the trigger reads the output, the exception names the exit status",
    "execution_timeout_deferred": f"TI failed, destroyed <= 30 s after start_date + {EXECUTION_TIMEOUT} s, 0 alive",
    "execution_timeout_sync": f"TI failed, destroyed <= 30 s after start_date + {EXECUTION_TIMEOUT} s, 0 alive",
    "interruptible": "a deferred interruptible job outbid twice finishes on its third rental, on three machines, one "
    "rental alive at a time, billed at its bids; 0 alive",
    # High availability (production shape only), each alone after the others: the fault touches every scenario.
    "triggerer_ha": "kill -9 the triggerer running a deferred job, no restart: the other resumes it; no destroy, "
    "one rental, every line in the task log, success, 0 alive",
    "scheduler_kill": "kill -9 one of two schedulers while a sync job runs: success on its one rental, 0 alive",
    "worker_kill": "kill -9 the Celery worker running a sync job, retries=0: destroyed <= 120 s after Airflow "
    "failed the TI, 0 alive",
    "postgres_restart": f"PostgreSQL down {POSTGRES_DOWN} s under a deferred and a sync job: both succeed on one "
    "rental each, every component healthy again, 0 alive",
}
#: Scenarios that disturb every other one: each runs alone, after all the others, in this order.
ALONE = ("triggerer_restart", "triggerer_ha", "scheduler_kill", "worker_kill", "postgres_restart")
#: The ones that need two schedulers, triggerers and Celery workers (skipped on the small shape).
HA = ("triggerer_ha", "scheduler_kill", "worker_kill", "postgres_restart")


class Miss(Exception):
    """The scenario missed its goal; the message says how."""


class Interrupted(Exception):
    """Ctrl-C, SIGTERM or the run's time budget: scenarios stop waiting."""


def short(cmdline: str) -> str:
    """A command line with its paths cut to their last part: "python airflow dag-processor"."""
    return " ".join(os.path.basename(word) if word.startswith("/") else word for word in cmdline.split())


def epoch(iso: str | None) -> float | None:
    """An Airflow API datetime ("2026-01-01T10:00:00.123456Z") as epoch seconds."""
    return datetime.fromisoformat(iso).timestamp() if iso else None


def _system_offers() -> tuple[dict, ...]:
    """Two offers per scenario, `sys-<scenario>`, so scenarios never compete and a second rental shows."""
    return tuple(
        {"id": 700_000 + 10 * n + k, "gpu_name": f"sys-{name}", "dph_total": 1.0 + k / 10, "reliability": 0.99}
        for n, name in enumerate(GOALS)
        for k in range(3 if name == "interruptible" else 2)  # a preemption never rents the same machine again
    )


SYSTEM = Workload(
    "system", DAGS_FOLDER, frozenset(f"system_{n}" for n in GOALS), _system_offers(), SPEED, WORKER_CONCURRENCY
)


# --- scenarios ---------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    name: str
    reason: str | None = None  # None: the goal was met
    billed: str = "n/a"  # seconds billed after the failure's reference point, ">N" while still alive
    finished: bool = False  # the scenario ran to its end (met its goal or missed it)


class Scenario:
    """One scenario's DAG run: its task instance (REST API), its instances (simulator) and bounded waits."""

    def __init__(self, name: str, harness: Harness) -> None:
        self.name = name
        self.h = harness
        self.dag_id = f"system_{name}"
        self.gpu = f"sys-{name}"
        self.run_id: str | None = None
        self.last_ti: dict = {}
        self.outcome = Outcome(name)

    def say(self, text: str) -> None:
        self.h.say(f"{self.name}: {text}")

    # REST API
    def triggerer_running_the_trigger(self) -> str:
        """The component whose triggerer job runs this TI's trigger: Airflow names the trigger's log file after
        that job's id (``attempt=N.log.trigger.<job id>.log``), and the job's hostname is the component's name."""
        files = sorted(self.log_folder.glob("attempt=*.log.trigger.*.log"), key=lambda path: path.stat().st_mtime)
        if not files:
            raise Miss(f"no trigger log file under {self.log_folder}")
        job_id = int(files[-1].name.split(".trigger.")[1].split(".")[0])
        jobs = self.h.api.call("GET", "/jobs", job_type="TriggererJob", limit=100)["jobs"]
        host = next((job["hostname"] for job in jobs if job["id"] == job_id), None)
        if host not in self.h.deployment.shape.of("triggerer"):
            raise Miss(f"triggerer job {job_id} runs the trigger, on host {host!r}: not one of this deployment's")
        return host

    def run_state(self) -> str | None:
        return self.h.api.call("GET", f"/dags/{self.dag_id}/dagRuns/{self.run_id}").get("state")

    def trigger(self) -> None:
        """Create the DAG run under a run id of our own, so a retried POST can never make a second run."""
        run_id = f"system-{time.strftime('%H%M%S')}-{secrets.token_hex(3)}"
        try:
            self.h.api.call("POST", f"/dags/{self.dag_id}/dagRuns", {"logical_date": None, "dag_run_id": run_id})
        except RuntimeError as exc:
            if "HTTP 409" not in str(exc):  # 409: an earlier try of this POST did create it
                raise
        self.run_id = run_id
        self.say(f"triggered run {self.run_id}")

    @property
    def ti_path(self) -> str:
        """The TI in the REST API (a mapped scenario's task has one mapped TI, map index 0)."""
        mapped = "/0" if self.name.endswith("_mapped") else ""
        return f"/dags/{self.dag_id}/dagRuns/{self.run_id}/taskInstances/job{mapped}"

    def ti(self) -> dict:
        self.last_ti = self.h.api.call("GET", self.ti_path, ok404=True) or {}
        return self.last_ti

    def state(self) -> str | None:
        return self.ti().get("state")

    def state_store(self) -> dict:
        """The TI's task state store entries (Airflow 3.3+), key -> value, through the REST API."""
        found = self.h.api.call("GET", f"{self.ti_path}/state-store", ok404=True) or {}
        entries = {entry["key"]: entry["value"] for entry in found.get("task_state_store", [])}
        return {k: json.loads(v) if isinstance(v, str) and v.startswith("{") else v for k, v in entries.items()}

    def mark_failed(self) -> None:
        self.h.api.call("PATCH", self.ti_path, {"new_state": "failed"})

    # simulator
    def instances(self) -> list[dict]:
        return self.h.sim.of_gpu(self.gpu)

    def running_instance(self) -> dict | None:
        return next((i for i in self.instances() if i.get("actual_status") == "running" and not i["destroyed"]), None)

    def destroyed_at(self, instance_id: int) -> float | None:
        """Real epoch second when the simulator destroyed the instance, None while it is alive."""
        found = next((i for i in self.instances() if i["id"] == instance_id), None)
        if found is None or not found["destroyed"]:
            return None
        return self.h.sim.real_time(found["destroyed_at"])

    @property
    def log_folder(self) -> Path:
        """Where Airflow writes the log files of this run's task ``job``."""
        return self.h.deployment.home / "logs" / f"dag_id={self.dag_id}" / f"run_id={self.run_id}" / "task_id=job"

    def task_log(self) -> str:
        """Every log file of this run's task (the worker's, and the triggerer's for deferred waits)."""
        files = sorted(self.log_folder.rglob("*"))
        return "".join(path.read_text(errors="replace") for path in files if path.is_file())

    def task_messages(self) -> str:
        """The messages of the task's log lines in time order, one per line (Airflow 3 writes JSON lines): a job
        line the task log shows is a whole message, not a piece of a longer one such as the trigger's event, which
        Airflow logs whole with the lines it carries."""
        timed = []  # (timestamp, message): the worker's and the triggerer's files merged in time, as the UI shows them
        for line in self.task_log().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                timed.append((str(record.get("timestamp", "")), str(record.get("event", ""))))
        return "\n".join(message for _, message in sorted(timed, key=lambda pair: pair[0]))

    def job_output(self, instance_id: int) -> str:
        return self.h.sim.get(f"/_sim/instances/{instance_id}/onstart").get("output") or ""

    def describe(self) -> str:
        shown = ", ".join(
            f"{i['id']} {'destroyed' if i['destroyed'] else repr(i.get('actual_status'))}" for i in self.instances()
        )
        return f"TI {self.last_ti.get('state')!r} try {self.last_ti.get('try_number')}; instances: {shown or 'none'}"

    def wait(self, what: str, timeout: float, check: Callable[[], T | None], interval: float = 1.0) -> T:
        """Poll `check` until it returns something truthy; Miss after `timeout` seconds."""
        deadline = min(time.time() + timeout, self.h.deadline)
        while True:
            if self.h.stop.is_set():
                raise Interrupted()
            result = check()
            if result:
                return result
            if time.time() > deadline:
                if time.time() >= self.h.deadline:
                    raise Miss(f"run budget of {RUN_BUDGET} s spent waiting for {what} ({self.describe()})")
                raise Miss(f"no {what} within {timeout:.0f} s ({self.describe()})")
            time.sleep(interval)

    def wait_running(self, ti_state: str) -> dict:
        """Until the TI is in `ti_state` and its instance is running; returns the instance."""
        instance = self.wait(
            f"TI {ti_state} with its instance running",
            180,
            lambda: self.running_instance() if self.state() == ti_state else None,
        )
        self.say(f"TI {ti_state}, instance {instance['id']} running")
        return instance

    def wait_finished(self, timeout: float) -> str:
        return self.wait("end of the TI", timeout, lambda: s if (s := self.state()) in FINISHED else None)

    def wait_destroyed(self, instance_id: int, since: float, after: str, limit: float) -> float:
        """Seconds from `since` (the moment `after` names) to the instance's destroy, which must come within
        `limit` seconds; when it does not, the figure is shown as '>N'."""
        try:
            destroyed = self.wait(
                f"destroy of instance {instance_id}",
                since + limit + 5 - time.time(),
                lambda: self.destroyed_at(instance_id),
            )
        except Miss:
            self.outcome.billed = f">{time.time() - since:.0f}"
            raise Miss(
                f"instance {instance_id} still alive {time.time() - since:.0f} s after {after} ({self.describe()})"
            ) from None
        billed = round(destroyed - since, 1) + 0.0  # + 0.0: never print "-0.0"
        self.outcome.billed = f"{billed:.1f}"
        self.say(f"instance {instance_id} destroyed {billed:.1f} s after {after}")
        if billed > limit:
            raise Miss(f"instance {instance_id} destroyed {billed:.1f} s after {after} (limit {limit} s)")
        return billed

    def wait_all_destroyed(self, timeout: float = 30) -> None:
        self.wait(
            "destroy of every instance of this scenario",
            timeout,
            lambda: all(i["destroyed"] for i in self.instances()) and self.instances(),
        )

    def expect_state(self, wanted: str, timeout: float = 60) -> None:
        final = self.wait_finished(timeout)
        if final != wanted:
            raise Miss(f"TI ended {final!r}, expected {wanted!r} ({self.describe()})")

    def kill_task(self) -> None:
        """kill -9 the TI's supervisor and task runner (found by the TI id in their titles) and their children;
        only processes under our scheduler are touched."""
        ti_id = str(self.ti()["id"])
        parents = self.h.deployment.task_parents()

        def ours() -> list[psutil.Process]:
            found = []
            for process in self.h.deployment.task_processes(ti_id):
                try:
                    if parents & {parent.pid for parent in process.parents()}:
                        found.append(process)
                except psutil.NoSuchProcess:
                    pass
            return found

        found = self.wait("supervisor process", 30, ours)
        victims = {p.pid: p for p in found}
        for process in found:
            victims.update({c.pid: c for c in process.children(recursive=True)})
        for process in victims.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        titles = sorted(" ".join(p.info["cmdline"] or []).strip()[:70] for p in found)
        self.say(f"kill -9 {sorted(victims)} ({'; '.join(titles)})")


def deferred_happy(s: Scenario) -> None:
    s.trigger()
    s.wait_running("deferred")
    ti_id = str(s.last_ti["id"])
    deferred_seen = time.time()
    holders: set[str] = set()
    samples = 0

    def finished() -> str | None:
        nonlocal samples
        state = s.state()
        # A few seconds of grace: the supervisor exits right after it reports the deferral.
        if state == "deferred" and time.time() - deferred_seen > 5:
            samples += 1
            holders.update(
                f"{p.pid} {' '.join(p.info['cmdline'] or [])[:60]}" for p in s.h.deployment.task_processes(ti_id)
            )
        return state if state in FINISHED else None

    final = s.wait("end of the TI", 180, finished)
    s.say(f"{samples} looks at the process table while deferred: {len(holders)} task process(es) for the TI")
    if holders:
        raise Miss(f"task processes existed while the TI was deferred: {sorted(holders)}")
    if final != "success":
        raise Miss(f"TI ended {final!r} ({s.describe()})")
    s.wait_all_destroyed()
    # The trigger read the job's output while it ran and once more after it stopped its instance: every line
    # once, in order.
    ticks = re.findall(r"^\[instance \d+\] (tick \d)$", s.task_messages(), re.M)
    s.say(f"job lines in the task log: {ticks}")
    if ticks != [f"tick {i}" for i in range(1, 9)]:
        raise Miss(f"expected the job's 8 tick lines once each, in order; found {ticks}")


def short_job(s: Scenario) -> None:
    """A job too short for any read while it runs: its lines come from the final read of the stopped instance."""
    s.trigger()
    s.expect_state("success", 180)
    s.wait_all_destroyed()
    (instance,) = s.instances()
    first = re.search(r"^first [0-9a-f]{12}$", s.job_output(instance["id"]), re.M)
    wanted = [first.group(0) if first else "first ?", "second", "third"]
    shown = re.findall(r"^\[instance \d+\] (first [0-9a-f]{12}|second|third)$", s.task_messages(), re.M)
    s.say(
        f"task log shows {shown}; billed {instance['compute_seconds']:.0f} simulated s of compute, "
        f"{instance['storage_seconds'] - instance['compute_seconds']:.0f} s of storage only (simulator at {SPEED:g}x)"
    )
    if shown != wanted:
        raise Miss(f"expected {wanted} once each in the task log; found {shown}")


def mark_failed(s: Scenario, deferred: bool) -> None:
    s.trigger()
    instance = s.wait_running("deferred" if deferred else "running")
    patched = time.time()
    s.mark_failed()
    s.say("TI marked failed through PATCH .../taskInstances/job {new_state: failed}")
    s.wait_destroyed(instance["id"], patched, "the PATCH", 30)
    s.expect_state("failed", 30)


def kill9(s: Scenario, retry: bool) -> None:
    s.trigger()
    instance = s.wait_running("running")
    if retry:  # durable (Airflow 3.3+): the rental is in the task state store, visible through the REST API
        store = s.wait("the rental in the task state store", 30, lambda: s.state_store().get("gpumarket_rental"))
        if store.get("instance_id") != instance["id"]:
            raise Miss(f"the task state store names {store!r}, not instance {instance['id']}")
        s.say(f"the task state store holds {store} (REST API) while the job runs")
    s.kill_task()
    killed = time.time()
    if retry:
        final = s.wait(
            "end of the retry",
            240,
            lambda: st if (st := s.state()) in FINISHED and s.last_ti["try_number"] > 1 else None,
        )
        created = s.instances()
        if len(created) != 1:
            raise Miss(f"{len(created)} instances rented for one task instance: {[i['id'] for i in created]}")
        if final != "success":
            raise Miss(f"retry ended {final!r} ({s.describe()})")
        if f"the task state store names instance {instance['id']}" not in s.task_log():
            raise Miss("the retry did not reconnect through the task state store (its log does not say so)")
        s.say("the retry reconnected to its rental through the task state store")
        s.wait_all_destroyed()
        return
    s.expect_state("failed", HEARTBEAT_TIMEOUT + 90)
    failed_at = epoch(s.last_ti["end_date"])
    assert failed_at is not None
    s.say(f"Airflow failed the TI {failed_at - killed:.0f} s after the kill (its end_date)")
    s.wait_destroyed(instance["id"], failed_at, "Airflow failed the TI", 120)


def wait_alone(s: Scenario) -> None:
    """Until every scenario that is not ALONE, and every ALONE one before this, has ended."""
    earlier = ALONE[: ALONE.index(s.name)]
    for other, thread in s.h.threads.items():
        if other == s.name or (other in ALONE and other not in earlier):
            continue
        while thread.is_alive():
            if s.h.stop.is_set():
                raise Interrupted()
            if time.time() > s.h.deadline:
                raise Miss(f"run budget spent waiting for {other} to end first")
            thread.join(0.5)


def triggerer_restart(s: Scenario) -> None:
    wait_alone(s)
    s.trigger()
    s.wait_running("deferred")
    time.sleep(2)
    victim = s.h.deployment.shape.of("triggerer")[0]  # with two, the other takes its triggers over
    s.h.deployment.processes.kill_group(victim)
    s.say(f"{victim} killed (kill -9 of its process group); restarting it in {TRIGGERER_DOWN} s")
    time.sleep(TRIGGERER_DOWN)
    s.h.deployment.start_component(victim)
    s.say(f"{victim} restarted")
    s.expect_state("success", 180)
    s.wait_all_destroyed()


def exit3(s: Scenario) -> None:
    s.trigger()
    s.expect_state("failed", 180)
    ended = epoch(s.last_ti["end_date"])
    assert ended is not None
    instances = s.instances()
    if not instances:
        raise Miss("no instance was rented")
    for instance in instances:
        s.wait_destroyed(instance["id"], ended, "the TI ended", 1)
    computed = re.search(r"^computed [0-9a-f]{12}$", s.job_output(instances[-1]["id"]), re.M)
    log = s.task_log()
    wanted = (("the computed line", computed.group(0) if computed else "?"), ("the status", "exit status 3"))
    missing = [what for what, text in wanted if text not in log]
    if missing:
        raise Miss(f"not in the task log: {', '.join(missing)} ({len(log)} characters of log)")
    s.say(f"task log shows {computed.group(0) if computed else '?'!r} and 'exit status 3'")


def execution_timeout(s: Scenario, deferred: bool) -> None:
    """The instance may still be booting when the timeout ends (creates queue behind the live rate limit when all
    scenarios start together): the goal is the same either way."""
    s.trigger()
    wanted = "deferred" if deferred else "running"
    instance = s.wait(
        f"TI {wanted} with an instance",
        120,
        lambda: next(iter(s.instances()), None) if s.state() == wanted else None,
    )
    s.say(f"TI {wanted}, instance {instance['id']} {instance.get('actual_status')!r}")
    started = epoch(s.last_ti["start_date"])
    assert started is not None
    limit = started + EXECUTION_TIMEOUT
    try:
        s.wait_destroyed(instance["id"], limit, f"start_date + {EXECUTION_TIMEOUT} s", 30)
    except Miss as miss:
        raise Miss(f"{miss}; TI {s.state()!r} {time.time() - started:.0f} s after its start_date") from None
    s.expect_state("failed", 30)


def survive_the_kill(s: Scenario, victim: str, what: str) -> None:
    """kill -9 the component ``victim`` and leave it down until the task succeeds (then start it again, as a
    service manager would): the other one of its kind carries the job on, on its one rental."""
    s.h.deployment.processes.kill_group(victim)
    killed = time.time()
    s.say(f"{victim} {what}killed with kill -9; not restarted until the job ends")
    try:
        s.expect_state("success", 180)
    finally:
        s.h.deployment.start_component(victim)
    s.say(f"success {time.time() - killed:.0f} s after the kill")
    s.wait_all_destroyed()
    rented = s.instances()
    if len(rented) != 1:
        raise Miss(f"{len(rented)} instances rented for one task instance")


def triggerer_ha(s: Scenario) -> None:
    """The triggerer that runs the trigger dies for good: the other one takes the trigger over once the dead one's
    heartbeat is older than [triggerer] triggerer_health_check_threshold, and the new copy resumes the wait."""
    wait_alone(s)
    s.trigger()
    s.wait_running("deferred")
    time.sleep(4)  # a few lines read by the first triggerer
    survive_the_kill(s, s.triggerer_running_the_trigger(), "(running the trigger) ")
    ticks = re.findall(r"^\[instance \d+\] (tick \d+)$", s.task_messages(), re.M)
    s.say(f"job lines in the task log: {ticks}")
    # Every line, in order; a resumed wait may show some again (it says so), never out of order.
    if list(dict.fromkeys(ticks)) != [f"tick {i}" for i in range(1, 13)]:
        raise Miss(f"expected ticks 1-12 in order (repeats only where marked); found {ticks}")


def scheduler_kill(s: Scenario) -> None:
    """One of two schedulers dies mid-run: the job, running in a Celery worker, does not depend on it."""
    wait_alone(s)
    s.trigger()
    s.wait_running("running")
    survive_the_kill(s, s.h.deployment.shape.of("scheduler")[0], "")


def worker_kill(s: Scenario) -> None:
    """The machine of a Celery worker is lost with a job on it: kill -9 the worker and everything under it."""
    wait_alone(s)
    s.trigger()
    instance = s.wait_running("running")
    ti_id = str(s.ti()["id"])
    deployment = s.h.deployment
    runner = deployment.task_processes(ti_id)
    workers = {deployment.processes.started[n].pid: n for n in deployment.shape.of("worker")}
    victim = next((workers[a.pid] for p in runner for a in p.parents() if a.pid in workers), None)
    if victim is None:
        raise Miss(f"no Celery worker found above the task's processes {[p.pid for p in runner]}")
    process = psutil.Process(deployment.processes.started[victim].pid)
    everything = [process, *process.children(recursive=True)]
    deployment.processes.kill_group(victim)
    for child in everything:
        with contextlib.suppress(psutil.Error):
            child.kill()
    killed = time.time()
    s.say(f"{victim} and its {len(everything) - 1} descendants killed with kill -9")
    try:
        s.expect_state("failed", HEARTBEAT_TIMEOUT + 90)
    finally:
        deployment.start_component(victim)
    failed_at = epoch(s.last_ti["end_date"])
    assert failed_at is not None
    s.say(f"Airflow failed the TI {failed_at - killed:.0f} s after the kill (its end_date)")
    s.wait_destroyed(instance["id"], failed_at, "Airflow failed the TI", 120)


def postgres_restart(s: Scenario) -> None:
    """The metadata database goes away for a while under a deferred wait and a sync one (the same DAG's two
    tasks): Airflow's components reconnect or are restarted by the supervisor, as a service manager would."""
    wait_alone(s)
    s.trigger()
    running = lambda: sum(i.get("actual_status") == "running" for i in s.instances()) == 2 or None  # noqa: E731
    s.wait("both jobs running", 180, running)
    s.h.deployment.postgres.restart(POSTGRES_DOWN)
    back = time.time()
    s.say(f"PostgreSQL was down {POSTGRES_DOWN} s")
    final = s.wait("end of both tasks", 240, lambda: s.run_state() if s.run_state() in FINISHED else None)
    if final != "success":
        raise Miss(f"DAG run ended {final!r} ({s.describe()})")
    s.wait_all_destroyed()
    rented = s.instances()
    if len(rented) != 2:
        raise Miss(f"{len(rented)} instances for two tasks")
    s.h.deployment.wait_healthy(120)
    s.say(f"both tasks succeeded, every component healthy {time.time() - back:.0f} s after PostgreSQL came back")


def interruptible(s: Scenario) -> None:
    """The market outbids the job's instance twice while its command runs (the admin surface's outbid): the task
    fails over in the triggerer each time and the third rental finishes the job."""
    s.trigger()
    outbid: list[int] = []

    def next_running_job() -> dict | None:
        for i in s.instances():
            fresh = i["id"] not in outbid and i.get("actual_status") == "running" and not i["destroyed"]
            if fresh and "run attempt=" in s.job_output(i["id"]):
                return i
        return None

    for n in (1, 2):
        instance = s.wait(f"rental {n}'s job running", 180, next_running_job)
        s.h.sim.post(f"/_sim/instances/{instance['id']}/outbid", {})
        outbid.append(instance["id"])
        s.say(
            f"outbid instance {instance['id']} (bid ${instance['bid_price']}/h on a ${instance['dph_total']}/h offer)"
        )
    s.expect_state("success", 240)
    s.wait_all_destroyed()
    s.h.sim.refresh()
    rented = sorted(s.instances(), key=lambda i: i["created_at"])
    if len(rented) != 3 or len({i["machine_id"] for i in rented}) != 3:
        raise Miss(f"expected three rentals on three machines; found {[(i['id'], i['machine_id']) for i in rented]}")
    overlaps = [
        (a["id"], b["id"]) for a, b in zip(rented, rented[1:], strict=False) if b["created_at"] < a["destroyed_at"]
    ]
    if overlaps:
        raise Miss(f"two rentals alive at once: {overlaps}")
    finished = "finished on attempt 3" in s.job_output(rented[-1]["id"])
    if not finished:
        raise Miss("the third rental's job did not say 'finished on attempt 3'")
    billed = sum(i["cost"] for i in rented)
    on_demand = sum(i["compute_seconds"] * i["dph_total"] / 3600 for i in rented)
    s.say(
        f"3 rentals, one at a time; the ledger billed ${billed:.4f} (compute at the bids, plus storage); the same "
        f"compute on demand: ${on_demand:.4f}"
    )


SCENARIOS: dict[str, Callable[[Scenario], None]] = {
    "deferred_happy": deferred_happy,
    "short_job_deferred": short_job,
    "mark_failed_deferred": lambda s: mark_failed(s, deferred=True),
    "mark_failed_running": lambda s: mark_failed(s, deferred=False),
    "kill9_retry": lambda s: kill9(s, retry=True),
    "lost_worker": lambda s: kill9(s, retry=False),
    "lost_worker_mapped": lambda s: kill9(s, retry=False),
    "triggerer_restart": triggerer_restart,
    "exit3": exit3,
    "exit3_deferred": exit3,
    "execution_timeout_deferred": lambda s: execution_timeout(s, deferred=True),
    "execution_timeout_sync": lambda s: execution_timeout(s, deferred=False),
    "interruptible": interruptible,
    "triggerer_ha": triggerer_ha,
    "scheduler_kill": scheduler_kill,
    "worker_kill": worker_kill,
    "postgres_restart": postgres_restart,
}
assert list(SCENARIOS) == list(GOALS)


# --- the run -----------------------------------------------------------------------------------------------


class Harness:
    def __init__(self, names: list[str], shape: Shape) -> None:
        self.started = time.time()
        self.deadline = self.started + RUN_BUDGET
        self.stop = threading.Event()
        self.print_lock = threading.Lock()
        self.deployment = Deployment(shape, SYSTEM)
        self.scenarios = {name: Scenario(name, self) for name in names}
        self.threads: dict[str, threading.Thread] = {}
        self.quiet = False
        self.summary = f"SYS: 0/{len(names)} scenarios pass, alive unknown (the simulator was never reached)"

    @property
    def api(self) -> AirflowApi:
        return self.deployment.api

    @property
    def sim(self) -> Simulator:
        assert self.deployment.sim is not None
        return self.deployment.sim

    def say(self, text: str) -> None:
        with self.print_lock:
            if self.quiet:  # the report is being printed: late words of interrupted scenarios would cut into it
                return
            print(f"  {time.time() - self.started:6.1f}s  {text}", flush=True)

    def run_scenario(self, scenario: Scenario) -> None:
        outcome = scenario.outcome
        try:
            SCENARIOS[scenario.name](scenario)
        except Miss as miss:
            outcome.reason = str(miss)
        except Interrupted:
            return
        except Exception as exc:  # noqa: BLE001 - a harness error is reported as this scenario's failure
            if self.stop.is_set():  # the deployment is going away under it
                return
            outcome.reason = f"harness error: {type(exc).__name__}: {exc}"
            traceback.print_exc()
        outcome.finished = True
        scenario.say("done" if outcome.reason is None else f"FAIL: {outcome.reason}")

    def run(self) -> None:
        self.deployment.start(self.say)
        watcher = threading.Thread(target=self.sim.watch, args=(self.stop,), daemon=True)
        self.sim.refresh()
        watcher.start()
        self.deployment.wait_ready(self.say)
        threading.Thread(target=self.supervise, daemon=True).start()
        for name, scenario in self.scenarios.items():
            self.threads[name] = threading.Thread(target=self.run_scenario, args=(scenario,), daemon=True)
        for thread in self.threads.values():
            thread.start()
            # Spread the DAG-run POSTs: eleven at once made the api-server's SQLite writers wait out their 60 s
            # busy timeout (one run started its scenarios two minutes late).
            time.sleep(TRIGGER_SPACING)
        for thread in self.threads.values():
            while thread.is_alive():  # join in slices so Ctrl-C reaches the main thread
                thread.join(0.5)

    def supervise(self) -> None:
        while not self.stop.wait(SUPERVISE_INTERVAL):
            try:
                self.deployment.supervise(self.say)
            except Exception as exc:  # noqa: BLE001 - a supervisor that died would hide every later death
                self.say(f"supervisor: {type(exc).__name__}: {exc}")

    def report(self) -> bool:
        """The SYS lines from a last look at the simulator; True when every goal was met."""
        try:
            instances = self.sim.refresh()
        except Exception as exc:  # noqa: BLE001 - still print what is known
            print(f"could not read the simulator's state: {exc}")
            instances = self.sim.instances
        ok = True
        print(self.deployment.shape.line())
        passed = 0
        for name, scenario in self.scenarios.items():
            outcome = scenario.outcome
            alive = sum(1 for i in instances if i.get("gpu_name") == scenario.gpu and not i["destroyed"])
            if not outcome.finished:
                outcome.reason = "interrupted" if name in self.threads else "not run"
            if outcome.reason is None and alive:
                outcome.reason = f"{alive} instance(s) of this scenario alive at the end"
            ok = ok and outcome.reason is None
            passed += outcome.reason is None
            shown = "PASS" if outcome.reason is None else f"FAIL ({outcome.reason})"
            print(f"SYS {name}: {shown} billed_after_failure={outcome.billed} alive={alive} (goal: {GOALS[name]})")
        alive_total = sum(1 for i in instances if not i["destroyed"])
        print(f"SYS alive_total: {alive_total} (goal: 0)")
        restarts = self.deployment.restarts
        print(f"SYS components restarted after dying on their own: {len(restarts)} {restarts or ''}".rstrip())
        self.summary = f"SYS: {passed}/{len(self.scenarios)} scenarios pass, {alive_total} instances alive"
        return ok and alive_total == 0

    def report_probes(self) -> None:
        """What the probe callbacks of the DAG file recorded: where Airflow ran them after the heartbeat timeouts,
        how often, and whether the connection resolved there."""
        records: dict[str, list[dict]] = {}
        for path in sorted((self.deployment.home / "system-probes").glob("*.json")):
            record = json.loads(path.read_text())
            records.setdefault(f"{record.get('callback')} of {record.get('dag_id')}", []).append(record)
        processor = self.deployment.processor_pid
        for what, runs in records.items():
            places = sorted(
                f"pid {r['pid']} '{short(r.get('process', '?'))}', a child of "
                + ("the dag-processor" if r.get("ppid") == processor else f"pid {r.get('ppid')} '{short(r['parent'])}'")
                for r in runs
            )
            connections = sorted({str(r.get("connection_host") or r.get("connection_error")) for r in runs})
            print(f"  probe: {what} ran {len(runs)}x: in {'; '.join(places)}; gpumarket_default -> {connections}")

    def where_the_logs_are(self) -> None:
        home = self.deployment.home
        print(f"Logs: Airflow home {home}")
        for name in ("simulator", "db-migrate", *self.deployment.components):
            print(f"  {name}: {home / (name + '.log')}")
        print(f"  dag-processor children: {home / 'logs' / 'dag_processor'}")
        for name, scenario in self.scenarios.items():
            if scenario.outcome.reason is not None:
                print(f"  task logs of {name}: {home / 'logs' / f'dag_id={scenario.dag_id}'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scenarios",
        type=lambda text: [name.strip() for name in text.split(",") if name.strip()],
        default=None,
        help=f"comma-separated names, of: {', '.join(SCENARIOS)} (default: all the shape can run; the small shape "
        f"cannot run {', '.join(HA)})",
    )
    parser.add_argument(
        "--shape",
        choices=("production", "small"),
        default="production",
        help="production: CeleryExecutor with Redis, 2 schedulers, 2 triggerers, 2 workers (default); small: "
        "LocalExecutor, one scheduler, one triggerer. PostgreSQL either way.",
    )
    args = parser.parse_args()
    shape = PRODUCTION if args.shape == "production" else SMALL
    names = args.scenarios or [n for n in SCENARIOS if shape is PRODUCTION or n not in HA]
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        parser.error(f"--scenarios: no scenario named {', '.join(unknown)}; the names are {', '.join(SCENARIOS)}")
    if shape is SMALL and set(names) & set(HA):
        parser.error(f"--scenarios: {', '.join(sorted(set(names) & set(HA)))} need the production shape")

    interrupt_on_signals()
    harness = Harness(names, shape)
    ok = False
    try:
        harness.run()
        ok = True
    except KeyboardInterrupt:
        print("interrupted: counting what is alive and stopping what this script started", flush=True)
    except Exception as exc:  # noqa: BLE001 - report, count and clean up whatever broke
        print(f"system test could not run: {type(exc).__name__}: {exc}", flush=True)
    finally:
        harness.stop.set()  # every wait gives up within about a second
        give_up = time.time() + 10
        for thread in harness.threads.values():
            thread.join(max(0.0, give_up - time.time()))
        harness.quiet = True
        try:
            if harness.deployment.sim is not None:
                ok = harness.report() and ok
                harness.report_probes()
            print(f"wall-clock time: {time.time() - harness.started:.0f} s (goal: < 600 s)", flush=True)
            if not ok:
                harness.where_the_logs_are()
        finally:
            harness.deployment.stop()
        print(harness.summary, flush=True)  # the last line, for a person or a script
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
