"""Runs an instance's onstart script as a local process, as a host would run it inside the container."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

#: Variables taken from the simulator's own environment. They win over the request's env: a container's PATH
#: (say /opt/conda/bin) means nothing on this machine and would leave the script without a shell toolbox.
INHERITED_VARIABLES = ("PATH", "HOME", "LANG")
#: After a stop or destroy the script gets this long (real seconds) before SIGTERM, so that a script that
#: stopped or destroyed its own instance receives the answer to that request first.
HALT_GRACE_SECONDS = 0.5
KILL_AFTER_TERM_SECONDS = 2.0
MAX_OUTPUT_BYTES = 1 << 20
#: A script that left children holding its output open is reported finished this long after it exits.
DRAIN_SECONDS = 0.5


def free_local_port() -> int:
    """A TCP port of this host that nothing listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class _Run:
    process: subprocess.Popen[bytes]
    workdir: str
    output: bytearray = field(default_factory=bytearray)
    halting: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    drained: threading.Event = field(default_factory=threading.Event)
    exited_at: float | None = None
    bin_dir: str | None = None

    def remove_files(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self.bin_dir:
            shutil.rmtree(self.bin_dir, ignore_errors=True)

    def finished(self) -> bool:
        """The script exited and its output was read to the end (or its children kept the pipe too long)."""
        if self.exited_at is None:
            return False
        return self.drained.is_set() or time.monotonic() - self.exited_at > DRAIN_SECONDS


class OnstartRunner:
    """Runs each instance's onstart script as one process group, keeping its output and exit code.

    A script is started once per instance, and again only after an outbid instance came back; combined stdout/stderr and
    the exit code are kept.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._runs: dict[int, _Run] = {}
        self._base: str | None = None

    def start(
        self,
        instance_id: int,
        script: str,
        env: dict[str, str],
        again: bool = False,
        tools: dict[str, str] | None = None,
    ) -> None:
        """Start the script once per instance.

        ``tools``: executables (name to sh script) put first on its PATH, as the host's ``nvidia-smi`` is. With
        ``again`` (a container that came back after it stopped) it starts anew once the previous run was halted,
        its output following the earlier one's as a container log does.
        """
        if not self.enabled:
            return
        earlier = b""
        with self._lock:
            previous = self._runs.get(instance_id)
            if previous is not None and not (again and previous.halting):
                return
            if previous is not None:
                with previous.lock:
                    earlier = bytes(previous.output)
            if self._base is None:
                self._base = tempfile.mkdtemp(prefix="gpumarket-sim-onstart-")
            workdir = tempfile.mkdtemp(prefix=f"instance-{instance_id}-", dir=self._base)
            path = os.path.join(workdir, "onstart.sh")
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(script)
            full_env = dict(env)
            full_env.update({k: os.environ[k] for k in INHERITED_VARIABLES if k in os.environ})
            full_env["CONTAINER_ID"] = str(instance_id)
            bin_dir = None
            if tools:  # beside the scratch directory, which the script finds empty
                bin_dir = tempfile.mkdtemp(prefix=f"instance-{instance_id}-bin-", dir=self._base)
                for name, text in tools.items():
                    tool = os.path.join(bin_dir, name)
                    with open(tool, "w", encoding="utf-8") as fh:
                        fh.write(text)
                    os.chmod(tool, 0o755)
                full_env["PATH"] = bin_dir + os.pathsep + full_env.get("PATH", os.defpath)
            # Its own scratch space, removed when the instance stops running: scripts that write temporary files
            # (the provider's job wrapper does) leave nothing behind on the simulator's host.
            full_env["TMPDIR"] = workdir
            process = subprocess.Popen(
                [shutil.which("sh") or "/bin/sh", path],
                cwd=workdir,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, so a kill also reaches its children
            )
            run = _Run(process=process, workdir=workdir, output=bytearray(earlier), bin_dir=bin_dir)
            self._runs[instance_id] = run
        threading.Thread(target=self._collect, args=(run,), name=f"onstart-out-{instance_id}", daemon=True).start()
        threading.Thread(target=self._wait, args=(run,), name=f"onstart-wait-{instance_id}", daemon=True).start()

    @staticmethod
    def _wait(run: _Run) -> None:
        run.process.wait()
        run.exited_at = time.monotonic()

    @staticmethod
    def _collect(run: _Run) -> None:
        stream = run.process.stdout
        assert stream is not None
        fd = stream.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            with run.lock:
                run.output += chunk
                if len(run.output) > MAX_OUTPUT_BYTES:
                    del run.output[: len(run.output) - MAX_OUTPUT_BYTES]
        stream.close()
        run.drained.set()

    def halt(self, instance_id: int, grace: float = HALT_GRACE_SECONDS) -> None:
        """The instance stopped running (stop, destroy, failure): end its script as the container would."""
        with self._lock:
            run = self._runs.get(instance_id)
        # Even when the script itself has ended, children it left in the background are ended too.
        if run is None or run.halting:
            return
        run.halting = True
        timer = threading.Timer(grace, self._terminate, args=(run,))
        timer.daemon = True
        timer.start()

    def _terminate(self, run: _Run) -> None:
        groups = {run.process.pid} | _groups_below(run.process.pid)  # as a container's end, whatever left the group
        for group in groups:
            _signal(group, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            run.process.wait(timeout=KILL_AFTER_TERM_SECONDS)
        for group in groups:
            _signal(group, signal.SIGKILL)
        run.remove_files()  # the output is kept in memory

    def result(self, instance_id: int) -> dict[str, Any] | None:
        with self._lock:
            run = self._runs.get(instance_id)
        if run is None:
            return None
        finished = run.finished()
        with run.lock:
            output = run.output.decode("utf-8", "replace")
        return {
            "exit_code": run.process.returncode if finished else None,
            "output": output,
            "running": not finished,
        }

    def reset(self) -> None:
        """Kill every script now and forget them (their scratch directories go too)."""
        with self._lock:
            runs = list(self._runs.values())
            self._runs.clear()
        for run in runs:
            _signal(run.process.pid, signal.SIGKILL)
        for run in runs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.process.wait(timeout=5)
            run.remove_files()

    def close(self) -> None:
        self.reset()
        with self._lock:
            base, self._base = self._base, None
        if base:
            shutil.rmtree(base, ignore_errors=True)


def _signal(group: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


def _groups_below(root: int) -> set[int]:
    """The process groups of every process below ``root`` (``timeout`` and ``setsid`` start groups of their own)."""
    try:
        listing = subprocess.run(
            ["ps", "-A", "-o", "pid=", "-o", "ppid=", "-o", "pgid="], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    children: dict[int, list[tuple[int, int]]] = {}
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) == 3 and all(f.isdigit() for f in fields):
            pid, ppid, pgid = map(int, fields)
            children.setdefault(ppid, []).append((pid, pgid))
    groups, todo = set(), [root]
    while todo:
        for pid, pgid in children.get(todo.pop(), []):
            groups.add(pgid)
            todo.append(pid)
    return groups - {root, os.getpgrp()}
