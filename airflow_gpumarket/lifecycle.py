"""The rental's life as pure functions: deterministic labels with a lease, and what an observed status means.

Used by the operators (synchronous polling), the trigger (asynchronous polling) and the reaper, so the three
read a status the same way. No Airflow and no transport imports.

Label format (at most 28 characters): ``afgm-<key>-<lease_until>`` where ``key`` is 12 hex characters of
sha256(dag_id|run_id|task_id|map_index), the same for every try of one task instance, and ``lease_until`` is the
epoch second after which the reaper may destroy the instance.

Leases kept alive: while a task watches a job (in the worker or in the triggerer), the lease in the label is kept a
short ``keepalive`` ahead and renewed by changing the label, never past the job's own limit. When the watching side
is gone for longer than that, the reaper may destroy the instance; an instance found gone after its lease expired
cannot count as a job that ended well (the reaper, not the job, may have destroyed it).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_gpumarket import api

LABEL_PREFIX = "afgm-"
_LABEL = re.compile(r"^afgm-([0-9a-f]{12})-(\d{1,12})$")

#: Wait modes of the trigger and the waiting loop.
WAIT_STATUS = "status"  # until actual_status equals a target (default running)
WAIT_JOB = "job"  # through boot and the onstart job, until the job ends its own billing

# Event kinds (the "status" key of every event).
REACHED = "reached"
NEVER_RUNS = "never_runs"
GONE = "gone"
JOB_SUCCEEDED = "job_succeeded"
JOB_FAILED = "job_failed"
BOOT_TIMEOUT = "boot_timeout"
TIMEOUT = "timeout"
ERROR = "error"
LEASE_EXPIRED = "lease_expired"
#: ``limit`` of a TIMEOUT event that max_runtime ended (other timeouts come from an absolute deadline).
MAX_RUNTIME = "max_runtime"

#: A kept-alive lease is renewed once less than this share of ``keepalive`` is left (every third of it).
RENEW_WHEN_LEFT = 2 / 3


def rental_key(dag_id: str, run_id: str, task_id: str, map_index: int | None) -> str:
    """Same value for every try of one task instance, so a retry finds what an earlier try rented."""
    raw = f"{dag_id}|{run_id}|{task_id}|{-1 if map_index is None else map_index}"
    return hashlib.sha256(raw.encode()).hexdigest()[:12]


def make_label(key: str, lease_until: float) -> str:
    return f"{LABEL_PREFIX}{key}-{int(lease_until)}"


def parse_label(label: Any) -> tuple[str, int] | None:
    """(key, lease_until) of a label this provider wrote, else None (instances made by hand are never touched)."""
    match = _LABEL.match(label) if isinstance(label, str) else None
    return (match.group(1), int(match.group(2))) if match else None


def renewed_label(label: Any, *, now: float, keepalive: float, lease_cap: float) -> str | None:
    """The label with its lease moved to ``min(now + keepalive, lease_cap)`` when a renewal is due, else None.

    Due once less than ``RENEW_WHEN_LEFT`` of ``keepalive`` is left; never moved past ``lease_cap`` (the job's own
    limit) and never moved backwards. None as well for a label this provider did not write.
    """
    parsed = parse_label(label)
    if parsed is None:
        return None
    key, lease_until = parsed
    target = int(min(now + keepalive, lease_cap))
    if lease_until - now >= keepalive * RENEW_WHEN_LEFT or target <= lease_until:
        return None
    return make_label(key, target)


def lease_of(label: Any) -> int | None:
    """The lease_until of a label this provider wrote, else None."""
    parsed = parse_label(label)
    return parsed[1] if parsed else None


def started_at(instance: Mapping[str, Any], *, fallback: float, now: float) -> float:
    """When the instance started billing, from the service's ``start_date`` (epoch seconds) when it is a
    plausible number, else ``fallback``."""
    value = instance.get("start_date")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= now:
        return float(value)
    return fallback


def rentals_of(instances: Iterable[Mapping[str, Any]], key: str) -> list[Mapping[str, Any]]:
    """Instances rented by the task instance with this key (any try), oldest first."""
    found = [i for i in instances if (parsed := parse_label(i.get("label"))) and parsed[0] == key]
    return sorted(found, key=lambda i: i.get("id") or 0)


def evaluate(
    *,
    wait_for: str,
    status: str | None,
    gone: bool,
    now: float,
    seen_running: bool,
    target_status: str = api.STATUS_RUNNING,
    boot_deadline: float | None = None,
    deadline: float | None = None,
    lease_until: float | None = None,
    max_runtime: float | None = None,
    running_since: float | None = None,
) -> dict[str, Any] | None:
    """What one observation means: an event dict when waiting is over, None to keep waiting.

    ``status``: the instance's actual_status (ignored when ``gone``, i.e. the instance answered 404).
    In job mode, the job wrapper destroys the instance after exit 0 (gone = success) and stops it otherwise; gone
    after ``lease_until`` (the label's lease as last written) proves nothing, since the reaper may have destroyed it.
    ``max_runtime`` counts from ``running_since``, when the watcher first saw the instance running (the job starts
    then); ``deadline`` is absolute.
    """
    if wait_for == WAIT_JOB:
        if gone and lease_until is not None and now > lease_until:
            return {"status": LEASE_EXPIRED}
        if gone:
            return {"status": JOB_SUCCEEDED}
        if status == api.STATUS_RUNNING:
            pass
        elif status in api.FAILED_STATUSES and not seen_running:
            return {"status": NEVER_RUNS, "actual_status": status}
        elif not api.is_booting(status):
            return {"status": JOB_FAILED, "actual_status": status}
    else:
        if gone:
            return {"status": GONE}
        if status == target_status:
            return {"status": REACHED, "actual_status": status}
        if status in api.FAILED_STATUSES or (target_status == api.STATUS_RUNNING and api.will_never_run(status)):
            return {"status": NEVER_RUNS, "actual_status": status}
    if boot_deadline is not None and api.is_booting(status) and now >= boot_deadline:
        return {"status": BOOT_TIMEOUT, "actual_status": status}
    if deadline is not None and now >= deadline:
        return {"status": TIMEOUT, "actual_status": status}
    if max_runtime is not None and running_since is not None and now >= running_since + max_runtime:
        return {"status": TIMEOUT, "actual_status": status, "limit": MAX_RUNTIME}
    return None


def describe_event(event: Mapping[str, Any], instance_id: int) -> str:
    """A sentence for the task log and for exception messages."""
    kind = event.get("status")
    status = event.get("actual_status")
    return {
        REACHED: f"instance {instance_id} reached status {status!r}",
        NEVER_RUNS: f"instance {instance_id} ended in status {status!r}, which never becomes running "
        "(the host failed); it must be destroyed and another offer tried",
        GONE: f"instance {instance_id} no longer exists (destroyed)",
        JOB_SUCCEEDED: f"the job on instance {instance_id} exited 0 and the instance destroyed itself",
        JOB_FAILED: f"the job on instance {instance_id} failed: the instance is in status {status!r} "
        "(the job wrapper stops the instance when the command exits non-zero, or the host failed mid-job)",
        BOOT_TIMEOUT: f"instance {instance_id} did not reach running before boot_timeout (last status {status!r})",
        TIMEOUT: (
            f"the job on instance {instance_id} ran longer than max_runtime (last status {status!r})"
            if event.get("limit") == MAX_RUNTIME
            else f"instance {instance_id} hit its time limit (last status {status!r})"
        ),
        ERROR: f"waiting for instance {instance_id} failed: {event.get('message')}",
        LEASE_EXPIRED: f"instance {instance_id} is gone, but its lease had expired before (nothing renewed it), so "
        "the reaper may have destroyed it: the job's outcome is unknown",
    }.get(str(kind), f"instance {instance_id}: unexpected event {dict(event)!r}")


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def estimated_cost(dph_total: float | None, seconds: float) -> float | None:
    """Compute cost so far at the offer's hourly price (disk charges, whose price is not shown, not included)."""
    return None if dph_total is None else round(dph_total * max(0.0, seconds) / 3600.0, 4)
