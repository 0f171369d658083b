"""The one renting mechanism that ``GpuMarketCreateInstanceOperator`` and ``GpuMarketRunJobOperator`` share, read top
to bottom: validation, offers, the guarded rental, the wait (in the worker or deferred), its end. Destroying on
failure is ``guard``'s part; the creation fields' handling is ``creation``'s.

Every operator that rents goes through ``GpuMarketRentingBaseOperator``: one mechanism that picks offers, fails
over, labels each rental deterministically, and destroys what it made on every failure path (exception in the
task, SIGTERM and ``execution_timeout`` through ``on_kill``, ``execution_timeout`` while deferred through the
trigger's deadline, a user killing the deferred task through the trigger's ``on_kill``, a worker lost without a
trace through a failure callback that Airflow runs elsewhere, a retry after the worker died through the label).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import api, bidding
from airflow_gpumarket._compat import AirflowException, AirflowTaskTimeout
from airflow_gpumarket.exceptions import (
    GpuMarketCreateRefusedError,
    GpuMarketError,
    GpuMarketOfferUnavailableError,
    GpuMarketValidationError,
)
from airflow_gpumarket.operators import interruptible as interruptible_rentals
from airflow_gpumarket.operators.base import GpuMarketBaseOperator
from airflow_gpumarket.operators.creation import TYPED_FIELDS, CreationBody, creation_fields, takes_creation_fields
from airflow_gpumarket.operators.failures import GpuMarketNoWorkingOffer
from airflow_gpumarket.operators.guard import RentalGuard, destroy_rentals_on_failure
from airflow_gpumarket.operators.interruptible import PreemptionHandling
from airflow_gpumarket.ui.links import GpuRentalLink
from airflow_gpumarket.utils import (
    DEFAULT_DEFERRABLE,
    RunTimeModule,
    duration_seconds,
    is_templated,
    resolved_at_run_time,
)

if TYPE_CHECKING:
    from airflow_gpumarket import job_logs, lifecycle
    from airflow_gpumarket.ui.records import RentalRecorder
else:  # what only a running task needs: not imported when a DAG file is parsed
    job_logs, lifecycle = RunTimeModule("airflow_gpumarket.job_logs"), RunTimeModule("airflow_gpumarket.lifecycle")

#: A job's whole lease runs this long past its boot and run time limits.
JOB_LEASE_MARGIN_SECONDS = 15 * 60
#: A kept-alive lease spans at least this many poll intervals, so a renewal always comes before it runs out.
KEEPALIVE_POLLS = 3


class GpuMarketRentingBaseOperator(RentalGuard, PreemptionHandling, CreationBody, GpuMarketBaseOperator):
    """The one renting mechanism: offer choice, failover, labels, waiting, and destroy on every failure path.

    :param offer_id: rent exactly this offer (no failover to others).
    :param offer_filters: or pick the cheapest matching offer (ordered by ``offer_order``, default price
        ascending) whose price is at most ``max_dph``.
    :param offer_order: ``[field, direction]`` pairs for the search.
    :param offer_type: ``ondemand`` (default), ``on-demand`` or ``bid``.
    :param max_dph: highest acceptable price in dollars per hour.
    :param max_offer_attempts: offers tried at most (an offer taken by someone else, a host that ends in
        exited/unknown/offline, a boot that times out all move on to the next offer; an offer is never tried twice).
    :param boot_timeout: time allowed from creation to running (default 15 minutes).
    :param poll_interval: seconds between status reads (default 10, as the spec recommends).
    :param deferrable: wait in the triggerer (default ``[operators] default_deferrable``). The task's
        ``execution_timeout`` counts the whole try, deferred waits included.
    :param command: shell commands run through the provider's job wrapper as the onstart script (see
        ``airflow_gpumarket.job_script``); give it or ``onstart``, not both. Runtype then defaults to ``ssh_proxy``.
    :param export_env_to_ssh: the job wrapper also appends ``env``'s variables to ``/etc/environment`` so SSH
        sessions see them (the spec says they are not visible there otherwise).
    :param log_interval: seconds (or a timedelta) between reads of a running job's output through the service's
        logs endpoint; new lines go to the task log, prefixed with the instance id, each once (default 30 s; the
        interval doubles while reads are rate limited). When a job fails, its exit status and last lines go into
        the exception; when an instance never boots, the host daemon's last lines are logged before the next
        offer is tried. 0 turns every read of logs off.
    :param interruptible: rent bid (interruptible) instances, below the on-demand price, until a higher bid takes
        the machine (see ``airflow_gpumarket.operators.interruptible``): offers come from a ``type: bid`` search,
        the bid is the offer's ``min_bid`` plus 5 %, and ``max_dph`` applies to the bid.
    :param max_bid: the highest bid in $/h (default: the offer's on-demand ``dph_total``, never above it).
    :param max_preemptions: preemptions survived before the task fails (default 3).
    :param on_preemption: ``"failover"`` (destroy, rent another machine, run the job again) or ``"wait"`` (leave
        the stopped instance ``max_outbid_wait`` to win its machine back, then fail over).
    :param max_outbid_wait: see ``on_preemption`` (default 10 minutes).
    :param fallback_on_demand: after ``max_preemptions``, rent on demand instead of failing.
    :param bid_strategy: ``"min"`` (bid once, 5 % over the offer's ``min_bid``) or ``"hold"`` (raise the bid up to
        ``max_bid`` when the machine's ``min_bid`` rises toward it, and bid again after a preemption to win the
        machine back; see ``airflow_gpumarket.operators.interruptible``).
    :param durable: on Airflow 3.3+, keep the rental in the task state store (AIP-103) from its creation to its
        end, so that a retry reconnects to it first (default True). The label finds it as well, on every version.

    :param instance: the spec's creation fields as one dict (templated; "Rendered Template" shows it as sent).
        Each field may also be given by name, below; a name wins over the dict. ``cancel_unavail`` defaults to
        True so a taken offer fails fast and the next is tried; the label is written by the operator (see
        ``airflow_gpumarket.lifecycle``).
    """

    template_fields: Sequence[str] = ("offer_id", "offer_filters", "offer_order", "max_dph", "command", "instance")
    operator_extra_links = (GpuRentalLink(),)
    #: The instance outlives the task, for later tasks of its DAG run (``GpuMarketCreateInstanceOperator``).
    _hands_over_its_instance = False
    template_fields_renderers = {"instance": "json", "offer_filters": "json", "command": "bash"}
    ui_color = "#c9e7ff"
    #: Waits for a job to end (``lifecycle.WAIT_JOB``) rather than for a status (``lifecycle.WAIT_STATUS``).
    _waits_for_job = False

    @takes_creation_fields
    def __init__(
        self,
        *,
        offer_id: int | None = None,
        offer_filters: Mapping[str, Any] | None = None,
        offer_order: list | None = None,
        offer_type: str = "ondemand",
        max_dph: float | None = None,
        max_offer_attempts: int = 3,
        boot_timeout: timedelta | float = timedelta(minutes=15),
        poll_interval: float = api.POLL_INTERVAL_SECONDS,
        deferrable: bool | None = None,
        instance: Mapping[str, Any] | None = None,
        command: str | None = None,
        export_env_to_ssh: bool = False,
        log_interval: timedelta | float = api.LOG_INTERVAL_SECONDS,
        interruptible: bool = False,
        max_bid: float | None = None,
        max_preemptions: int = 3,
        on_preemption: str = "failover",
        max_outbid_wait: timedelta | float = interruptible_rentals.DEFAULT_MAX_OUTBID_WAIT,
        fallback_on_demand: bool = False,
        bid_strategy: str = "min",
        durable: bool = True,
        **kwargs: Any,
    ) -> None:
        named = {name: kwargs.pop(name) for name in api.CREATION_FIELD_NAMES if name in kwargs}
        super().__init__(**kwargs)
        api.require_bool("durable", durable)
        self.durable = durable
        self.command = command
        self.instance = creation_fields(instance, named, command=command)
        self.export_env_to_ssh = export_env_to_ssh
        self.log_interval = duration_seconds("log_interval", log_interval, zero_ok=True)
        self.offer_id = offer_id
        self.offer_filters = offer_filters
        self.offer_order = offer_order
        self.offer_type = offer_type
        self.max_dph = max_dph
        self.max_offer_attempts = max_offer_attempts
        self.boot_timeout = duration_seconds("boot_timeout", boot_timeout)
        self.poll_interval = duration_seconds("poll_interval", poll_interval)
        self.deferrable = DEFAULT_DEFERRABLE if deferrable is None else deferrable
        api.require_bool("interruptible", interruptible)
        self.interruptible = interruptible
        self.bidding = interruptible_rentals.BidPolicy.parse(
            max_bid=max_bid,
            max_preemptions=max_preemptions,
            on_preemption=on_preemption,
            max_outbid_wait=max_outbid_wait,
            fallback_on_demand=fallback_on_demand,
            bid_strategy=bid_strategy,
        )
        callbacks: Any = getattr(self, "on_failure_callback", None)
        if callbacks is None:
            callbacks = []
        elif callable(callbacks):
            callbacks = [callbacks]
        if destroy_rentals_on_failure not in callbacks:  # a mapped task's partial() may carry it already
            self.on_failure_callback = [*callbacks, destroy_rentals_on_failure]
        api.require_positive_int("max_offer_attempts", max_offer_attempts)
        if offer_id is None and offer_filters is None:
            raise GpuMarketValidationError(
                "offer_id", "give offer_id (one offer) or offer_filters (pick the cheapest match); neither was given"
            )
        self._validate(parse_time=True)
        self._validate_interruptible()

    # --- validation ------------------------------------------------------------------------------------
    def _validate(self, *, parse_time: bool = False) -> None:
        """Every rule that can be checked. At parse time, fields still holding Jinja are checked after rendering
        (in ``execute``, before anything billable is sent)."""
        if self.command is not None:
            if self.instance.get("runtype") == "args":
                raise GpuMarketValidationError(
                    "runtype", "'args' does not run the onstart script, so the command would never start; use ssh"
                )
            if not (parse_time and is_templated(self.command)) and (
                not isinstance(self.command, str) or not self.command.strip()
            ):
                raise GpuMarketValidationError("command", "must be a non-empty string of shell commands")
        deferred = parse_time and any(
            resolved_at_run_time(value) or (name in TYPED_FIELDS and is_templated(value))
            for name, value in self.instance.items()
        )
        if not deferred:
            self._creation_body(label=None, base_url=None)
        if parse_time and is_templated(self.offer_id):
            return
        if self.offer_id is not None:
            api.require_positive_int("offer_id", self._offer_id_int())
        if self.offer_filters is not None and not (parse_time and is_templated(self.offer_filters)):
            api.build_search_body(self.offer_filters, offer_type=self.offer_type, order=self.offer_order)
        if self.max_dph is not None and not (parse_time and is_templated(self.max_dph)):
            api.require_positive_number("max_dph", self.max_dph)

    def _offer_id_int(self) -> int:
        try:
            return int(self.offer_id)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise GpuMarketValidationError(
                "offer_id", f"must be an offer id (integer), got {self.offer_id!r}"
            ) from None

    # --- offers ----------------------------------------------------------------------------------------
    def _next_offer(self, attempts: lifecycle.Attempts) -> tuple[Mapping[str, Any] | None, float | None, str]:
        """The next offer to rent and its bid (None on demand); or no offer, and why."""
        tried, bids = attempts.tried, self._bids(attempts)
        if self.offer_id is not None:
            offer_id = self._offer_id_int()
            if offer_id in tried:
                return None, None, "no further matching offer"
            if not bids:
                return {"id": offer_id}, None, ""
        offers = self.hook.search_offers(
            {"id": {"eq": self._offer_id_int()}} if self.offer_id is not None else self.offer_filters,
            offer_type="bid" if bids else self.offer_type,
            order=self.offer_order or [["dph_total", "asc"]],
            limit=len(tried) + len(attempts.lost_machines) + 10,
        )
        skipped = ""
        for offer in offers:
            if offer.get("id") in tried or offer.get("rentable") is False:
                continue
            if offer.get("machine_id") is not None and offer.get("machine_id") in attempts.lost_machines:
                continue  # a preemption took this machine: never again
            bid = None
            if bids:
                bid, skipped = bidding.bid_for(offer, self.bidding.max_bid)
                if bid is None:
                    continue
            price = bid if bid is not None else offer.get("dph_total") or 0
            if self.max_dph is not None and price > self.max_dph:
                continue
            return offer, bid, ""
        return None, None, "no further matching offer" + (f" (the last one refused: {skipped})" if skipped else "")

    # --- the guarded rental ------------------------------------------------------------------------------
    def execute(self, context: Any) -> Any:
        self._started_at = time.time()
        self._validate()
        self._recorder = self._new_recorder(context)
        self._store = self._state_store(context)
        with self._destroy_on_failure():
            rental = self._adopt_earlier_rental(context)
            if rental is not None:
                self._recorder.start(rental, handed_over=self._hands_over_its_instance)
                self._save_rental(rental)
                return self._wait_and_finish(context, rental)
            return self._rent(context, lifecycle.Attempts())

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        """Resume after the trigger fired. Everything needed comes in the event (``dag.test()`` passes no defer
        kwargs)."""
        instance_id = event.get("instance_id") if isinstance(event, Mapping) else None
        if isinstance(instance_id, int):
            self._instance_id = instance_id  # whatever else is wrong with the event, the guard destroys it
        self._recorder = self._new_recorder(context)
        self._store = self._state_store(context)
        with self._destroy_on_failure():
            try:
                lifecycle.event_kind(event)
                rental = lifecycle.Rental.from_resume(event.get("resume"))
            except ValueError as exc:
                raise AirflowException(f"Cannot resume waiting for instance {instance_id}: {exc}") from None
            if rental.instance_id != instance_id:
                raise AirflowException(f"Unexpected trigger event for instance {rental.instance_id}: {event!r}")
            rental.relabel(event.get("label"))  # the trigger's renewals came later
            # Written when it was created, before the deferral.
            self._recorder.start(rental, write=False, handed_over=self._hands_over_its_instance)
            if rental.running_at is None and api.is_positive_number(running_at := event.get("running_at")):
                rental.running_at = running_at
                self._recorder.running(rental)
            if api.is_positive_number(stopped_at := event.get("stopped_at")):
                rental.stopped_at = stopped_at
            if api.is_positive_number(bid := event.get("bid")):
                rental.rebid(bid)  # the trigger held the bid
            event = dict(event)
            job_logs.show_held(event, self.log)
            return self._finish(context, rental, event)

    def _new_recorder(self, context: Any) -> RentalRecorder:
        """This run's writer of rental records (imported here, not when a DAG file is parsed)."""
        from airflow_gpumarket.ui.records import RentalRecorder

        return RentalRecorder(context, self.log, self.gpumarket_conn_id, clock=self.hook.service_now)

    def _execution_deadline(self, context: Any) -> float | None:
        """The epoch second at which ``execution_timeout`` ends, counted from the start of this try.

        Airflow times each run of the task's code on its own (``execute``, then ``execute_complete`` afresh), so a
        deferred wait carries the remaining time itself: as the trigger's deadline and as ``defer(timeout=...)``.
        """
        if not self.execution_timeout:
            return None
        ti = context.get("ti") if isinstance(context, Mapping) else None
        start_date = getattr(ti, "start_date", None)
        if isinstance(start_date, datetime):
            started = start_date.timestamp()
        else:
            started = self._started_at if self._started_at is not None else time.time()
        return started + self.execution_timeout.total_seconds()

    def _rent(self, context: Any, attempts: lifecycle.Attempts) -> Any:
        """Create on the next untried offer and wait, failing over until max_offer_attempts offers were tried (since
        the last preemption)."""
        while attempts.offers_this_round() < self.max_offer_attempts:
            offer, bid, why_not = self._next_offer(attempts)
            if offer is None:
                attempts.reasons.append(why_not)
                break
            attempts.tried.append(int(offer["id"]))
            rental = self._create(context, offer, bid, attempts)
            if rental is None:  # nothing was made (or what was made is destroyed): the reason is in attempts
                continue
            return self._wait_and_finish(context, rental)
        raise GpuMarketNoWorkingOffer(
            f"Could not get a working instance after trying {attempts.offers_this_round()} offer(s) "
            f"(max_offer_attempts={self.max_offer_attempts}): {'; '.join(attempts.reasons) or 'no offer matched'}. "
            "Nothing is left running."
        )

    def _create(
        self, context: Any, offer: Mapping[str, Any], bid: float | None, attempts: lifecycle.Attempts
    ) -> lifecycle.Rental | None:
        key = self._rental_key(context)
        created_at = time.time()
        keepalive = self._keepalive_seconds()
        lease = self._lease_seconds() if keepalive is None else min(keepalive, self._lease_seconds())
        label = lifecycle.make_label(key, created_at + lease)
        body = self._creation_body(
            label=label, base_url=self.hook.settings.base_url, bid=bid, preemptions=attempts.preemptions
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
        # Until the answer names the instance, a failure (or on_kill) looks for it by this label: the request may
        # have made it. Cleared only once the id is held, or the service said no instance was made.
        self._creating_label = label
        try:
            result = self.hook.create_instance(int(offer["id"]), **body)
        except GpuMarketOfferUnavailableError as exc:
            self._creating_label = None
            self.log.warning("Offer %s is no longer available (%s); trying the next one", offer["id"], exc.msg or exc)
            attempts.reasons.append(f"offer {offer['id']} was taken before creation")
            return None
        except GpuMarketCreateRefusedError as exc:
            # Not destroyed: the label stays set, and the failure path finds the instance by it and destroys it. A
            # price of the user's own (not the operator's bid) is not retried on other offers: it fails as it is.
            if not exc.destroyed or bid is None:
                raise
            self._creating_label = None
            # The winning price of a bid market moves: it rose above the bid between the search and the create.
            self.log.warning("Offer %s refused the bid of $%s/h (%s); trying the next one", offer["id"], bid, exc)
            attempts.reasons.append(f"offer {offer['id']} refused the bid of ${bid}/h (its minimum rose)")
            return None
        self._instance_id = int(result["new_contract"])
        self._creating_label = None
        self.log.info("Created instance %s on offer %s", self._instance_id, offer["id"])
        rental = lifecycle.Rental(
            instance_id=self._instance_id,
            offer_id=int(offer["id"]),
            dph_total=offer.get("dph_total"),
            gpu_name=offer.get("gpu_name"),
            label=label,
            created_at=created_at,
            lease_cap=created_at + self._lease_seconds(),
            ambiguous=bool(result.get("ambiguous")),
            key_digest=job_logs.key_digest(own_key) if (own_key := result.get("instance_api_key")) else None,
            bid=bid,
            machine_id=offer.get("machine_id"),
            attempts=attempts,
        )
        if self._recorder is not None:
            self._recorder.start(rental, handed_over=self._hands_over_its_instance)
        self._save_rental(rental)
        if rental.ambiguous:
            self._destroy_duplicates(rental)
        return rental

    def _destroy_duplicates(self, rental: lifecycle.Rental) -> None:
        """After an ambiguous create, a request still in flight may have made a second instance with this
        task's label key: destroy every instance of the key but this rental's."""
        key = (lifecycle.parse_label(rental.label) or ("",))[0]
        for instance in lifecycle.rentals_of(self.hook.list_instances(), key):
            if instance.get("id") == rental.instance_id:
                continue
            self.log.warning("Destroying instance %s: a duplicate left by an ambiguous create", instance.get("id"))
            self._destroy(int(instance["id"]))

    def _watch(self, rental: lifecycle.Rental) -> lifecycle.Watch:
        deadline, max_runtime = self._limits(rental)
        return lifecycle.Watch(
            wait_for=lifecycle.WAIT_JOB if self._waits_for_job else lifecycle.WAIT_STATUS,
            boot_deadline=rental.created_at + self.boot_timeout,
            deadline=deadline,
            max_runtime=max_runtime,
            label=rental.label,
            keepalive=self._keepalive_seconds(),
            lease_cap=rental.lease_cap,
        )

    def _wait_and_finish(self, context: Any, rental: lifecycle.Rental) -> Any:
        if not self._should_wait():
            return self._complete(context, rental, None)
        watch = self._watch(rental)
        if self.deferrable:
            self._defer(context, rental, watch)
        return self._finish(context, rental, self._poll(rental, watch))

    def _defer(self, context: Any, rental: lifecycle.Rental, watch: lifecycle.Watch, shown: Sequence[str] = ()) -> None:
        from airflow_gpumarket.triggers.instances import GpuMarketInstanceStatusTrigger

        deadline, timeout = watch.deadline, None
        if (limit := self._execution_deadline(context)) is not None:
            left = limit - time.time()
            if left <= 0:
                raise AirflowTaskTimeout(self._timed_out(rental.instance_id))
            deadline, timeout = limit if deadline is None else min(deadline, limit), timedelta(seconds=left)
        self.defer(
            trigger=GpuMarketInstanceStatusTrigger(
                instance_id=rental.instance_id,
                gpumarket_conn_id=self.gpumarket_conn_id,
                wait_for=watch.wait_for,
                poll_interval=self.poll_interval,
                destroy_on_kill=True,
                dph_total=rental.hourly_price,
                boot_deadline=watch.boot_deadline,
                deadline=deadline,
                max_runtime=watch.max_runtime,
                label=watch.label,
                keepalive=watch.keepalive,
                lease_cap=watch.lease_cap,
                log_interval=self._job_log_interval(),
                key_digest=rental.key_digest,
                outbid_wait_until=watch.outbid_wait_until,
                hold_bid_up_to=self._hold_cap(rental),
                shown_lines=list(shown),
                resume=rental.to_resume(),
            ),
            method_name="execute_complete",
            timeout=timeout,
        )

    def _job_log_interval(self) -> float:
        """Seconds between reads of the job's output while this task waits (0: none)."""
        return self.log_interval if self._waits_for_job else 0.0

    def _poll(self, rental: lifecycle.Rental, watch: lifecycle.Watch, shown: Sequence[str] = ()) -> dict:
        """The synchronous loop around ``watch`` (the trigger is the asynchronous one), with cost-so-far logging
        and the job's output forwarded to the task log (after ``shown``, the lines an earlier wait showed last)."""
        instance_id = rental.instance_id
        pump = job_logs.LogPump(instance_id, self._job_log_interval(), key_digest=rental.key_digest, shown=shown)
        while True:
            # Wait first: right after creating (or a read) the answer cannot have changed yet.
            time.sleep(self.poll_interval)
            self._stop_if_killed(instance_id)
            instance, unread = None, False
            try:
                instance = self.hook.find_instance(instance_id)
            except GpuMarketError as exc:
                if not api.is_retryable(exc):
                    raise
                self.log.warning("Reading instance %s failed after retries (%s); still polling", instance_id, exc)
                unread = True
            self._stop_if_killed(instance_id)  # on_kill ran during the read: "gone" would not be the job's doing
            if instance is not None:
                rental.learn_ssh_host(instance.get("ssh_host"))
                pump.began(instance.get("actual_status") == api.STATUS_RUNNING)
                self._renew_lease(rental, watch)
                self._hold_bid(rental, instance)
            now = time.time()
            event = watch.observe(
                now,
                status=None if instance is None else instance.get("actual_status"),
                gone=instance is None and not unread,
                unread=unread,
            )
            if rental.note_billing(watch.status, self.hook.service_now()) and self._recorder is not None:
                self._recorder.running(rental)
            if watch.changed:
                self.log.info("Instance %s: status %s", instance_id, watch.shown)
            self.log.info(
                "Instance %s: %s after %s, cost so far about $%s",
                instance_id,
                watch.shown,
                lifecycle.format_duration(rental.elapsed(now)),
                lifecycle.estimated_cost(rental.hourly_price, rental.elapsed(now)),
            )
            if event is None and watch.reads_log() and pump.due(now):
                self.hook.run_flow(job_logs.forward_flow(self.hook, pump, self.log))
                event = lifecycle.ended_while_waiting(watch, pump)
            if event is not None:
                if lifecycle.needs_final_read(event, pump):
                    self.hook.run_flow(job_logs.forward_flow(self.hook, pump, self.log, final=True))
                return lifecycle.end_of_wait(event, pump)

    def _log_daemon_tail(self, instance_id: int) -> None:
        """Before giving up an instance that never ran: what its host daemon said, for diagnosis."""
        if self.log_interval <= 0:
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

    def _stop_if_killed(self, instance_id: int) -> None:
        if self._killed:
            raise AirflowException(f"Task was killed while waiting for instance {instance_id}")

    def _renew_lease(self, rental: lifecycle.Rental, watch: lifecycle.Watch) -> None:
        renewed = self.hook.run_flow(self.hook.renew_lease_flow(rental.instance_id, watch, time.time(), self.log))
        if renewed is not None:
            rental.relabel(renewed)

    def _finish(self, context: Any, rental: lifecycle.Rental, event: dict[str, Any]) -> Any:
        if rental.ambiguous:  # a create delayed past the first sweep may have landed since
            self._destroy_duplicates(rental)
        kind = lifecycle.event_kind(event)
        if kind is lifecycle.EventKind.TIMEOUT and self._execution_timeout_is_binding(context, rental, event):
            self._destroy(rental.instance_id)
            raise AirflowTaskTimeout(lifecycle.with_job_detail(self._timed_out(rental.instance_id), event))
        if kind in (lifecycle.EventKind.NEVER_RUNS, lifecycle.EventKind.BOOT_TIMEOUT):
            sentence = lifecycle.describe_event(event, rental.instance_id)
            self.log.warning("Failover: %s", sentence)
            self._log_daemon_tail(rental.instance_id)
            self._destroy(rental.instance_id)
            rental.give_up(sentence)
            return self._rent(context, rental.attempts)
        if rental.bid is not None and lifecycle.preempted(event):
            return self._after_preemption(context, rental, event)
        return self._complete(context, rental, event)

    def _execution_timeout_is_binding(self, context: Any, rental: lifecycle.Rental, event: Mapping[str, Any]) -> bool:
        if event.get("limit") == lifecycle.MAX_RUNTIME:
            return False
        limit = self._execution_deadline(context)
        own = self._limits(rental)[0]
        return limit is not None and (own is None or limit <= own)

    def _timed_out(self, instance_id: int) -> str:
        return (
            f"execution_timeout ({self.execution_timeout}) elapsed while waiting for instance {instance_id}; "
            "the instance is destroyed"
        )

    # --- per-operator choices --------------------------------------------------------------------------
    def _rental_key(self, context: Any) -> str:
        ti = context.get("ti") if isinstance(context, Mapping) else None
        run_id = context.get("run_id") if isinstance(context, Mapping) else None
        map_index = getattr(ti, "map_index", -1) if ti is not None else -1
        return lifecycle.rental_key(self.dag_id or "", str(run_id), self.task_id, map_index)

    def _should_wait(self) -> bool:
        return True

    def _lease_seconds(self) -> float:
        """The whole lease: how long after creation the reaper may destroy the instance at the latest."""
        raise NotImplementedError

    def _keepalive_seconds(self) -> float | None:
        """How far ahead the lease is kept while this task watches, or None for the whole lease at once."""
        return None

    def _limits(self, rental: lifecycle.Rental) -> tuple[float | None, float | None]:
        """The wait's absolute deadline (epoch seconds) and max_runtime (seconds from the job's start), if any."""
        return None, None

    def _complete(self, context: Any, rental: lifecycle.Rental, event: dict[str, Any] | None) -> Any:
        """What the task returns, or the failure it raises, once the wait ended with ``event`` (None: no wait)."""
        raise NotImplementedError

    def _summary(self, rental: lifecycle.Rental, status: str | None) -> dict[str, Any]:
        elapsed = rental.elapsed(time.time())
        return {
            "instance_id": rental.instance_id,
            "offer_id": rental.offer_id,
            "dph_total": rental.dph_total,
            **({} if rental.bid is None else {"bid": rental.bid, "preemptions": rental.attempts.preemptions}),
            "gpu_name": rental.gpu_name,
            "label": rental.label,
            "actual_status": status,
            "ssh_host": rental.ssh_host,
            "elapsed_seconds": round(elapsed, 3),
            "estimated_cost": lifecycle.estimated_cost(rental.hourly_price, elapsed),
        }


GpuMarketRentingBaseOperator.__doc__ = (
    (GpuMarketRentingBaseOperator.__doc__ or "").rstrip() + "\n" + api.fields_doc(api.CREATION_FIELDS, "    ")
)
