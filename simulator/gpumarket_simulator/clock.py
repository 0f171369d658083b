"""The simulated clock: real elapsed time times ``speed``, plus manual advances."""

from __future__ import annotations

import threading
import time


class SimClock:
    """Simulated epoch seconds.

    ``now = start + advanced + real_elapsed * speed``. A speed of 0 freezes the clock so that only
    :meth:`advance` moves it, which is what deterministic tests want.
    """

    def __init__(self, speed: float, start: float) -> None:
        if speed < 0:
            raise ValueError(f"speed must be >= 0, got {speed!r}")
        self._lock = threading.Lock()
        self._start = float(start)
        self._speed = float(speed)
        self._advanced = 0.0
        self._t0 = time.monotonic()

    @property
    def speed(self) -> float:
        return self._speed

    @property
    def start(self) -> float:
        return self._start

    def now(self) -> float:
        with self._lock:
            return self._start + self._advanced + (time.monotonic() - self._t0) * self._speed

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("the simulated clock only moves forward")
        with self._lock:
            self._advanced += seconds
        return self.now()

    def set_speed(self, speed: float) -> None:
        if speed < 0:
            raise ValueError(f"speed must be >= 0, got {speed!r}")
        with self._lock:
            # Fold the time run so far into the manual offset so the clock does not jump.
            mono = time.monotonic()
            self._advanced += (mono - self._t0) * self._speed
            self._t0 = mono
            self._speed = float(speed)

    def reset(self, speed: float, start: float) -> None:
        with self._lock:
            self._start = float(start)
            self._speed = float(speed)
            self._advanced = 0.0
            self._t0 = time.monotonic()
