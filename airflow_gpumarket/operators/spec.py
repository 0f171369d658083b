"""What a renting task asked for, checked: the arguments' rules, the lease and limits, the create body, the job script.

A ``RentalSpec`` is made from the operator's arguments when the DAG is parsed (``RentalSpec.check``: templated ones
wait) and again, rendered, when the task runs (``RentalSpec.of``: checked, with the values derived from them, such as
the lease, as plain attributes). The renting operators differ only by their ``Terms``: values each passes (waits for a
job or a status, hands its instance over, lease, max runtime, keepalive), not flags it overrides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import api, job_secrets
from airflow_gpumarket.creation import TYPED_FIELDS, creation_body
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.utils import RunTimeModule, is_templated, resolved_at_run_time

if TYPE_CHECKING:
    from airflow_gpumarket import bidding, budgets, lifecycle, staging, waiting
    from airflow_gpumarket.job_script import WrapperStaging
else:  # what only a running task needs: not imported when a DAG file is parsed
    budgets, lifecycle = RunTimeModule("airflow_gpumarket.budgets"), RunTimeModule("airflow_gpumarket.lifecycle")
    staging, waiting = RunTimeModule("airflow_gpumarket.staging"), RunTimeModule("airflow_gpumarket.waiting")

#: A job's whole lease runs this long past its boot and run time limits.
JOB_LEASE_MARGIN_SECONDS = 15 * 60
#: A kept-alive lease spans at least this many poll intervals, so a renewal always comes before it runs out.
KEEPALIVE_POLLS = 3
#: The durable-data arguments, as the operator and ``staging.make_plan`` name them.
DATA_ARGUMENTS = ("checkpoint_dir", "checkpoint_uri", "cloud_integration", "inputs", "outputs")


class _Frozen:
    """A value whose fields its constructor sets once (a plain class: cheaper to define than a NamedTuple at parse)."""

    __slots__: tuple[str, ...] = ()

    def __init__(self, **values: Any) -> None:
        for name in self.__slots__:
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: make a new one with _replace()")

    def _replace(self, **changes: Any) -> Any:
        """A copy with ``changes``."""
        return type(self)(**{name: changes.get(name, getattr(self, name)) for name in self.__slots__})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.__slots__)})"


class Terms(_Frozen):
    """What an operator does with its rental: the values by which the renting operators differ.

    ``job``: waits for its job to end (``lifecycle.WAIT_JOB``), else for the instance to run; ``waits``: waits at all;
    ``hands_over``: the instance outlives the task; ``lease``: a created instance's lease; ``max_runtime``: a job's
    time limit; ``keepalive``: how far ahead its lease is kept; ``reads_result``: the job wrapper stops the instance
    after exit 0 whatever ``log_interval`` says, so that the result can be read from its log; ``serves``: the command
    is a server (``airflow_gpumarket.services``) on the service port, given its credential and ended at the lease.
    """

    __slots__ = ("job", "waits", "hands_over", "lease", "max_runtime", "keepalive", "reads_result", "serves")
    job: bool
    waits: bool
    hands_over: bool
    lease: float | None
    max_runtime: float | None
    keepalive: float | None
    reads_result: bool
    serves: bool

    def __init__(
        self,
        *,
        job: bool = False,
        waits: bool = True,
        hands_over: bool = False,
        lease: float | None = None,
        max_runtime: float | None = None,
        keepalive: float | None = None,
        reads_result: bool = False,
        serves: bool = False,
    ) -> None:
        super().__init__(
            job=job,
            waits=waits,
            hands_over=hands_over,
            lease=lease,
            max_runtime=max_runtime,
            keepalive=keepalive,
            reads_result=reads_result,
            serves=serves,
        )


class RentalSpec(_Frozen):
    """A renting task's arguments as values, and the rules they follow (see ``GpuMarketRentingBaseOperator``)."""

    ARGUMENTS = (
        "terms",
        "instance",
        "command",
        "export_env_to_ssh",
        "secrets",
        "registry_conn_id",
        "offer_id",
        "offer_filters",
        "extra_filter_fields",
        "offer_order",
        "offer_type",
        "max_dph",
        "max_offer_attempts",
        "offer_choice",
        "expected_runtime",
        "image_size_gb",
        "transfer_gb",
        "preflight",
        "avoid_failed_hosts",
        "deadline",
        "boot_timeout",
        "poll_interval",
        "log_interval",
        "interruptible",
        "bidding",
        "max_cost",
        *DATA_ARGUMENTS,
        "on_restore_failure",
        "staging_timeout",
        "keep_on_output_failure",
    )
    #: Values derived from the arguments once they are checked (``of``): None in a parse-time ``check``.
    DERIVED = ("pinned_offer", "lease_seconds", "first_lease", "job_log_interval", "disk_gb", "data_plan")
    __slots__ = ARGUMENTS + DERIVED
    terms: Terms
    instance: Mapping[str, Any]
    command: str | None
    export_env_to_ssh: bool
    secrets: Any
    registry_conn_id: str | None
    offer_id: Any
    offer_filters: Any
    extra_filter_fields: Any
    offer_order: Any
    offer_type: str
    max_dph: Any
    max_offer_attempts: int
    offer_choice: str
    expected_runtime: Any
    image_size_gb: Any
    transfer_gb: Any
    preflight: Any
    avoid_failed_hosts: bool
    deadline: Any
    boot_timeout: float
    poll_interval: float
    log_interval: float
    interruptible: bool
    bidding: bidding.BidPolicy
    max_cost: float | None
    checkpoint_dir: Any
    checkpoint_uri: Any
    cloud_integration: Any
    inputs: Any
    outputs: Any
    on_restore_failure: str
    staging_timeout: float
    keep_on_output_failure: float | None
    pinned_offer: int | None  #: ``offer_id`` as an offer id; None when offers are searched for
    lease_seconds: float  #: the whole lease: how long after creation the reaper may destroy the instance at the latest
    first_lease: float  #: the lease written at creation: the whole lease, or ``keepalive`` when it is kept alive
    job_log_interval: float  #: seconds between reads of the job's output while this task waits (0: none)
    disk_gb: float | None  #: the disk asked for, in GB (the service's default when none is; None at parse time)
    data_plan: staging.DataPlan | None  #: the durable data asked for; None when none was

    @classmethod
    def of(cls, operator: Any, **changes: Any) -> RentalSpec:
        """The spec of ``operator``'s arguments as they are now (rendered, once the task runs), ``changes`` applied,
        checked."""
        return cls._made(lambda name: changes[name] if name in changes else getattr(operator, name), parse_time=False)

    @classmethod
    def check(cls, operator: Any) -> RentalSpec:
        """The spec of ``operator``'s arguments as its DAG is parsed: values holding Jinja wait for the task to run."""
        return cls._made(partial(getattr, operator), parse_time=True)

    @classmethod
    def _made(cls, argument: Callable[[str], Any], *, parse_time: bool) -> RentalSpec:
        """The spec of each argument's value (``argument(name)``), checked, and (not at parse time) derived."""
        spec = object.__new__(cls)
        for name in cls.ARGUMENTS:
            object.__setattr__(spec, name, argument(name))
        for name in cls.DERIVED:
            object.__setattr__(spec, name, None)
        plan = spec.validate(parse_time=parse_time)
        if not parse_time:
            lease = spec._lease()
            derived = {
                "pinned_offer": spec._pinned_offer(),
                "lease_seconds": lease,
                "first_lease": lease if spec.terms.keepalive is None else min(spec.terms.keepalive, lease),
                "job_log_interval": spec.log_interval if spec.terms.job else 0.0,
                "disk_gb": disk if api.is_positive_number(disk := spec.instance.get("disk")) else api.DEFAULT_DISK_GB,
                "data_plan": plan,
            }
            for name, value in derived.items():
                object.__setattr__(spec, name, value)
        return spec

    def _replace(self, **changes: Any) -> Any:
        """A copy with ``changes`` to its arguments, checked and derived again."""
        return self._made(lambda name: changes.get(name, getattr(self, name)), parse_time=self.lease_seconds is None)

    # --- the arguments' rules ----------------------------------------------------------------------------
    def validate(self, *, parse_time: bool = False) -> staging.DataPlan | None:
        """Every rule that can be checked, and the durable data's plan; at parse time, values holding Jinja wait for the
        task to run."""
        if self.max_cost is not None:
            api.require_positive_number("max_cost", self.max_cost)
            if not self.terms.job:
                raise GpuMarketValidationError(
                    "max_cost",
                    "needs a task that watches its rental to the end (GpuMarketRunJobOperator, @task.gpumarket); "
                    "a created instance's cost is bounded by its lease",
                )
        api.require_positive_int("max_offer_attempts", self.max_offer_attempts)
        if self.offer_id is None and self.offer_filters is None:
            raise GpuMarketValidationError(
                "offer_id", "give offer_id (one offer) or offer_filters (pick the cheapest match); neither was given"
            )
        self._check_choice(parse_time)
        self._check_fields(parse_time)
        self._check_bidding()
        plan = self._data_plan(parse_time=parse_time)
        keepalive = self.terms.keepalive
        if keepalive is not None and keepalive < KEEPALIVE_POLLS * self.poll_interval:
            raise GpuMarketValidationError(
                "keepalive",
                f"is {keepalive:g} s, shorter than {KEEPALIVE_POLLS} poll intervals; the lease could run out "
                "between two reads. Make it longer, or None for one lease covering the whole job",
            )
        return plan

    def _check_fields(self, parse_time: bool) -> None:
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
            self.creation_body(label=None, base_url=None)
        job_secrets.check(self.secrets, env=self.instance.get("env"))
        job_secrets.check_registry(self.registry_conn_id, self.instance.get("image_login"))
        if parse_time and is_templated(self.offer_id):
            return
        if self.offer_id is not None:
            api.require_positive_int("offer_id", self._pinned_offer())
        if self.offer_filters is not None and not (parse_time and is_templated(self.offer_filters)):
            api.build_search_body(
                self.offer_filters,
                offer_type=self.offer_type,
                order=self.offer_order,
                extra_fields=api.require_field_names("extra_filter_fields", self.extra_filter_fields),
                argument="offer_filters",
            )
        if self.max_dph is not None and not (parse_time and is_templated(self.max_dph)):
            api.require_positive_number("max_dph", self.max_dph)

    def _check_bidding(self) -> None:
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
        if self.terms.job and self.log_interval <= 0:
            raise GpuMarketValidationError(
                "log_interval",
                "is 0, but an interruptible job's log tells a preemption from its own stop; give a log_interval > 0",
            )

    def _check_choice(self, parse_time: bool) -> None:
        """The offer choice's arguments (``offer_cost`` is imported only when one of them is given)."""
        api.require_bool("avoid_failed_hosts", self.avoid_failed_hosts)
        given = (self.expected_runtime, self.image_size_gb, self.transfer_gb, self.preflight, self.deadline)
        if self.offer_choice == "price" and all(value is None for value in given):
            return
        from airflow_gpumarket import offer_cost

        offer_cost.check_offer_choice(self.offer_choice)
        if self.offer_choice == "expected_cost" and self.offer_id is not None:
            raise GpuMarketValidationError(
                "offer_choice",
                "'expected_cost' chooses among the offers offer_filters finds, but offer_id pins one: drop one of them",
            )
        offer_cost.check_expected_runtime(self.expected_runtime)
        offer_cost.check_image_size_gb(self.image_size_gb)
        if offer_cost.check_transfer_gb(self.transfer_gb) is not None and self.offer_choice != "expected_cost":
            raise GpuMarketValidationError(
                "transfer_gb",
                "prices data moved for offer_choice='expected_cost' only: set offer_choice, or drop transfer_gb",
            )
        if self.preflight is not None:
            if self.command is None:
                raise GpuMarketValidationError(
                    "preflight",
                    "runs in the provider's job wrapper, which runs only a command: give command, not onstart",
                )
            if not (parse_time and is_templated(self.preflight)):
                from airflow_gpumarket.job_script import validate_preflight

                validate_preflight(0, self.preflight)
        if self.deadline is not None:
            if not self.interruptible:
                raise GpuMarketValidationError(
                    "deadline", "decides when an interruptible rental stops bidding: set interruptible=True, or drop it"
                )
            deadline = offer_cost.check_deadline(self.deadline, parse_time=parse_time)
            if not parse_time:  # in its normal form, for the preemption rules
                object.__setattr__(self, "deadline", deadline)

    def _data_plan(self, *, parse_time: bool = False) -> staging.DataPlan | None:
        """The durable data the task asked for, checked; None when none was, or at parse time while it is templated."""
        values = {name: getattr(self, name) for name in DATA_ARGUMENTS}
        if all(value is None for value in values.values()) and self.on_restore_failure == "restart":
            return None  # nothing asked for: the rules' module is not even imported
        plan = None
        if not (parse_time and any(is_templated(v) or resolved_at_run_time(v) for v in values.values())):
            plan = staging.make_plan(
                **values, on_restore_failure=self.on_restore_failure, staging_timeout=self.staging_timeout
            )
        asked = next((name for name in ("checkpoint_dir", "inputs", "outputs") if getattr(self, name)), None)
        if asked is None:
            return plan
        if self.command is None:
            raise GpuMarketValidationError(
                asked, "is staged by the provider's job wrapper, which runs only a command: give command, not onstart"
            )
        if self.outputs and not self.terms.job:
            raise GpuMarketValidationError(
                "outputs",
                "are copied after the job's exit 0, which only GpuMarketRunJobOperator and @task.gpumarket wait for",
            )
        if not self.terms.waits:
            raise GpuMarketValidationError(asked, "is copied in once the instance runs: keep wait_for_running=True")
        if self.log_interval <= 0:
            raise GpuMarketValidationError(
                "log_interval", f"is 0, but {asked} needs the job's log to see it start; give a log_interval > 0"
            )
        return plan

    def _pinned_offer(self) -> int | None:
        if self.offer_id is None:
            return None
        try:
            return int(self.offer_id)
        except (TypeError, ValueError):
            raise GpuMarketValidationError(
                "offer_id", f"must be an offer id (integer), got {self.offer_id!r}"
            ) from None

    # --- the create body and the job script --------------------------------------------------------------
    def creation_body(
        self,
        *,
        label: str | None,
        base_url: str | None,
        bid: float | None = None,
        preemptions: int = 0,
        staged: WrapperStaging | None = None,
        gpu_count: int = 1,
        secret_env: Mapping[str, str] | None = None,
        image_login: str | None = None,
        service_key: str | None = None,
    ) -> dict[str, Any]:
        """What a create sends; ``gpu_count``: the GPUs the offer promises, which the job wrapper checks first.

        ``secret_env`` (the secrets' values) joins ``env``, and ``image_login`` (from ``registry_conn_id``) is sent as
        given: in the request only, never in the spec. A service (``terms.serves``) asks for its port, and gets the
        credential derived from ``service_key`` (the connection's API key) and ``label``.

        Without ``base_url`` (a check before the connection is read), a command's script is written only when it might
        not fit.
        """
        onstart = None
        if self.command is not None and not (base_url is None and staged is None and self._script_certainly_fits()):
            onstart = self.job_script(base_url or "https://api.example.invalid", staged, gpu_count=gpu_count)
        fields = dict(self.instance)
        if self.terms.serves:
            from airflow_gpumarket import services

            secret_env = dict(secret_env or {})
            if service_key is not None and label is not None:
                from airflow_gpumarket._compat import mask_secret

                secret_env[services.TOKEN_VARIABLE] = credential = services.token(service_key, label)
                mask_secret(credential)
            if (env := fields.get("env")) is None or isinstance(env, Mapping):  # a template string at parse time
                fields["env"] = {services.PORT_MAPPING: "1", **(env or {})}
        if secret_env:
            fields["env"] = {**(fields.get("env") or {}), **secret_env}
        if image_login is not None:
            fields["image_login"] = image_login
        return creation_body(
            fields,
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
            and not is_templated(self.preflight)
            and certainly_fits(
                self.command, stop_on_success=self.stops_on_success(), gpu_count=1, preflight=self.preflight
            )
        )

    def job_script(self, base_url: str, staged: WrapperStaging | None = None, *, gpu_count: int = 1) -> str | None:
        """The job wrapper's onstart script for ``command``; None while it, ``env`` or ``preflight`` is templated."""
        from airflow_gpumarket.job_script import build_job_onstart

        env = self.instance.get("env")
        if is_templated(self.command) or is_templated(env) or is_templated(self.preflight):
            return None
        names = sorted(api.env_variables(env or {})) if self.export_env_to_ssh else []
        command = self.command
        if self.terms.serves:
            from airflow_gpumarket import services

            command = services.server_command(command, self.lease_seconds)  # type: ignore[arg-type]
        return build_job_onstart(
            command,  # type: ignore[arg-type]
            base_url=base_url,
            export_env=names,
            stop_on_success=self.stops_on_success(),
            staged=staged,
            gpu_count=gpu_count,
            preflight=self.preflight,
        )

    def stops_on_success(self) -> bool:
        """Whether the job wrapper stops the instance after exit 0, so its log's end is read before the destroy.

        With ``log_interval=0`` nothing reads the log, and the wrapper destroys the instance itself.
        """
        return self.terms.reads_result or (self.terms.job and self.log_interval > 0)

    # --- lease, limits and the wait ------------------------------------------------------------------------
    def _lease(self) -> float:
        if self.terms.max_runtime is not None:
            return self.boot_timeout + self.terms.max_runtime + JOB_LEASE_MARGIN_SECONDS
        assert self.terms.lease is not None  # set by every operator that rents without a job's time limit
        return self.terms.lease

    def runtime_deadline(self, rental: lifecycle.Rental) -> float | None:
        """The epoch second at which the job's own time limit ends, counted from creation, if it has one."""
        if self.terms.max_runtime is None:
            return None
        return rental.created_at + self.boot_timeout + self.terms.max_runtime

    def source_lease(self, plan: staging.DataPlan) -> float:
        """A kept checkpoint source's lease: past the next rental's offers and boots, its staging and its save."""
        return self.boot_timeout * self.max_offer_attempts + 2 * plan.staging_timeout + JOB_LEASE_MARGIN_SECONDS

    def watch(self, rental: lifecycle.Rental, *, stages_in: bool, now: float) -> waiting.Watch:
        """The wait for ``rental``: for its job, or (its data still to be staged, or no job) for it to run."""
        price = self.bidding.reserved_price(rental.dph_total, rental.bid)
        rates = None if self.max_cost is None or price is None else [rental.billed_from, price, rental.disk_hourly]
        return waiting.Watch(
            wait_for=lifecycle.WAIT_JOB if self.terms.job and not stages_in else lifecycle.WAIT_STATUS,
            boot_deadline=rental.created_at + self.boot_timeout,
            deadline=self.runtime_deadline(rental),
            max_runtime=self.terms.max_runtime,
            label=rental.label,
            keepalive=self.terms.keepalive,
            lease_cap=rental.lease_cap,
            max_cost=self.max_cost,
            cost_rates=rates,
            compute_from=rental.running_at,
            running_since=now if rental.staged else None,  # it ran: a stop is its job's end, not a boot's
            hold_bid_up_to=self.bidding.hold_cap(rental.bid, rental.dph_total),
        )
