"""Instance disks, cloud buckets and the copies between them, as a small engine on the simulated clock.

Each instance has a directory of its own (its disk: an instance path ``/a/b`` is ``<disk>/a/b``), kept while the
instance exists, stopped or outbid included, and removed when it is destroyed. Each cloud integration has a bucket
directory. A copy (``copy_direct`` between two instances, ``rclone`` between an instance and a bucket) starts after
a latency and moves files one by one, in sorted path order, at a modelled rate of simulated time; each file is
written under a temporary name and renamed when whole, as rsync does. What a copy did shows in its instance's
``status_msg`` some simulated seconds late, as on the live service.

Called with the market lock held (see ``market.py``), with the time ``now`` the world was brought to.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpumarket_simulator.errors import bad_request

if TYPE_CHECKING:
    from gpumarket_simulator.copy_faults import CopyFault
    from gpumarket_simulator.world import World

#: What the onstart script's process finds its disk under; the provider's job wrapper prefixes instance paths
#: with it (on the real service it is unset: the prefix is empty).
INSTANCE_ROOT_ENV = "GPUMARKET_INSTANCE_ROOT"
#: Modelled transfer rate of one copy, bytes per simulated second (50 MB/s).
DEFAULT_BYTES_PER_SECOND = 50_000_000.0
#: Simulated seconds between a copy request and its first byte.
DEFAULT_START_LATENCY_SECONDS = 5.0
#: How late (simulated seconds) a copy's progress shows in ``status_msg``; the official CLI says "~30 seconds".
STATUS_DELAY_SECONDS = 30.0
BYTES_PER_GB = 1e9

COPY_DIRECT = "copy_direct"
RCLONE = "rclone"
KINDS = (COPY_DIRECT, RCLONE)
INSTANCE_TO_CLOUD = "Instance To Cloud"
CLOUD_TO_INSTANCE = "Cloud To Instance"
TRANSFERS = {t.lower(): t for t in (INSTANCE_TO_CLOUD, CLOUD_TO_INSTANCE)}
#: ``direction`` of a copy_direct in /_sim/copies and in copy fault rules.
INSTANCE_TO_INSTANCE = "Instance To Instance"
DIRECTIONS = (INSTANCE_TO_CLOUD, CLOUD_TO_INSTANCE, INSTANCE_TO_INSTANCE)
STATES = ("pending", "running", "finished", "failed", "cancelled")

#: The live service's wording of a cloud copy (public: the official CLI tells users to wait for "Finished").
CLOUD_WORDS = {
    "progress": "Cloud Copy Operation",
    "finished": "Cloud Copy Operation Finished",
    "failed": "Cloud Copy Operation Failed",
    "cancelled": "Cloud Copy Operation Cancelled",
}
#: The simulator's own wording of an instance-to-instance copy (the live wording is not public).
DIRECT_WORDS = {
    "progress": "Remote copy",
    "finished": "Remote copy finished",
    "failed": "Remote copy failed",
    "cancelled": "Remote copy cancelled",
}
TEMP_PREFIX = ".gpumarket-sim-partial."


def instance_path(value: Any, field_name: str) -> str:
    """An absolute instance path as the parts below the disk ("" for the root); 400 naming the field otherwise."""
    if not isinstance(value, str) or not value:
        raise bad_request(f"{field_name} must be a non-empty absolute path string")
    if not value.startswith("/"):
        raise bad_request(f"{field_name} must be an absolute path (start with /), got {value!r}")
    return _clean(value, field_name)


def bucket_path(value: Any, field_name: str) -> str:
    """A path inside a bucket, with or without a leading slash; 400 naming the field for ``..`` or NUL."""
    if not isinstance(value, str) or not value:
        raise bad_request(f"{field_name} must be a non-empty path string")
    return _clean(value, field_name)


def _clean(value: str, field_name: str) -> str:
    if "\0" in value:
        raise bad_request(f"{field_name} must not contain a NUL character")
    parts = [p for p in value.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise bad_request(f"{field_name} must not contain '..' components, got {value!r}")
    return "/".join(parts) + ("/" if value.endswith("/") and parts else "")


@dataclass
class Endpoint:
    """One side of a copy: an instance's disk or a bucket, and the path inside it."""

    instance_id: int | None
    integration_id: int | None
    path: str  # relative to the root, as ``instance_path``/``bucket_path`` return it

    def label(self) -> str:
        where = f"C.{self.instance_id}" if self.instance_id is not None else f"cloud.{self.integration_id}"
        return f"{where}:/{self.path}"


@dataclass
class Copy:
    id: int
    kind: str
    direction: str
    src: Endpoint
    dst: Endpoint
    #: The instance whose status_msg shows the copy: the destination of a copy_direct, the instance of a cloud copy.
    shown_on: int
    requested_at: float
    start_at: float
    flags: list[str] = field(default_factory=list)
    state: str = "pending"
    files: list[tuple[str, str, int]] = field(default_factory=list)  # (source file, destination file, size)
    files_done: int = 0
    bytes_done: float = 0.0  # bytes moved, the current file's part included
    billed_bytes: int = 0
    current_temp: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    last_t: float = 0.0
    error: str | None = None
    fault: CopyFault | None = None

    @property
    def bytes_total(self) -> int:
        return sum(size for _, _, size in self.files)

    @property
    def active(self) -> bool:
        return self.state in ("pending", "running")

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "direction": self.direction,
            "src": self.src.label(),
            "dst": self.dst.label(),
            "src_instance_id": self.src.instance_id,
            "dst_instance_id": self.dst.instance_id,
            "integration_id": self.src.integration_id or self.dst.integration_id,
            "shown_on": self.shown_on,
            "flags": list(self.flags),
            "state": "running" if self.state == "pending" else self.state,
            "files_done": self.files_done,
            "files_total": len(self.files),
            "bytes_done": int(self.bytes_done),
            "bytes_total": self.bytes_total,
            "requested_at": self.requested_at,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "error": self.error,
        }


class Storage:
    """Disks, buckets and copies under one data directory (a temporary one unless given)."""

    def __init__(self, data_dir: str | os.PathLike[str] | None = None) -> None:
        self._owns_root = data_dir is None
        self.root = os.path.abspath(tempfile.mkdtemp(prefix="gpumarket-sim-data-") if data_dir is None else data_dir)
        self.disks_dir = os.path.join(self.root, "disks")
        self.buckets_dir = os.path.join(self.root, "buckets")
        self.bytes_per_second = DEFAULT_BYTES_PER_SECOND
        self.start_latency = DEFAULT_START_LATENCY_SECONDS
        self.status_delay = STATUS_DELAY_SECONDS
        self.copies: dict[int, Copy] = {}
        self.faults: list[CopyFault] = []
        #: (visible at, sequence, instance id, message), shown in status_msg once the clock passes the time.
        self._notes: list[tuple[float, int, int, str]] = []
        self._next_id = 1
        self._seq = 0
        self._make_dirs()

    def _make_dirs(self) -> None:
        os.makedirs(self.disks_dir, exist_ok=True)
        os.makedirs(self.buckets_dir, exist_ok=True)

    # --- disks and buckets ----------------------------------------------------------------------------------
    def disk(self, instance_id: int) -> str:
        return os.path.join(self.disks_dir, f"instance-{instance_id}")

    def bucket(self, integration_id: int) -> str:
        return os.path.join(self.buckets_dir, str(integration_id))

    def create_disk(self, instance_id: int) -> None:
        os.makedirs(self.disk(instance_id), exist_ok=True)

    def create_bucket(self, integration_id: int, files: Mapping[str, bytes] | None = None) -> None:
        """The bucket's directory, holding ``files`` (path -> bytes) to begin with."""
        os.makedirs(self.bucket(integration_id), exist_ok=True)
        for path, data in (files or {}).items():
            full = os.path.join(self.bucket(integration_id), path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as fh:
                fh.write(data)

    def remove_disk(self, instance_id: int) -> None:
        shutil.rmtree(self.disk(instance_id), ignore_errors=True)

    def reset(self, buckets: Mapping[int, Mapping[str, bytes]]) -> None:
        """Forget every copy and setting; empty disks and buckets, then make the world's buckets again."""
        self.copies.clear()
        self.faults = []
        self._notes.clear()
        self.bytes_per_second = DEFAULT_BYTES_PER_SECOND
        self.start_latency = DEFAULT_START_LATENCY_SECONDS
        self.status_delay = STATUS_DELAY_SECONDS
        shutil.rmtree(self.disks_dir, ignore_errors=True)
        shutil.rmtree(self.buckets_dir, ignore_errors=True)
        self._make_dirs()
        for integration_id, files in buckets.items():
            self.create_bucket(integration_id, files)

    def close(self) -> None:
        if self._owns_root:
            shutil.rmtree(self.root, ignore_errors=True)
        else:  # a --data-dir of the user's: leave the directory itself
            shutil.rmtree(self.disks_dir, ignore_errors=True)
            shutil.rmtree(self.buckets_dir, ignore_errors=True)

    @staticmethod
    def list_files(root: str) -> list[dict[str, Any]]:
        return [{"path": rel, "size": size} for rel, size in _walk(root) if not _is_temp(rel)] + [
            {"path": rel, "size": size, "partial": True} for rel, size in _walk(root) if _is_temp(rel)
        ]

    @staticmethod
    def resolve(root: str, path: Any, field_name: str = "path") -> str:
        """A path under ``root`` (an admin route's), refusing ``..`` and symbolic links out of it."""
        rel = bucket_path(path, field_name).rstrip("/")
        full = os.path.join(root, rel)
        if not _inside(root, full):
            raise bad_request(f"{field_name} leads out of its directory")
        return full

    # --- settings ------------------------------------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        return {
            "bytes_per_second": self.bytes_per_second,
            "start_latency_seconds": self.start_latency,
            "status_delay_seconds": self.status_delay,
        }

    def set_settings(self, body: dict[str, Any]) -> None:
        names = {
            "bytes_per_second": "bytes_per_second",
            "start_latency_seconds": "start_latency",
            "status_delay_seconds": "status_delay",
        }
        unknown = set(body) - set(names)
        if unknown:
            raise ValueError(f"unknown settings {', '.join(sorted(unknown))}; known: {', '.join(names)}")
        values = {}
        for name, value in body.items():
            ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
            if not ok or value < 0 or (name == "bytes_per_second" and value <= 0):
                raise ValueError(f"{name} must be a finite number {'> 0' if name == 'bytes_per_second' else '>= 0'}")
            values[names[name]] = float(value)
        for attr, value in values.items():
            setattr(self, attr, value)

    # --- copies --------------------------------------------------------------------------------------------
    def start_copy(
        self,
        kind: str,
        direction: str,
        src: Endpoint,
        dst: Endpoint,
        shown_on: int,
        now: float,
        flags: list[str] | None = None,
    ) -> Copy:
        copy = Copy(
            id=self._next_id,
            kind=kind,
            direction=direction,
            src=src,
            dst=dst,
            shown_on=shown_on,
            requested_at=now,
            start_at=now + self.start_latency,
            flags=list(flags or []),
            last_t=now,
        )
        self._next_id += 1
        for rule in self.faults:
            if rule.times > 0 and rule.kind in (None, kind) and rule.direction in (None, direction):
                rule.times -= 1
                copy.fault = rule
                break
        self.copies[copy.id] = copy
        return copy

    def cancel(self, world: World, match: Callable[[Copy], bool], now: float) -> int:
        cancelled = 0
        for copy in self.copies.values():
            if copy.active and match(copy):
                self._end(copy, "cancelled", now, None, world)
                cancelled += 1
        return cancelled

    def instance_destroyed(self, world: World, instance_id: int, now: float) -> None:
        """Copies from or to a destroyed instance fail (its disk goes); outbid or stopped ones carry on."""
        for copy in self.copies.values():
            if copy.active and instance_id in (copy.src.instance_id, copy.dst.instance_id):
                self._end(copy, "failed", now, f"instance {instance_id} was destroyed", world)
        self.remove_disk(instance_id)

    def view(self) -> list[dict[str, Any]]:
        return [c.view() for c in self.copies.values()]

    def update(self, world: World, now: float) -> None:
        """Move every copy up to ``now`` and show the status messages that are due."""
        for copy in list(self.copies.values()):
            if copy.active:
                self._advance(world, copy, now)
        due = [n for n in self._notes if n[0] <= now]
        if due:
            self._notes = [n for n in self._notes if n[0] > now]
            for _, _, instance_id, text in sorted(due):
                inst = world.live.get(instance_id)
                if inst is not None:
                    inst.status_msg = text

    def _root_of(self, end: Endpoint) -> str:
        return self.disk(end.instance_id) if end.instance_id is not None else self.bucket(end.integration_id or 0)

    def _advance(self, world: World, copy: Copy, now: float) -> None:
        if now < copy.start_at:
            return
        if copy.state == "pending":
            self._begin(world, copy)
            if not copy.active:
                return
        t = max(copy.last_t, copy.start_at)
        rate = self.bytes_per_second
        while copy.active and copy.files_done < len(copy.files):
            if self._fault_due(copy):
                self._end_by_fault(world, copy, t)
                return
            src, dst, size = copy.files[copy.files_done]
            done_before = sum(s for _, _, s in copy.files[: copy.files_done])
            left = size - (copy.bytes_done - done_before)
            if copy.current_temp is None:
                copy.current_temp = _open_temp(dst)
            if t + left / rate > now:
                copy.bytes_done += (now - t) * rate
                copy.last_t = now
                return
            t += left / rate
            copy.bytes_done = done_before + size
            error = _finish_file(src, dst, copy.current_temp)
            copy.current_temp = None
            if error is not None:
                self._end(copy, "failed", t, error, world)
                return
            copy.files_done += 1
            self._bill(world, copy, t)
            self._note(copy, t, self._progress_text(copy))
        if copy.active and self._fault_due(copy):
            self._end_by_fault(world, copy, t)
        elif copy.active:
            self._end(copy, "finished", t, None, world)

    def _end_by_fault(self, world: World, copy: Copy, at: float) -> None:
        fault = copy.fault
        assert fault is not None
        self._end(copy, fault.ends, at, fault.msg if fault.ends == "failed" else None, world, words=fault.status_msg)

    @staticmethod
    def _fault_due(copy: Copy) -> bool:
        if copy.fault is None:
            return False
        return copy.files_done >= math.ceil(copy.fault.after_fraction * len(copy.files))

    def _begin(self, world: World, copy: Copy) -> None:
        """The first byte moves: the source is listed now; a source that does not exist fails the copy."""
        copy.state = "running"
        copy.started_at = copy.start_at
        copy.last_t = copy.start_at
        src_root, dst_root = self._root_of(copy.src), self._root_of(copy.dst)
        src_full = os.path.join(src_root, copy.src.path.rstrip("/"))
        dst_full = os.path.join(dst_root, copy.dst.path.rstrip("/"))
        if not _inside(src_root, src_full) or not _inside(dst_root, dst_full):
            self._end(copy, "failed", copy.start_at, "the path leads out of its disk or bucket", world)
            return
        if os.path.isdir(src_full):
            copy.files = [
                (os.path.join(src_full, rel), os.path.join(dst_full, rel), size) for rel, size in _walk(src_full)
            ]
        elif os.path.isfile(src_full) and not os.path.islink(src_full):
            into = copy.dst.path.endswith("/") or copy.dst.path == "" or os.path.isdir(dst_full)
            target = os.path.join(dst_full, os.path.basename(src_full)) if into else dst_full
            copy.files = [(src_full, target, os.path.getsize(src_full))]
        else:
            self._end(copy, "failed", copy.start_at, f"source {copy.src.label()} does not exist", world)
            return
        self._note(copy, copy.start_at, self._progress_text(copy))

    def _progress_text(self, copy: Copy) -> str:
        words = CLOUD_WORDS if copy.kind == RCLONE else DIRECT_WORDS
        total = copy.bytes_total
        percent = int(100 * copy.bytes_done / total) if total else int(100 * copy.files_done / max(1, len(copy.files)))
        return f"{words['progress']}: {percent}% ({copy.files_done} of {len(copy.files)} files)"

    def _end(
        self,
        copy: Copy,
        state: str,
        at: float,
        reason: str | None,
        world: World | None = None,
        words: str | None = None,
    ) -> None:
        copy.state = state
        copy.ended_at = at
        copy.error = reason
        if copy.current_temp is not None:
            _remove(copy.current_temp)
            copy.current_temp = None
        if world is not None:
            self._bill(world, copy, at)
        if words is None:
            wording = CLOUD_WORDS if copy.kind == RCLONE else DIRECT_WORDS
            words = f"{wording[state]}: {reason}" if state == "failed" else wording[state]
        self._note(copy, at, words)

    def _bill(self, world: World, copy: Copy, at: float) -> None:
        """Bill the bytes moved since the last bill, at ``at``: the source's upload and the destination's download."""
        moved = int(copy.bytes_done) - copy.billed_bytes
        if moved <= 0:
            return
        copy.billed_bytes += moved
        for end, up in ((copy.src, True), (copy.dst, False)):
            inst = world.instances.get(end.instance_id) if end.instance_id is not None else None
            if inst is not None:
                price = inst.offer.inet_up_cost if up else inst.offer.inet_down_cost
                world.bill_bandwidth(inst, moved, moved / BYTES_PER_GB * price, up=up, at=at)

    def _note(self, copy: Copy, at: float, text: str) -> None:
        self._seq += 1
        self._notes.append((at + self.status_delay, self._seq, copy.shown_on, text))


def _is_temp(rel: str) -> bool:
    return os.path.basename(rel).startswith(TEMP_PREFIX)


def _walk(root: str) -> Iterator[tuple[str, int]]:
    """Regular files under ``root`` as (relative path, size), in sorted path order; links are not followed."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in filenames:
            full = os.path.join(dirpath, name)
            if os.path.islink(full) or not os.path.isfile(full):
                continue
            try:
                size = os.path.getsize(full)
            except OSError:
                continue
            found.append((os.path.relpath(full, root), size))
    yield from sorted(found)


def _inside(root: str, path: str) -> bool:
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    return real == real_root or real.startswith(real_root + os.sep)


def _open_temp(dst: str) -> str:
    """The temporary name the file is written under until whole (created empty now, as rsync's is)."""
    directory = os.path.dirname(dst)
    try:
        os.makedirs(directory, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=TEMP_PREFIX + os.path.basename(dst) + ".", dir=directory)
        os.close(fd)
    except OSError:
        return os.path.join(directory, TEMP_PREFIX + os.path.basename(dst))
    return temp


def _finish_file(src: str, dst: str, temp: str) -> str | None:
    """Write the whole file under its temporary name and rename it into place; the error text on failure."""
    try:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(src, temp)
        if os.path.isdir(dst):
            _remove(temp)
            return f"{dst!r} is a directory"
        os.replace(temp, dst)
    except OSError as exc:
        _remove(temp)
        return f"{os.path.basename(src)}: {exc.strerror or exc}"
    return None


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)
