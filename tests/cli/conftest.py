"""Fixtures of the official-CLI compatibility tests.

- ``vastai_exe``: the official CLI ``vastai==1.9.1``, installed once into its own virtual environment under
  ``.airflow/`` (git-ignored), never into the provider's: its dependency pins must not leak into ours.
- ``live_sim``: ``gpumarket-sim --profile live`` started as a user would start it, one per test (about 0.5 s), so
  every test sees the initial world and a request log of its own calls only.
- ``cli``: runs the CLI against that simulator with a throw-away HOME, so it never reads the user's key file or
  writes into the user's ``~/.config``, ``~/.cache`` or ``~/.local``.

What the CLI sends and reads is catalogued in the module docstring of ``test_official_cli.py``.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]

VASTAI_VERSION = "1.9.1"
VASTAI_REQUIREMENT = f"vastai=={VASTAI_VERSION}"
VASTAI_VENV = REPO / ".airflow" / f"vastai-{VASTAI_VERSION}"
VASTAI_STAMP = VASTAI_VENV / ".installed"
VASTAI_LOCK = REPO / ".airflow" / f"vastai-{VASTAI_VERSION}.lock"

INSTALL_TIMEOUT = 900  # seconds for venv + pip; also the longest we wait for another process building it
CLI_TIMEOUT = 120  # seconds per CLI invocation (each takes about 1.2 s)
SIM_START_TIMEOUT = 30  # seconds until the simulator prints its first line
SIM_SPEED = 600  # simulated seconds per real second: a 60-300 s boot takes 0.1-0.5 s
SIM_SEED = 0
SIM_API_KEY = "c1c0ffee" * 8  # 64 hex digits, the shape of a real account key


# --- the official CLI in its own virtual environment ----------------------------------------------------------
def _stamp_text() -> str:
    return f"{VASTAI_REQUIREMENT}\npython {sys.version_info.major}.{sys.version_info.minor}\n"


def _venv_ready() -> bool:
    try:
        stamp = VASTAI_STAMP.read_text()
    except OSError:
        return False
    return stamp == _stamp_text() and (VASTAI_VENV / "bin" / "vastai").exists()


def _run_install_step(command: list[str], what: str) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, cwd=REPO)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} took more than {INSTALL_TIMEOUT} s: {' '.join(command)}", pytrace=False)
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()[-3000:]
        pytest.fail(
            f"{what} failed (exit status {done.returncode}): {' '.join(command)}\n{output}\n\n"
            f"These tests install the official CLI {VASTAI_REQUIREMENT} from the package index configured for pip "
            f"(PyPI in CI) into {VASTAI_VENV}. Without index access they cannot run; they are not skipped, so a "
            "missing index is seen, not hidden.",
            pytrace=False,
        )


def _install_vastai() -> None:
    shutil.rmtree(VASTAI_VENV, ignore_errors=True)
    _run_install_step([sys.executable, "-m", "venv", str(VASTAI_VENV)], "Creating the vastai virtual environment")
    python = str(VASTAI_VENV / "bin" / "python")
    _run_install_step(
        [python, "-m", "pip", "install", "--disable-pip-version-check", "--quiet", VASTAI_REQUIREMENT],
        f"pip install {VASTAI_REQUIREMENT}",
    )
    # Ask the package metadata, not `vastai --version`: the CLI sends a request at import time (see the catalogue).
    probe = "import importlib.metadata as m; print(m.version('vastai'))"
    installed = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60).stdout.strip()
    if installed != VASTAI_VERSION:
        pytest.fail(f"{VASTAI_VENV} holds vastai {installed!r}, not {VASTAI_VERSION}", pytrace=False)
    VASTAI_STAMP.write_text(_stamp_text())


@pytest.fixture(scope="session")
def vastai_exe() -> Path:
    """``.airflow/vastai-1.9.1/bin/vastai``, built on first use and reused by later runs (a stamp marks it done)."""
    if not _venv_ready():
        VASTAI_LOCK.parent.mkdir(parents=True, exist_ok=True)
        with open(VASTAI_LOCK, "w") as lock:
            # Another pytest process (a parallel worker, a second run) may be building it right now: wait for it.
            deadline = time.monotonic() + INSTALL_TIMEOUT
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        pytest.fail(f"{VASTAI_LOCK} stayed locked for {INSTALL_TIMEOUT} s", pytrace=False)
                    time.sleep(0.5)
            try:
                if not _venv_ready():
                    _install_vastai()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    return VASTAI_VENV / "bin" / "vastai"


# --- the simulator, as a user starts it -----------------------------------------------------------------------
def _sim_executable() -> str:
    beside = Path(sys.executable).with_name("gpumarket-sim")
    if beside.exists():
        return str(beside)
    found = shutil.which("gpumarket-sim")
    if found is None:
        pytest.fail("gpumarket-sim is not installed next to this Python nor on PATH (run `make install`)")
    return found


@dataclass
class LiveSim:
    """A running ``gpumarket-sim --profile live`` and its admin surface (``/_sim/``)."""

    url: str
    api_key: str
    process: subprocess.Popen[bytes]
    stderr_path: Path
    session: requests.Session = field(default_factory=requests.Session)

    def __post_init__(self) -> None:
        self.session.trust_env = False  # loopback: never through a proxy from the environment

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        response = self.session.request(method, f"{self.url}/_sim{path}", json=body, timeout=10)
        assert response.status_code == 200, f"{method} /_sim{path}: {response.status_code} {response.text}"
        return response.json()

    def state(self) -> dict[str, Any]:
        return self.admin("GET", "/state")

    def request_log(self) -> list[dict[str, Any]]:
        return self.admin("GET", "/requests")["requests"]

    def alive_ids(self) -> list[int]:
        return sorted(instance["id"] for instance in self.admin("GET", "/alive-instances")["instances"])

    def instance(self, instance_id: int) -> dict[str, Any]:
        matches = [i for i in self.state()["instances"] if i["id"] == instance_id]
        assert matches, f"the simulator has no instance {instance_id}"
        return matches[0]

    def wait_for_status(self, instance_id: int, *statuses: str, timeout: float = 20.0) -> dict[str, Any]:
        """Poll the admin state until the instance's ``actual_status`` is one of ``statuses``."""
        deadline = time.monotonic() + timeout
        while True:
            instance = self.instance(instance_id)
            if instance["actual_status"] in statuses:
                return instance
            if time.monotonic() > deadline:
                pytest.fail(
                    f"instance {instance_id} is {instance['actual_status']!r}, not one of {statuses}, after {timeout} s"
                )
            time.sleep(0.05)

    def stderr_text(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def _read_first_line(process: subprocess.Popen[bytes], stdout_path: Path, stderr_path: Path) -> str:
    deadline = time.monotonic() + SIM_START_TIMEOUT
    while True:
        text = stdout_path.read_text(errors="replace")
        if "\n" in text:
            return text.splitlines()[0]
        if process.poll() is not None:
            pytest.fail(
                f"gpumarket-sim exited with status {process.returncode} before listening.\n"
                f"stdout: {text.strip()}\nstderr: {stderr_path.read_text(errors='replace').strip()}",
                pytrace=False,
            )
        if time.monotonic() > deadline:
            pytest.fail(f"gpumarket-sim printed no first line within {SIM_START_TIMEOUT} s", pytrace=False)
        time.sleep(0.02)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture
def live_sim(tmp_path: Path) -> Iterator[LiveSim]:
    command = [
        _sim_executable(),
        "--profile",
        "live",
        "--port",
        "0",
        "--speed",
        str(SIM_SPEED),
        "--seed",
        str(SIM_SEED),
        "--api-key",
        SIM_API_KEY,
    ]
    stdout_path, stderr_path = tmp_path / "sim.stdout", tmp_path / "sim.stderr"
    with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)
    try:
        first = _read_first_line(process, stdout_path, stderr_path)
        match = re.match(r"gpumarket-sim listening on (http://\S+)", first)
        assert match, f"unexpected first line from gpumarket-sim: {first!r}"
        sim = LiveSim(url=match.group(1), api_key=SIM_API_KEY, process=process, stderr_path=stderr_path)
        yield sim
        sim.session.close()
    finally:
        _stop(process)


# --- the CLI, run against the simulator with a throw-away HOME ------------------------------------------------
@dataclass
class CliResult:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    requests: list[dict[str, Any]]  # what the simulator logged during this invocation

    def json(self) -> Any:
        try:
            return json.loads(self.stdout)
        except ValueError:
            pytest.fail(f"stdout is not JSON\n{self.describe()}", pytrace=False)

    def sent(self) -> list[tuple[str, str, int]]:
        return [(r["method"], r["path"], r["status"]) for r in self.requests]

    def describe(self) -> str:
        log = "\n".join(f"    {r['method']} {r['path']} -> {r['status']}" for r in self.requests) or "    (none)"
        return (
            f"$ vastai {' '.join(self.argv)}\nexit status: {self.returncode}\n"
            f"--- stdout:\n{self.stdout.rstrip()}\n--- stderr:\n{self.stderr.rstrip()}\n--- simulator log:\n{log}"
        )


class Cli:
    def __init__(self, exe: Path, sim: LiveSim, home: Path) -> None:
        self.exe = exe
        self.sim = sim
        self.home = home
        self.config_dir = home / ".config"
        # A minimal environment: no VAST_API_KEY, no proxies, no XDG paths of the real user.
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(self.config_dir),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "TMPDIR": str(home / "tmp"),
            # The CLI fetches /api/v0/gpu_names/unique/ at import from $VAST_URL (not --url), else the real console.
            "VAST_URL": sim.url,
            "VASTAI_NO_UPDATE_CHECK": "1",
            "PYTHONIOENCODING": "utf-8",
            "LANG": "C.UTF-8",
            "COLUMNS": "250",  # wide tables: no truncated ids
            "LINES": "10000",  # long tables: no pager
        }
        (home / "tmp").mkdir(parents=True, exist_ok=True)

    def __call__(self, *args: str, stdin: str = "", with_key: bool = True, timeout: float = CLI_TIMEOUT) -> CliResult:
        argv = ["--url", self.sim.url, *(["--api-key", self.sim.api_key] if with_key else []), *args]
        before = len(self.sim.request_log())
        try:
            done = subprocess.run(
                [str(self.exe), *argv],
                input=stdin,
                capture_output=True,
                text=True,
                env=self.env,
                cwd=self.home,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"`vastai {' '.join(argv)}` did not finish within {timeout} s: {exc}", pytrace=False)
        return CliResult(argv, done.returncode, done.stdout, done.stderr, self.sim.request_log()[before:])


@pytest.fixture
def cli(vastai_exe: Path, live_sim: LiveSim, tmp_path: Path) -> Cli:
    return Cli(vastai_exe, live_sim, tmp_path / "home")
