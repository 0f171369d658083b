"""The throwaway PostgreSQL server of the system tests runs from any checkout.

As root, the server runs as the unprivileged `postgres` user, who may not enter the checkout (a clone inside a
`mktemp -d` folder is mode 0700): its programs must run from, and write their log into, a folder of their own.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from . import postgres


@pytest.fixture
def postgres_module(monkeypatch):
    monkeypatch.setattr(postgres, "find_bin", lambda: Path("/usr/lib/postgresql/15/bin"))
    monkeypatch.setattr(postgres.os, "geteuid", lambda: 0)
    monkeypatch.setattr(postgres.shutil, "chown", lambda *_: None)
    return postgres


def test_rule_the_server_runs_and_logs_in_its_own_folder_never_in_the_checkout(postgres_module, tmp_path, monkeypatch):
    calls = []

    def run(command, **kwargs):
        calls.append((command, kwargs.get("cwd")))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(postgres_module.subprocess, "run", run)
    checkout = tmp_path / "private-0700" / "checkout"
    log = checkout / ".airflow" / "system-1" / "postgres.log"
    log.parent.mkdir(parents=True)
    server = postgres_module.Postgres(log)
    server.start()
    assert [command[4].rsplit("/", 1)[-1] for command, _ in calls] == ["initdb", "pg_ctl", "createdb"]
    assert all(command[:4] == ["runuser", "-u", "postgres", "--"] for command, _ in calls)
    assert all(cwd is not None and Path(cwd) == server.root for _, cwd in calls)  # never the checkout
    pg_ctl = calls[1][0]
    server_log = Path(pg_ctl[pg_ctl.index("-l") + 1])
    assert server_log.parent == server.root and checkout not in server_log.parents
    server_log.write_text("database system is ready to accept connections\n")
    (server.data / "postmaster.pid").parent.mkdir(parents=True)
    server.stop()  # the log is copied to where the deployment keeps its logs, the folder removed
    assert log.read_text() == "database system is ready to accept connections\n" and not server.root.exists()
