"""Interruptible (bid) rentals: the policy a renting operator is given, the bid it makes for an offer, and what a
preemption leads to.

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

After ``max_preemptions`` the task fails with a sentence saying so, or rents on demand from then on with
``fallback_on_demand=True``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import GpuMarketError, GpuMarketValidationError
from airflow_gpumarket.operators.failures import GpuMarketPreemptedTooOften
from airflow_gpumarket.utils import RunTimeModule, duration_seconds

if TYPE_CHECKING:
    from airflow_gpumarket import lifecycle
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
else:  # what only a running task needs: not imported when a DAG file is parsed
    lifecycle = RunTimeModule("airflow_gpumarket.lifecycle")

#: The bid is the offer's ``min_bid`` plus this share of it, so that the smallest rise of the winning price does
#: not outbid the instance at once; never above the cap (``max_bid``, and the offer's on-demand ``dph_total``).
BID_MARGIN = 0.05
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

    @classmethod
    def parse(
        cls,
        *,
        max_bid: Any,
        max_preemptions: Any,
        on_preemption: Any,
        max_outbid_wait: timedelta | float,
        fallback_on_demand: Any,
    ) -> BidPolicy:
        if max_bid is not None:
            api.require_positive_number("max_bid", max_bid)
        api.require_non_negative_int("max_preemptions", max_preemptions)
        if on_preemption not in ON_PREEMPTION:
            raise GpuMarketValidationError(
                "on_preemption", f"must be one of {', '.join(map(repr, ON_PREEMPTION))}, got {on_preemption!r}"
            )
        api.require_bool("fallback_on_demand", fallback_on_demand)
        return cls(
            max_bid=None if max_bid is None else float(max_bid),
            max_preemptions=max_preemptions,
            on_preemption=on_preemption,
            max_outbid_wait=duration_seconds("max_outbid_wait", max_outbid_wait, zero_ok=True),
            fallback_on_demand=fallback_on_demand,
        )


def bid_for(offer: Mapping[str, Any], max_bid: float | None) -> tuple[float | None, str]:
    """(the bid for ``offer`` in $/h, "") or (None, why no bid is made on it).

    The bid is ``min_bid`` plus ``BID_MARGIN``, capped by ``max_bid`` and by the offer's on-demand ``dph_total``
    (a bid above the on-demand price buys nothing). An offer without a ``min_bid`` or a price, or whose minimum is
    above the cap, gets no bid: a bid is never made without a price."""
    min_bid: Any = offer.get("min_bid")
    on_demand = offer.get("dph_total")
    if not api.is_positive_number(min_bid):
        return None, f"offer {offer.get('id')} shows no min_bid"
    caps: list[float] = [cap for cap in (max_bid, on_demand) if api.is_positive_number(cap)]  # type: ignore[misc]
    if not caps:
        return None, f"offer {offer.get('id')} shows no on-demand price to cap the bid (set max_bid)"
    cap = min(caps)
    if min_bid > cap:
        return None, f"offer {offer.get('id')}'s min_bid ${min_bid}/h is above the cap ${cap}/h"
    return round(min(min_bid * (1 + BID_MARGIN), cap), 4), ""


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

        def _defer(self, context: Any, rental: lifecycle.Rental, watch: lifecycle.Watch) -> None: ...

        def _poll(self, rental: lifecycle.Rental, watch: lifecycle.Watch) -> dict: ...

        def _finish(self, context: Any, rental: lifecycle.Rental, event: dict[str, Any]) -> Any: ...

        def _destroy(self, instance_id: int) -> None: ...

        def _rent(self, context: Any, attempts: lifecycle.Attempts) -> Any: ...

    def _validate_interruptible(self) -> None:
        if not self.interruptible:
            if self.bidding.max_bid is not None:
                raise GpuMarketValidationError("max_bid", "applies to interruptible rentals: set interruptible=True")
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
        self._log_status_msg(rental.instance_id)
        self.log.warning("Preemption %d of at most %d: %s", attempts.preemptions, policy.max_preemptions, sentence)
        over = attempts.preemptions > policy.max_preemptions
        if policy.on_preemption == "wait" and not waited and not over and policy.max_outbid_wait > 0:
            self.log.warning(
                "Leaving instance %s up to %s to win its machine back (on_preemption='wait')",
                rental.instance_id,
                lifecycle.format_duration(policy.max_outbid_wait),
            )
            watch = self._watch(rental)
            watch.outbid_wait_until = time.time() + policy.max_outbid_wait
            watch.boot_deadline = watch.outbid_wait_until + self.boot_timeout
            if self.deferrable:
                self._defer(context, rental, watch)
            return self._finish(context, rental, self._poll(rental, watch))
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

    def _log_status_msg(self, instance_id: int) -> None:
        """What the service says of a preempted instance, for the person reading the log (never parsed)."""
        try:
            instance = self.hook.find_instance(instance_id)
        except GpuMarketError as exc:
            self.log.info("Could not read the status message of instance %s (%s)", instance_id, exc)
            return
        if instance and instance.get("status_msg"):
            self.log.warning("Instance %s: the service says %r", instance_id, instance.get("status_msg"))
