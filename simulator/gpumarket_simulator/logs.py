"""Instance logs as the live service serves them, through an unguessable upload URL.

A request snapshots the log and "uploads" it to that URL, which answers 404 until the upload lands, then the text,
without any key.

The container log is what the instance's processes printed: the onstart script's combined output when the
simulator executes onstart, else a short boot log. The daemon log is the host's account of the instance's life,
written from its recorded history (useful when an instance never boots). Not in the spec: the simulator's own
choices are listed in docs/simulator.md.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpumarket_simulator.instances import Instance

#: Simulated seconds between a logs request and its upload being readable (the official client polls for ~9 s).
UPLOAD_SECONDS = 2.0
#: Uploads kept at most; the oldest go first.
MAX_UPLOADS = 2000
#: Path under which uploads are served, outside the API and the loopback-only admin surface.
UPLOAD_PREFIX = "/sim-log-uploads/"
DEFAULT_TAIL = 1000


@dataclass
class Upload:
    ready_at: float  # simulated time
    text: str


class LogUploads:
    """Snapshots waiting to be fetched; thread-safe (requests arrive on the server's loop, admin calls elsewhere)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._uploads: OrderedDict[str, Upload] = OrderedDict()

    def put(self, text: str, now: float) -> str:
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._uploads[token] = Upload(ready_at=now + UPLOAD_SECONDS, text=text)
            while len(self._uploads) > MAX_UPLOADS:
                self._uploads.popitem(last=False)
        return token

    def get(self, token: str, now: float) -> str | None:
        """The text once uploaded; None while the upload has not landed, or for a token never given out."""
        with self._lock:
            upload = self._uploads.get(token)
        if upload is None or now < upload.ready_at:
            return None
        return upload.text

    def clear(self) -> None:
        with self._lock:
            self._uploads.clear()


def select(text: str, tail: int | None, log_filter: str | None) -> str:
    """The lines matching ``log_filter``, then the last ``tail`` of them.

    ``log_filter`` is a regular expression, as grep; it is taken literally when it is not one.
    """
    lines = text.splitlines()
    if log_filter:
        try:
            pattern = re.compile(log_filter)
        except re.error:
            pattern = re.compile(re.escape(log_filter))
        lines = [line for line in lines if pattern.search(line)]
    lines = lines[-(tail or DEFAULT_TAIL) :]
    return "".join(f"{line}\n" for line in lines)


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def boot_log(inst: Instance) -> str:
    """The container log of an instance whose onstart is not executed: what its boot printed."""
    if inst.first_running_at is None:
        return ""
    lines = [
        f"{_stamp(inst.first_running_at)} container started from image {inst.config.get('image')}",
        "gpumarket-sim: onstart is not executed (start the simulator with --execute-onstart to run it)",
    ]
    return "".join(f"{line}\n" for line in lines)


def daemon_log(inst: Instance, now: float) -> str:
    """The host daemon's account of one instance, from its recorded history."""
    machine = inst.offer.machine_id
    created = _stamp(inst.created_at)
    lines = [f"{created} machine {machine}: instance {inst.id} created, pulling {inst.config.get('image')}"]
    if inst.provisioned:
        lines.append(f"{created} image pulled; creating the container")
    if inst.first_running_at is not None:
        lines.append(f"{_stamp(inst.first_running_at)} container started")
    status = inst.status
    if status in (None, "loading"):
        lines.append(f"{_stamp(now)} still {'loading' if status else 'provisioning'}: the image is being pulled")
    elif status == "exited":
        lines.append(f"{_stamp(now)} container exited unexpectedly; it will not be restarted on this host")
    elif status == "unknown":
        lines.append(f"{_stamp(now)} lost contact with the container; its state is unknown")
    elif status == "offline":
        lines.append(f"{_stamp(now)} machine {machine} is offline")
    elif status == "stopped":
        lines.append(f"{_stamp(now)} container stopped on request")
    return "".join(f"{line}\n" for line in lines)
