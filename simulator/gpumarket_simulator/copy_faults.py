"""Copy faults: rules that make the next matching copies fail, or report them finished, part of the way through."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpumarket_simulator.storage import DIRECTIONS, KINDS

#: How a faulty copy ends: ``failed``, or ``finished`` as reported although it moved only part of its files.
FAULT_ENDS = ("failed", "finished")


@dataclass
class CopyFault:
    """Make the next ``times`` matching copies end once ``after_fraction`` of their files are done.

    ``ends``: ``failed`` (with ``msg`` as the reason) or ``finished`` (reported done, the rest never moved).
    ``status_msg``: the whole status message of that end instead of the simulator's wording (another service's).
    """

    times: int
    after_fraction: float
    kind: str | None = None
    direction: str | None = None
    msg: str = "injected failure"
    ends: str = "failed"
    status_msg: str | None = None

    def view(self) -> dict[str, Any]:
        return {
            "times_left": self.times,
            "after_fraction": self.after_fraction,
            "kind": self.kind,
            "direction": self.direction,
            "msg": self.msg,
            "ends": self.ends,
            "status_msg": self.status_msg,
        }


def parse_copy_faults(rules: Any) -> list[CopyFault]:
    if not isinstance(rules, list):
        raise ValueError("copy fault rules must be a list of objects")
    parsed = []
    for i, spec in enumerate(rules):
        where = f"rule {i}"
        if not isinstance(spec, dict):
            raise ValueError(f"{where}: must be an object")
        unknown = set(spec) - {"times", "after_fraction", "kind", "direction", "msg", "ends", "status_msg"}
        if unknown:
            raise ValueError(f"{where}: unknown fields {', '.join(sorted(unknown))}")
        times = spec.get("times", 1)
        if isinstance(times, bool) or not isinstance(times, int) or times < 0:
            raise ValueError(f"{where}: times must be an integer >= 0")
        fraction = spec.get("after_fraction", 0.5)
        if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 <= fraction <= 1:
            raise ValueError(f"{where}: after_fraction must be a number from 0 to 1")
        kind = spec.get("kind")
        if kind is not None and kind not in KINDS:
            raise ValueError(f"{where}: kind must be one of {', '.join(KINDS)} or null")
        direction = spec.get("direction")
        if direction is not None:
            if not isinstance(direction, str) or direction.lower() not in {d.lower() for d in DIRECTIONS}:
                raise ValueError(f"{where}: direction must be one of {', '.join(DIRECTIONS)} or null")
            direction = next(d for d in DIRECTIONS if d.lower() == direction.lower())
        msg = spec.get("msg", "injected failure")
        if not isinstance(msg, str):
            raise ValueError(f"{where}: msg must be a string")
        ends = spec.get("ends", "failed")
        if ends not in FAULT_ENDS:
            raise ValueError(f"{where}: ends must be one of {', '.join(FAULT_ENDS)}")
        status_msg = spec.get("status_msg")
        if status_msg is not None and not isinstance(status_msg, str):
            raise ValueError(f"{where}: status_msg must be a string or null")
        parsed.append(CopyFault(times, float(fraction), kind, direction, msg, ends, status_msg))
    return parsed
