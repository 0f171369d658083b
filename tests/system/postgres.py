"""A throwaway PostgreSQL server for the deployments of deployment.py: Airflow's metadata database as production
runs it (SQLite lets one writer at a time, and its lock has stalled whole runs of `make system`).

The server is Debian's `postgresql` package (the Makefile installs it when missing). It runs from a temporary
directory on a loopback port, with trust authentication for one local role, and is removed when it stops. As
root it runs as the unprivileged `postgres` user (PostgreSQL refuses to run as root), which may not be able to
enter the checkout (a clone inside a `mktemp -d` folder, mode 0700): its programs run from the temporary
directory and write their log there, copied to the deployment's log path as it stops. Nothing else on the machine
is touched: not the package's own cluster, not another server.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

#: Debian installs each major version's programs here.
_BIN_GLOB = "/usr/lib/postgresql/*/bin"
ROLE = "airflow"
DATABASE = "airflow"
#: Seconds pg_ctl waits for the server to start or stop.
PG_CTL_WAIT = 60


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def find_bin() -> Path:
    """The newest installed PostgreSQL's program folder; RuntimeError naming the fix when there is none."""
    found = sorted(Path("/").glob(_BIN_GLOB.lstrip("/")), key=lambda p: int(p.parent.name))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql (make system does it as root)")
    return found[-1]


class Postgres:
    """One server: ``start()``, ``url`` for SQLAlchemy, ``restart(down_seconds)``, ``stop()``."""

    def __init__(self, log: Path) -> None:
        self.bin = find_bin()
        self.port = _free_port()
        self.log = log  # where the server's log is copied as it stops
        self.root = Path(tempfile.mkdtemp(prefix="gpumarket-pg-"))
        self.data = self.root / "data"
        self.server_log = self.root / "postgres.log"  # where the server writes it: a folder its user can enter
        self.run_as: list[str] = []
        if os.geteuid() == 0:  # initdb and postgres refuse root: run them as the package's unprivileged user
            self.run_as = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.root, "postgres", "postgres")

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://{ROLE}@127.0.0.1:{self.port}/{DATABASE}"

    def _run(self, program: str, *args: str) -> None:
        command = [*self.run_as, str(self.bin / program), *args]
        result = subprocess.run(command, capture_output=True, text=True, check=False, cwd=self.root)
        if result.returncode != 0:
            raise RuntimeError(f"{program} failed ({result.returncode}): {(result.stderr or result.stdout)[-600:]}")

    def start(self) -> None:
        if not self.data.exists():
            self._run("initdb", "-D", str(self.data), "-U", ROLE, "--auth=trust", "-E", "UTF8", "--no-sync")
        self._pg_ctl("start")
        if not getattr(self, "_created", False):
            self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", ROLE, DATABASE)
            self._created = True

    def _pg_ctl(self, action: str) -> None:
        # A socket folder of its own (not /var/run/postgresql), fsync off: a test database, rebuilt every run.
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off"
        )
        args = ["-D", str(self.data), "-w", "-t", str(PG_CTL_WAIT)]
        if action == "start":
            args += ["-o", options, "-l", str(self.server_log)]
        else:
            args += ["-m", "fast"]
        self._run("pg_ctl", action, *args)

    def restart(self, down_seconds: float) -> None:
        """Stop the server, leave it down for ``down_seconds``, start it again (same port, same data)."""
        self._pg_ctl("stop")
        time.sleep(down_seconds)
        self._pg_ctl("start")

    def stop(self) -> None:
        """Stop the server (fast shutdown: open sessions are ended) and remove its folder."""
        with contextlib.suppress(RuntimeError):
            if (self.data / "postmaster.pid").exists():
                self._pg_ctl("stop")
        with contextlib.suppress(OSError):
            shutil.copyfile(self.server_log, self.log)
        shutil.rmtree(self.root, ignore_errors=True)
