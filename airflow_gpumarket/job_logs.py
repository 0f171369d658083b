"""The job's own output, as read through the service's logs endpoint: pure functions, no transport.

The endpoint answers the last ``tail`` lines of the container's log each time it is asked, so successive reads
overlap. ``LogFollower`` turns those overlapping tails into each line once, keeping only a bounded window of
recent lines. ``Redactor`` takes secrets out of fetched text before it reaches a log or an exception.
``exit_status`` reads the status line the job wrapper prints (see ``airflow_gpumarket.job_script``).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from airflow_gpumarket import api, job_secrets
from airflow_gpumarket.exceptions import GpuMarketError, GpuMarketNotFoundError, GpuMarketRateLimitError
from airflow_gpumarket.job_script import (
    EXIT_STATUS_LINE,
    PREFLIGHT_FAILED_LINE,
    PREFLIGHT_FAILED_STATUS,
    STARTED_LINE,
    WRAPPER_LINE_PREFIX,
)
from airflow_gpumarket.python_job import is_marker_line

#: After a rate-limited read the interval doubles, up to this; a read that works brings it back.
MAX_LOG_INTERVAL_SECONDS = 600.0

#: Lines of the job's output put into a failure's exception message.
FAILURE_TAIL_LINES = 20
#: Characters of one forwarded line at most (a progress bar without newlines is one very long line).
MAX_LINE_CHARS = 2000
#: Characters of one line in a trigger event's tail (events are stored in Airflow's database).
EVENT_LINE_CHARS = 500
#: What replaces a secret in fetched text.
MASK = "***"
_EXIT_STATUS = re.compile("^" + re.escape(EXIT_STATUS_LINE.format(rc="")) + r"(\d{1,3})\s*$")
_PREFLIGHT_FAILED = re.compile(
    "^" + re.escape(PREFLIGHT_FAILED_LINE.split("{check}")[0]) + r"(gpus|command)" + re.escape("): ") + "(.*)$"
)
#: Tokens that may be a key: compared by digest with the instance keys the caller knows only by digest.
_TOKEN = re.compile(r"[A-Za-z0-9_\-]{16,}")
#: Where a secret known by salted digest may start: a word's first character, or any character that is no word's.
_EDGE = re.compile(r"\b\w|\W")
#: ``CONTAINER_API_KEY=<value>`` (``env`` output, a shell trace): the value is masked whatever it is.
_NAMED_KEY = re.compile(r"(CONTAINER_API_KEY[\"']?\s*[=:]\s*[\"']?)[^\s\"']+")


def key_digest(key: str) -> str:
    """The sha256 of a key: lets a process that must not hold the key (the triggerer) still recognise it."""
    return hashlib.sha256(key.encode()).hexdigest()


class Redactor:
    """Masks the given secrets, any token whose digest is in ``digests``, and every ``CONTAINER_API_KEY=`` value.

    A digest of ``job_secrets.digests`` (length, salt, hash) masks its value wherever it starts at a word's edge.
    """

    def __init__(self, secrets: Iterable[str | None] = (), digests: Iterable[str | None] = ()) -> None:
        self.secrets = tuple(s for s in secrets if s)
        given = [d for d in digests if d]
        self.digests = frozenset(d for d in given if not d.startswith(job_secrets.DIGEST_PREFIX))
        self.salted: dict[tuple[int, str], set[str]] = {}
        for d in given:
            if d.startswith(job_secrets.DIGEST_PREFIX):
                length, salt, digest = d[len(job_secrets.DIGEST_PREFIX) :].split(":", 2)
                self.salted.setdefault((int(length), salt), set()).add(digest)

    def __call__(self, text: str) -> str:
        text = api.redact(text, self.secrets)
        if self.digests:
            text = _TOKEN.sub(lambda m: MASK if key_digest(m.group(0)) in self.digests else m.group(0), text)
        if self.salted:
            text = self._mask_salted(text)
        return _NAMED_KEY.sub(lambda m: m.group(1) + MASK, text)

    def _mask_salted(self, text: str) -> str:
        spans = []
        for start in (m.start() for m in _EDGE.finditer(text)):  # one-character matches: each start once, in order
            for (length, salt), wanted in self.salted.items():
                if job_secrets.salted(salt, text[start : start + length]) in wanted:
                    spans.append((start, start + length))
        parts, done = [], 0
        for start, end in spans:
            if start >= done:
                parts += [text[done:start], MASK]
                done = end
        return "".join(parts) + text[done:]


def split_lines(text: str, *, complete_only: bool) -> list[str]:
    """The lines of ``text``.

    With ``complete_only``, a last line without its newline (still being written) is left out, so it is read whole next
    time.
    """
    lines = text.split("\n")
    last = lines.pop()  # "" when text ends with a newline
    if last and not complete_only:
        lines.append(last)
    return [line.rstrip("\r")[:MAX_LINE_CHARS] for line in lines]


class LogFollower:
    """Each line of a growing log once, from successive overlapping tails of it.

    ``take`` is given the last lines of the log (at most ``window`` of them) and returns those after the part it
    has already returned. The overlap is found by matching the start of the new tail against the end of the
    lines seen, longest match first; only the last ``window`` lines are kept, so memory stays bounded however
    long the job runs. When the log grew by more than a whole tail between two reads, the lines in between were
    never fetched: ``skipped`` is then True for that read.

    ``shown``: the last lines an earlier wait on the same log showed (as its event carries them: ``log_tail``).
    The first read returns only what follows their first occurrence, when it has them all. An exit status among
    them is the job's: the wrapper prints it once, and a wait that showed it may end before the instance stops.
    """

    def __init__(self, window: int = api.LOG_TAIL_DEFAULT, shown: Sequence[str] = ()) -> None:
        self.window = window
        self._seen: deque[str] = deque(maxlen=window)
        self._shown_before = [line[:EVENT_LINE_CHARS] for line in shown]
        self.skipped = False
        self.exit_status: int | None = exit_status(self._shown_before)
        self.advanced = 0  # lines of the log taken so far: a change means there is something new to record

    def take(self, lines: Sequence[str]) -> list[str]:
        overlap = self._overlap(lines)
        start = overlap
        if self._shown_before:  # the first read after an earlier wait's, or lines another copy of this wait showed
            start = max(overlap, self._after_shown_before(lines))
            self._shown_before = []
        self.skipped = bool(self._seen) and start == 0 and len(lines) >= self.window
        self._seen.extend(lines[overlap:])  # what another wait showed is seen too, though not returned
        self.advanced += len(lines) - overlap
        status = exit_status(lines[overlap:])
        if status is not None:
            self.exit_status = status
        return list(lines[start:])

    def also_shown(self, lines: Sequence[str]) -> None:
        """Take the last lines another copy of this wait showed: the next ``take`` returns only what follows them."""
        cut = [line[:EVENT_LINE_CHARS] for line in lines]
        if not cut or [line[:EVENT_LINE_CHARS] for line in self.recent(len(cut))] == cut:
            return
        self._shown_before = cut
        status = exit_status(cut)
        if status is not None:
            self.exit_status = status

    def _overlap(self, lines: Sequence[str]) -> int:
        """How many leading lines of ``lines`` were already returned.

        That is the longest k for which the last k lines seen are the first k of ``lines``.
        """
        if not lines or not self._seen:
            return 0
        seen = list(self._seen)
        first = lines[0]
        for i in range(max(0, len(seen) - len(lines)), len(seen)):  # earliest start first: the longest overlap
            k = len(seen) - i
            if seen[i] == first and seen[i:] == list(lines[:k]):
                return k
        return 0

    def _after_shown_before(self, lines: Sequence[str]) -> int:
        """Where the lines an earlier wait showed last end in ``lines`` (their first occurrence), else 0."""
        block = self._shown_before
        if not block:
            return 0
        cut = [line[:EVENT_LINE_CHARS] for line in lines]
        for end in range(len(block), len(cut) + 1):
            if cut[end - len(block) : end] == block:
                return end
        return 0

    def recent(self, n: int = FAILURE_TAIL_LINES) -> list[str]:
        return list(self._seen)[-n:]


def _shown(line: str) -> str:
    """A line as the task log shows it: a Python job's result line only by its size (the value goes to XCom)."""
    if is_marker_line(line):
        return f"(the function's return value: {len(line)} characters, read when the job ends)"
    return line


def exit_status(lines: Iterable[str]) -> int | None:
    """The exit status the job wrapper printed, from the last status line among ``lines``; None without one."""
    found = None
    for line in lines:
        match = _EXIT_STATUS.match(line)
        if match:
            found = int(match.group(1))
    return found


class PreflightFailure(NamedTuple):
    """What a failed preflight found: ``check`` is ``"gpus"``, ``"command"`` or ``"ready"`` (a service's readiness
    probe); ``seen`` what it saw."""

    check: str
    seen: str

    def describe(self, machine_id: object = None) -> str:
        where = "the host" if machine_id is None else f"machine {machine_id}"
        if self.check == "ready":
            return f"the service on {where} did not become ready: {self.seen}"
        if self.check == "gpus":
            return f"{where} failed the GPU preflight: {self.seen}"
        return f"{where} failed the preflight command: {self.seen}"


def preflight_failure(lines: Iterable[str], status: int | None = None) -> PreflightFailure | None:
    """The host failure a wrapper's preflight marker reports, or None (no marker, or the job itself ran).

    ``status``: the exit status read (``exit_status``); any other than ``PREFLIGHT_FAILED_STATUS`` is the job's own.
    """
    if status is not None and status != PREFLIGHT_FAILED_STATUS:
        return None
    for line in lines:
        if line == STARTED_LINE:
            return None
        match = _PREFLIGHT_FAILED.match(line)
        if match:
            return PreflightFailure(match.group(1), match.group(2))
    return None


class LogEnd(NamedTuple):
    """The end of a stopped instance's log: its last lines and the exit status the wrapper printed (None: none)."""

    lines: list[str]
    status: int | None

    @property
    def preflight(self) -> PreflightFailure | None:
        """The host failure the wrapper's preflight reported, if it stopped the instance."""
        return preflight_failure(self.lines, self.status)

    @property
    def job_exited(self) -> bool:
        """Whether the command itself ran and exited (the job's end, not the host's)."""
        return self.status is not None and self.preflight is None


def end_in_log(hook: Any, instance_id: int) -> LogEnd:
    """How the job wrapper ended ``instance_id``, as its log's last lines say (an unreadable log: no lines)."""
    try:
        text = hook.get_instance_logs(instance_id, tail=FAILURE_TAIL_LINES, retry=False)
    except GpuMarketError:
        return LogEnd([], None)
    lines = split_lines(text, complete_only=False)
    return LogEnd(lines, exit_status(lines))


def log_daemon_tail(hook: Any, log: Any, instance_id: int) -> None:
    """Before giving up an instance that never ran: what its host daemon said, for diagnosis."""
    try:
        text = hook.get_instance_logs(instance_id, tail=FAILURE_TAIL_LINES, daemon_logs=True, retry=False)
    except GpuMarketError as exc:
        log.warning("Could not read the host daemon's log of instance %s: %s", instance_id, exc)
        return
    lines = split_lines(text, complete_only=False)[-FAILURE_TAIL_LINES:]
    log.warning("The host daemon's log of instance %s ends with %d line(s):", instance_id, len(lines))
    for line in lines:
        log.warning("[instance %s daemon] %s", instance_id, line)


def failure_detail(lines: Sequence[str], status: int | None) -> str:
    """What a failure's exception message adds: the exit status and the last lines the job printed."""
    parts = []
    if status is not None:
        parts.append(f"the command ended with exit status {status}")
    shown = [line for line in lines if line != STARTED_LINE and not _EXIT_STATUS.match(line)][-FAILURE_TAIL_LINES:]
    if shown:
        parts.append("its last output lines, quoted from its log:\n" + "\n".join(f"    > {line}" for line in shown))
    return "; ".join(parts)


#: Lines a wait that finds the job already running shows of the log as it stands then (they may repeat lines an
#: earlier wait showed; the earlier ones are not shown again).
RESUMED_WAIT_LINES = 20


class LogPump:
    """One wait's reading of a running job's log.

    It decides when the next read is due, what each read adds to the task log (prefixed with the instance id), and how
    failed reads slow it down or turn it off.

    Used by the operator's loop, the trigger and the sensor around their own transport. ``interval`` 0 turns
    reading off (no request to the logs endpoint at all). ``shown``: see ``LogFollower``.
    """

    def __init__(
        self,
        instance_id: int,
        interval: float,
        *,
        key_digest: str | None = None,
        secret_digests: Sequence[str] = (),
        window: int = api.LOG_TAIL_DEFAULT,
        shown: Sequence[str] = (),
        since: float | None = None,
    ) -> None:
        self.instance_id = instance_id
        self.since = since
        self.interval = interval
        self.key_digests = tuple(d for d in (key_digest, *secret_digests) if d)
        self.follower = LogFollower(window, shown)
        self.off = interval <= 0
        self._wait = interval
        self._next_at: float | None = None
        self._warned = False
        self._began_running: bool | None = None  # whether the first status this wait read was running
        self._said_repeats = bool(shown)  # the lines shown before are known: nothing is repeated
        self.wrapper_seen = any(line.startswith(WRAPPER_LINE_PREFIX) for line in shown)
        #: The last read held the whole log, some of it, and no line of the job wrapper: its onstart did not run yet.
        self.without_wrapper = False

    def began(self, running: bool, now: float | None = None) -> None:
        """Take a status this wait read at ``now``; only the first counts.

        A job already running then (this wait resumed on another triggerer, or a retry took the instance over) has
        printed lines that may have been shown before: nothing records which, so the first read shows only the log's
        last ``RESUMED_WAIT_LINES`` lines, marked. Not when this first read comes less than one interval after
        ``since`` (the rental's creation): no earlier wait can have read the log by then.
        """
        if self._began_running is None:
            fresh = self.since is not None and now is not None and now < self.since + self.interval
            self._began_running = running and not fresh

    def shown_elsewhere(self, lines: Sequence[str]) -> None:
        """Take the last lines another copy of this wait showed (``LogFollower.also_shown``): they are not shown again.

        With those known, a wait that finds the job already running no longer needs to show the log's last lines.
        """
        if lines:
            self.follower.also_shown(lines)
            self._said_repeats = True
            self.wrapper_seen = self.wrapper_seen or any(line.startswith(WRAPPER_LINE_PREFIX) for line in lines)

    def read_due(self, now: float) -> bool:
        """Whether a periodic read is due now, changing nothing (unlike ``due``)."""
        return not self.off and self._next_at is not None and now >= self._next_at

    def due(self, now: float) -> bool:
        """True when a read should be made now.

        The first is due one interval after the first call: the job has just started then and cannot have printed much.
        """
        if self.off:
            return False
        if self._next_at is None:
            self._next_at = now + self._wait
        return now >= self._next_at

    def read(self, now: float, text: str, *, final: bool = False) -> list[str]:
        """The task-log lines a read adds: each line of the job's output once, prefixed with the instance id."""
        self._wait = self.interval
        self._next_at = now + self._wait
        lines = split_lines(text, complete_only=not final)
        self.wrapper_seen = self.wrapper_seen or any(line.startswith(WRAPPER_LINE_PREFIX) for line in lines)
        self.without_wrapper = not self.wrapper_seen and 0 < len(lines) < self.follower.window
        new = self.follower.take(lines)
        prefix = f"[instance {self.instance_id}]"
        if new and self._began_running and not self._said_repeats:
            # Nothing records what the previous wait showed: show only the log's last few lines, marked.
            self._said_repeats = True
            left_out, new = max(0, len(new) - RESUMED_WAIT_LINES), new[-RESUMED_WAIT_LINES:]
            return [
                f"{prefix} (this wait found the job already running, after a triggerer restart or a retry that took "
                f"the instance over: the {len(new)} lines below are the log's last, and may repeat lines shown "
                f"before; {left_out} earlier lines are not shown again, the service keeps the whole log)",
                *(f"{prefix} {_shown(line)}" for line in new),
            ]
        out = [f"{prefix} {_shown(line)}" for line in new]
        if self.follower.skipped:
            out.insert(
                0,
                f"{prefix} ... (lines in between were not read: over {self.follower.window} lines since the last read)",
            )
        return out

    def failed(self, now: float, exc: GpuMarketError, *, final: bool = False) -> str | None:
        """Take a failed read; returns the warning to log, or None when the same kind was already reported.

        The final read (after the job ended) is always reported, with what is lost.
        """
        if final:
            self.off = True
            return (
                f"The final read of the log of instance {self.instance_id} failed after retries ({exc}): the job's "
                "output since the last read and its exit status are lost (the instance is destroyed all the same)"
            )
        if isinstance(exc, GpuMarketNotFoundError):
            self.off = True
            return (
                f"The log of instance {self.instance_id} cannot be read ({exc}); not asking again "
                "(this server may have no logs endpoint)"
            )
        if isinstance(exc, GpuMarketRateLimitError):
            self._wait = min(self._wait * 2, MAX_LOG_INTERVAL_SECONDS)
        self._next_at = now + self._wait
        if self._warned:
            return None
        self._warned = True
        return (
            f"Reading the log of instance {self.instance_id} failed ({exc}); trying again in {self._wait:g} s "
            "(further failures of this wait are not reported)"
        )

    def tail(self) -> list[str]:
        """The last lines read, each cut to ``EVENT_LINE_CHARS``: what a wait's outcome carries of the log."""
        return [line[:EVENT_LINE_CHARS] for line in self.follower.recent()]


def forward_flow(hook: Any, pump: LogPump, log: Any, *, final: bool = False, hold_final: bool = False) -> Any:
    """One read of the job's output into ``log``, as a flow either hook runs (``hook.run_flow``).

    A failed read is reported (once) and only delays the next: the job goes on whatever happens here. Periodic reads
    make one try (the next round is the retry); the ``final`` read, whose lines go into the failure message, gets the
    hook's retries.

    With ``hold_final`` (the trigger), the lines of the final read are returned instead of logged, for the event (see
    ``held_for_the_task``). Airflow (3.2 and 3.3 alike) closes a trigger's log file when the trigger reports itself
    finished, which races with the lines it logged just before, so they can be lost. The resumed task logs them itself.
    Otherwise the flow returns ``[]``.
    """
    try:
        text = yield from hook.get_instance_logs_flow(
            pump.instance_id, tail=pump.follower.window, retry=final, key_digests=pump.key_digests
        )
    except GpuMarketError as exc:
        _report(pump, log, exc, final)
        return []
    if final and hold_final:
        return pump.read(time.time(), text, final=True)
    _emit(pump, log, text, final)
    return []


#: Lines of a trigger's final read that its event carries to the resumed task at most (each cut to
#: ``EVENT_LINE_CHARS``); of more, the last ones, after a line that says how many were left out.
EVENT_FINAL_LINES = 200


def held_for_the_task(lines: Sequence[str], instance_id: int) -> list[str]:
    """The task-log lines of a trigger's final read as its event carries them: at most ``EVENT_FINAL_LINES``."""
    kept = [line[:EVENT_LINE_CHARS] for line in lines[-EVENT_FINAL_LINES:]]
    left_out = len(lines) - len(kept)
    if left_out:
        kept.insert(0, f"[instance {instance_id}] ... ({left_out} earlier lines of the last read not shown)")
    return kept


def _report(pump: LogPump, log: Any, exc: GpuMarketError, final: bool) -> None:
    warning = pump.failed(time.time(), exc, final=final)
    if warning:
        log.warning("%s", warning)


def _emit(pump: LogPump, log: Any, text: str, final: bool) -> None:
    for line in pump.read(time.time(), text, final=final):
        log.info("%s", line)
