"""A production-shaped Airflow 3 deployment against the embedded simulator, for the system tests and the benchmarks.

A fresh Airflow home under .airflow/<workload>-<time> (ignored by git), the simulator (`gpumarket-sim
--execute-onstart`, its clock sped up), PostgreSQL (postgres.py, a throwaway server on a loopback port) and the
shape's components: production is Redis, `airflow api-server`, two `scheduler`s, a `dag-processor`, two
`triggerer`s and two `celery worker`s (CeleryExecutor); small is the LocalExecutor with one scheduler and one
triggerer. Each process runs in its own process group, logging to a file in the Airflow home, and only those are
stopped. The Airflow is the one of the Python that imports this module.

Used by this package's tests (make system), `make fleet` (bench/fleet.py), `make ui-test` (bench/ui_browser.py)
and `make system-airflow2` (bench/system_airflow2.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import requests

from .postgres import Postgres

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SPEED = 20.0  # simulated seconds per real second: a 60-300 s boot takes 3-15 real seconds
HEARTBEAT_TIMEOUT = 25  # [scheduler] task_instance_heartbeat_timeout, seconds


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- processes ---------------------------------------------------------------------------------------------


class Processes:
    """The processes a deployment started, each in its own process group, and how to stop only those."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.started: dict[str, subprocess.Popen] = {}
        self.lock = threading.Lock()  # the supervisor thread must not see a component a scenario is killing

    def start(self, name: str, cmd: list[str], env: dict[str, str], log: str) -> subprocess.Popen:
        with open(self.home / log, "ab") as out:  # the child keeps its own copy of the descriptor
            process = subprocess.Popen(
                cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        with self.lock:
            self.started[name] = process
        return process

    def died(self, names: tuple[str, ...]) -> dict[str, int]:
        """Components among ``names`` that exited on their own (nobody killed them here): name -> exit code."""
        with self.lock:
            return {n: p.returncode for n, p in self.started.items() if n in names and p.poll() is not None}

    def signal(self, name: str, sig: signal.Signals) -> None:
        """Send ``sig`` to the whole process group of one component (SIGSTOP freezes it, SIGCONT resumes it)."""
        with self.lock:
            process = self.started[name]
        self._signal_group(process, sig)

    def kill_group(self, name: str) -> None:
        """kill -9 the whole process group of one component (and forget it)."""
        with self.lock:
            process = self.started.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def stop_all(self, grace: float = 10.0) -> None:
        """Airflow's components first, then the simulator (which kills the onstart scripts it runs as it stops):
        SIGTERM to each process group, SIGKILL after the grace period, then SIGKILL to the descendants that
        left the groups (Airflow puts each task runner in a group of its own, the simulator each script)."""
        airflow = [(n, p) for n, p in self.started.items() if n != "simulator"]
        simulator = [(n, p) for n, p in self.started.items() if n == "simulator"]
        for batch in (airflow, simulator):
            descendants: list[psutil.Process] = []
            for _, process in batch:
                with contextlib.suppress(psutil.NoSuchProcess):
                    descendants += psutil.Process(process.pid).children(recursive=True)
                self._signal_group(process, signal.SIGTERM)
            deadline = time.monotonic() + grace
            for _, process in batch:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=max(0.1, deadline - time.monotonic()))
                self._signal_group(process, signal.SIGKILL)
                process.wait()
            for child in descendants:
                with contextlib.suppress(psutil.Error):
                    if child.is_running():  # psutil compares the start time too: never a recycled pid
                        child.kill()
        self.started.clear()

    @staticmethod
    def _signal_group(process: subprocess.Popen, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)


# --- the simulator -----------------------------------------------------------------------------------------


class Simulator:
    """The simulator's admin surface, with one thread keeping a fresh copy of its instances for every scenario."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = requests.Session()
        self.lock = threading.Lock()
        self.instances: list[dict] = []
        self.error: str | None = None
        # Simulated epoch seconds -> real ones: real = real_at_sample + (sim - sim_at_sample) / speed.
        started = time.time()
        clock = self.get("/_sim/clock")
        self.real_at_sample = (started + time.time()) / 2
        self.sim_at_sample = float(clock["now"])
        self.speed = float(clock["speed"])

    def get(self, path: str) -> Any:
        response = self.session.get(f"{self.url}{path}", timeout=30)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: dict) -> Any:
        response = self.session.post(f"{self.url}{path}", json=body, timeout=30)
        response.raise_for_status()
        return response.json()

    def put(self, path: str, body: dict) -> Any:
        response = self.session.put(f"{self.url}{path}", json=body, timeout=30)
        response.raise_for_status()
        return response.json()

    def real_time(self, simulated: float) -> float:
        return self.real_at_sample + (simulated - self.sim_at_sample) / self.speed

    def refresh(self) -> list[dict]:
        instances = self.get("/_sim/state")["instances"]
        with self.lock:
            self.instances = instances
        return instances

    def watch(self, stop: threading.Event) -> None:
        while not stop.wait(1.0):
            try:
                self.refresh()
                self.error = None
            except requests.RequestException as exc:  # the scenarios time out and say why
                self.error = str(exc)

    def of_gpu(self, gpu_name: str) -> list[dict]:
        with self.lock:
            return [dict(i) for i in self.instances if i.get("gpu_name") == gpu_name]


def start_simulator(processes: Processes, world: Path, speed: float = SPEED) -> tuple[Simulator, str]:
    """`gpumarket-sim --execute-onstart` with ``world``, its clock at ``speed`` x, started through ``processes``
    (log: simulator.log in their home): its admin surface and the connection URI it prints."""
    log = processes.home / "simulator.log"
    process = processes.start(
        "simulator",
        [str(BIN / "gpumarket-sim"), "--port", "0", "--speed", str(speed), "--execute-onstart", "--world", str(world)],
        dict(os.environ),
        log.name,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        first_line = next((line for line in text.splitlines() if "listening on" in line), None)
        if first_line is not None:
            url = next(word for word in first_line.split() if word.startswith("http://"))
            return Simulator(url), first_line.split("AIRFLOW_CONN_GPUMARKET_DEFAULT=", 1)[1].split()[0]
        if process.poll() is not None:
            break
        time.sleep(0.1)  # the simulator writes its first line within about a second
    raise RuntimeError(f"gpumarket-sim did not start; see {log}")


def interrupt_on_signals() -> None:
    """SIGTERM and SIGINT raise KeyboardInterrupt, so a script reports what is alive and stops what it started (also
    when started with SIGINT ignored, as `cmd &` does)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)


# --- Airflow -----------------------------------------------------------------------------------------------


class AirflowApi:
    """The api-server's public REST API v2.

    Auth (Airflow 3.3.2, simple auth manager): with `[core] simple_auth_manager_all_admins = True`,
    `GET /auth/token` returns `{"access_token": ...}` without credentials (and a middleware would even add a token
    to requests without one); with users, `POST /auth/token` with ``credentials`` (username, password) does. The
    token goes in `Authorization: Bearer`.
    """

    def __init__(self, base_url: str, credentials: tuple[str, str] | None = None) -> None:
        self.base = base_url
        self.credentials = credentials
        self.session = requests.Session()

    def health(self) -> dict | None:
        try:
            response = self.session.get(f"{self.base}/api/v2/monitor/health", timeout=5)
            return response.json() if response.ok else None
        except requests.RequestException:
            return None

    def login(self) -> None:
        if self.credentials is None:
            response = self.session.get(f"{self.base}/auth/token", timeout=30)
        else:
            username, password = self.credentials
            body = {"username": username, "password": password}
            response = self.session.post(f"{self.base}/auth/token", json=body, timeout=30)
        response.raise_for_status()
        self.session.headers["Authorization"] = f"Bearer {response.json()['access_token']}"

    def call(self, method: str, path: str, body: Any = None, ok404: bool = False, **params: Any) -> Any:
        """One request, retried on a 5xx or no answer: on SQLite a busy database makes the api-server answer
        500 now and then while the scheduler and the tasks write. Only idempotent requests come here (a trigger
        names its run id, so a repeated one answers 409)."""
        error = ""
        for attempt in range(4):
            if attempt:
                time.sleep(2 ** (attempt - 1))
            try:
                response = self.session.request(
                    method, f"{self.base}/api/v2{path}", json=body, params=params, timeout=30
                )
            except requests.RequestException as exc:
                error = f"{type(exc).__name__}: {exc}"
                continue
            if ok404 and response.status_code == 404:
                return None
            if response.ok:
                return response.json()
            error = f"HTTP {response.status_code} {response.text[:300]}"
            if response.status_code < 500:
                break
        raise RuntimeError(f"{method} {path}: {error}")


@dataclass(frozen=True)
class Shape:
    """What runs: the executor and how many of each scaled component."""

    executor: str
    schedulers: int
    triggerers: int
    workers: int  # Celery workers (0 with the LocalExecutor, whose workers are the scheduler's children)

    @property
    def components(self) -> tuple[str, ...]:
        """The Airflow processes by name (``scheduler-2``, ``worker-1``, ...); the first of each kind has no number
        when it is the only one."""

        def named(kind: str, count: int) -> list[str]:
            return [kind] if count == 1 else [f"{kind}-{i}" for i in range(1, count + 1)]

        return (
            "api-server",
            *named("scheduler", self.schedulers),
            "dag-processor",
            *named("triggerer", self.triggerers),
            *named("worker", self.workers),
        )

    def of(self, kind: str) -> list[str]:
        return [name for name in self.components if name.split("-")[0] == kind and name != "dag-processor"]

    def line(self) -> str:
        return (
            f"SYS deployment: executor={self.executor} database=postgresql schedulers={self.schedulers} "
            f"triggerers={self.triggerers} workers={self.workers}"
        )


#: What production runs (make system): Celery with Redis, two of each, as managed offerings do for availability.
PRODUCTION = Shape("CeleryExecutor", schedulers=2, triggerers=2, workers=2)
#: The smaller deployment (make system-airflow32): one scheduler forking its own workers, one triggerer.
SMALL = Shape("LocalExecutor", schedulers=1, triggerers=1, workers=0)
#: Task slots of each Celery worker (the LocalExecutor's parallelism is the same in total).
WORKER_CONCURRENCY = 6


@dataclass(frozen=True)
class Workload:
    """What a deployment runs: its DAGs, the offers of the simulator's world, the clock's speed, the task slots."""

    name: str  # the Airflow home is .airflow/<name>-<time>
    dags_folder: Path
    dag_ids: frozenset[str]  # ready once the DAG processor has serialized each of these
    offers: tuple[dict, ...]
    speed: float
    worker_concurrency: int


class Deployment:
    """A fresh Airflow home, the simulator, PostgreSQL, Redis (Celery's broker) and the Airflow components."""

    def __init__(self, shape: Shape, workload: Workload) -> None:
        self.shape = shape
        self.workload = workload
        self.components = shape.components
        self.home = ROOT / ".airflow" / f"{workload.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        self.home.mkdir(parents=True)
        self.processes = Processes(self.home)
        self.redis_port = free_port()
        self.api_port = free_port()
        self.env: dict[str, str] = {}
        self.sim: Simulator | None = None
        self.api = AirflowApi(f"http://127.0.0.1:{self.api_port}")
        self.restarts: list[str] = []  # components that died on their own and were restarted
        self.postgres = Postgres(self.home / "postgres.log")

    def airflow_env(self, conn_uri: str) -> dict[str, str]:
        # Nothing Airflow-related leaks in from the caller's environment: the deployment is the same everywhere.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        base = f"http://127.0.0.1:{self.api_port}"
        env.update(
            AIRFLOW_HOME=str(self.home),
            AIRFLOW_CONN_GPUMARKET_DEFAULT=conn_uri,
            AIRFLOW__CORE__DAGS_FOLDER=str(self.workload.dags_folder),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__UNIT_TEST_MODE="False",
            AIRFLOW__CORE__EXECUTOR=self.shape.executor,
            # The LocalExecutor forks this many workers up front.
            AIRFLOW__CORE__PARALLELISM=str(2 * self.workload.worker_concurrency),
            AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"{base}/execution/",
            # The budget scenario's DAG: $1 a day (tests/system/dags/system_dags.py, system_budget).
            AIRFLOW_VAR_GPUMARKET_BUDGETS='{"system_budget": {"day": 1.0}}',
            AIRFLOW__API__BASE_URL=base,
            AIRFLOW__API__HOST="127.0.0.1",
            AIRFLOW__API__PORT=str(self.api_port),
            AIRFLOW__API__WORKERS="1",
            # The same secrets for every component: the api-server must accept the scheduler's task tokens.
            AIRFLOW__API__SECRET_KEY=secrets.token_hex(16),
            AIRFLOW__API_AUTH__JWT_SECRET=secrets.token_hex(32),
            # A task whose supervisor died is failed after this (supervisors heartbeat every 5 s).
            AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT=str(HEARTBEAT_TIMEOUT),
            AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL="5",
            AIRFLOW__SCHEDULER__TRIGGER_TIMEOUT_CHECK_INTERVAL="5",
            # A triggerer whose heartbeat (every 5 s) is older than this is dead: its triggers go to another one.
            AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD="15",
            AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
            AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL="15",
            AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES="1",
            # PostgreSQL, as production runs it: SQLite's single write lock stalled whole runs (the api-server
            # stopped answering for minutes while a writer held it).
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=self.postgres.url,
            AIRFLOW__CELERY__BROKER_URL=f"redis://127.0.0.1:{self.redis_port}/0",
            AIRFLOW__CELERY__RESULT_BACKEND="db+" + self.postgres.url,
            AIRFLOW__CELERY__WORKER_CONCURRENCY=str(self.workload.worker_concurrency),
            # Each component reports its own name as its host (as if each ran on a machine of its own), so that a
            # job row tells which triggerer runs a trigger.
            AIRFLOW__CORE__HOSTNAME_CALLABLE="gpumarket_system_host.hostname",
            PYTHONPATH=os.pathsep.join(filter(None, [str(self.home), os.environ.get("PYTHONPATH")])),
        )
        (self.home / "gpumarket_system_host.py").write_text(
            "import os\nimport socket\n\n\ndef hostname():\n"
            "    return os.environ.get('GPUMARKET_SYSTEM_HOST') or socket.getfqdn()\n"
        )
        return env

    def supervise(self, say: Callable[[str], None]) -> None:
        """Restart a component that died on its own, as a service manager would, and say why it died."""
        for name, code in self.processes.died(self.components).items():
            log = self.home / f"{name}.log"
            lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
            last = next((line for line in reversed(lines) if line.strip()), "(empty log)")
            say(f"{name} exited on its own (code {code}; last log line: {clip(last, 160)}); restarting it")
            self.restarts.append(f"{name}: {clip(last, 100)}")
            self.start_component(name)

    def start(self, say: Callable[[str], None]) -> None:
        say(f"Airflow home {self.home}")
        world = self.home / "world.json"
        # Credit enough that the simulator's $0 stop never stops a scenario's instances.
        world.write_text(json.dumps({"offers": list(self.workload.offers), "credit": 1e9}))
        self.sim, conn_uri = start_simulator(self.processes, world, self.workload.speed)
        say(f"simulator at {self.sim.url} (speed {self.workload.speed:g}x)")
        self.postgres.start()
        pg = self.postgres
        say(f"PostgreSQL {pg.bin.parent.name} at 127.0.0.1:{pg.port}, data in {pg.root}")
        self.env = self.airflow_env(conn_uri)
        with open(self.home / "db-migrate.log", "wb") as log:
            subprocess.run(
                [str(BIN / "airflow"), "db", "migrate"], env=self.env, stdout=log, stderr=subprocess.STDOUT, check=True
            )
        self.after_migrate()
        if self.shape.workers:
            redis = ["redis-server", "--bind", "127.0.0.1", "--port", str(self.redis_port), "--save", ""]
            redis += ["--appendonly", "no", "--dir", str(self.home)]  # nothing written: a broker for one run
            self.processes.start("redis", redis, self.env, "redis.log")
            say(f"Redis at 127.0.0.1:{self.redis_port} (Celery's broker)")
        say(f"airflow db migrate done; starting {', '.join(self.components)}")
        for name in self.components:
            self.start_component(name)

    def after_migrate(self) -> None:
        """What a deployment sets up in its database before its components start (nothing here)."""

    def start_component(self, name: str) -> None:
        kind = name if name == "dag-processor" else name.split("-")[0]
        if kind == "api":
            cmd = [str(BIN / "airflow"), "api-server", "--host", "127.0.0.1", "--port", str(self.api_port)]
            cmd += ["--workers", "1"]
        elif kind == "worker":
            # One hostname each (two workers on one machine); no log server (its port would collide): the logs
            # are files in the shared Airflow home.
            cmd = [str(BIN / "airflow"), "celery", "worker", "--celery-hostname", f"{name}@%h", "--skip-serve-logs"]
            cmd += ["--concurrency", str(self.workload.worker_concurrency), "--without-gossip", "--without-mingle"]
        elif kind in ("scheduler", "triggerer"):
            cmd = [str(BIN / "airflow"), kind, "--skip-serve-logs"]
        else:
            cmd = [str(BIN / "airflow"), kind]
        self.processes.start(name, cmd, {**self.env, "GPUMARKET_SYSTEM_HOST": name}, f"{name}.log")

    def wait_ready(self, say: Callable[[str], None], timeout: float = 180) -> None:
        """Until every component reports healthy and the DAG processor has serialized every DAG of the workload."""
        deadline = time.monotonic() + timeout
        self.wait_healthy(timeout, starting=True)
        self.api.login()
        say(f"{', '.join(self.components)} healthy")
        wanted = set(self.workload.dag_ids)
        while True:
            dags = self.api.call("GET", "/dags", limit=1000)["dags"]
            missing = wanted - {d["dag_id"] for d in dags}
            if not missing:
                break
            errors = self.api.call("GET", "/importErrors")["import_errors"]
            if errors:
                raise RuntimeError(f"DAG import errors: {[e['filename'] + ': ' + e['stack_trace'] for e in errors]}")
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"DAGs not parsed after {timeout} s: {sorted(missing)}")
            time.sleep(1)
        say(f"{len(wanted)} DAGs parsed")

    def stop(self) -> None:
        """Stop only what this deployment started: its processes (and what left their groups), PostgreSQL."""
        self.processes.stop_all()
        self.postgres.stop()

    def log_of(self, name: str) -> str:
        log = self.home / f"{name}.log"
        return log.read_text(errors="replace") if log.exists() else ""

    def wait_healthy(self, timeout: float, *, starting: bool = False) -> None:
        """Until the api-server reports every component healthy (TimeoutError after ``timeout`` seconds);
        ``starting``: a component that exits fails the start at once (RuntimeError)."""
        deadline = time.monotonic() + timeout
        while True:
            health = self.api.health() or {}
            unhealthy = [k for k, v in health.items() if isinstance(v, dict) and v.get("status") != "healthy"]
            if health and not unhealthy:
                return
            if starting:
                self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"not healthy {timeout:.0f} s later: {unhealthy or 'api-server not answering'}")
            time.sleep(1)

    def task_parents(self) -> set[int]:
        """The components whose descendants run task instances: the schedulers (LocalExecutor) or workers."""
        names = self.shape.of("worker") or self.shape.of("scheduler")
        return {self.processes.started[n].pid for n in names if n in self.processes.started}

    @property
    def processor_pid(self) -> int | None:
        process = self.processes.started.get("dag-processor")
        return process.pid if process else None

    def _check_alive(self) -> None:
        for name, process in self.processes.started.items():
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with status {process.returncode}; see {self.home}")

    def task_processes(self, ti_id: str) -> list[psutil.Process]:
        """The supervisor ("airflow worker -- LocalExecutor: <ti id>", or Celery's "airflow task supervisor: <the
        workload, with the ti id>") and task runner ("airflow worker -- <ti id>") of one task instance try: both
        carry the TI's id in their process title."""
        found = []
        for process in psutil.process_iter(["cmdline"]):
            title = " ".join(process.info["cmdline"] or [])
            if ti_id not in title:
                continue
            # A Celery pool process keeps the supervisor's title after the task left it (until its next task):
            # only a supervisor with its task runner under it holds the task.
            with contextlib.suppress(psutil.Error):
                if title.startswith("airflow supervisor:") and not process.children():
                    continue
                found.append(process)
        return found
