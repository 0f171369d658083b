"""One try of a renting task: the ``RentalSession`` its operator holds, the one owner of what the try rents.

The session rents, adopts and resumes rentals, waits for them in the worker, and is the only in-process place that
ends one (``end``, through ``ending.end_rental``: destroyed, handed over or kept, then settled, recorded, released
and counted, once). It holds what the try holds, so that a failure (``failed``), SIGTERM or ``execution_timeout``
(``kill``) destroys it; a durable task saves it in the task state store for a retry to reconnect to. Its parts hold
none of each other: the ``Budget`` (reserve before a create), the ``RentalRecorder`` (the GPU rentals page), the
``OfferChooser``, ``Preemptions`` (bid rentals) and, for durable data, the ``Stager``. Which of the instances
earlier tries left a retry takes back is ``adoption.py``'s rule.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import api, budgets, job_logs, job_secrets, lifecycle, metrics, waiting
from airflow_gpumarket._compat import AirflowException
from airflow_gpumarket.exceptions import (
    GpuMarketCreateRefusedError,
    GpuMarketError,
    GpuMarketOfferUnavailableError,
    GpuMarketValidationError,
)
from airflow_gpumarket.operators import adoption, approval, cost
from airflow_gpumarket.operators.adoption import STATE_KEY
from airflow_gpumarket.operators.budget import Budget
from airflow_gpumarket.operators.chooser import OfferChooser, Pick
from airflow_gpumarket.operators.ending import Books, Disposal, end_rental
from airflow_gpumarket.operators.failures import (
    GpuMarketNoWorkingOffer,
    GpuMarketOutcomeUnknown,
    GpuMarketStagingFailed,
    ended_unseen,
)
from airflow_gpumarket.operators.guard import destroy_rentals
from airflow_gpumarket.outcome import WaitOutcome, from_event, instance_of
from airflow_gpumarket.ui.records import RentalRecorder
from airflow_gpumarket.utils import try_number, try_started

if TYPE_CHECKING:
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
    from airflow_gpumarket.operators.preemption import Preemptions
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
        #: The task instance's label key: the same for every try (``lifecycle.rental_key``).
        self.key = lifecycle.task_key(task, context)
        self._try_number = try_number(context)
        self._started = try_started(context, time.time())  # a deadline's timedelta counts from here
        self._store = context.get("task_state_store") if task.durable and isinstance(context, Mapping) else None
        self._recorder = RentalRecorder(context, log, conn_id, clock=hook.service_now, image=spec.instance.get("image"))
        self._budget = Budget(hook, log, context, dag_id=task.dag_id or "", task_id=task.task_id, conn_id=conn_id)
        self._chooser = OfferChooser(hook, log, spec, conn_id=conn_id, task_ids=(task.dag_id or "", task.task_id))
        self._stager: Stager | None = None
        self._preemptions: Preemptions | None = None  # a bid rental's, made by ``_prepare``
        self.attempts = lifecycle.Attempts()  # the task instance's offers tried, preemptions and checkpoint source
        self._prepared = False  # ``_prepare`` ran: before the first rental, or on resuming
        # What this try holds, and ends whenever it fails.
        self.instance_id: int | None = None
        self._creating: str | None = None  # a create in flight: its instance is found by this label
        self._rental: lifecycle.Rental | None = None  # the rental held: what it cost is known when it ends
        env = spec.instance.get("env")
        self._secrets = job_secrets.TrySecrets(spec.secrets, spec.registry_conn_id, env=env, log=self.log)
        self.killed = False
        self._counted: set[int] = set()  # the instances whose end the metrics counted
        #: No try of the task instance can have rented: the first, until it sends a create or takes a rental over.
        self.rented_nothing = self._try_number <= 1
        self._task = task

    @property
    def recorded(self) -> bool:
        """Whether this try recorded a rental (and so the address the GPU rental link opens)."""
        return self._recorder.recorded

    # --- failure paths -------------------------------------------------------------------------------------
    def failed(self, exc: BaseException) -> None:
        """The try fails (``exc``; deferring is no failure): end what it holds, so that nothing bills on."""
        for instance_id in self._held(self.instance_id or self._find_in_flight()):
            self.log.warning("Task failed (%s): destroying instance %s so it stops billing", exc, instance_id)
            self._end(instance_id, metric=metrics.TASK_FAILED, why="the task failed")

    def kill(self) -> None:
        """SIGTERM or execution_timeout: destroy now (the process may be killed for good any moment)."""
        self.killed = True
        for instance_id in self._held(self.instance_id or self._find_in_flight()):
            try:
                self._end(instance_id, metric=metrics.TASK_FAILED, why="the task was killed")
            except Exception as exc:  # on_kill must not raise; the message names the instance
                self.log.error("Task killed: %s", exc)

    def stop_if_killed(self, instance_id: int) -> None:
        if self.killed:
            # Untyped on purpose: the task is being killed, and its on_kill ends what it holds; nothing retries on this.
            raise AirflowException(f"Task was killed while waiting for instance {instance_id}")

    def _held(self, instance_id: int | None) -> list[int]:
        """What a failure destroys: the instance held and a kept checkpoint source."""
        return [i for i in (instance_id, self.attempts.source_id) if i is not None]

    def _find_in_flight(self) -> int | None:
        """A create whose answer never came may still have made an instance: look for its label."""
        if self._creating is None:
            return None
        try:
            found = api.find_by_label(self.hook.list_instances(label=self._creating), self._creating)
        except GpuMarketError as exc:
            self.log.error("Could not check for an instance labelled %s: %s", self._creating, exc)
            return None
        return int(found["id"]) if found else None

    # --- where a rental starts -----------------------------------------------------------------------------
    def _adopt(self) -> lifecycle.Rental | None:
        """On a retry, the rental an earlier try left (the rest ended), as this try holds it; else None."""
        if self._try_number <= 1:
            return None
        saved = self._store_call("get")
        choice = adoption.choose(self.hook, self.log, self.key, saved, waits_for_job=self.spec.terms.job)
        for instance_id in choice.leftovers:
            self.log.warning("Destroying instance %s left by an earlier try", instance_id)
            self._end(instance_id, metric=None, why="left by an earlier try")
        if choice.adopted is None:
            return None
        adopted = adoption.rental_of(choice.adopted, lease=self.spec.lease_seconds, now=time.time())
        if self.spec.secrets:  # its job's log is masked as if this try had rented it
            try:
                adopted.secret_digests = self._secrets.read().digests
            except GpuMarketValidationError as exc:
                self.log.warning("The job's secrets cannot be read to mask them in its log: %s", exc)
        self.instance_id, self.attempts, self.rented_nothing = adopted.instance_id, adopted.attempts, False
        self._start(adopted)
        return adopted

    def resume(self, event: Any) -> tuple[lifecycle.Rental, WaitOutcome]:
        """The rental a trigger's event brings back, with what its wait learnt; its held log lines shown."""
        # Whatever else is wrong with the event, a failure destroys its instance.
        self.instance_id, self.rented_nothing = instance_of(event), False
        try:
            ended, rental = from_event(event)
            if rental is None:
                raise ValueError(f"no rental to resume in {event!r}")
        except ValueError as exc:
            raise GpuMarketOutcomeUnknown(f"Cannot resume waiting for instance {self.instance_id}: {exc}") from None
        if rental.instance_id != self.instance_id:
            raise GpuMarketOutcomeUnknown(f"Unexpected trigger event for instance {rental.instance_id}: {event!r}")
        self._rental = rental
        self._start(rental, write=False)
        if rental.observe(ended.marks):
            self._recorder.running(rental)
        for line in ended.final_lines:
            self.log.info("%s", line)
        self.attempts = rental.attempts
        self._prepare()
        return rental, ended

    def _prepare(self) -> None:
        """Before the first rental (or resumed wait): its durable data's integration found, a bid's preemptions."""
        self._prepared = True
        spec = self.spec
        plan = spec.data_plan
        if plan is not None and plan.active:
            from airflow_gpumarket.operators.stager import Stager

            self._stager = Stager(
                self.hook,
                self.log,
                plan,
                spec.poll_interval,
                source_lease=spec.source_lease(plan),
                key=self.key,
                stop_if_killed=self.stop_if_killed,
                end_source=lambda instance_id: self._end(instance_id, metric=None, why="its checkpoint is not needed"),
            )
            self._stager.resolve()
        if spec.interruptible:
            from airflow_gpumarket.operators.preemption import Preemptions

            learned = None
            if spec.deadline is not None and None in (spec.expected_runtime, spec.image_size_gb):
                learned = self._chooser.history()  # the deadline's work and boot: learnt from history
            self._preemptions = Preemptions(
                self.hook, self.log, spec, self._stager, started=self._started, learned=learned
            )

    def rent(self) -> lifecycle.Rental:
        """The rental to wait for: first, on a retry, the one an earlier try left (``adoption``); else a new one.

        Created on the next untried offer until one is made or ``max_offer_attempts`` offers were tried, counted since
        the last preemption. Machines in host memory are skipped (not a pinned offer's).
        """
        if not self._prepared:
            self._prepare()
            if (adopted := self._adopt()) is not None:
                return adopted
        attempts = self.attempts
        if self._preemptions is not None:
            self._preemptions.before_renting(attempts)  # a deadline may end the bidding
        first = True
        while attempts.offers_this_round() < self.spec.max_offer_attempts:
            pick, first = self._chooser.next_offer(attempts, first=first), False
            if isinstance(pick, str):
                attempts.reasons.append(pick)
                break
            approval.check(self._task, pick)  # above approval_above: a person says yes first, before anything
            attempts.tried.append(int(pick.offer["id"]))
            if self.killed:  # on_kill ran meanwhile (during a failover's destroy, say): nothing more is rented
                raise AirflowException("Task was killed: nothing more is rented")
            rental = self._create(pick)
            if rental is not None:
                self.stop_if_killed(rental.instance_id)  # killed during the create: neither waited for nor kept
                return rental
        why = "; ".join(attempts.reasons) or "no offer matched"
        raise GpuMarketNoWorkingOffer(
            f"Could not get a working instance after trying {attempts.offers_this_round()} offer(s) "
            f"(max_offer_attempts={self.spec.max_offer_attempts}): {why}. Nothing is left running.",
            unmatched=None if attempts.tried else self._chooser.unmatched(),
        )

    def _create(self, pick: Pick) -> lifecycle.Rental | None:
        """Rent ``pick``: reserve, create, record, hold; None when nothing was made (why: in ``attempts``)."""
        spec, budget, attempts, offer, bid = self.spec, self._budget, self.attempts, pick.offer, pick.bid
        created_at = time.time()
        label = lifecycle.make_label(self.key, created_at + spec.first_lease)
        staged = None if self._stager is None else self._stager.wrapper(attempts.source_id)
        secrets = self._secrets.read()
        body = spec.creation_body(
            label=label,
            base_url=self.hook.settings.base_url,
            bid=bid,
            preemptions=attempts.preemptions,
            staged=staged,
            gpu_count=pick.gpus,
            secret_env=secrets.env,
            image_login=secrets.image_login,
            service_key=self.hook.settings.api_key if spec.terms.serves else None,
        )
        budget.reserve(pick.worst, started=self.hook.service_now())  # refused: nothing is rented
        self.log.info(
            "Renting offer %s (%s x %s at $%s/h%s) with label %s",
            offer["id"],
            offer.get("num_gpus", "?"),
            offer.get("gpu_name", "?"),
            offer.get("dph_total", "?"),
            "" if bid is None else f" on demand; bidding ${bid}/h, interruptible, attempt {attempts.preemptions + 1}",
            label,
        )
        # Until the answer names the instance, a failure (or on_kill) looks for it by this label.
        self._creating, self.rented_nothing = label, False
        try:
            result = self.hook.create_instance(int(offer["id"]), **body)
        except GpuMarketOfferUnavailableError as exc:
            budget.not_created()
            self._creating = None
            self.log.warning("Offer %s is no longer available (%s); trying the next one", offer["id"], exc.msg or exc)
            attempts.reasons.append(f"offer {offer['id']} was taken before creation")
            return None
        except GpuMarketCreateRefusedError as exc:
            # Not destroyed: the label stays set, and the failure path finds the instance by it. A price of the
            # user's own (not the operator's bid) is not retried on other offers.
            if not exc.destroyed or bid is None:
                raise
            budget.not_created()
            self._creating = None
            self.log.warning("Offer %s refused the bid of $%s/h (%s); trying the next one", offer["id"], bid, exc)
            attempts.reasons.append(f"offer {offer['id']} refused the bid of ${bid}/h (its minimum rose)")
            return None
        except GpuMarketError as exc:
            if exc.status_code is not None and 400 <= exc.status_code < 500:
                budget.not_created()  # refused as asked: nothing was made
            raise
        # The rental takes its id from the answer, not back from what is held: on_kill (SIGTERM's handler, or
        # another thread) may end the instance meanwhile, and it is then no longer held.
        instance_id = int(result["new_contract"])
        self.instance_id = instance_id
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
            lease_cap=created_at + spec.lease_seconds,
            ambiguous=bool(result.get("ambiguous")),
            key_digest=job_logs.key_digest(own_key) if (own_key := result.get("instance_api_key")) else None,
            bid=bid,
            machine_id=offer.get("machine_id"),
            attempts=attempts,
            disk_hourly=budgets.storage_hourly(spec.disk_gb, offer.get("storage_cost")),
            inet_down=float(down) if api.is_positive_number(down := offer.get("inet_down")) else None,
            secret_digests=secrets.digests,
        )
        self._start(rental)
        self.check_duplicates(rental)
        return rental

    def _start(self, rental: lifecycle.Rental, *, write: bool = True) -> None:
        """The try holds ``rental`` from now on: recorded, and (unless resumed) saved for a retry to reconnect to."""
        self._recorder.start(rental, write=write, handed_over=self.spec.terms.hands_over)
        if write:
            self.instance_id, self._creating, self._rental = rental.instance_id, None, rental
            saved = {"instance_id": rental.instance_id, "label": rental.label, "offer_id": rental.offer_id}
            self._store_call("set", saved)

    def check_duplicates(self, rental: lifecycle.Rental) -> None:
        """After an ambiguous create (a duplicate may have landed since): end every other instance of the key."""
        if not rental.ambiguous:
            return
        why = "a duplicate left by an ambiguous create"
        destroy_rentals(
            self.hook.list_instances(),
            self.key,
            self.log,
            why[0].upper() + why[1:],
            lambda instance: self._end(int(instance["id"]), metric=None, why=why),
            keep=self._held(rental.instance_id),
        )

    # --- the wait ------------------------------------------------------------------------------------------
    def stage_in(self, rental: lifecycle.Rental) -> list[str]:
        """Copy the rental's data in until its job started; the job's lines shown meanwhile."""
        assert self._stager is not None  # asked only when ``plan.stages_in``
        return self._stager.stage_in(rental)

    def wait(self, rental: lifecycle.Rental, watch: waiting.Watch, shown: Sequence[str]) -> WaitOutcome:
        """The wait in the worker: read, sleep, and hand each read to a ``waiting.Wait``; log the cost so far."""
        instance_id = rental.instance_id
        watch.shown_lines = list(shown)
        pump = job_logs.LogPump(
            instance_id,
            self.spec.job_log_interval,
            key_digest=rental.key_digest,
            secret_digests=rental.secret_digests,
            shown=watch.shown_lines,
            since=rental.created_at,
        )
        wait = waiting.Wait(watch, pump, self.log, marks=rental.marks())
        while True:
            time.sleep(self.spec.poll_interval)  # right after creating (or a read) the answer cannot have changed yet
            self.stop_if_killed(instance_id)
            seen = self.hook.run_flow(waiting.read_flow(self.hook, instance_id))
            if seen.error is not None and not api.is_retryable(seen.error):
                raise seen.error
            self.stop_if_killed(instance_id)  # on_kill ran during the read: "gone" would not be the job's doing
            ended = self.hook.run_flow(wait.step(self.hook, seen, time.time()))
            if rental.observe(wait.marks()):
                self._recorder.running(rental)
            log_progress(self.log, rental, watch, self.hook.service_now())
            if ended is not None:
                return ended

    def after_preemption(self, rental: lifecycle.Rental, ended: WaitOutcome) -> waiting.Watch | None:
        """The wait for a preempted bid instance to win its machine back, or None: rent another (``Preemptions``).

        A preempted instance not waited for is destroyed, or kept as the next rental's checkpoint source.
        """
        assert self._preemptions is not None  # made by ``_prepare`` for every bid rental
        answer = self._preemptions.after(rental, ended)
        if answer.watch is not None:
            return answer.watch
        disposal = Disposal.KEEP if answer.kept else Disposal.DESTROY
        why = "preempted; kept as the checkpoint's source" if answer.kept else "preempted"
        self._end(rental.instance_id, disposal, metric=metrics.PREEMPTED, why=why, failover=not answer.fails)
        self._preemptions.conclude(answer, rental.attempts)
        return None

    # --- where a rental ends -------------------------------------------------------------------------------
    def fail_over(
        self, rental: lifecycle.Rental, ended: WaitOutcome, preflight: job_logs.PreflightFailure | None
    ) -> WaitOutcome | None:
        """The rental's host failed before the job ran: destroyed, its machine remembered, and why kept for the end.

        It never ran, did not boot in time, or failed the job wrapper's preflight (``preflight``). A stop whose log
        shows the command's own exit is no host's failure: a job's outcome is returned, another command's raised.
        """
        if preflight is None and ended.actual_status == api.STATUS_STOPPED and self.spec.command is not None:
            # a wait for the status (data to stage, a service) ends so: the wrapper may have stopped it unseen
            end = job_logs.end_in_log(self.hook, rental.instance_id) if self.spec.log_interval else None
            if end is not None and end.job_exited:
                return ended_unseen(self.spec.terms.job, rental.instance_id, end, ended)
            preflight = None if end is None else end.preflight
        if preflight is not None:
            sentence = f"instance {rental.instance_id}: {preflight.describe(rental.machine_id)}"
            sentence += "" if preflight.check == "ready" else "; the job did not run"
        else:
            sentence = ended.describe(rental.instance_id)
        self.log.warning("Failover: %s", sentence)
        if preflight is None and self.spec.log_interval > 0:
            job_logs.log_daemon_tail(self.hook, self.log, rental.instance_id)
        self._end(rental.instance_id, metric=metrics.NEVER_RAN, why="its host failed", failover=True)
        self._chooser.remember_failover(rental, ended, preflight, sentence)
        rental.give_up(sentence)
        return None

    def remember_lost(self, rental: lifecycle.Rental, ended: WaitOutcome) -> None:
        """The host failed under the running job: its machine remembered (host memory)."""
        self._chooser.remember(
            rental, "lost", f"instance {rental.instance_id} went {ended.actual_status} while its job ran"
        )

    def end(self, rental: lifecycle.Rental, how: Outcome, *, metric: str | None, why: str = "") -> None:
        """The task is done with ``rental``: saved, copied out, then destroyed, handed over or kept, as ``how`` says.

        ``metric`` is the outcome counted. Fails naming each output lost (the instance is destroyed, or kept under
        ``keep_on_output_failure``).
        """
        why = why or f"the task is done with it ({how.value})"
        if how is Outcome.GONE:
            self._end(rental.instance_id, Disposal.GONE, metric=metric, why=why)  # a 404 proved it
            return
        if how is Outcome.DESTROYED:  # the task fails next: its failure path ends a kept source, unsaved
            self._end(rental.instance_id, metric=metric, why=why)
            return
        if self._stager is not None:  # a kept checkpoint source is no longer needed
            self._stager.drop_source(rental.attempts, "the job no longer needs its checkpoint")
        if how is Outcome.HANDED_OVER:
            self._end(rental.instance_id, Disposal.HAND_OVER, metric=metric, why=why)
            return
        lost: dict[str, str] = {}
        if self._stager is not None and how is not Outcome.NOT_STARTED:
            self._stager.save(rental.instance_id)
            if how is Outcome.SUCCEEDED:
                lost = self._stager.stage_out(rental.instance_id)
        if lost and self.spec.keep_on_output_failure:
            self._keep_for_outputs(rental, self.spec.keep_on_output_failure)
            self._end(rental.instance_id, Disposal.KEEP, metric=metric, why="its outputs are to be copied")
        else:
            self._end(rental.instance_id, metric=metric, why=why)
        if lost:
            raise GpuMarketStagingFailed(
                f"The job on instance {rental.instance_id} succeeded, but {len(lost)} output(s) did not reach the "
                "cloud integration: " + "; ".join(f"{path} -> {why}" for path, why in lost.items())
            )

    def _end(
        self,
        instance_id: int,
        disposal: Disposal = Disposal.DESTROY,
        *,
        metric: str | None,
        why: str,
        failover: bool = False,
    ) -> None:
        """This try is done with ``instance_id``: ended through ``ending.end_rental``, then no longer held.

        Handed over or kept, it is only no longer this try's to destroy.
        """
        if instance_id in self._counted:  # an end that failed to destroy is tried again, and counted once
            metric = None
        elif metric is not None:
            self._counted.add(instance_id)
        held = self._rental if self._rental is not None and self._rental.instance_id == instance_id else None
        rental = held or self.attempts.kept_source(instance_id)
        books = Books(self.hook, self.log, rental=rental, record_end=self._recorder.end, release=self._budget.ended)
        end_rental(books, instance_id, disposal, metric=metric, why=why, read_charge=not self.killed, failover=failover)
        if self.instance_id == instance_id:
            self.instance_id = None
        if disposal in (Disposal.HAND_OVER, Disposal.KEEP):
            return
        self.attempts.record_end(instance_id, rental)
        if self.attempts.source_id == instance_id:
            self.attempts.source_id = None
        if rental is not None and rental is not held:
            self.attempts.source_rental = None
        if adoption.saved_instance(self._store_call("get")) == instance_id:
            self._store_call("delete")

    def _keep_for_outputs(self, rental: lifecycle.Rental, seconds: float) -> None:
        """Keep the stopped instance (storage bills) under a lease the reaper honours, to copy its outputs by hand."""
        # Under a key of its own: the task's failure callback destroys what carries the task's key.
        label = lifecycle.make_label(lifecycle.kept_key(self.key), time.time() + seconds)
        self.hook.label_instance(rental.instance_id, label)
        self.log.error(
            "Keeping stopped instance %s for %s (keep_on_output_failure; storage bills, compute does not), for its "
            "outputs to be copied by hand (`vastai cloud copy`); the reaper destroys it after that",
            rental.instance_id,
            lifecycle.format_duration(seconds),
        )

    def _store_call(self, method: str, *args: Any) -> Any:
        """One call to the task state store; a store that fails is reported and the label path goes on alone."""
        if self._store is None:
            return None
        try:
            result = getattr(self._store, method)(STATE_KEY, *args)
        except Exception as exc:  # noqa: BLE001 - durability is a help; the label still finds the rental
            self.log.warning(
                "The task state store failed (%s %s: %s); a retry finds the rental by its label", method, STATE_KEY, exc
            )
            return None
        if method == "set":
            self.log.info("Instance %s saved in the task state store (key %r)", args[0]["instance_id"], STATE_KEY)
        return result

    # --- what the task reports -----------------------------------------------------------------------------
    def lineage_facts(self) -> tuple[Any, str | None]:
        """For OpenLineage: the try's latest rental (its record and ``Rental``), and its cloud integration's type."""
        return self._recorder.latest, getattr(self._stager, "cloud_type", None)

    def credit_ran_out(self) -> float | None:
        """The account's credit when it is $0 or less (the service then stops every instance), else None."""
        available = self._budget.credit()
        return available if available is not None and available <= 0 else None


def log_progress(log: Any, rental: lifecycle.Rental, watch: waiting.Watch, service_now: float) -> None:
    """The line each read of a wait in the worker logs: the status, and the cost so far (the service's clock); the
    wait has watched since the create, so a rental not seen running yet has billed its disk alone."""
    so_far = rental.cost_until(service_now) if rental.running_at is not None else rental.disk_until(service_now)
    log.info(
        "Instance %s: %s after %s, cost so far %s",
        rental.instance_id,
        watch.shown,
        lifecycle.format_duration(service_now - rental.billed_from),
        cost.text(so_far, cost.ESTIMATED),
    )
