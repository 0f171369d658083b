"""Interruptible (bid) rentals: the policy a renting operator is given, how it bids (``airflow_gpumarket.bidding``),
and what a preemption leads to.

A bid instance rents a machine below its on-demand price until a higher bid takes the machine: the market stops it
(its processes killed, its disk kept; storage bills on). How the provider tells that stop from the job's own is
``lifecycle.preempted``: the job wrapper prints its exit status line before it stops its instance, so a bid
instance stopped with a log read to its end and no such line was stopped by the market.

After a preemption (``on_preemption``):

- ``"failover"`` (default): the preempted instance is destroyed (the destroy answered, or the task fails), then
  another offer is searched (never on a machine a preemption took) and rented under the same label key, so two
  are never alive at once. The job runs again from the start with ``GPUMARKET_ATTEMPT`` (1, 2, ...) and
  ``GPUMARKET_PREEMPTIONS`` in its environment; resuming from a checkpoint is the job's business.
- ``"wait"``: the stopped instance is left for ``max_outbid_wait`` to win its machine back (the market restarts it
  and its onstart script runs again, on the same disk, with the same environment); after that, failover.

How it bids (``bid_strategy``):

- ``"min"`` (default): ``BID_MARGIN`` over the offer's ``min_bid`` when it rents, never changed.
- ``"hold"``: the same first bid; then, on every read of the instance, the bid is raised through the service's
  change-bid call (never above ``max_bid`` or the on-demand price) once the machine's ``min_bid`` eats half the
  margin. After a preemption it bids again at once: when that bid wins, the stopped instance is left up to
  ``max_outbid_wait`` to come back (as with ``"wait"``, whatever ``on_preemption`` says); when no bid up to the
  cap wins, ``on_preemption`` decides. A raised bid is what the rental costs from then on.

After ``max_preemptions`` the task fails with a sentence saying so, or rents on demand from then on with
``fallback_on_demand=True``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_gpumarket import api, bidding
from airflow_gpumarket.exceptions import GpuMarketError, GpuMarketValidationError
from airflow_gpumarket.operators.failures import GpuMarketPreemptedTooOften
from airflow_gpumarket.utils import RunTimeModule, duration_seconds

if TYPE_CHECKING:
    from airflow_gpumarket import lifecycle
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
else:  # what only a running task needs: not imported when a DAG file is parsed
    lifecycle = RunTimeModule("airflow_gpumarket.lifecycle")

ON_PREEMPTION = ("failover", "wait")
DEFAULT_MAX_OUTBID_WAIT = timedelta(minutes=10)
#: Environment variables every interruptible job gets: which run of the job this is (1 for the first) and how many
#: preemptions came before it.
ATTEMPT_ENV = "GPUMARKET_ATTEMPT"
PREEMPTIONS_ENV = "GPUMARKET_PREEMPTIONS"


class BidPolicy(NamedTuple):  # not a dataclass, which takes longer to make when a DAG file imports this module
    """How an interruptible rental bids and what it does when preempted (checked when the DAG is parsed)."""

    max_bid: float | None = None
    max_preemptions: int = 3
    on_preemption: str = "failover"
    max_outbid_wait: float = DEFAULT_MAX_OUTBID_WAIT.total_seconds()
    fallback_on_demand: bool = False
    bid_strategy: str = "min"

    @classmethod
    def parse(
        cls,
        *,
        max_bid: Any,
        max_preemptions: Any,
        on_preemption: Any,
        max_outbid_wait: timedelta | float,
        fallback_on_demand: Any,
        bid_strategy: Any = "min",
    ) -> BidPolicy:
        if max_bid is not None:
            api.require_positive_number("max_bid", max_bid)
        api.require_non_negative_int("max_preemptions", max_preemptions)
        if on_preemption not in ON_PREEMPTION:
            raise GpuMarketValidationError(
                "on_preemption", f"must be one of {', '.join(map(repr, ON_PREEMPTION))}, got {on_preemption!r}"
            )
        api.require_bool("fallback_on_demand", fallback_on_demand)
        if bid_strategy not in bidding.BID_STRATEGIES:
            raise GpuMarketValidationError(
                "bid_strategy",
                f"must be one of {', '.join(map(repr, bidding.BID_STRATEGIES))}, got {bid_strategy!r}",
            )
        return cls(
            max_bid=None if max_bid is None else float(max_bid),
            max_preemptions=max_preemptions,
            on_preemption=on_preemption,
            max_outbid_wait=duration_seconds("max_outbid_wait", max_outbid_wait, zero_ok=True),
            fallback_on_demand=fallback_on_demand,
            bid_strategy=bid_strategy,
        )


def job_env(env: Any, *, preemptions: int) -> dict[str, str]:
    """The creation's ``env`` with the run's attempt number and the preemptions before it."""
    return {**(env or {}), ATTEMPT_ENV: str(preemptions + 1), PREEMPTIONS_ENV: str(preemptions)}


class PreemptionHandling:
    """The renting operator's part for interruptible rentals: the checks of its settings, whether the next rental
    bids, and what a preemption leads to. Mixed into ``GpuMarketRentingBaseOperator``, whose rental mechanism
    (watch, wait, destroy, rent) it calls."""

    interruptible: bool
    bidding: BidPolicy
    if TYPE_CHECKING:
        hook: GpuMarketHook
        log: Any
        instance: dict[str, Any]
        offer_id: Any
        log_interval: float
        boot_timeout: float
        deferrable: bool
        _waits_for_job: bool

        def _watch(self, rental: lifecycle.Rental) -> lifecycle.Watch: ...

        def _defer(
            self, context: Any, rental: lifecycle.Rental, watch: lifecycle.Watch, shown: Sequence[str] = ()
        ) -> None: ...

        def _poll(self, rental: lifecycle.Rental, watch: lifecycle.Watch, shown: Sequence[str] = ()) -> dict: ...

        def _finish(self, context: Any, rental: lifecycle.Rental, event: dict[str, Any]) -> Any: ...

        def _destroy(self, instance_id: int) -> None: ...

        def _rent(self, context: Any, attempts: lifecycle.Attempts) -> Any: ...

    def _validate_interruptible(self) -> None:
        if not self.interruptible:
            if self.bidding.max_bid is not None:
                raise GpuMarketValidationError("max_bid", "applies to interruptible rentals: set interruptible=True")
            if self.bidding.bid_strategy != "min":
                raise GpuMarketValidationError(
                    "bid_strategy", "applies to interruptible rentals: set interruptible=True"
                )
            return
        if "price" in self.instance:
            raise GpuMarketValidationError(
                "price", "is the bid, which an interruptible rental makes itself from the offer; give max_bid instead"
            )
        if self.offer_id is not None and self.bidding.on_preemption == "failover":
            raise GpuMarketValidationError(
                "offer_id",
                "pins one machine, which a preemption takes away: give offer_filters so the job can fail over to "
                "another machine, or on_preemption='wait'",
            )
        if self._waits_for_job and self.log_interval <= 0:
            raise GpuMarketValidationError(
                "log_interval",
                "is 0, which turns log reads off, but an interruptible job needs the end of its log to tell a "
                "preemption from its own stop (the wrapper's exit status line): give a log_interval > 0",
            )

    def _bids(self, attempts: lifecycle.Attempts) -> bool:
        """Whether the next rental is a bid (interruptible, and not fallen back to on-demand)."""
        return self.interruptible and not attempts.on_demand

    def _after_preemption(self, context: Any, rental: lifecycle.Rental, event: dict[str, Any]) -> Any:
        """A bid instance of this job was preempted: wait for it to win its machine back, or destroy it and rent
        another (see ``interruptible``), or fail after ``max_preemptions``."""
        sentence = lifecycle.describe_event(
            {**event, "status": lifecycle.EventKind.PREEMPTED.value}, rental.instance_id
        )
        attempts, policy = rental.attempts, self.bidding
        waited = bool(event.get("waited"))  # the wait for the bid ran out: that preemption was counted already
        if not waited:
            attempts.count_preemption()
        instance = self._read_preempted(rental.instance_id)
        self.log.warning("Preemption %d of at most %d: %s", attempts.preemptions, policy.max_preemptions, sentence)
        over = attempts.preemptions > policy.max_preemptions
        may_wait = not waited and not over and policy.max_outbid_wait > 0
        won_back = may_wait and instance is not None and self._bids_back(rental, instance)
        if may_wait and (policy.on_preemption == "wait" or won_back):
            self.log.warning(
                "Leaving instance %s up to %s to win its machine back (%s)",
                rental.instance_id,
                lifecycle.format_duration(policy.max_outbid_wait),
                "its bid wins it again" if won_back else "on_preemption='wait'",
            )
            watch = self._watch(rental)
            watch.outbid_wait_until = time.time() + policy.max_outbid_wait
            watch.boot_deadline = watch.outbid_wait_until + self.boot_timeout
            shown = event.get("log_tail") or ()  # this wait's reads of the log start after them
            if self.deferrable:
                self._defer(context, rental, watch, shown)
            return self._finish(context, rental, self._poll(rental, watch, shown))
        self._destroy(rental.instance_id)  # answered, or the task fails here: never two alive at once
        attempts.lose_machine(rental.machine_id, sentence)
        if over:
            if not (policy.fallback_on_demand and not attempts.on_demand):
                raise GpuMarketPreemptedTooOften(
                    f"The job was preempted {attempts.preemptions} times, more than max_preemptions="
                    f"{policy.max_preemptions}; every instance it rented is destroyed. Raise max_preemptions, set "
                    "fallback_on_demand=True, or rent on demand (interruptible=False)."
                )
            self.log.warning("max_preemptions=%d reached: renting on demand from now on", policy.max_preemptions)
            attempts.fall_back_to_on_demand()
        return self._rent(context, attempts)

    def _read_preempted(self, instance_id: int) -> Mapping[str, Any] | None:
        """A preempted instance as the service shows it now, its status message logged for the person reading the
        log (never parsed); None when it cannot be read."""
        try:
            instance = self.hook.find_instance(instance_id)
        except GpuMarketError as exc:
            self.log.info("Could not read the status message of instance %s (%s)", instance_id, exc)
            return None
        if instance and instance.get("status_msg"):
            self.log.warning("Instance %s: the service says %r", instance_id, instance.get("status_msg"))
        return instance

    def _hold_cap(self, rental: lifecycle.Rental) -> float | None:
        """The most this rental's bid may be raised to, or None when it does not hold its bid."""
        if self.bidding.bid_strategy != "hold" or rental.bid is None:
            return None
        return bidding.bid_cap(self.bidding.max_bid, rental.dph_total)

    def _hold_bid(self, rental: lifecycle.Rental, instance: Mapping[str, Any]) -> None:
        """Under ``bid_strategy="hold"``: raise the bid once the machine's ``min_bid`` rose toward it or past it."""
        cap = self._hold_cap(rental)
        if cap is None or rental.bid is None:
            return
        raised = bidding.held_bid(rental.bid, instance.get("min_bid"), cap)
        if raised is None:
            return
        try:
            self.hook.change_bid(rental.instance_id, raised)
        except GpuMarketError as exc:
            self.log.warning("Could not raise the bid of instance %s to $%s/h: %s", rental.instance_id, raised, exc)
            return
        self.log.warning(
            "Raised the bid of instance %s from $%s/h to $%s/h: its machine's minimum bid is now $%s/h (cap $%s/h)",
            rental.instance_id,
            rental.bid,
            raised,
            instance.get("min_bid"),
            cap,
        )
        rental.rebid(raised)

    def _bids_back(self, rental: lifecycle.Rental, instance: Mapping[str, Any]) -> bool:
        """Under ``bid_strategy="hold"``, after a preemption: bid again; whether the bid now wins the machine."""
        if self._hold_cap(rental) is None:
            return False
        self._hold_bid(rental, instance)
        min_bid = instance.get("min_bid")
        return api.is_positive_number(min_bid) and rental.bid is not None and rental.bid >= min_bid
