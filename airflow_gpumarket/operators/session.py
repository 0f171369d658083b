"""One try of a renting task: the ``RentalSession`` its operator holds, as ``KubernetesPodOperator`` holds a PodManager.

The session owns the hook's rentals for one try. Its parts hold none of each other: the ``RentalGuard`` (what the
try holds, ended on every failure path), the ``Budget`` (reserve before a create), the ``RentalRecorder`` (the GPU
rentals page), the ``OfferChooser``, ``Preemptions`` and, for durable data, the ``Stager``. A rental starts in one
place (``_start``: created by ``rent``, adopted by ``adopt`` or resumed by ``resume``) and ends through the guard's
``end``, which calls ``ending.end_rental`` (from ``end``, ``fail_over``, ``after_preemption``, or a failure path).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_gpumarket import api, budgets, job_logs, lifecycle, metrics, waiting
from airflow_gpumarket.exceptions import GpuMarketCreateRefusedError, GpuMarketError, GpuMarketOfferUnavailableError
from airflow_gpumarket.operators import cost, offers
from airflow_gpumarket.operators.budget import Budget
from airflow_gpumarket.operators.chooser import OfferChooser
from airflow_gpumarket.operators.ending import Disposal
from airflow_gpumarket.operators.failures import (
    GpuMarketNoWorkingOffer,
    GpuMarketOutcomeUnknown,
    GpuMarketStagingFailed,
)
from airflow_gpumarket.operators.guard import RentalGuard, task_key
from airflow_gpumarket.operators.plan import stages_in
from airflow_gpumarket.operators.preemption import Preemptions
from airflow_gpumarket.operators.spec import try_started
from airflow_gpumarket.outcome import EventKind, WaitOutcome, from_event, instance_of
from airflow_gpumarket.ui.records import RentalRecorder

if TYPE_CHECKING:
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
    from airflow_gpumarket.operators.spec import RentalSpec
    from airflow_gpumarket.operators.stager import Stager


class Outcome(str, Enum):  # noqa: UP042 - StrEnum is 3.11+; Airflow 2.11 runs on 3.10
    """How a task is done with its rental (``RentalSession.end``)."""

    SUCCEEDED = "succeeded"  # the job exited 0: its checkpoint saved, its outputs copied, then destroyed
    FAILED = "failed"  # the job ended otherwise: its checkpoint saved, then destroyed
    NOT_STARTED = "not_started"  # the job never started (its staged data did not arrive): destroyed
    DESTROYED = "destroyed"  # destroyed with nothing saved or waited for (execution_timeout): the task fails next
    HANDED_OVER = "handed_over"  # the instance outlives the task, for later tasks of its DAG run
    GONE = "gone"  # the instance is gone already (the job destroyed it, or somebody did)


class RentalResult(NamedTuple):
    """How a rental's wait ended, for the operator to judge: the rental and the outcome (None: not waited for)."""

    rental: lifecycle.Rental
    outcome: WaitOutcome | None
    context: Any = None  # the task's context (its outlets' asset events)

    @property
    def kind(self) -> EventKind | None:
        return None if self.outcome is None else self.outcome.kind

    @property
    def status(self) -> str | None:
        """The instance's status as the wait last read it."""
        return None if self.outcome is None else self.outcome.actual_status


class RentalSession:
    """The rentals of one try of a renting task, from the first offer to the last destroy.

    :param hook: the task's hook.
    :param log: the task's logger.
    :param spec: the task's arguments, rendered and checked.
    :param context: the task's context.
    :param task: the operator (its DAG, task id, connection and ``durable``).
    """

    def __init__(self, hook: GpuMarketHook, log: Any, spec: RentalSpec, context: Any, *, task: Any) -> None:
        self.hook = hook
        self.log = log
        self.spec = spec
        conn_id = task.gpumarket_conn_id
        self._recorder = RentalRecorder(context, log, conn_id, clock=hook.service_now, image=spec.instance.get("image"))
        self._budget = Budget(hook, log, context, dag_id=task.dag_id or "", task_id=task.task_id, conn_id=conn_id)
        store = context.get("task_state_store") if task.durable and isinstance(context, Mapping) else None
        self._guard = RentalGuard(
            hook, log, task_key(task, context), store=store, recorder=self._recorder, budget=self._budget
        )
        self._stager: Stager | None = None
        self._preemptions: Preemptions | None = None  # made by ``prepare``, with the stager if any
        self._chooser = OfferChooser(hook, log, spec, conn_id=conn_id, task_ids=(task.dag_id or "", task.task_id))
        self._started = try_started(context, time.time())  # a deadline's timedelta counts from here

    @property
    def key(self) -> str:
        """The task instance's label key: the same for every try (``lifecycle.rental_key``)."""
        return self._guard.key

    @property
    def recorded(self) -> bool:
        """Whether this try recorded a rental (and so the address the GPU rental link opens)."""
        return self._recorder.recorded

    # --- failure paths -------------------------------------------------------------------------------------
    def guarded(self) -> AbstractContextManager[None]:
        """Destroy what this try holds when anything fails inside; deferring is not a failure."""
        return self._guard.on_failure()

    def kill(self) -> None:
        """SIGTERM or execution_timeout: destroy what this try holds now."""
        self._guard.kill()

    # --- where a rental starts -----------------------------------------------------------------------------
    def adopt(self, try_number: int) -> lifecycle.Rental | None:
        """On a retry, the rental an earlier try left (the rest destroyed), as this try holds it; else None."""
        adopted = self._guard.adopt(try_number, waits_for_job=self.spec.terms.job)
        if adopted is None:
            return None
        now = time.time()
        created_at = lifecycle.started_at(adopted, fallback=now, now=now)
        offer_id = adopted.get("offer_id")
        rental = lifecycle.Rental(
            instance_id=int(adopted["id"]),
            offer_id=offer_id,
            dph_total=adopted.get("dph_total"),
            gpu_name=adopted.get("gpu_name"),
            label=adopted.get("label"),
            created_at=created_at,
            lease_cap=created_at + self.spec.lease_seconds(),
            bid=adopted.get("bid_price") if adopted.get("is_bid") else None,
            machine_id=adopted.get("machine_id"),
            attempts=lifecycle.Attempts(tried=[] if offer_id is None else [int(offer_id)]),
            recorded_at=start if api.is_positive_number(start := adopted.get("start_date")) else None,
        )
        self._start(rental)
        return rental

    def resume(self, event: Any) -> tuple[lifecycle.Rental, WaitOutcome]:
        """The rental a trigger's event brings back, with what its wait learnt; its held log lines shown."""
        instance_id = instance_of(event)
        if instance_id is not None:
            self._guard.take(instance_id)  # whatever else is wrong with the event, the guard destroys it
        try:
            ended, rental = from_event(event)
            if rental is None:
                raise ValueError(f"no rental to resume in {event!r}")
        except ValueError as exc:
            raise GpuMarketOutcomeUnknown(f"Cannot resume waiting for instance {instance_id}: {exc}") from None
        if rental.instance_id != instance_id:
            raise GpuMarketOutcomeUnknown(f"Unexpected trigger event for instance {rental.instance_id}: {event!r}")
        self._guard.resumed(rental)
        self._start(rental, write=False)
        if rental.observe(ended.marks):
            self._recorder.running(rental)
        for line in ended.final_lines:
            self.log.info("%s", line)
        return rental, ended

    def prepare(self, attempts: lifecycle.Attempts) -> None:
        """Before renting: the task instance's attempts followed, its durable data's integration found."""
        self._guard.follow(attempts)
        plan = self.spec.data_plan()
        if plan is not None and plan.active:
            from airflow_gpumarket.operators.stager import Stager

            self._stager = Stager(
                self.hook,
                self.log,
                plan,
                self.spec.poll_interval,
                source_lease=self.spec.source_lease(plan),
                key=self._guard.key,
                stop_if_killed=self._guard.stop_if_killed,
                end_source=self._end_source,
            )
            self._stager.resolve()
        spec = self.spec
        learned = None
        if spec.deadline is not None and None in (spec.expected_runtime, spec.image_size_gb):
            learned = self._chooser.history()  # the deadline's work and boot: learnt from history
        self._preemptions = Preemptions(self.hook, self.log, spec, self._stager, started=self._started, learned=learned)

    def rent(self, attempts: lifecycle.Attempts) -> lifecycle.Rental:
        """Create on the next untried offer until one is made or ``max_offer_attempts`` offers were tried.

        Offers are counted since the last preemption. Machines in host memory are skipped (not a pinned offer's).
        """
        spec = self.spec
        if self._preemptions is not None:  # made by ``prepare``
            self._preemptions.before_renting(attempts)  # a deadline may end the bidding
        self._chooser.start()
        while attempts.offers_this_round() < spec.max_offer_attempts:
            offer, bid, why_not = self._chooser.next_offer(attempts)
            if offer is None:
                attempts.reasons.append(why_not)
                break
            attempts.tried.append(int(offer["id"]))
            rental = self._create(offer, bid, attempts)
            if rental is not None:
                self._guard.stop_if_killed(rental.instance_id)  # killed during the create: neither waited for nor kept
                return rental
        raise GpuMarketNoWorkingOffer(
            f"Could not get a working instance after trying {attempts.offers_this_round()} offer(s) "
            f"(max_offer_attempts={spec.max_offer_attempts}): {'; '.join(attempts.reasons) or 'no offer matched'}. "
            "Nothing is left running."
        )

    def _create(
        self, offer: Mapping[str, Any], bid: float | None, attempts: lifecycle.Attempts
    ) -> lifecycle.Rental | None:
        """Rent ``offer``: reserve, create, attach, record, hold; None when nothing was made (why: in ``attempts``)."""
        spec, guard, budget = self.spec, self._guard, self._budget
        created_at = time.time()
        label = lifecycle.make_label(guard.key, created_at + spec.first_lease())
        staged = None if self._stager is None else self._stager.wrapper(attempts.source_id)
        body = spec.creation_body(
            label=label,
            base_url=self.hook.settings.base_url,
            bid=bid,
            preemptions=attempts.preemptions,
            staged=staged,
            gpu_count=offers.gpu_count(offer),
        )
        self.log.info(
            "Renting offer %s (%s x %s at $%s/h%s) with label %s",
            offer["id"],
            offer.get("num_gpus", "?"),
            offer.get("gpu_name", "?"),
            offer.get("dph_total", "?"),
            "" if bid is None else f" on demand; bidding ${bid}/h, interruptible, attempt {attempts.preemptions + 1}",
            label,
        )
        cost_start = self.hook.service_now()
        budget.reserve(offers.worst_case(spec, offer, bid), started=cost_start)  # refused: nothing is rented
        guard.creating(label)  # until the answer names the instance, a failure (or on_kill) looks for it by this label
        try:
            result = self.hook.create_instance(int(offer["id"]), **body)
        except GpuMarketOfferUnavailableError as exc:
            budget.not_created()
            guard.creating(None)
            self.log.warning("Offer %s is no longer available (%s); trying the next one", offer["id"], exc.msg or exc)
            attempts.reasons.append(f"offer {offer['id']} was taken before creation")
            return None
        except GpuMarketCreateRefusedError as exc:
            # Not destroyed: the label stays set, and the failure path finds the instance by it. A price of the
            # user's own (not the operator's bid) is not retried on other offers.
            if not exc.destroyed or bid is None:
                raise
            budget.not_created()
            guard.creating(None)
            self.log.warning("Offer %s refused the bid of $%s/h (%s); trying the next one", offer["id"], bid, exc)
            attempts.reasons.append(f"offer {offer['id']} refused the bid of ${bid}/h (its minimum rose)")
            return None
        except GpuMarketError as exc:
            if exc.status_code is not None and 400 <= exc.status_code < 500:
                budget.not_created()  # refused as asked: nothing was made
            raise
        # The rental takes its id from the answer, not back from the guard: on_kill (SIGTERM's handler, or another
        # thread) may destroy the instance meanwhile, and the guard then forgets it.
        instance_id = int(result["new_contract"])
        guard.take(instance_id)
        budget.created(instance_id)
        metrics.rental_started(interruptible=bid is not None)
        self.log.info("Created instance %s on offer %s", instance_id, offer["id"])
        rental = lifecycle.Rental(
            instance_id=instance_id,
            offer_id=int(offer["id"]),
            dph_total=offer.get("dph_total"),
            gpu_name=offer.get("gpu_name"),
            label=label,
            created_at=created_at,
            lease_cap=created_at + spec.lease_seconds(),
            ambiguous=bool(result.get("ambiguous")),
            key_digest=job_logs.key_digest(own_key) if (own_key := result.get("instance_api_key")) else None,
            bid=bid,
            machine_id=offer.get("machine_id"),
            attempts=attempts,
            disk_hourly=budgets.storage_hourly(spec.disk_gb(), offer.get("storage_cost")),
            inet_down=float(down) if api.is_positive_number(down := offer.get("inet_down")) else None,
        )
        self._start(rental)
        self.check_duplicates(rental)
        return rental

    def _start(self, rental: lifecycle.Rental, *, write: bool = True) -> None:
        """The task holds ``rental`` from now on: recorded, and (unless resumed) saved for a retry to reconnect to."""
        self._recorder.start(rental, write=write, handed_over=self.spec.terms.hands_over)
        if write:
            self._guard.hold(rental)

    # --- the wait ------------------------------------------------------------------------------------------
    def watch(self, rental: lifecycle.Rental) -> waiting.Watch:
        """The wait for ``rental``: for its job, or (its data still to be staged, or no job) for it to run."""
        return self.spec.watch(rental, stages_in=stages_in(self.spec, rental), now=time.time())

    def stage_in(self, rental: lifecycle.Rental) -> list[str]:
        """Copy the rental's data in until its job started; the job's lines shown meanwhile."""
        assert self._stager is not None  # asked only when ``plan.stages_in``
        return self._stager.stage_in(rental)

    def wait(self, rental: lifecycle.Rental, watch: waiting.Watch, shown: Sequence[str]) -> WaitOutcome:
        """The wait in the worker: read, sleep, and hand each read to a ``waiting.Wait``; log the cost so far."""
        guard, instance_id = self._guard, rental.instance_id
        watch.shown_lines = list(shown)
        pump = job_logs.LogPump(
            instance_id,
            self.spec.job_log_interval(),
            key_digest=rental.key_digest,
            shown=watch.shown_lines,
            since=rental.created_at,
        )
        wait = waiting.Wait(watch, pump, self.log, marks=rental.marks())
        while True:
            time.sleep(self.spec.poll_interval)  # right after creating (or a read) the answer cannot have changed yet
            guard.stop_if_killed(instance_id)
            seen = self.hook.run_flow(waiting.read_flow(self.hook, instance_id))
            if seen.error is not None and not api.is_retryable(seen.error):
                raise seen.error
            guard.stop_if_killed(instance_id)  # on_kill ran during the read: "gone" would not be the job's doing
            ended = self.hook.run_flow(wait.step(self.hook, seen, time.time()))
            if rental.observe(wait.marks()):
                self._recorder.running(rental)
            log_progress(self.log, rental, watch, self.hook.service_now())
            if ended is not None:
                return ended

    def check_duplicates(self, rental: lifecycle.Rental) -> None:
        """After an ambiguous create (a duplicate may have landed since): destroy every other instance of the key."""
        if rental.ambiguous:
            self._guard.destroy_duplicates(rental)

    def after_preemption(self, rental: lifecycle.Rental, ended: WaitOutcome) -> waiting.Watch | None:
        """The wait for a preempted bid instance to win its machine back, or None: rent another (``Preemptions``).

        A preempted instance not waited for is destroyed, or kept as the next rental's checkpoint source.
        """
        assert self._preemptions is not None  # made by ``prepare``, before anything is rented
        answer = self._preemptions.after(rental, ended)
        if answer.watch is not None:
            return answer.watch
        disposal = Disposal.KEEP if answer.kept else Disposal.DESTROY
        why = "preempted; kept as the checkpoint's source" if answer.kept else "preempted"
        self._guard.end(rental.instance_id, disposal, metric=metrics.PREEMPTED, why=why, failover=not answer.fails)
        self._preemptions.conclude(answer, rental.attempts)
        return None

    # --- where a rental ends -------------------------------------------------------------------------------
    def fail_over(
        self, rental: lifecycle.Rental, ended: WaitOutcome, preflight: job_logs.PreflightFailure | None
    ) -> None:
        """The rental's host failed before the job ran: destroyed, its machine remembered, and why kept for the end.

        It never ran, did not boot in time, or failed the job wrapper's preflight (``preflight``).
        """
        preflight = preflight or preflight_in_log(self.hook, self.spec, rental, ended)
        if preflight is not None:
            sentence = f"instance {rental.instance_id}: {preflight.describe(rental.machine_id)}; the job did not run"
        else:
            sentence = ended.describe(rental.instance_id)
        self.log.warning("Failover: %s", sentence)
        if preflight is None:
            self._log_daemon_tail(rental.instance_id)
        self._guard.end(rental.instance_id, metric=metrics.NEVER_RAN, why="its host failed", failover=True)
        if preflight is not None:
            self._chooser.remember(rental, "preflight", preflight.describe())
        elif ended.kind is EventKind.BOOT_TIMEOUT:
            self._chooser.remember(rental, "boot_timeout", sentence)
        elif ended.actual_status in api.FAILED_STATUSES:
            self._chooser.remember(rental, str(ended.actual_status), sentence)
        rental.give_up(sentence)

    def remember_lost(self, rental: lifecycle.Rental, ended: WaitOutcome) -> None:
        """The host failed under the running job: its machine remembered (host memory)."""
        self._chooser.remember(
            rental, "lost", f"instance {rental.instance_id} went {ended.actual_status} while its job ran"
        )

    def end(self, rental: lifecycle.Rental, how: Outcome, *, metric: str | None, why: str = "") -> None:
        """The task is done with ``rental``: saved, copied out, then destroyed, handed over or kept, as ``how`` says.

        Ends through the guard (``ending.end_rental``), which settles, records and releases the budget; ``metric`` is
        the outcome counted. Fails naming each output lost (the instance is destroyed, or kept under
        ``keep_on_output_failure``).
        """
        why = why or f"the task is done with it ({how.value})"
        if how is Outcome.GONE:
            self._guard.end(rental.instance_id, Disposal.GONE, metric=metric, why=why)  # a 404 proved it
            return
        if how is Outcome.DESTROYED:  # the task fails next: its failure path ends a kept source, unsaved
            self._guard.end(rental.instance_id, metric=metric, why=why)
            return
        if self._stager is not None:  # a kept checkpoint source is no longer needed
            self._stager.drop_source(rental.attempts, "the job no longer needs its checkpoint")
        if how is Outcome.HANDED_OVER:
            self._guard.end(rental.instance_id, Disposal.HAND_OVER, metric=metric, why=why)
            return
        lost: dict[str, str] = {}
        if self._stager is not None and how is not Outcome.NOT_STARTED:
            self._stager.save(rental.instance_id)
            if how is Outcome.SUCCEEDED:
                lost = self._stager.stage_out(rental.instance_id)
        if lost and self.spec.keep_on_output_failure:
            self._keep_for_outputs(rental, self.spec.keep_on_output_failure)
            self._guard.end(rental.instance_id, Disposal.KEEP, metric=metric, why="its outputs are to be copied")
        else:
            self._guard.end(rental.instance_id, metric=metric, why=why)
        if lost:
            raise GpuMarketStagingFailed(
                f"The job on instance {rental.instance_id} succeeded, but {len(lost)} output(s) did not reach the "
                "cloud integration: " + "; ".join(f"{path} -> {why}" for path, why in lost.items())
            )

    def _end_source(self, instance_id: int) -> None:
        """A kept checkpoint source is no longer needed: destroyed (its preemption was counted then)."""
        self._guard.end(instance_id, metric=None, why="its checkpoint is no longer needed")

    def _keep_for_outputs(self, rental: lifecycle.Rental, seconds: float) -> None:
        """Keep the stopped instance (storage bills) under a lease the reaper honours, to copy its outputs by hand."""
        # Under a key of its own: the task's failure callback destroys what carries the task's key.
        label = lifecycle.make_label(lifecycle.kept_key(self._guard.key), time.time() + seconds)
        self.hook.label_instance(rental.instance_id, label)
        self.log.error(
            "Keeping stopped instance %s for %s (keep_on_output_failure; storage bills, compute does not), for its "
            "outputs to be copied by hand (`vastai cloud copy`); the reaper destroys it after that",
            rental.instance_id,
            lifecycle.format_duration(seconds),
        )

    # --- what the task reports -----------------------------------------------------------------------------
    def lineage_facts(self) -> tuple[Any, str | None]:
        """For OpenLineage: the try's latest rental (its record and ``Rental``), and its cloud integration's type."""
        return self._recorder.latest, getattr(self._stager, "cloud_type", None)

    def credit_ran_out(self) -> float | None:
        """The account's credit when it is $0 or less (the service then stops every instance), else None."""
        available = self._budget.credit()
        return available if available is not None and available <= 0 else None

    def _log_daemon_tail(self, instance_id: int) -> None:
        """Before giving up an instance that never ran: what its host daemon said, for diagnosis."""
        if self.spec.log_interval <= 0:
            return
        try:
            text = self.hook.get_instance_logs(
                instance_id, tail=job_logs.FAILURE_TAIL_LINES, daemon_logs=True, retry=False
            )
        except GpuMarketError as exc:
            self.log.warning("Could not read the host daemon's log of instance %s: %s", instance_id, exc)
            return
        lines = job_logs.split_lines(text, complete_only=False)[-job_logs.FAILURE_TAIL_LINES :]
        self.log.warning("The host daemon's log of instance %s ends with %d line(s):", instance_id, len(lines))
        for line in lines:
            self.log.warning("[instance %s daemon] %s", instance_id, line)


def log_progress(log: Any, rental: lifecycle.Rental, watch: waiting.Watch, service_now: float) -> None:
    """The line each read of a wait in the worker logs: the status, and the cost so far (the service's clock)."""
    log.info(
        "Instance %s: %s after %s, cost so far %s",
        rental.instance_id,
        watch.shown,
        lifecycle.format_duration(service_now - rental.billed_from),
        cost.text(rental.cost_until(service_now), cost.ESTIMATED),
    )


def summary(rental: lifecycle.Rental, status: str | None, service_now: Callable[[], float]) -> dict[str, Any]:
    """What a renting task returns of its rental; times and costs on the service's clock, up to its end if it ended."""
    end = rental.ended_at if rental.ended_at is not None else service_now()
    estimate = rental.cost_until(end, digits=6)
    return {
        "instance_id": rental.instance_id,
        "offer_id": rental.offer_id,
        "dph_total": rental.dph_total,
        **({} if rental.bid is None else {"bid": rental.bid, "preemptions": rental.attempts.preemptions}),
        "gpu_name": rental.gpu_name,
        "label": rental.label,
        "actual_status": status,
        "ssh_host": rental.ssh_host,
        "elapsed_seconds": round(max(0.0, end - rental.billed_from), 3),
        "estimated_cost": estimate,
        "cost": estimate if rental.cost is None else rental.cost,
        "cost_kind": rental.cost_kind or cost.ESTIMATED,
    }


def preflight_in_log(
    hook: GpuMarketHook, spec: RentalSpec, rental: lifecycle.Rental, ended: WaitOutcome
) -> job_logs.PreflightFailure | None:
    """A job's instance that stopped before it was seen running: whether its wrapper's preflight stopped it.

    Only a wait for the status (data still to be staged) ends that way; its log was not read yet.
    """
    if ended.actual_status != api.STATUS_STOPPED or spec.command is None or spec.job_log_interval() <= 0:
        return None
    try:
        text = hook.get_instance_logs(rental.instance_id, tail=job_logs.FAILURE_TAIL_LINES, retry=False)
    except GpuMarketError:
        return None
    lines = job_logs.split_lines(text, complete_only=False)
    return job_logs.preflight_failure(lines, job_logs.exit_status(lines))


def try_number(context: Any) -> int:
    """The try of the task instance in ``context`` (1 when it does not tell)."""
    ti = context.get("ti") if isinstance(context, Mapping) else None
    return getattr(ti, "try_number", 1) or 1
