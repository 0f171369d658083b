"""One request budget shared by every process of a machine that calls the service with one API key.

The live service keeps a token bucket per operation, API key and client address, without burst: every process on
one host that calls with one key draws from the same bucket. A process that paces itself as if it owned the key
(as each triggerer, worker and scheduler would) makes two processes send twice the budget, and each refusal costs
a penalty token on top.

So the slots are booked in a small file per (server, key, operation) under the temp folder, locked with
``flock``: it holds the wall-clock second of the next free slot, and each call books the one after it and waits
for its own. Processes on other hosts have buckets of their own and need no coordination; hosts behind one NAT
address share a bucket that no file sees, and the hook's backoff on 429s covers them. Where the file cannot be used
(no ``fcntl``, a temp folder that cannot be written), pacing falls back to this process alone. The file's name is
a digest: it never shows the key.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # not on this platform: each process paces itself
    fcntl = None  # type: ignore[assignment]

#: Where the slot files are: ``$GPUMARKET_PACING_DIR``, else ``<temp folder>/gpumarket-pacing``.
PACING_DIR_ENV = "GPUMARKET_PACING_DIR"


def pacing_dir() -> Path:
    return Path(os.environ.get(PACING_DIR_ENV) or Path(tempfile.gettempdir()) / "gpumarket-pacing")


class SharedPacer:
    """Books request slots for one (server, key, operation) across the processes of this machine.

    ``book(interval)`` returns how long to wait before sending, and keeps the next slot ``interval`` seconds after this
    one.
    """

    def __init__(self, base_url: str, api_key: str, operation: str) -> None:
        digest = hashlib.sha256(f"{base_url.rstrip('/')}\n{api_key}\n{operation}".encode()).hexdigest()[:32]
        self.path = pacing_dir() / f"{operation}-{digest}"
        self._local_next_at = 0.0  # used when the file cannot be
        self._lock = threading.Lock()
        self.shared = fcntl is not None

    def book(self, interval: float) -> float:
        """Seconds to wait before the request this slot is for (0: send now)."""
        if self.shared:
            try:
                return self._book_in_file(interval)
            except OSError:
                self.shared = False  # e.g. a read-only temp folder: from now on, this process alone
        with self._lock:
            now = time.time()
            slot = max(now, self._local_next_at)
            self._local_next_at = slot + interval
            return slot - now

    def free_in(self) -> float:
        """Seconds until the next free slot (0: free now), booking nothing; this process's own view without the file."""
        next_at = self._local_next_at
        if self.shared:
            with contextlib.suppress(OSError, ValueError):
                next_at = float(self.path.read_text() or 0)
        return max(0.0, next_at - time.time())

    def _book_in_file(self, interval: float) -> float:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.pread(fd, 64, 0)
            next_at = 0.0
            with contextlib.suppress(ValueError):
                next_at = float(raw.decode() or 0)
            now = time.time()
            if next_at > now + 3600:  # a clock that jumped back: never wait an hour for a slot
                next_at = now
            slot = max(now, next_at)
            data = f"{slot + interval:.6f}".encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            return slot - now
        finally:
            os.close(fd)  # also releases the lock
