"""The system tests' deployment and one scenario's DAG run: its task instance, its instances and bounded waits."""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import psutil
import requests

from .deployment import SPEED, WORKER_CONCURRENCY, AirflowApi, Deployment, Shape, Simulator, Workload

SUPERVISE_INTERVAL = 2.0  # seconds between two looks for components that died on their own
EXECUTION_TIMEOUT = 25  # the execution_timeout of the execution_timeout_* DAGs, seconds
POSTGRES_DOWN = 10  # seconds PostgreSQL stays down in postgres_restart
FINISHED = {"success", "failed", "skipped", "upstream_failed", "removed"}
T = TypeVar("T")

#: The cancel_mid_step scenario's mapped jobs that end on their own, then those marked failed mid-step.
CANCEL_MID_STEP_JOBS = 10
CANCEL_MID_STEP_MARKED = 3
#: The mapped jobs of the budget scenario, and the DAG's daily budget in dollars (the Variable the deployment sets).
BUDGET_JOBS = 50
BUDGET_PER_DAY = 1.0

#: The scenarios, in the order they are reported: one DAG each (dags/system_dags.py, system_<name>) renting only
#: the offers named sys-<name>, and one test each (test_scenarios.py, test_<name>).
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
    # High availability (production shape only): the fault touches every scenario.
    "triggerer_ha": "kill -9 the triggerer running a deferred job, no restart: the other resumes it; no destroy, "
    "one rental, every line in the task log, success, 0 alive",
    "triggerer_handover": "the triggerer running a deferred job frozen (SIGSTOP) until the other takes the trigger "
    "over, then resumed: no destroy, one rental, each line in the task log once, success, 0 alive",
    "cancel_mid_step": "10 deferred jobs end while 3 others are marked failed, their log reads slowed to 20 s: each of "
    "the 10 fires within 5 s of its job's end, the 3 are destroyed, 0 alive",
    "scheduler_kill": "kill -9 one of two schedulers while a sync job runs: success on its one rental, 0 alive",
    "worker_kill": "kill -9 the Celery worker running a sync job, retries=0: destroyed <= 120 s after Airflow "
    "failed the TI, 0 alive",
    "postgres_restart": f"PostgreSQL down {POSTGRES_DOWN} s under a deferred and a sync job: both succeed on one "
    "rental each, every component healthy again, 0 alive",
    "budget": f"{BUDGET_JOBS} mapped deferred jobs of $0.10 worst case under a $1 daily budget: at most 10 rented at "
    "once, every other one failed before renting naming the budget, the ledger and the simulator's bill within $1; "
    "0 alive; a captured reservation replayed: 401, sent anew: the same reservation, limits in its body ignored",
    "durable": "a deferred interruptible job outbid twice (a triggerer killed at the second) resumes from its "
    "checkpoint on its third machine, disks isolated, each epoch once but at most one per preemption; its output in "
    "the integration's bucket before the destroy; 0 alive",
    "asset_downstream": "a training job's success emits its model's asset event, extra naming its instance; the "
    "DAG scheduled on that asset runs and succeeds, reading it; 0 alive",
    "rent_well": "a deferred job ranked by expected cost rents the cheapest offer, whose GPUs fail the wrapper's "
    "preflight: destroyed within a minute, its machine in host memory through the api-server (`airflow gpumarket "
    "hosts` lists it), the job succeeds on the next offer; 0 alive",
    "statsd": "a job whose first offer never runs fails over and succeeds: the StatsD listener counts, for its DAG, "
    "2 rentals started, 1 ended never_ran, 1 failover, 1 ended succeeded, 1 boot, 2 reservations and 2 settlements "
    "no larger; 0 alive",
    "service": "a service for a task group: the Celery worker running one of its two tasks killed -9 mid-use; the "
    "task's retry reaches the same service from another worker, the group succeeds, the teardown destroys the one "
    "rental; 0 alive",
    "market_watch": "a DAG scheduled by an offer watcher runs once when its offers are there; both triggerers "
    "killed -9 and restarted while they still are: no second run; the offers gone, then back: one more run; each "
    "run rents one of them; 0 alive",
    "orphan": "an instance handed over and never torn down, stopped once its run ended: `airflow gpumarket orphans` "
    "lists it, `--destroy --yes` destroys it, and the ledger, the GPU rentals page and `spend` each say what the "
    "service charged, within 1 %; 0 alive",
}
#: The DAG scheduled on the asset_downstream scenario's model (dags/system_dags.py).
ASSET_CONSUMER = "system_asset_downstream_evaluate"


#: More offers than two: a preempted machine is never rented again; the budget admits ten rentals at once.
_OFFERS_OF = {"interruptible": 3, "durable": 3, "budget": 30, "cancel_mid_step": 16}


def _offers() -> tuple[dict, ...]:
    """Two offers per scenario, `sys-<scenario>`, so scenarios never compete and a second rental shows."""
    return tuple(
        {
            "id": 700_000 + 100 * n + k,
            "gpu_name": f"sys-{name}",
            "dph_total": 0.5 if name == "budget" else 1.0 + k / 10,  # the budget's jobs: one worst case each
            "reliability": 0.99,
            **({"fate": "exited"} if name == "statsd" and k == 0 else {}),  # the cheapest never runs: a failover
            **({"gpu_check": "fail"} if name == "rent_well" and k == 0 else {}),  # the cheapest has no usable GPU
        }
        for n, name in enumerate(GOALS)
        for k in range(_OFFERS_OF.get(name, 2))
    )


WORKLOAD = Workload(
    "system",
    Path(__file__).resolve().parent / "dags",
    frozenset({*(f"system_{name}" for name in GOALS), ASSET_CONSUMER}),
    _offers(),
    SPEED,
    WORKER_CONCURRENCY,
)


class Stopped(Exception):
    """The deployment is stopping (the session ends or was interrupted): a scenario's wait gives up."""


def epoch(iso: str | None) -> float | None:
    """An Airflow API datetime ("2026-01-01T10:00:00.123456Z") as epoch seconds."""
    return datetime.fromisoformat(iso).timestamp() if iso else None


class StatsdListener:
    """A StatsD server on a loopback UDP port, as an operations team runs one: every line received, kept."""

    def __init__(self) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # Airflow's own metrics come too
        self.socket.bind(("127.0.0.1", 0))
        self.socket.settimeout(1.0)
        self.lines: list[str] = []
        self.lock = threading.Lock()

    def airflow_env(self) -> dict[str, str]:
        """``[metrics]``: StatsD to this listener, tags in the names (InfluxDB's form) so each DAG's are told apart."""
        settings = {"ON": "True", "HOST": "127.0.0.1", "PORT": str(self.socket.getsockname()[1])}
        settings["INFLUXDB_ENABLED"] = "True"
        return {f"AIRFLOW__METRICS__STATSD_{key}": value for key, value in settings.items()}

    def listen(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                packet = self.socket.recv(65536).decode(errors="replace")
            except OSError:  # the timeout, or the socket closed
                continue
            with self.lock:
                self.lines.extend(packet.splitlines())

    def metrics(self, prefix: str, **tags: str) -> dict[str, list[float]]:
        """Name -> values received, of the metrics under ``prefix`` that carry every one of ``tags``."""
        found: dict[str, list[float]] = {}
        with self.lock:
            lines = list(self.lines)
        for line in lines:
            key, _, value = line.partition(":")
            name, *pairs = key.split(",")
            carried = dict(pair.partition("=")[::2] for pair in pairs)
            if name.startswith(prefix) and all(carried.get(k) == v for k, v in tags.items()):
                found.setdefault(name, []).append(float(value.split("|")[0]))
        return found


class SystemDeployment(Deployment):
    """The deployment the scenarios share: a fresh copy of the simulator's instances, dead components restarted."""

    def __init__(self, shape: Shape, write: Callable[[str], None] = print) -> None:
        super().__init__(shape, WORKLOAD)
        self.statsd = StatsdListener()
        self._write = write  # one progress line
        self.started = time.time()
        self.stopping = threading.Event()
        self.scenarios: dict[str, Scenario] = {}
        self.final_instances: list[dict] | None = None  # the simulator's instances as the deployment stopped
        self.ended: float | None = None
        self._print_lock = threading.Lock()

    def say(self, text: str) -> None:
        with self._print_lock:
            self._write(f"  {time.time() - self.started:6.1f}s  {text}")

    @property
    def simulator(self) -> Simulator:
        assert self.sim is not None, "the simulator has not started"
        return self.sim

    def airflow_env(self, conn_uri: str) -> dict[str, str]:
        return {**super().airflow_env(conn_uri), **self.statsd.airflow_env()}

    def start_all(self) -> None:
        """Start everything, keep the simulator's state fresh, restart what dies on its own; return once ready."""
        threading.Thread(target=self.statsd.listen, args=(self.stopping,), daemon=True).start()
        self.start(self.say)
        self.simulator.refresh()
        threading.Thread(target=self.simulator.watch, args=(self.stopping,), daemon=True).start()
        self.wait_ready(self.say)
        threading.Thread(target=self._supervise, daemon=True).start()

    def _supervise(self) -> None:
        while not self.stopping.wait(SUPERVISE_INTERVAL):
            try:
                self.supervise(self.say)
            except Exception as exc:  # noqa: BLE001 - a supervisor that died would hide every later death
                self.say(f"supervisor: {type(exc).__name__}: {exc}")

    def scenario(self, name: str) -> Scenario:
        return self.scenarios.setdefault(name, Scenario(name, self))

    def stop_all(self) -> None:
        """Count what is alive (``final_instances``), then stop every process and PostgreSQL."""
        self.stopping.set()
        try:
            if self.sim is not None:
                try:
                    self.final_instances = self.sim.refresh()
                except requests.RequestException as exc:
                    self.say(f"could not read the simulator's state: {exc}; counting its last copy")
                    self.final_instances = self.sim.instances
            self.ended = time.time()
        finally:
            self.stop()
            self.statsd.socket.close()


class Scenario:
    """One scenario's DAG run: its task instance (REST API), its instances (simulator) and bounded waits."""

    def __init__(self, name: str, deployment: SystemDeployment) -> None:
        self.name = name
        self.deployment = deployment
        self.dag_id = f"system_{name}"
        self.gpu = f"sys-{name}"
        self.run_id: str | None = None
        self.last_ti: dict = {}
        self.billed = "n/a"  # seconds billed after the failure's reference point, ">N" while still alive

    @property
    def api(self) -> AirflowApi:
        return self.deployment.api

    @property
    def sim(self) -> Simulator:
        return self.deployment.simulator

    def say(self, text: str) -> None:
        self.deployment.say(f"{self.name}: {text}")

    # REST API
    def trigger(self) -> None:
        """Create the DAG run under a run id of our own, so a retried POST can never make a second run."""
        run_id = f"system-{time.strftime('%H%M%S')}-{secrets.token_hex(3)}"
        try:
            self.api.call("POST", f"/dags/{self.dag_id}/dagRuns", {"logical_date": None, "dag_run_id": run_id})
        except RuntimeError as exc:
            if "HTTP 409" not in str(exc):  # 409: an earlier try of this POST did create it
                raise
        self.run_id = run_id
        self.say(f"triggered run {self.run_id}")

    def run_state(self) -> str | None:
        return self.api.call("GET", f"/dags/{self.dag_id}/dagRuns/{self.run_id}").get("state")

    @property
    def ti_path(self) -> str:
        """The TI in the REST API (a mapped scenario's task has one mapped TI, map index 0)."""
        mapped = "/0" if self.name.endswith("_mapped") else ""
        return f"/dags/{self.dag_id}/dagRuns/{self.run_id}/taskInstances/job{mapped}"

    def ti(self) -> dict:
        self.last_ti = self.api.call("GET", self.ti_path, ok404=True) or {}
        return self.last_ti

    def state(self) -> str | None:
        return self.ti().get("state")

    def state_store(self) -> dict:
        """The TI's task state store entries (Airflow 3.3+), key -> value, through the REST API."""
        found = self.api.call("GET", f"{self.ti_path}/state-store", ok404=True) or {}
        entries = {entry["key"]: entry["value"] for entry in found.get("task_state_store", [])}
        return {k: json.loads(v) if isinstance(v, str) and v.startswith("{") else v for k, v in entries.items()}

    def mark_failed(self) -> None:
        self.api.call("PATCH", self.ti_path, {"new_state": "failed"})

    def triggerer_running_the_trigger(self) -> str:
        """The triggerer component that runs this TI's trigger.

        Airflow names the trigger's log file after that triggerer job's id (``attempt=N.log.trigger.<job id>.log``),
        and the job's hostname is the component's name.
        """
        files = sorted(self.log_folder.glob("attempt=*.log.trigger.*.log"), key=lambda path: path.stat().st_mtime)
        assert files, f"no trigger log file under {self.log_folder}"
        job_id = int(files[-1].name.split(".trigger.")[1].split(".")[0])
        jobs = self.api.call("GET", "/jobs", job_type="TriggererJob", limit=100)["jobs"]
        host = next((job["hostname"] for job in jobs if job["id"] == job_id), None)
        triggerers = self.deployment.shape.of("triggerer")
        assert host in triggerers, f"triggerer job {job_id} runs the trigger on host {host!r}, none of {triggerers}"
        return host

    # simulator
    def instances(self) -> list[dict]:
        return self.sim.of_gpu(self.gpu)

    def running_instance(self) -> dict | None:
        return next((i for i in self.instances() if i.get("actual_status") == "running" and not i["destroyed"]), None)

    def destroyed_at(self, instance_id: int) -> float | None:
        """Real epoch second when the simulator destroyed the instance, None while it is alive."""
        found = next((i for i in self.instances() if i["id"] == instance_id), None)
        if found is None or not found["destroyed"]:
            return None
        return self.sim.real_time(found["destroyed_at"])

    def job_output(self, instance_id: int) -> str:
        return self.sim.get(f"/_sim/instances/{instance_id}/onstart").get("output") or ""

    # task log
    @property
    def log_folder(self) -> Path:
        """Where Airflow writes the log files of this run's task ``job``."""
        return self.deployment.home / "logs" / f"dag_id={self.dag_id}" / f"run_id={self.run_id}" / "task_id=job"

    def task_log(self) -> str:
        """Every log file of this run's task (the worker's, and the triggerer's for deferred waits)."""
        files = sorted(self.log_folder.rglob("*"))
        return "".join(path.read_text(errors="replace") for path in files if path.is_file())

    def task_messages(self) -> str:
        """The messages of the task's log lines (Airflow 3 writes JSON lines), in time order, one per line.

        A job line the task log shows is a whole message, not a piece of a longer one such as the trigger's event,
        which Airflow logs whole with the lines it carries.
        """
        timed = []  # (timestamp, message): the worker's and the triggerer's files merged in time, as the UI shows them
        for line in self.task_log().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                timed.append((str(record.get("timestamp", "")), str(record.get("event", ""))))
        return "\n".join(message for _, message in sorted(timed, key=lambda pair: pair[0]))

    def describe(self) -> str:
        shown = ", ".join(
            f"{i['id']} {'destroyed' if i['destroyed'] else repr(i.get('actual_status'))}" for i in self.instances()
        )
        return f"TI {self.last_ti.get('state')!r} try {self.last_ti.get('try_number')}; instances: {shown or 'none'}"

    # bounded waits
    def poll(self, timeout: float, check: Callable[[], T | None], interval: float = 1.0) -> T | None:
        """What ``check`` returns once it is truthy, or None after ``timeout`` seconds."""
        deadline = time.time() + timeout
        while True:
            if self.deployment.stopping.is_set():
                raise Stopped(self.name)
            result = check()
            if result or time.time() > deadline:
                return result or None
            time.sleep(interval)

    def wait(self, what: str, timeout: float, check: Callable[[], T | None], interval: float = 1.0) -> T:
        """What ``check`` returns once it is truthy; fails after ``timeout`` seconds."""
        result = self.poll(timeout, check, interval)
        assert result is not None, f"no {what} within {timeout:.0f} s ({self.describe()})"
        return result

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

    def expect_state(self, wanted: str, timeout: float = 60) -> None:
        final = self.wait_finished(timeout)
        assert final == wanted, f"TI ended {final!r}, expected {wanted!r} ({self.describe()})"

    def wait_destroyed(self, instance_id: int, since: float, after: str, limit: float) -> float:
        """Seconds from ``since`` (the moment ``after`` names) to the instance's destroy: at most ``limit``.

        The figure is the scenario's billed_after_failure, shown as '>N' while the instance is alive.
        """
        destroyed = self.poll(since + limit + 5 - time.time(), lambda: self.destroyed_at(instance_id))
        if destroyed is None:
            self.billed = f">{time.time() - since:.0f}"
        assert destroyed is not None, (
            f"instance {instance_id} still alive {time.time() - since:.0f} s after {after} ({self.describe()})"
        )
        billed = round(destroyed - since, 1) + 0.0  # + 0.0: never print "-0.0"
        self.billed = f"{billed:.1f}"
        self.say(f"instance {instance_id} destroyed {billed:.1f} s after {after}")
        assert billed <= limit, f"instance {instance_id} destroyed {billed:.1f} s after {after} (limit {limit} s)"
        return billed

    def wait_all_destroyed(self, timeout: float = 30) -> None:
        self.wait(
            "destroy of every instance of this scenario",
            timeout,
            lambda: all(i["destroyed"] for i in self.instances()) and self.instances(),
        )

    # processes
    def kill_task(self) -> None:
        """kill -9 the TI's supervisor and task runner (their titles name the TI) and their children."""
        ti_id = str(self.ti()["id"])
        parents = self.deployment.task_parents()

        def ours() -> list[psutil.Process]:
            found = []
            for process in self.deployment.task_processes(ti_id):
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
