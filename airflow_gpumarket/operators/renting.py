"""The renting mechanism that ``GpuMarketCreateInstanceOperator`` and ``GpuMarketRunJobOperator`` share.

Read top to bottom: validation, the create body (``creation``), offers, then ``_run``: one loop over offers and
preemptions that rents, waits (in the worker, or deferred to the triggerer) and judges how the wait ended. The
operator holds its parts: a ``RentalGuard`` destroys what the task rented on every failure path, a
``bidding.BidPolicy`` answers what a preemption leads to, and a ``waiting.Wait`` takes each read of the instance.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import api, bidding
from airflow_gpumarket._compat import AirflowException, AirflowTaskTimeout
from airflow_gpumarket.creation import TYPED_FIELDS, creation_body, creation_fields
from airflow_gpumarket.exceptions import (
    GpuMarketCreateRefusedError,
    GpuMarketError,
    GpuMarketOfferUnavailableError,
    GpuMarketValidationError,
)
from airflow_gpumarket.operators.base import GpuMarketBaseOperator
from airflow_gpumarket.operators.failures import GpuMarketNoWorkingOffer, GpuMarketPreemptedTooOften
from airflow_gpumarket.operators.guard import RentalGuard, destroy_rentals_on_failure
from airflow_gpumarket.ui.links import GpuRentalLink
from airflow_gpumarket.utils import (
    DEFAULT_DEFERRABLE,
    RunTimeModule,
    duration_seconds,
    is_templated,
    resolved_at_run_time,
)

if TYPE_CHECKING:
    from airflow_gpumarket import budgets, job_logs, lifecycle, staging, waiting
    from airflow_gpumarket.job_script import WrapperStaging
    from airflow_gpumarket.operators.budget import Budget
    from airflow_gpumarket.operators.stager import Stager
else:  # what only a running task needs: not imported when a DAG file is parsed
    job_logs, lifecycle = RunTimeModule("airflow_gpumarket.job_logs"), RunTimeModule("airflow_gpumarket.lifecycle")
    waiting = RunTimeModule("airflow_gpumarket.waiting")
    staging = RunTimeModule("airflow_gpumarket.staging")
    budgets = RunTimeModule("airflow_gpumarket.budgets")

#: A job's whole lease runs this long past its boot and run time limits.
JOB_LEASE_MARGIN_SECONDS = 15 * 60
#: A kept-alive lease spans at least this many poll intervals, so a renewal always comes before it runs out.
KEEPALIVE_POLLS = 3


class GpuMarketRentingBaseOperator(GpuMarketBaseOperator):
    """Rent an instance: offer choice, failover, labels, waiting, and destroy on every failure path.

    :param offer_id: rent exactly this offer (no failover to others).
    :param offer_filters: or pick the cheapest matching offer (ordered by ``offer_order``, default price
        ascending) whose price is at most ``max_dph``.
    :param offer_order: ``[field, direction]`` pairs for the search.
    :param offer_type: ``ondemand`` (default), ``on-demand`` or ``bid``.
    :param max_dph: highest acceptable price in dollars per hour.
    :param max_offer_attempts: offers tried at most; a taken offer, a host that fails and a boot that times out
        move on to the next offer, and an offer is never tried twice.
    :param boot_timeout: time allowed from creation to running (default 15 minutes).
    :param poll_interval: seconds between status reads (default 10, as the spec recommends).
    :param deferrable: wait in the triggerer (default ``[operators] default_deferrable``). The task's
        ``execution_timeout`` counts the whole try, deferred waits included.
    :param instance: the spec's creation fields as one dict (templated); a field given by name wins over it.
    :param command: shell commands run through the provider's job wrapper as the onstart script
        (``airflow_gpumarket.job_script``); give it or ``onstart``, not both. Runtype then defaults to ``ssh_proxy``.
    :param export_env_to_ssh: the job wrapper also appends ``env``'s variables to ``/etc/environment``.
    :param log_interval: seconds between reads of a running job's output; new lines go to the task log, each once
        (default 30 s; 0 turns reads off).
    :param interruptible: rent bid instances, below the on-demand price, until a higher bid takes the machine.
    :param max_bid: the highest bid in $/h (default: the offer's on-demand ``dph_total``, never above it).
    :param max_preemptions: preemptions survived before the task fails (default 3).
    :param on_preemption: ``"failover"`` (destroy, rent another machine, run the job again) or ``"wait"`` (leave
        the stopped instance ``max_outbid_wait`` to win its machine back, then fail over).
    :param max_outbid_wait: see ``on_preemption`` (default 10 minutes).
    :param fallback_on_demand: after ``max_preemptions``, rent on demand instead of failing.
    :param bid_strategy: ``"min"`` (bid once, 5 % over the offer's ``min_bid``) or ``"hold"`` (raise the bid up
        to the cap as the machine's ``min_bid`` rises, and bid again after a preemption).
    :param durable: on Airflow 3.3+, keep the rental in the task state store so that a retry reconnects to it
        first (default True). The label finds it as well, on every version.
    :param checkpoint_dir: a directory on the instance for the job's checkpoints (templated), given to the job as
        ``GPUMARKET_CHECKPOINT_DIR``. After a preemption the next rental's job starts from the preempted instance's
        latest files (copied by the service), and learns where from in ``GPUMARKET_RESUMED_FROM``.
    :param checkpoint_uri: a path in ``cloud_integration`` that keeps ``checkpoint_dir`` across task retries and DAG
        runs (templated): restored before every job starts, saved after a preemption and before every destroy.
    :param cloud_integration: the name (or id) of a cloud integration set up in the service's console; its
        credentials stay with the service.
    :param inputs: ``{instance path: integration path}`` copied in before the job starts (templated).
    :param outputs: ``{instance path: integration path}`` copied out after exit 0, before the destroy (templated);
        one that fails fails the task and names the path.
    :param on_restore_failure: when a checkpoint restore does not complete: ``"restart"`` (default: the job starts
        from scratch, and the log says so) or ``"fail"``.
    :param staging_timeout: the bound of each copy step: restore and inputs, a save, the outputs (default 30 min).
        A destroy waits for a save at most this long, then destroys anyway and logs what was not saved.
    :param keep_on_output_failure: when an output copy fails, keep the stopped instance (storage bills) under a lease
        this long instead of destroying it, to copy the output by hand (default None: destroy).
    :param max_cost: the most, in dollars, one rental of this task may cost (operators that watch a job to its end).
        Its worst case is reserved with this cap; a job whose estimated cost reaches it is destroyed within one
        poll interval, and the task fails naming the cost. DAG budgets: the ``gpumarket_budgets`` Variable.
    :param image: container image (or template_hash_id).
    :param template_hash_id: a template to create from (or image).
    :param disk: disk size in GB.
    :param runtype: how the instance is reached.
    :param target_state: running or stopped.
    :param price: a bid in $/h (an interruptible instance).
    :param env: environment variables and port mappings.
    :param onstart: script run at start (ssh and jupyter runtypes).
    :param args_str: arguments for runtype 'args'.
    :param use_jupyter_lab: JupyterLab instead of Notebook.
    :param jupyter_dir: Jupyter's working directory.
    :param python_utf8: PYTHONUTF8=1.
    :param lang_utf8: a UTF-8 locale.
    :param image_login: registry login '-u <user> -p <token> <host>'.
    :param cancel_unavail: fail at once when the offer is taken (default True).
    :param vm: a virtual machine instead of a container.
    :param volume_info: a volume to create or attach.
    """

    template_fields: Sequence[str] = (
        "offer_id",
        "offer_filters",
        "offer_order",
        "max_dph",
        "command",
        "instance",
        "checkpoint_dir",
        "checkpoint_uri",
        "cloud_integration",
        "inputs",
        "outputs",
    )
    template_fields_renderers = {
        "instance": "json",
        "offer_filters": "json",
        "command": "bash",
        "inputs": "json",
        "outputs": "json",
    }
    operator_extra_links = (GpuRentalLink(),)
    ui_color = "#c9e7ff"
    #: Read by ``destroy_rentals_on_failure``: what this operator rents carries its task instance's label key.
    rents_instances = True
    #: The instance outlives the task, for later tasks of its DAG run (``GpuMarketCreateInstanceOperator``).
    _hands_over_its_instance = False
    #: Waits for a job to end (``lifecycle.WAIT_JOB``) rather than for a status (``lifecycle.WAIT_STATUS``).
    _waits_for_job = False
    #: What each operator sets: a created instance's lease, or a job's time limit and the lease kept ahead of it.
    lease: float | None = None
    max_runtime: float | None = None
    keepalive: float | None = None
    #: The current try's guard, set by ``execute`` and ``execute_complete``.
    _guard: RentalGuard | None = None
    _stager: Stager | None = None
    _budget: Budget | None = None
    _started_at: float | None = None

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
        max_outbid_wait: timedelta | float = bidding.DEFAULT_MAX_OUTBID_WAIT,
        fallback_on_demand: bool = False,
        bid_strategy: str = "min",
        durable: bool = True,
        checkpoint_dir: str | None = None,
        checkpoint_uri: str | None = None,
        cloud_integration: str | int | None = None,
        inputs: Mapping[str, str] | None = None,
        outputs: Mapping[str, str] | None = None,
        on_restore_failure: str = "restart",
        staging_timeout: timedelta | float = timedelta(minutes=30),
        keep_on_output_failure: timedelta | float | None = None,
        max_cost: float | None = None,
        image: str | None = None,
        template_hash_id: str | None = None,
        disk: float | None = None,
        runtype: str | None = None,
        target_state: str | None = None,
        price: float | None = None,
        env: Mapping[str, Any] | None = None,
        onstart: str | None = None,
        args_str: str | None = None,
        use_jupyter_lab: bool | None = None,
        jupyter_dir: str | None = None,
        python_utf8: bool | None = None,
        lang_utf8: bool | None = None,
        image_login: str | None = None,
        cancel_unavail: bool | None = None,
        vm: bool | None = None,
        volume_info: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        named = {name: value for name, value in locals().items() if name in api.CREATION_FIELD_NAMES}
        super().__init__(**kwargs)
        api.require_bool("durable", durable)
        self.durable = durable
        self.command = command
        self.instance = creation_fields(instance, {k: v for k, v in named.items() if v is not None}, command=command)
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
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_uri = checkpoint_uri
        self.cloud_integration = cloud_integration
        self.inputs = inputs
        self.outputs = outputs
        self.on_restore_failure = on_restore_failure
        self.staging_timeout = duration_seconds("staging_timeout", staging_timeout)
        self.keep_on_output_failure = (
            None
            if keep_on_output_failure is None
            else duration_seconds("keep_on_output_failure", keep_on_output_failure)
        )
        if max_cost is not None:
            api.require_positive_number("max_cost", max_cost)
            if not self._waits_for_job:
                raise GpuMarketValidationError(
                    "max_cost",
                    "needs a task that watches its rental to the end (GpuMarketRunJobOperator, @task.gpumarket); "
                    "a created instance's cost is bounded by its lease",
                )
        self.max_cost = max_cost
        api.require_bool("interruptible", interruptible)
        self.interruptible = interruptible
        self.bidding = bidding.BidPolicy.parse(
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
        self._validate_staging(parse_time=True)

    # --- validation ------------------------------------------------------------------------------------
    def _validate(self, *, parse_time: bool = False) -> None:
        """Every rule that can be checked; at parse time, fields holding Jinja wait for ``execute``."""
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

    def _data_plan(self, *, parse_time: bool = False) -> staging.DataPlan | None:
        """The durable data the task asked for, checked; None at parse time while any of it is templated."""
        values = {
            "checkpoint_dir": self.checkpoint_dir,
            "checkpoint_uri": self.checkpoint_uri,
            "cloud_integration": self.cloud_integration,
            "inputs": self.inputs,
            "outputs": self.outputs,
        }
        if all(value is None for value in values.values()) and self.on_restore_failure == "restart":
            return None  # nothing asked for: the rules' module is not even imported
        if parse_time and any(is_templated(value) or resolved_at_run_time(value) for value in values.values()):
            return None
        return staging.make_plan(
            **values, on_restore_failure=self.on_restore_failure, staging_timeout=self.staging_timeout
        )

    def _validate_staging(self, *, parse_time: bool = False) -> staging.DataPlan | None:
        plan = self._data_plan(parse_time=parse_time)
        asked = next((name for name in ("checkpoint_dir", "inputs", "outputs") if getattr(self, name)), None)
        if asked is None:
            return plan
        if self.command is None:
            raise GpuMarketValidationError(
                asked, "is staged by the provider's job wrapper, which runs only a command: give command, not onstart"
            )
        if self.outputs and not self._waits_for_job:
            raise GpuMarketValidationError(
                "outputs",
                "are copied after the job's exit 0, which only GpuMarketRunJobOperator and @task.gpumarket wait for",
            )
        if not self._should_wait():
            raise GpuMarketValidationError(asked, "is copied in once the instance runs: keep wait_for_running=True")
        if self.log_interval <= 0:
            raise GpuMarketValidationError(
                "log_interval", f"is 0, but {asked} needs the job's log to see it start; give a log_interval > 0"
            )
        return plan

    def _validate_interruptible(self) -> None:
        if not self.interruptible:
            for name, value, default in (
                ("max_bid", self.bidding.max_bid, None),
                ("bid_strategy", self.bidding.bid_strategy, "min"),
            ):
                if value != default:
                    raise GpuMarketValidationError(name, "applies to interruptible rentals: set interruptible=True")
            return
        if "price" in self.instance:
            raise GpuMarketValidationError(
                "price", "is the bid, which an interruptible rental makes itself from the offer; give max_bid instead"
            )
        if self.offer_id is not None and self.bidding.on_preemption == "failover":
            raise GpuMarketValidationError(
                "offer_id",
                "pins one machine, which a preemption takes away; give offer_filters, or on_preemption='wait'",
            )
        if self._waits_for_job and self.log_interval <= 0:
            raise GpuMarketValidationError(
                "log_interval",
                "is 0, but an interruptible job's log tells a preemption from its own stop; give a log_interval > 0",
            )

    def _offer_id_int(self) -> int:
        try:
            return int(self.offer_id)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise GpuMarketValidationError(
                "offer_id", f"must be an offer id (integer), got {self.offer_id!r}"
            ) from None

    # --- the create body -------------------------------------------------------------------------------
    def _creation_body(
        self,
        *,
        label: str | None,
        base_url: str | None,
        bid: float | None = None,
        preemptions: int = 0,
        staged: WrapperStaging | None = None,
    ) -> dict[str, Any]:
        """What a create sends.

        Without ``base_url`` (a check before the connection is read), a command's script is written only when it might
        not fit.
        """
        onstart = None
        if self.command is not None and not (base_url is None and staged is None and self._script_certainly_fits()):
            onstart = self._job_script(base_url or "https://api.example.invalid", staged)
        return creation_body(
            self.instance,
            onstart=onstart,
            label=label,
            bid=bid,
            preemptions=preemptions if self.interruptible else None,  # after a fallback too: the job learns its run
        )

    def _script_certainly_fits(self) -> bool:
        from airflow_gpumarket.job_script import certainly_fits

        return (
            isinstance(self.command, str)
            and not self.export_env_to_ssh
            and certainly_fits(self.command, stop_on_success=self._stops_on_success())
        )

    def _job_script(self, base_url: str, staged: WrapperStaging | None = None) -> str | None:
        """The job wrapper's onstart script for ``command``; None while the command or ``env`` is templated."""
        from airflow_gpumarket.job_script import build_job_onstart

        env = self.instance.get("env")
        if is_templated(self.command) or is_templated(env):
            return None
        names = sorted(api.env_variables(env or {})) if self.export_env_to_ssh else []
        return build_job_onstart(
            self.command,  # type: ignore[arg-type]
            base_url=base_url,
            export_env=names,
            stop_on_success=self._stops_on_success(),
            staged=staged,
        )

    # --- offers ----------------------------------------------------------------------------------------
    def _next_offer(self, attempts: lifecycle.Attempts) -> tuple[Mapping[str, Any] | None, float | None, str]:
        """The next offer to rent and its bid (None on demand); or no offer, and why.

        A pinned offer is searched for by its id too: its price must be known before its worst case is reserved.
        """
        tried, bids = attempts.tried, self.interruptible and not attempts.on_demand
        pinned = None if self.offer_id is None else self._offer_id_int()
        if pinned in tried:
            return None, None, "no further matching offer"
        offer_type = "bid" if bids else self.offer_type
        offers = self.hook.search_offers(
            self.offer_filters if pinned is None else {"id": {"eq": pinned}},
            offer_type=offer_type,
            order=self.offer_order or [["dph_total", "asc"]],
            limit=len(tried) + len(attempts.lost_machines) + 10,
        )
        skipped = ""
        for offer in offers:
            if offer.get("id") in tried or offer.get("rentable") is False:
                continue
            if offer.get("machine_id") is not None and offer.get("machine_id") in attempts.lost_machines:
                continue  # a preemption took this machine: never again
            if not api.is_positive_number(offer.get("dph_total")):
                skipped = f"offer {offer.get('id')} shows no price (dph_total), so its worst case cannot be reserved"
                continue
            bid = None
            if bids:
                bid, skipped = bidding.bid_for(offer, self.bidding.max_bid)
                if bid is None:
                    continue
            price = bid if bid is not None else offer["dph_total"]
            if self.max_dph is not None and price > self.max_dph:
                continue
            return offer, bid, ""
        if pinned is not None and not skipped and all(offer.get("id") != pinned for offer in offers):
            why = f"offer_id {pinned} is not found by a search for it ({offer_type}): it is taken or no longer listed"
            return None, None, why + ", and its price cannot be known before renting"
        return None, None, "no further matching offer" + (f" (the last one refused: {skipped})" if skipped else "")

    # --- the task --------------------------------------------------------------------------------------
    def execute(self, context: Any) -> Any:
        self._started_at = time.time()
        self._validate()
        guard = self._guard = self._new_guard(context)
        with guard.on_failure():
            ti = context.get("ti") if isinstance(context, Mapping) else None
            adopted = guard.adopt(getattr(ti, "try_number", 1) or 1, waits_for_job=self._waits_for_job)
            rental = None
            if adopted is not None:
                rental = self._rental_of(adopted)
                if guard.recorder is not None:
                    guard.recorder.start(rental, handed_over=self._hands_over_its_instance)
                guard.hold(rental)
            return self._run(context, rental, None)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        """Resume after the trigger fired; everything needed comes in the event."""
        instance_id = event.get("instance_id") if isinstance(event, Mapping) else None
        guard = self._guard = self._new_guard(context)
        if isinstance(instance_id, int):
            guard.instance_id = instance_id  # whatever else is wrong with the event, the guard destroys it
        with guard.on_failure():
            try:
                lifecycle.event_kind(event)
                rental = lifecycle.Rental.from_resume(event.get("resume"))
            except ValueError as exc:
                raise AirflowException(f"Cannot resume waiting for instance {instance_id}: {exc}") from None
            if rental.instance_id != instance_id:
                raise AirflowException(f"Unexpected trigger event for instance {rental.instance_id}: {event!r}")
            rental.relabel(event.get("label"))  # the trigger's renewals came later
            if guard.recorder is not None:
                guard.recorder.start(rental, write=False, handed_over=self._hands_over_its_instance)
            if rental.running_at is None and api.is_positive_number(running_at := event.get("running_at")):
                rental.running_at = running_at
                if guard.recorder is not None:
                    guard.recorder.running(rental)
            if api.is_positive_number(stopped_at := event.get("stopped_at")):
                rental.stopped_at = stopped_at
            if api.is_positive_number(bid := event.get("bid")):
                rental.rebid(bid)  # the trigger held the bid
            event = dict(event)
            job_logs.show_held(event, self.log)
            return self._run(context, rental, event)

    def on_kill(self) -> None:
        """SIGTERM or execution_timeout: destroy what this try holds now."""
        if self._guard is not None:
            self._guard.kill()

    def _new_guard(self, context: Any) -> RentalGuard:
        from airflow_gpumarket.operators.budget import Budget
        from airflow_gpumarket.ui.records import RentalRecorder

        recorder = RentalRecorder(context, self.log, self.gpumarket_conn_id, clock=self.hook.service_now)
        store = context.get("task_state_store") if self.durable and isinstance(context, Mapping) else None
        budget = self._budget = Budget(
            self.hook,
            self.log,
            context,
            dag_id=self.dag_id or "",
            task_id=self.task_id,
            conn_id=self.gpumarket_conn_id,
        )
        guard = RentalGuard(self.hook, self.log, self._rental_key(context), store=store, recorder=recorder)
        guard.budget = budget
        return guard

    def _run(self, context: Any, rental: lifecycle.Rental | None, event: dict[str, Any] | None) -> Any:
        """Rent, wait and judge, over offers and preemptions, until the task's outcome."""
        guard = self._guard
        assert guard is not None
        attempts = lifecycle.Attempts() if rental is None else rental.attempts
        plan = self._validate_staging()
        stager = self._stager = None
        if plan is not None and plan.active:
            from airflow_gpumarket.operators.stager import Stager

            # A kept source outlives the next rental's offers and boots, its staging and its save.
            source_lease = (
                self.boot_timeout * self.max_offer_attempts + 2 * plan.staging_timeout + JOB_LEASE_MARGIN_SECONDS
            )
            stager = self._stager = Stager(
                self.hook, self.log, plan, guard, self.poll_interval, source_lease=source_lease
            )
            guard.source_id = attempts.source_id
            stager.resolve()
        watch: waiting.Watch | None = None
        shown: Sequence[str] = ()  # the log lines the wait before a preemption showed last
        while True:
            if rental is None:
                rental = self._rent(context, attempts)
                guard.stop_if_killed(rental.instance_id)  # killed during the create: neither waited for nor handed over
            if event is None:
                if not self._should_wait():
                    return self._complete(context, rental, None)
                watch = watch or self._watch(rental)
                if self.deferrable:
                    self._defer(context, rental, watch, shown)
                event = self._poll(rental, watch, shown)
            shown = ()
            if rental.ambiguous:  # a create delayed past the first sweep may have landed since
                guard.destroy_duplicates(rental)
            kind = lifecycle.event_kind(event)
            if kind is lifecycle.EventKind.TIMEOUT and self._execution_timeout_is_binding(context, rental, event):
                guard.destroy(rental.instance_id)
                raise AirflowTaskTimeout(lifecycle.with_job_detail(self._timed_out(rental.instance_id), event))
            if kind in (lifecycle.EventKind.NEVER_RUNS, lifecycle.EventKind.BOOT_TIMEOUT):
                sentence = lifecycle.describe_event(event, rental.instance_id)
                self.log.warning("Failover: %s", sentence)
                self._log_daemon_tail(rental.instance_id)
                guard.destroy(rental.instance_id)
                rental.give_up(sentence)
                rental, event, watch = None, None, None
                continue
            if kind is lifecycle.EventKind.REACHED and stager is not None and self._stages_in(rental):
                shown = stager.stage_in(rental)
                if not self._waits_for_job:
                    return self._complete(context, rental, event)
                event, watch = None, None
                continue
            if rental.bid is not None and lifecycle.preempted(event):
                watch = self._after_preemption(rental, event)
                if watch is None:
                    rental = None
                else:
                    shown = event.get("log_tail") or ()  # the wait for the bid shows what follows them
                event = None
                continue
            return self._complete(context, rental, event)

    def _rent(self, context: Any, attempts: lifecycle.Attempts) -> lifecycle.Rental:
        """Create on the next untried offer until one is made or ``max_offer_attempts`` offers were tried.

        Offers are counted since the last preemption.
        """
        while attempts.offers_this_round() < self.max_offer_attempts:
            offer, bid, why_not = self._next_offer(attempts)
            if offer is None:
                attempts.reasons.append(why_not)
                break
            attempts.tried.append(int(offer["id"]))
            rental = self._create(context, offer, bid, attempts)
            if rental is not None:
                return rental
        raise GpuMarketNoWorkingOffer(
            f"Could not get a working instance after trying {attempts.offers_this_round()} offer(s) "
            f"(max_offer_attempts={self.max_offer_attempts}): {'; '.join(attempts.reasons) or 'no offer matched'}. "
            "Nothing is left running."
        )

    def _create(
        self, context: Any, offer: Mapping[str, Any], bid: float | None, attempts: lifecycle.Attempts
    ) -> lifecycle.Rental | None:
        """Rent ``offer``; None when nothing was made (the reason is in ``attempts``)."""
        guard = self._guard
        assert guard is not None
        created_at = time.time()
        lease = self._lease_seconds() if self.keepalive is None else min(self.keepalive, self._lease_seconds())
        label = lifecycle.make_label(guard.key, created_at + lease)
        body = self._creation_body(
            label=label,
            base_url=self.hook.settings.base_url,
            bid=bid,
            preemptions=attempts.preemptions,
            staged=None if self._stager is None else self._stager.wrapper(attempts.source_id),
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
        budget = self._budget
        assert budget is not None
        worst = self._worst_case(offer, bid)
        cost_start = self.hook.service_now()
        budget.reserve(worst, started=cost_start)  # refused: nothing is rented
        # Until the answer names the instance, a failure (or on_kill) looks for it by this label.
        guard.creating_label = label
        try:
            result = self.hook.create_instance(int(offer["id"]), **body)
        except GpuMarketOfferUnavailableError as exc:
            budget.not_created()
            guard.creating_label = None
            self.log.warning("Offer %s is no longer available (%s); trying the next one", offer["id"], exc.msg or exc)
            attempts.reasons.append(f"offer {offer['id']} was taken before creation")
            return None
        except GpuMarketCreateRefusedError as exc:
            # Not destroyed: the label stays set, and the failure path finds the instance by it. A price of the
            # user's own (not the operator's bid) is not retried on other offers.
            if not exc.destroyed or bid is None:
                raise
            budget.not_created()
            guard.creating_label = None
            self.log.warning("Offer %s refused the bid of $%s/h (%s); trying the next one", offer["id"], bid, exc)
            attempts.reasons.append(f"offer {offer['id']} refused the bid of ${bid}/h (its minimum rose)")
            return None
        except GpuMarketError as exc:
            if exc.status_code is not None and 400 <= exc.status_code < 500:
                budget.not_created()  # refused as asked: nothing was made
            raise
        # The rental takes its id from the answer, not back from the guard: on_kill (SIGTERM's handler, or another
        # thread) may destroy the instance meanwhile, and the guard then forgets it.
        instance_id = guard.instance_id = int(result["new_contract"])
        budget.created(instance_id)
        self.log.info("Created instance %s on offer %s", instance_id, offer["id"])
        rental = lifecycle.Rental(
            instance_id=instance_id,
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
            disk_hourly=budgets.storage_hourly(self._disk_gb(), offer.get("storage_cost")),
        )
        if guard.recorder is not None:
            guard.recorder.start(rental, handed_over=self._hands_over_its_instance)
        guard.hold(rental)
        if rental.ambiguous:
            guard.destroy_duplicates(rental)
        return rental

    def _worst_case(self, offer: Mapping[str, Any], bid: float | None) -> budgets.WorstCase:
        """The most a rental of ``offer`` may cost: its price over its lease, disk included, capped by max_cost."""
        return budgets.worst_case(
            hourly_price=self._reserved_price(offer.get("dph_total"), bid) or 0.0,
            seconds=self._lease_seconds(),
            disk_gb=self._disk_gb(),
            storage_price_per_gb_month=offer.get("storage_cost"),
            max_cost=self.max_cost,
            overshoot_seconds=self.poll_interval,
        )

    def _reserved_price(self, dph_total: Any, bid: float | None) -> float | None:
        """The compute price a rental is reserved and capped at: its price, or the cap a held bid may rise to."""
        if bid is None:
            return float(dph_total) if api.is_positive_number(dph_total) else None
        cap = self.bidding.hold_cap(bid, dph_total)
        return float(bid) if cap is None else max(float(bid), cap)

    def _disk_gb(self) -> float | None:
        return disk if api.is_positive_number(disk := self.instance.get("disk")) else None

    def _rental_of(self, adopted: Mapping[str, Any]) -> lifecycle.Rental:
        """The rental an earlier try left, as this try holds it."""
        created_at = lifecycle.started_at(adopted, fallback=time.time(), now=time.time())
        offer_id = adopted.get("offer_id")
        return lifecycle.Rental(
            instance_id=int(adopted["id"]),
            offer_id=offer_id,
            dph_total=adopted.get("dph_total"),
            gpu_name=adopted.get("gpu_name"),
            label=adopted.get("label"),
            created_at=created_at,
            lease_cap=created_at + self._lease_seconds(),
            bid=adopted.get("bid_price") if adopted.get("is_bid") else None,
            machine_id=adopted.get("machine_id"),
            attempts=lifecycle.Attempts(tried=[] if offer_id is None else [int(offer_id)]),
            recorded_at=start if api.is_positive_number(start := adopted.get("start_date")) else None,
        )

    # --- the wait --------------------------------------------------------------------------------------
    def _watch(self, rental: lifecycle.Rental) -> waiting.Watch:
        deadline, max_runtime = self._limits(rental)
        job = self._waits_for_job and not self._stages_in(rental)
        cost_deadline = None
        price = self._reserved_price(rental.dph_total, rental.bid)
        if self.max_cost is not None and price is not None:
            hourly = price + rental.disk_hourly
            start = self._billed_from(rental)
            cost_deadline = budgets.cost_deadline(start=start, hourly=hourly, max_cost=self.max_cost)
        return waiting.Watch(
            wait_for=lifecycle.WAIT_JOB if job else lifecycle.WAIT_STATUS,
            boot_deadline=rental.created_at + self.boot_timeout,
            deadline=deadline,
            max_runtime=max_runtime,
            label=rental.label,
            keepalive=self.keepalive,
            lease_cap=rental.lease_cap,
            cost_deadline=cost_deadline,
            running_since=time.time() if rental.staged else None,  # it ran: a stop is its job's end, not a boot's
        )

    @staticmethod
    def _billed_from(rental: lifecycle.Rental) -> float:
        """When the rental's bill starts, on the service's clock when the record knows it (as the service bills)."""
        return rental.recorded_at if rental.recorded_at is not None else rental.created_at

    def _cost_text(self, rental: lifecycle.Rental) -> str:
        """The rental's cost so far, for a message: what it bills per hour since it began, on the service's clock."""
        hourly = rental.hourly or 0.0
        seconds = max(0.0, self.hook.service_now() - self._billed_from(rental))
        return f"its cost so far is about ${hourly * seconds / 3600:.4f} (${hourly:g}/h for {seconds / 60:.1f} min)"

    def _credit_ran_out(self) -> float | None:
        """The account's credit when it is $0 or less (the service then stops every instance), else None."""
        available = None if self._budget is None else self._budget.credit()
        return available if available is not None and available <= 0 else None

    def _drop_source(self, rental: lifecycle.Rental) -> None:
        """The job ended: a checkpoint source still kept is destroyed (after its save)."""
        if self._stager is not None:
            self._stager.drop_source(rental.attempts, "the job no longer needs its checkpoint")

    def _stages_in(self, rental: lifecycle.Rental) -> bool:
        """Whether the rental still waits for its data to be copied in before its job is watched."""
        return self._stager is not None and not rental.staged and self._stager.stages_in(rental)

    def _job_log_interval(self) -> float:
        """Seconds between reads of the job's output while this task waits (0: none)."""
        return self.log_interval if self._waits_for_job else 0.0

    def _hold_cap(self, rental: lifecycle.Rental) -> float | None:
        """The most this rental's bid may be raised to, or None when it does not hold its bid."""
        return self.bidding.hold_cap(rental.bid, rental.dph_total)

    def _defer(self, context: Any, rental: lifecycle.Rental, watch: waiting.Watch, shown: Sequence[str]) -> None:
        from airflow_gpumarket.triggers.instances import GpuMarketInstanceStatusTrigger

        deadline, timeout = watch.deadline, None
        if (limit := self._execution_deadline(context)) is not None:
            left = limit - time.time()
            if left <= 0:
                raise AirflowTaskTimeout(self._timed_out(rental.instance_id))
            deadline, timeout = limit if deadline is None else min(deadline, limit), timedelta(seconds=left)
        watch.deadline, watch.hold_bid_up_to, watch.shown_lines = deadline, self._hold_cap(rental), list(shown)
        self.defer(
            trigger=GpuMarketInstanceStatusTrigger(
                instance_id=rental.instance_id,
                gpumarket_conn_id=self.gpumarket_conn_id,
                watch=watch.to_dict(),
                rental=rental.to_resume(),
                poll_interval=self.poll_interval,
                log_interval=self._job_log_interval(),
                destroy_on_kill=True,
            ),
            method_name="execute_complete",
            timeout=timeout,
        )

    def _poll(self, rental: lifecycle.Rental, watch: waiting.Watch, shown: Sequence[str]) -> dict[str, Any]:
        """The wait in the worker: read, sleep, and hand each read to a ``waiting.Wait``; log the cost so far."""
        guard, instance_id = self._guard, rental.instance_id
        assert guard is not None
        pump = job_logs.LogPump(
            instance_id, self._job_log_interval(), key_digest=rental.key_digest, shown=shown, since=rental.created_at
        )
        watch.hold_bid_up_to = self._hold_cap(rental)
        wait = waiting.Wait(
            watch,
            pump,
            self.log,
            bid=rental.bid,
            read_at=rental.read_at if rental.read_at is not None else rental.recorded_at,
        )
        wait.running_at, wait.stopped_at = rental.running_at, rental.stopped_at
        while True:
            time.sleep(self.poll_interval)  # right after creating (or a read) the answer cannot have changed yet
            guard.stop_if_killed(instance_id)
            seen = self.hook.run_flow(waiting.read_flow(self.hook, instance_id))
            if seen.error is not None and not api.is_retryable(seen.error):
                raise seen.error
            guard.stop_if_killed(instance_id)  # on_kill ran during the read: "gone" would not be the job's doing
            rental.learn_ssh_host(seen.ssh_host)
            now = time.time()
            event = self.hook.run_flow(wait.step(self.hook, seen, now))
            rental.relabel(watch.label)
            if wait.bid is not None and rental.bid is not None and wait.bid != rental.bid:
                rental.rebid(wait.bid)
            first_running = rental.running_at is None and wait.running_at is not None
            rental.running_at, rental.stopped_at, rental.read_at = wait.running_at, wait.stopped_at, wait.read_at
            if first_running and guard.recorder is not None:
                guard.recorder.running(rental)
            self.log.info(
                "Instance %s: %s after %s, cost so far about $%s",
                instance_id,
                watch.shown,
                lifecycle.format_duration(rental.elapsed(now)),
                lifecycle.estimated_cost(rental.hourly, rental.elapsed(now)),
            )
            if event is not None:
                return event

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

    # --- preemptions -----------------------------------------------------------------------------------
    def _after_preemption(self, rental: lifecycle.Rental, event: Mapping[str, Any]) -> waiting.Watch | None:
        """Handle a preempted bid instance of this job.

        Returns the watch of the wait for it to win its machine back, or None once it is destroyed and another is to be
        rented. Fails after ``max_preemptions``.
        """
        guard, attempts, policy = self._guard, rental.attempts, self.bidding
        assert guard is not None
        sentence = lifecycle.describe_event(
            {**event, "status": lifecycle.EventKind.PREEMPTED.value}, rental.instance_id
        )
        waited = bool(event.get("waited"))  # the wait for the bid ran out: that preemption was counted already
        if not waited:
            attempts.count_preemption()
        instance = self._read_preempted(rental.instance_id)
        self.log.warning("Preemption %d of at most %d: %s", attempts.preemptions, policy.max_preemptions, sentence)
        won_back = (
            policy.holds()
            and instance is not None
            and policy.may_wait(attempts.preemptions, waited=waited)
            and self._bids_back(rental, instance)
        )
        step = policy.after_preemption(
            attempts.preemptions, waited=waited, won_back=won_back, on_demand=attempts.on_demand
        )
        if step is bidding.Next.WAIT:
            self.log.warning(
                "Leaving instance %s up to %s to win its machine back (%s)",
                rental.instance_id,
                lifecycle.format_duration(policy.max_outbid_wait),
                "its bid wins it again" if won_back else "on_preemption='wait'",
            )
            watch = self._watch(rental)
            watch.outbid_wait_until = time.time() + policy.max_outbid_wait
            watch.boot_deadline = watch.outbid_wait_until + self.boot_timeout
            return watch
        stager = self._stager
        if step is bidding.Next.FAIL and stager is not None:
            stager.save(rental.instance_id)
        if step is bidding.Next.FAIL or stager is None or not stager.keep_source(rental):
            guard.destroy(rental.instance_id)  # answered, or the task fails here: never two alive at once
        attempts.lose_machine(rental.machine_id, sentence)
        if step is bidding.Next.FAIL:
            raise GpuMarketPreemptedTooOften(
                f"The job was preempted {attempts.preemptions} times, more than max_preemptions="
                f"{policy.max_preemptions}; every instance it rented is destroyed. Raise max_preemptions or set "
                "fallback_on_demand=True."
            )
        if step is bidding.Next.ON_DEMAND:
            self.log.warning("max_preemptions=%d reached: renting on demand from now on", policy.max_preemptions)
            attempts.fall_back_to_on_demand()
        return None

    def _read_preempted(self, instance_id: int) -> Mapping[str, Any] | None:
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
        cap = self._hold_cap(rental)
        if cap is None or rental.bid is None:
            return False
        min_bid = instance.get("min_bid")
        raised = self.hook.run_flow(
            waiting.hold_bid_flow(self.hook, rental.instance_id, rental.bid, min_bid, cap, self.log)
        )
        if raised is not None:
            rental.rebid(raised)
        return api.is_positive_number(min_bid) and rental.bid >= min_bid

    # --- timeouts --------------------------------------------------------------------------------------
    def _execution_deadline(self, context: Any) -> float | None:
        """The epoch second at which ``execution_timeout`` ends, counted from the start of this try.

        A deferred wait carries the time left as the trigger's deadline and as ``defer(timeout=...)``.
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

    def _execution_timeout_is_binding(self, context: Any, rental: lifecycle.Rental, event: Mapping[str, Any]) -> bool:
        if event.get("limit") in (lifecycle.MAX_RUNTIME, lifecycle.MAX_COST):
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
        if self.max_runtime is not None:
            return self.boot_timeout + self.max_runtime + JOB_LEASE_MARGIN_SECONDS
        assert self.lease is not None  # set by every operator that rents without a job's time limit
        return self.lease

    def _limits(self, rental: lifecycle.Rental) -> tuple[float | None, float | None]:
        """The wait's absolute deadline (epoch seconds) and max_runtime (seconds from the job's start), if any."""
        if self.max_runtime is None:
            return None, None
        return rental.created_at + self.boot_timeout + self.max_runtime, self.max_runtime

    def _stops_on_success(self) -> bool:
        """Whether the job wrapper stops the instance after exit 0, so its log's end is read before the destroy.

        With ``log_interval=0`` nothing reads the log, and the wrapper destroys the instance itself.
        """
        return self._waits_for_job and self.log_interval > 0

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
            "estimated_cost": lifecycle.estimated_cost(rental.hourly, elapsed),
        }
