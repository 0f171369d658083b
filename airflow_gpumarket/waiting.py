"""One wait on one instance, shared by the renting operators, the trigger and the sensor.

Each read of the instance (an ``Observation``) goes to ``Wait.step``, a flow either hook runs (``hook.run_flow``):
it renews the lease, holds the bid, judges the read (``lifecycle.Watch``), reads the job's log when due, and
returns the event that ends the wait, or None. The callers differ only in how they read and sleep: the operator
reads and sleeps in the worker, the trigger gets its reads from the shared poller, the sensor reads once a poke.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from airflow_gpumarket import api, bidding, job_logs, lifecycle
from airflow_gpumarket.exceptions import GpuMarketError


class Observation:
    """What one read learnt about one instance, and the service's time of the read (``at``).

    That is its status (and, for a bid instance, its bid and its machine's ``min_bid``), that it is gone, or a failure;
    ``at`` is in epoch seconds.
    """

    __slots__ = ("status", "gone", "error", "at", "bid", "min_bid", "ssh_host")

    def __init__(
        self,
        status: str | None = None,
        gone: bool = False,
        error: GpuMarketError | None = None,
        at: float | None = None,
        bid: Any = None,
        min_bid: Any = None,
        ssh_host: str | None = None,
    ) -> None:
        self.status = status
        self.gone = gone
        self.error = error
        self.at = time.time() if at is None else at
        self.bid = bid
        self.min_bid = min_bid
        self.ssh_host = ssh_host

    @classmethod
    def of(cls, instance: Mapping[str, Any], at: float) -> Observation:
        """What a read of ``instance`` at the service's time ``at`` learnt."""
        return cls(
            status=instance.get("actual_status"),
            at=at,
            bid=instance.get("bid_price"),
            min_bid=instance.get("min_bid"),
            ssh_host=instance.get("ssh_host"),
        )


def read_flow(hook: Any, instance_id: int) -> Any:
    """One read of the instance as an ``Observation``: its state, that it is gone, or the failure left after the
    hook's retries."""
    try:
        instance = yield from hook.find_instance_flow(instance_id)
    except GpuMarketError as exc:
        return Observation(error=exc)
    at = hook.service_now()
    return Observation(gone=True, at=at) if instance is None else Observation.of(instance, at)


def hold_bid_flow(hook: Any, instance_id: int, bid: float, min_bid: Any, cap: float, log: Any) -> Any:
    """Raise the bid when the machine's ``min_bid`` rose toward it (``bidding.held_bid``): the bid placed, else None."""
    raised = bidding.held_bid(bid, min_bid, cap)
    if raised is None:
        return None
    try:
        yield from hook.change_bid_flow(instance_id, raised)
    except GpuMarketError as exc:
        log.warning("Could not raise the bid of instance %s to $%s/h: %s", instance_id, raised, exc)
        return None
    log.warning(
        "Raised the bid of instance %s from $%s/h to $%s/h: its machine's minimum bid is now $%s/h (cap $%s/h)",
        instance_id,
        bid,
        raised,
        min_bid,
        cap,
    )
    return raised


class Wait:
    """The state of one wait: the ``Watch``, the job log's ``LogPump``, the billing marks and the bid held.

    :param watch: what the wait waits for, and its deadlines.
    :param pump: the job's log reader (interval 0: no reads).
    :param log: where status changes and the job's lines go.
    :param hold_bid_up_to: raise a bid instance's bid up to this, or None to hold nothing.
    :param bid: the bid as last placed, when known.
    :param hold_final: return the final read's lines in the event (``final_lines``) instead of logging them.
    :param read_at: the service's time of the last read before this wait, if any (for the billing marks).
    """

    def __init__(
        self,
        watch: lifecycle.Watch,
        pump: job_logs.LogPump,
        log: Any,
        *,
        hold_bid_up_to: float | None = None,
        bid: float | None = None,
        hold_final: bool = False,
        read_at: float | None = None,
    ) -> None:
        self.watch = watch
        self.pump = pump
        self.log = log
        self.hold_bid_up_to = hold_bid_up_to
        self.bid = bid
        self.hold_final = hold_final
        self.read_at = read_at
        self.running_at: float | None = None
        self.stopped_at: float | None = None

    @property
    def instance_id(self) -> int:
        return self.pump.instance_id

    def step(self, hook: Any, seen: Observation, now: float) -> Any:
        """Take one read: the event that ends the wait, or None.

        A read that failed (after the hook's retries) is judged as the last status read; the caller ends the wait on a
        failure that retries cannot mend.
        """
        if seen.error is not None:
            self.log.warning(
                "Reading instance %s failed after retries (%s); still polling", self.instance_id, seen.error
            )
        elif not seen.gone:
            self.pump.began(seen.status == api.STATUS_RUNNING, now)
            yield from hook.renew_lease_flow(self.instance_id, self.watch, now, self.log)
            yield from self._hold_bid(hook, seen)
        event = self.watch.observe(
            now,
            status=seen.status,
            gone=seen.gone,
            unread=seen.error is not None,
            service_at=seen.at if seen.error is None else None,
        )
        if seen.error is None:
            self.running_at, self.stopped_at = lifecycle.billing_marks(
                self.running_at, self.stopped_at, self.watch.status, seen.at, self.read_at
            )
            self.read_at = seen.at
        if self.watch.changed:
            self.log.info("Instance %s: status %s", self.instance_id, self.watch.shown)
        if event is None and self.watch.reads_log() and self.pump.due(now):
            yield from job_logs.forward_flow(hook, self.pump, self.log)
            event = lifecycle.ended_while_waiting(self.watch, self.pump) or lifecycle.never_started(
                self.watch, self.pump, self.running_at, seen.at if seen.error is None else None
            )
        if event is None:
            return None
        if lifecycle.needs_final_read(event, self.pump):
            lines = yield from job_logs.forward_flow(hook, self.pump, self.log, final=True, hold_final=self.hold_final)
            if lines:
                event["final_lines"] = job_logs.held_for_the_task(lines, self.instance_id)
        return lifecycle.end_of_wait(event, self.pump)

    def _hold_bid(self, hook: Any, seen: Observation) -> Any:
        if self.hold_bid_up_to is None:
            return
        known = [float(bid) for bid in (seen.bid, self.bid) if api.is_positive_number(bid)]
        if not known:
            return
        self.bid = max(known)  # a listing may predate this wait's last raise
        raised = yield from hold_bid_flow(hook, self.instance_id, self.bid, seen.min_bid, self.hold_bid_up_to, self.log)
        if raised is not None:
            self.bid = raised
