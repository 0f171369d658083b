"""The renting operators' base: their arguments, and a rental's whole life in ``execute``, read top to bottom.

``RentalSpec`` (``spec.py``) checks the arguments and builds what a create sends. The ``RentalSession``
(``session.py``) that ``execute`` makes owns the try's rentals: it rents (``chooser.py`` picks the offer; a retry
adopts first), waits in the worker, and ends each one. What comes next is ``plan.next_step``'s word, one step at a
time, on one ``Try``, each step one call of the session. Deferred, the wait runs in ``triggers/instances.py``,
carrying a ``waiting.Watch`` and the ``lifecycle.Rental``, and comes back as an ``outcome.WaitOutcome``. Each operator
says what it does with its rental through ``spec.Terms`` and judges how the wait ended in ``_complete``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import api, bidding
from airflow_gpumarket._compat import AirflowTaskTimeout, has_retry_policies, pauses
from airflow_gpumarket.creation import creation_fields
from airflow_gpumarket.operators import approval, offer_wait
from airflow_gpumarket.operators.base import GpuMarketBaseOperator
from airflow_gpumarket.operators.guard import destroy_rentals_on_failure
from airflow_gpumarket.operators.spec import RentalSpec, Terms
from airflow_gpumarket.utils import DEFAULT_DEFERRABLE, RunTimeModule, duration_seconds, try_started

if TYPE_CHECKING:
    from airflow_gpumarket import job_logs, lifecycle, metrics, waiting
    from airflow_gpumarket.operators import plan
    from airflow_gpumarket.operators.result import RentalResult
    from airflow_gpumarket.operators.session import RentalSession
    from airflow_gpumarket.outcome import WaitOutcome
else:  # what only a running task needs: not imported when a DAG file is parsed
    lifecycle, metrics = RunTimeModule("airflow_gpumarket.lifecycle"), RunTimeModule("airflow_gpumarket.metrics")
    plan = RunTimeModule("airflow_gpumarket.operators.plan")


class Try:
    """Where one try stands: the rental held, how its last wait ended, the wait to run next, the log lines shown.

    ``outcome`` None: not waited for since it was rented; ``watch``: the next wait, when already made (a preempted
    bid instance's); ``shown``: the job's log lines the wait before showed last. (A plain class: a dataclass costs
    its creation when a DAG file is parsed.)
    """

    __slots__ = ("rental", "outcome", "watch", "shown")

    def __init__(
        self,
        rental: lifecycle.Rental | None = None,
        outcome: WaitOutcome | None = None,
        watch: waiting.Watch | None = None,
        shown: Sequence[str] = (),
    ) -> None:
        self.rental, self.outcome, self.watch, self.shown = rental, outcome, watch, shown


class _ExtraLinks:
    """``operator_extra_links``, made on first access: a DAG file that only constructs operators never reads them."""

    def __get__(self, instance: Any, owner: type) -> tuple[Any, ...]:
        from airflow_gpumarket.ui.links import GpuRentalLink

        links = (GpuRentalLink(),)
        GpuMarketRentingBaseOperator.operator_extra_links = links
        return links


class GpuMarketRentingBaseOperator(GpuMarketBaseOperator):
    """Rent an instance: offer choice, failover, labels, waiting, and destroy on every failure path.

    :param offer_id: rent exactly this offer (no failover to others).
    :param offer_filters: or pick the cheapest matching offer (ordered by ``offer_order``, default price
        ascending) whose price is at most ``max_dph``. Each field must be one the service filters on
        (``api.OFFER_FILTER_FIELDS``): it ignores others, so a misspelt one would match every offer.
    :param extra_filter_fields: offer fields newer than this provider that ``offer_filters`` may name.
    :param offer_order: ``[field, direction]`` pairs for the search.
    :param offer_type: ``ondemand`` (default), ``on-demand`` or ``bid``.
    :param max_dph: highest acceptable price in dollars per hour.
    :param max_offer_attempts: offers tried at most; a taken offer, a host that fails and a boot that times out
        move on to the next offer, and an offer is never tried twice.
    :param offer_choice: ``"price"`` (default: the cheapest per hour first, in ``offer_order``) or
        ``"expected_cost"``: the offer whose whole job is expected to cost least (boot, runtime, disk, transfer and
        the risk of a failed attempt; ``airflow_gpumarket.offer_cost``). The task log shows the top offers and why.
    :param expected_runtime: how long the job is expected to run (``offer_choice="expected_cost"`` and
        ``deadline``); default: the median of this task's earlier successful runs, else ``max_runtime``'s.
    :param image_size_gb: the image's compressed size in GB, from which each offer's boot time is expected;
        default: what this task's earlier boots of the image imply, else 6.
    :param transfer_gb: the data the job moves over the network, in GB, priced at each offer's bandwidth prices by
        ``offer_choice="expected_cost"``: a number (downloaded) or ``{"in": GB, "out": GB}``; default none.
    :param preflight: shell commands the job wrapper runs before the command, after checking that the GPUs the offer
        promised are visible; a failed check destroys the instance, remembers its machine and fails over.
    :param avoid_failed_hosts: skip machines that failed a rental of this account recently (host memory, kept in
        the metadata database for 24 hours), and remember those that fail this task (default True).
    :param deadline: an interruptible job's deadline (templated): an aware ``datetime``; a ``timedelta`` from the
        start of the try (its ``start_date``, deferrals included); a template rendering to an ISO 8601 date and time
        with its timezone; or, as any templated field takes one, a callable of ``context`` and ``jinja_env``
        returning either, e.g. ``lambda context, jinja_env: context["data_interval_end"] + timedelta(hours=6)``,
        the same for every retry. Before each rental the task bids only while the time left can absorb one more
        preemption on top of finishing on demand (boot, restore, the work left); from then on it rents on demand,
        and the task log says why (a time already past: on demand at once). A running bid instance is not replaced.
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
    :param approval_above: a rental whose worst case (the budget's reservation) is above this many dollars is
        first approved by a person in the Airflow UI (human-in-the-loop, Airflow 3.1+); a refusal or no answer
        within ``approval_timeout`` (default 1 hour) fails the task having rented nothing.
    :param approval_timeout: how long the question waits for an answer.
    :param wait_for_offer: when the first search of a try finds nothing to rent, wait this long (from the try's
        start) for an offer to appear, in the triggerer (``deferrable=True``), then search again; default: no wait.
    :param on_no_offer: what follows a wait that found nothing: ``"fail"`` (default) or ``"rent_on_demand"``: rent
        on demand (never as a bid) at up to ``fallback_max_dph`` $/h.
    :param fallback_max_dph: the cap of that on-demand rental.
    :param max_cost: the most, in dollars, one rental of this task may cost (operators that watch a job to its end).
        Its worst case is reserved with this cap; a job whose estimated cost reaches it is destroyed within one
        poll interval, and the task fails naming the cost. DAG budgets: the ``gpumarket_budgets`` Variable.
    :param image: container image (or template_hash_id).
    :param template_hash_id: a template to create from (or image).
    :param disk: disk size in GB.
    :param runtype: how the instance is reached.
    :param target_state: running or stopped.
    :param price: a bid in $/h (an interruptible instance).
    :param env: environment variables and port mappings (templated, shown in the task's rendered fields: no
        secrets here).
    :param secrets: the job's secret environment variables, each read when the task runs from an Airflow Variable
        or Connection (so from any secrets backend): ``{"HF_TOKEN": "variable:hf_token", "WANDB_API_KEY":
        "connection:wandb"}`` (a connection's password, or ``"connection:<conn_id>:login"``, ``:host``,
        ``:schema``). Each value is masked in Airflow whatever its name, and sent only in the create request:
        never in XCom, rendered fields, the task log or the GPU rentals page. Not exported by
        ``export_env_to_ssh``.
    :param registry_conn_id: an Airflow Connection (login, password, host) that logs the service in to the registry
        of a private ``image``; instead of ``image_login``, whose value would show in the rendered fields.
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
    :param terms: what the operator does with its rental (``spec.Terms``), passed by each renting operator.
    """

    template_fields: Sequence[str] = (
        "offer_id",
        "offer_filters",
        "offer_order",
        "max_dph",
        "command",
        "preflight",
        "instance",
        "checkpoint_dir",
        "checkpoint_uri",
        "cloud_integration",
        "inputs",
        "outputs",
        "deadline",
    )
    template_fields_renderers = {
        "instance": "json",
        "offer_filters": "json",
        "command": "bash",
        "inputs": "json",
        "outputs": "json",
    }
    operator_extra_links: Any = _ExtraLinks()
    ui_color = "#c9e7ff"
    #: Read by ``destroy_rentals_on_failure``: what this operator rents carries its task instance's label key.
    rents_instances = True
    #: The current try's rentals and its arguments, rendered and checked: set by ``execute`` and ``execute_complete``.
    session: RentalSession | None = None
    spec: RentalSpec | None = None
    _started_at: float | None = None
    _fell_back = False  # the try rents on demand up to fallback_max_dph: its wait for an offer ended with none
    _approved_up_to: float | None = None  # the worst case a person approved (approval_above)

    def __init__(
        self,
        *,
        terms: Terms | None = None,
        offer_id: int | None = None,
        offer_filters: Mapping[str, Any] | None = None,
        extra_filter_fields: Sequence[str] = (),
        offer_order: list | None = None,
        offer_type: str = "ondemand",
        max_dph: float | None = None,
        max_offer_attempts: int = 3,
        offer_choice: str = "price",
        expected_runtime: timedelta | float | None = None,
        image_size_gb: float | None = None,
        transfer_gb: float | Mapping[str, float] | None = None,
        preflight: str | None = None,
        avoid_failed_hosts: bool = True,
        deadline: datetime | timedelta | None = None,
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
        approval_above: float | None = None,
        approval_timeout: timedelta | float = timedelta(hours=1),
        wait_for_offer: timedelta | float | None = None,
        on_no_offer: str = "fail",
        fallback_max_dph: float | None = None,
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
        secrets: Mapping[str, str] | None = None,
        registry_conn_id: str | None = None,
        gpumarket_conn_id: str = "gpumarket_default",
        **kwargs: Any,
    ) -> None:
        given = locals()
        named = {name: given[name] for name in api.CREATION_FIELD_NAMES if given[name] is not None}
        if "retry_policy" in kwargs and kwargs["retry_policy"] is None and not has_retry_policies():
            del kwargs["retry_policy"]  # gpumarket_retry_policy() before Airflow 3.3: the standard retries apply
        super().__init__(**kwargs)
        api.require_bool("durable", durable)
        api.require_bool("interruptible", interruptible)
        keep = keep_on_output_failure
        # Set at once, not through BaseOperator.__setattr__ one by one: none is BaseOperator's, none has a converter.
        self.__dict__.update(
            gpumarket_conn_id=gpumarket_conn_id,
            terms=Terms() if terms is None else terms,
            durable=durable,
            command=command,
            instance=creation_fields(instance, named, command=command),
            export_env_to_ssh=export_env_to_ssh,
            secrets=secrets,
            registry_conn_id=registry_conn_id,
            log_interval=duration_seconds("log_interval", log_interval, zero_ok=True),
            offer_id=offer_id,
            offer_filters=offer_filters,
            extra_filter_fields=extra_filter_fields,
            offer_order=offer_order,
            offer_type=offer_type,
            max_dph=max_dph,
            max_offer_attempts=max_offer_attempts,
            offer_choice=offer_choice,
            expected_runtime=expected_runtime,
            image_size_gb=image_size_gb,
            transfer_gb=transfer_gb,
            preflight=preflight,
            avoid_failed_hosts=avoid_failed_hosts,
            deadline=deadline,
            boot_timeout=duration_seconds("boot_timeout", boot_timeout),
            poll_interval=duration_seconds("poll_interval", poll_interval),
            deferrable=DEFAULT_DEFERRABLE if deferrable is None else deferrable,
            checkpoint_dir=checkpoint_dir,
            checkpoint_uri=checkpoint_uri,
            cloud_integration=cloud_integration,
            inputs=inputs,
            outputs=outputs,
            on_restore_failure=on_restore_failure,
            staging_timeout=duration_seconds("staging_timeout", staging_timeout),
            keep_on_output_failure=None if keep is None else duration_seconds("keep_on_output_failure", keep),
            max_cost=max_cost,
            interruptible=interruptible,
            bidding=bidding.BidPolicy.parse(
                max_bid=max_bid,
                max_preemptions=max_preemptions,
                on_preemption=on_preemption,
                max_outbid_wait=max_outbid_wait,
                fallback_on_demand=fallback_on_demand,
                bid_strategy=bid_strategy,
            ),
        )
        self.wait_for_offer = offer_wait.checked(
            wait_for_offer, on_no_offer, fallback_max_dph, deferrable=self.deferrable, offer_id=offer_id
        )
        self.on_no_offer, self.fallback_max_dph = on_no_offer, fallback_max_dph
        self.approval_above, self.approval_timeout = approval.checked(approval_above, approval_timeout)
        callbacks: Any = getattr(self, "on_failure_callback", None)
        callbacks = [] if callbacks is None else [callbacks] if callable(callbacks) else callbacks
        if destroy_rentals_on_failure not in callbacks:  # a mapped task's partial() may carry it already
            self.on_failure_callback = [*callbacks, destroy_rentals_on_failure]
        RentalSpec.check(self)

    # --- the task --------------------------------------------------------------------------------------
    def execute(self, context: Any) -> Any:
        self._started_at = time.time()
        self._session(context)
        return self._run(context, Try)

    def execute_after_wait(self, context: Any, event: dict[str, Any]) -> Any:
        """Resume after a wait for an offer (``wait_for_offer``): search again, from the start of a rental."""
        self._session(context)
        return self._run(context, Try)

    def execute_after_approval(self, context: Any, event: dict[str, Any]) -> Any:
        """Resume after a person answered (``approval_above``): rent up to the amount approved, or fail."""
        approval.answered(self, event)
        self._session(context)
        return self._run(context, Try)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        """Resume after the trigger fired; everything needed comes in the event."""
        session = self._session(context)
        return self._run(context, lambda: Try(*session.resume(event)))

    def on_kill(self) -> None:
        """SIGTERM or execution_timeout: destroy what this try holds now."""
        if self.session is not None:
            self.session.kill()

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Datasets and the rental of this try, for the OpenLineage provider (``airflow_gpumarket.lineage``)."""
        from airflow_gpumarket.lineage import facets_on_complete

        return facets_on_complete(self, *(self.session.lineage_facts() if self.session else (None, None)))

    def _session(self, context: Any) -> RentalSession:
        """This try's session, over its arguments as rendered (checked again first)."""
        from airflow_gpumarket.operators.session import RentalSession

        spec = self.spec = RentalSpec.of(self)
        self.session = RentalSession(self.hook, self.log, spec, context, task=self)
        return self.session

    def _run(self, context: Any, start: Callable[[], Try]) -> Any:
        """Start (``start``: anew, or resumed), then the steps; whatever fails ends what the try holds."""
        assert self.session is not None
        try:
            return self._steps(context, start())
        except pauses():  # deferred, or awaiting a person's answer: nothing failed
            raise
        except BaseException as exc:
            self.session.failed(exc)
            raise

    def _steps(self, context: Any, now: Try) -> Any:
        """Rent, wait and judge, one step of ``plan.next_step`` at a time, until the task's outcome."""
        from airflow_gpumarket.operators.failures import GpuMarketNoWorkingOffer
        from airflow_gpumarket.operators.result import RentalResult
        from airflow_gpumarket.operators.session import Outcome

        spec, session = self.spec, self.session
        assert spec is not None and session is not None
        limit = self._execution_deadline(context)
        while True:
            if now.rental is not None and now.outcome is not None:
                session.check_duplicates(now.rental)  # a create delayed past the first sweep may have landed since
            match plan.next_step(spec, now.rental, now.outcome, limit=limit):
                case plan.Rent():
                    try:
                        now.rental = session.rent()
                    except approval.ApprovalNeeded as asked:
                        approval.ask(self, context, asked.pick)  # waits for a person's answer, holding nothing
                    except GpuMarketNoWorkingOffer as exc:
                        offer_wait.after_no_offer(self, context, exc)  # defers, fails, or turns to on demand
                        spec, session = self.spec, self.session
                        assert spec is not None and session is not None
                        continue
                case plan.Wait(stages_in):
                    assert now.rental is not None
                    now.watch = now.watch or spec.watch(now.rental, stages_in=stages_in, now=time.time())
                    if self.deferrable:
                        self._defer(context, now.rental, now.watch, now.shown, limit)
                    now.outcome, now.shown = session.wait(now.rental, now.watch, now.shown), ()
                case plan.TimedOut(ended):
                    assert now.rental is not None
                    session.end(now.rental, Outcome.DESTROYED, metric=metrics.TIMED_OUT, why="execution_timeout")
                    raise AirflowTaskTimeout(ended.with_detail(self._timed_out(now.rental.instance_id)))
                case plan.FailOver(ended, preflight):
                    assert now.rental is not None
                    if (seen := session.fail_over(now.rental, ended, preflight)) is not None:
                        now.outcome = seen  # the job ran to its end before the task saw it running
                        continue
                    now = Try()
                case plan.StageIn(ended, wait):
                    assert now.rental is not None
                    shown = session.stage_in(now.rental)
                    if not wait:
                        return self._complete(RentalResult(now.rental, ended, context))
                    now = Try(rental=now.rental, shown=shown)
                case plan.AfterPreemption(ended):
                    assert now.rental is not None
                    # None: rent another; else wait for the bid, showing what follows the lines this wait showed
                    watch = session.after_preemption(now.rental, ended)
                    now = Try() if watch is None else Try(rental=now.rental, watch=watch, shown=ended.log_tail)
                case plan.Finish(ended):
                    rental = now.rental
                    assert rental is not None
                    if ended is not None and (unready := self._unready(rental, ended)) is not None:
                        session.fail_over(rental, ended, unready)
                        now = Try()
                        continue
                    return self._complete(RentalResult(rental, ended, context))

    def _complete(self, result: RentalResult) -> Any:
        """What the task returns, or the failure it raises, once the wait ended (``result.outcome`` None: no wait)."""
        raise NotImplementedError

    def _unready(self, rental: lifecycle.Rental, ended: WaitOutcome) -> job_logs.PreflightFailure | None:
        """Why a rental that reached what it waited for is no use (the next offer is then tried); None: it is."""
        return None

    # --- deferring and timeouts ------------------------------------------------------------------------
    def _defer(
        self, context: Any, rental: lifecycle.Rental, watch: waiting.Watch, shown: Sequence[str], limit: float | None
    ) -> None:
        """Hand the wait to the triggerer; ``limit``: the epoch second at which ``execution_timeout`` ends."""
        assert self.spec is not None
        deadline, timeout = watch.deadline, None
        if limit is not None:
            left = limit - time.time()
            if left <= 0:
                raise AirflowTaskTimeout(self._timed_out(rental.instance_id))
            deadline, timeout = limit if deadline is None else min(deadline, limit), timedelta(seconds=left)
        if watch.wait_for == lifecycle.WAIT_JOB and self.spec.job_log_interval > 0:
            _start_the_record_of_lines_shown(context, rental.instance_id, shown)
        self.defer(
            trigger=self._wait_trigger(
                instance_id=rental.instance_id,
                gpumarket_conn_id=self.gpumarket_conn_id,
                watch=replace(watch, deadline=deadline, shown_lines=list(shown)).to_dict(),
                rental=rental.to_resume(),
                poll_interval=self.poll_interval,
                log_interval=self.spec.job_log_interval,
                destroy_on_kill=True,
            ),
            method_name="execute_complete",
            timeout=timeout,
        )

    def _wait_trigger(self, **kwargs: Any) -> Any:
        """The trigger a deferred wait runs (``kwargs``: ``GpuMarketInstanceStatusTrigger``'s)."""
        from airflow_gpumarket.triggers.instances import GpuMarketInstanceStatusTrigger

        return GpuMarketInstanceStatusTrigger(**kwargs)

    def _execution_deadline(self, context: Any) -> float | None:
        """The epoch second at which ``execution_timeout`` ends, counted from the start of this try, if it is set."""
        if not self.execution_timeout:
            return None
        started = self._started_at if self._started_at is not None else time.time()
        return try_started(context, started) + self.execution_timeout.total_seconds()

    def _timed_out(self, instance_id: int) -> str:
        """The message of a try that ``execution_timeout`` ended while it waited for ``instance_id``."""
        return (
            f"execution_timeout ({self.execution_timeout}) elapsed while waiting for instance {instance_id}; "
            "the instance is destroyed"
        )


def _start_the_record_of_lines_shown(context: Any, instance_id: int, shown: Sequence[str]) -> None:
    """Write the lines this try showed so far where the trigger's copies record theirs (best effort).

    The trigger reads that record before its first log read; written here, the read finds it (an XCom that does not
    exist yet is logged as an error by Airflow 3's triggerer).
    """
    from airflow_gpumarket.triggers.instances import shown_key

    ti: Any = context.get("ti") if isinstance(context, Mapping) else None
    try:
        ti.xcom_push(key=shown_key(instance_id), value=list(shown))
    except Exception:  # noqa: BLE001 - a test's bare context, an XCom backend error: the trigger reads without it
        logging.getLogger(__name__).debug("Could not start the record of lines shown of %s", instance_id, exc_info=True)
