"""Preemptions and bids: what a renting task does when the market takes its bid instance, and before each rental.

``Preemptions`` is held by the ``RentalSession``. It counts the preemption, reads the stopped instance, bids again
under ``bid_strategy="hold"``, and asks the ``bidding.BidPolicy`` what follows: the wait for the bid to win the
machine back, a failover (the instance destroyed, or kept as the checkpoint's source), on-demand rentals, or the
task's failure. It returns that as an ``Answer``; the session ends the instance, then ``conclude`` fails the task
or turns to on-demand rentals. With a ``deadline`` it also asks ``airflow_gpumarket.deadlines`` before each rental
and after each preemption whether the job may still bid. The rules are in ``airflow_gpumarket.bidding`` and
``deadlines``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_gpumarket import api, bidding, deadlines, lifecycle, metrics, offer_cost, waiting
from airflow_gpumarket.exceptions import GpuMarketError
from airflow_gpumarket.operators.failures import GpuMarketPreemptedTooOften
from airflow_gpumarket.outcome import EventKind

if TYPE_CHECKING:
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
    from airflow_gpumarket.operators.spec import RentalSpec
    from airflow_gpumarket.operators.stager import Stager
    from airflow_gpumarket.outcome import WaitOutcome
    from airflow_gpumarket.task_history import Learned


class Answer(NamedTuple):
    """What a preemption leads to: the policy's step, the deadline's word, and the wait or the instance's fate."""

    step: bidding.Next
    decision: deadlines.Decision | None
    watch: waiting.Watch | None = None  # the wait for the bid to win the machine back
    kept: bool = False  # the instance is kept as the next rental's checkpoint source (else destroyed)

    @property
    def fails(self) -> bool:
        return self.step is bidding.Next.FAIL


class Preemptions:
    """A task's answer to each preemption of its bid instances, and its deadline's word before each rental.

    :param hook: the task's hook.
    :param log: the task's logger.
    :param spec: the task's arguments (its ``bidding`` policy, ``boot_timeout``, ``deadline``).
    :param stager: the session's stager when the task stages data (the checkpoint's source is kept), else None.
    :param started: when the try started (epoch seconds), from which a ``timedelta`` deadline counts.
    :param learned: what the task's earlier successes tell (``task_history``), when read: the deadline's expected
        work when ``expected_runtime`` is not given, and its image's largest size when ``image_size_gb`` is not.
    """

    def __init__(
        self,
        hook: GpuMarketHook,
        log: Any,
        spec: RentalSpec,
        stager: Stager | None,
        *,
        started: float | None = None,
        learned: Learned | None = None,
    ) -> None:
        self.hook = hook
        self.log = log
        self.spec = spec
        self.stager = stager
        self.learned_runtime: float | None = learned.runtime if learned else None
        self.learned_image_gb: float | None = learned.image_gb_max if learned else None  # cautious: the largest
        self.deadline: float | None = None  # epoch seconds, for an interruptible task with a deadline
        if spec.interruptible and spec.deadline is not None:
            self.deadline = deadlines.deadline_at(spec.deadline, time.time() if started is None else started)
        self._boot: float | None = None  # how long the last rental of this try took to run, when seen

    def before_renting(self, attempts: lifecycle.Attempts) -> None:
        """Before each rental: from the first one the deadline leaves no room for a preemption on, rent on demand."""
        decision = None if attempts.on_demand else self._decide(attempts)
        if decision is None:
            return
        if decision.bids:
            self.log.info("Deadline: %s", decision.why)
            return
        self.log.warning("Deadline: %s", decision.why)
        attempts.fall_back_to_on_demand()

    def after(self, rental: lifecycle.Rental, ended: WaitOutcome) -> Answer:
        """What a preempted bid instance of this job leads to (the session ends it, then calls ``conclude``).

        The wait for it to win its machine back, or its end: kept as the checkpoint's source, or destroyed, before
        another is rented or the task fails (after ``max_preemptions``). A deadline that leaves no room for one more
        preemption ends the bidding here: no wait, and on-demand rentals from now on.
        """
        attempts, policy, stager = rental.attempts, self.spec.bidding, self.stager
        sentence = replace(ended, kind=EventKind.PREEMPTED).describe(rental.instance_id)
        if not ended.waited:  # a wait for the bid that ran out: that preemption was counted already
            attempts.count_preemption()
            metrics.preempted()
            self._learn(rental)
        instance = self._read(rental.instance_id)
        self.log.warning("Preemption %d of at most %d: %s", attempts.preemptions, policy.max_preemptions, sentence)
        decision = self._decide(attempts)
        bids = decision is None or decision.bids
        won_back = (
            policy.holds()
            and bids
            and instance is not None
            and policy.may_wait(attempts.preemptions, waited=ended.waited)
            and self._bids_back(rental, instance)
        )
        step = policy.after_preemption(
            attempts.preemptions, waited=ended.waited, won_back=won_back, on_demand=attempts.on_demand, bids=bids
        )
        if step is bidding.Next.WAIT:
            watch = self._wait_for_the_bid(rental, won_back, None if decision is None else decision.bid_until)
            return Answer(step, decision, watch=watch)
        if step is bidding.Next.FAIL and stager is not None:
            stager.save(rental.instance_id)
        kept = step is not bidding.Next.FAIL and stager is not None and stager.keep_source(rental)
        attempts.lose_machine(rental.machine_id, sentence)
        return Answer(step, decision, kept=kept)

    def conclude(self, answer: Answer, attempts: lifecycle.Attempts) -> None:
        """After the preempted instance ended: fail after ``max_preemptions``, or rent on demand from now on."""
        policy, decision = self.spec.bidding, answer.decision
        if answer.fails:
            raise GpuMarketPreemptedTooOften(
                f"The job was preempted {attempts.preemptions} times, more than max_preemptions="
                f"{policy.max_preemptions}; every instance it rented is destroyed. Raise max_preemptions or set "
                "fallback_on_demand=True."
            )
        if answer.step is bidding.Next.ON_DEMAND:
            if decision is not None and not decision.bids:
                self.log.warning("Deadline: %s", decision.why)
            else:
                self.log.warning("max_preemptions=%d reached: renting on demand from now on", policy.max_preemptions)
            attempts.fall_back_to_on_demand()

    def _decide(self, attempts: lifecycle.Attempts) -> deadlines.Decision | None:
        """The deadline's word on the next rental, now; None without a deadline."""
        if self.deadline is None:
            return None
        spec = self.spec
        work = deadlines.expected_work(
            offer_cost.check_expected_runtime(spec.expected_runtime), self.learned_runtime, spec.terms.max_runtime
        )
        estimate = deadlines.estimate(
            work,
            done=attempts.work_done,
            checkpointed=bool(spec.checkpoint_dir),
            boot_seen=self._boot,
            image_size_gb=offer_cost.check_image_size_gb(spec.image_size_gb) or self.learned_image_gb,
            notice=spec.poll_interval,
        )
        return deadlines.decide(self.deadline, time.time(), estimate)

    def _learn(self, rental: lifecycle.Rental) -> None:
        """From a preempted rental: how long it took to run and, with a checkpoint, the work its run carries over."""
        if rental.running_at is None:
            return
        self._boot = rental.running_at - rental.billed_from
        if self.spec.checkpoint_dir and rental.stopped_at is not None:
            ran = rental.stopped_at - rental.running_at
            rental.attempts.credit_work(rental.instance_id, deadlines.credited_work(ran))

    def _wait_for_the_bid(self, rental: lifecycle.Rental, won_back: bool, bid_until: float | None) -> waiting.Watch:
        """The wait that leaves the stopped instance ``max_outbid_wait`` to win its machine back.

        Never past ``bid_until``, when a deadline leaves room for one more preemption no longer.
        """
        spec, now = self.spec, time.time()
        wait = spec.bidding.max_outbid_wait if bid_until is None else min(spec.bidding.max_outbid_wait, bid_until - now)
        self.log.warning(
            "Leaving instance %s up to %s to win its machine back (%s%s)",
            rental.instance_id,
            lifecycle.format_duration(wait),
            "its bid wins it again" if won_back else "on_preemption='wait'",
            "" if wait == spec.bidding.max_outbid_wait else "; the deadline ends the wait sooner",
        )
        stages_in = self.stager is not None and self.stager.stages_in(rental)
        watch = spec.watch(rental, stages_in=stages_in, now=now)
        watch.outbid_wait_until = now + wait
        watch.boot_deadline = watch.outbid_wait_until + spec.boot_timeout
        return watch

    def _read(self, instance_id: int) -> Mapping[str, Any] | None:
        """A preempted instance as the service shows it now (its status message logged); None when unreadable."""
        try:
            instance = self.hook.find_instance(instance_id)
        except GpuMarketError as exc:
            self.log.info("Could not read the status message of instance %s (%s)", instance_id, exc)
            return None
        if instance and instance.get("status_msg"):
            self.log.warning("Instance %s: the service says %r", instance_id, instance.get("status_msg"))
        return instance

    def _bids_back(self, rental: lifecycle.Rental, instance: Mapping[str, Any]) -> bool:
        """After a preemption, under ``bid_strategy="hold"``: bid again; whether the bid now wins the machine."""
        cap = self.spec.bidding.hold_cap(rental.bid, rental.dph_total)
        if cap is None or rental.bid is None:
            return False
        min_bid = instance.get("min_bid")
        raised = self.hook.run_flow(
            waiting.hold_bid_flow(self.hook, rental.instance_id, rental.bid, min_bid, cap, self.log)
        )
        if raised is not None:
            rental.rebid(raised)
        return api.is_positive_number(min_bid) and rental.bid >= min_bid
