"""``GpuMarketRunJobOperator``: rent an instance, run a job on it through onstart, wait for it, destroy it."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.operators.renting import GpuMarketRentingBaseOperator
from airflow_gpumarket.operators.spec import Terms
from airflow_gpumarket.utils import RunTimeModule, duration_seconds

if TYPE_CHECKING:
    from airflow_gpumarket import assets, lifecycle, metrics, outcome
    from airflow_gpumarket.operators import cost, failures
    from airflow_gpumarket.operators.result import RentalResult
    from airflow_gpumarket.operators.session import RentalSession
else:  # what only a running task needs: not imported when a DAG file is parsed
    lifecycle, cost = RunTimeModule("airflow_gpumarket.lifecycle"), RunTimeModule("airflow_gpumarket.operators.cost")
    failures = RunTimeModule("airflow_gpumarket.operators.failures")
    assets, metrics = RunTimeModule("airflow_gpumarket.assets"), RunTimeModule("airflow_gpumarket.metrics")
    outcome = RunTimeModule("airflow_gpumarket.outcome")


class GpuMarketRunJobOperator(GpuMarketRentingBaseOperator):
    """The whole lifecycle in one task: rent, run ``command`` through onstart, wait for it, destroy.

    The command runs in the provider's job wrapper (``airflow_gpumarket.job_script``), which prints its exit status
    and stops the instance when it exits. The task reads the end of the job's log, destroys the instance, and
    succeeds when the status read is 0. With ``log_interval=0`` nothing is read: the wrapper destroys the instance
    after exit 0 (gone = success) and stops it otherwise. The instance is destroyed in every case.

    :param command: shell commands to run on the instance (templated; required).
    :param max_runtime: the job's own time limit, counted from when the instance is first seen running
        (default 6 hours); never later than boot_timeout + max_runtime after creation.
    :param keepalive: while the task watches the job, the lease in the instance's label is kept this far ahead
        and renewed every third of it (default 15 minutes). When nothing has watched for that long, the reaper may
        destroy the instance. ``None``: one lease for the whole job, never renewed.

    Other parameters: see ``GpuMarketRentingBaseOperator``; runtype defaults to ``ssh_proxy``.
    """

    def __init__(
        self,
        *,
        command: str,
        max_runtime: timedelta | float = timedelta(hours=6),
        keepalive: timedelta | float | None = timedelta(minutes=15),
        **kwargs: Any,
    ) -> None:
        if kwargs.get("onstart") is not None:
            raise GpuMarketValidationError("onstart", "is built from command by GpuMarketRunJobOperator; pass command")
        if command is None:
            raise GpuMarketValidationError("command", "is required: the shell commands the job runs")
        max_runtime = duration_seconds("max_runtime", max_runtime)
        keepalive = None if keepalive is None else duration_seconds("keepalive", keepalive)
        given, terms = kwargs.pop("terms", None), Terms(job=True, max_runtime=max_runtime, keepalive=keepalive)
        terms = terms if given is None else given._replace(job=True, max_runtime=max_runtime, keepalive=keepalive)
        super().__init__(command=command, terms=terms, **kwargs)
        self.__dict__.update(max_runtime=max_runtime, keepalive=keepalive)  # as the renting base sets its own
        if isinstance(command, str) and ("{#" in command or "{%" in command or "{{" in command):
            self._check_command_template(command)

    def _check_command_template(self, command: str) -> None:
        """Refuse at parse time a command Jinja cannot read (``${#VAR}`` opens a comment), as it renders then."""
        from jinja2 import TemplateSyntaxError

        try:
            self.get_template_env().parse(command)
        except TemplateSyntaxError as exc:
            raise GpuMarketValidationError(
                "command",
                f"is a Jinja template, and its line {exc.lineno} does not parse ({exc.message}). Shell text such as "
                "${#VAR} opens a Jinja comment: put it inside {% raw %}...{% endraw %}, or in a script the image holds",
            ) from None

    def _complete(self, result: RentalResult) -> Any:
        from airflow_gpumarket.operators.result import summary
        from airflow_gpumarket.operators.session import Outcome

        session, rental, ended = self._held(), result.rental, result.outcome
        assert ended is not None  # a job is always waited for
        succeeded = ended.kind is outcome.EventKind.JOB_SUCCEEDED
        not_started = self._staging_gave_up(result)
        if succeeded and ended.destroyed_itself:
            session.end(rental, Outcome.GONE, metric=metrics.outcome(ended), why="its job destroyed it")
            if self.spec is not None and self.spec.stops_on_success():  # so somebody else destroyed it
                raise failures.GpuMarketOutcomeUnknown(
                    f"instance {rental.instance_id} was destroyed before the end of its job could be read (by hand, "
                    "or by the reaper after its lease ran out): the job's outcome and its last output are unknown"
                )
        else:
            how = Outcome.SUCCEEDED if succeeded else Outcome.NOT_STARTED if not_started else Outcome.FAILED
            session.end(rental, how, metric=metrics.outcome(ended))
        done = summary(rental, result.status, self.hook.service_now)
        done["job_status"] = "succeeded" if succeeded else "failed"
        self.log.info(
            "Job on instance %s %s after %s; cost %s%s (%s)",
            rental.instance_id,
            done["job_status"],
            lifecycle.format_duration(done["elapsed_seconds"]),
            cost.text(done["cost"], done["cost_kind"]),
            cost.breakdown(done["rentals"]),
            cost.rate(done["rentals"], rental.hourly),
        )
        if not succeeded:
            self._fail(result, done, not_started)
        assets.annotate_outlet_events(result.context, done)
        return done

    def _fail(self, result: RentalResult, done: dict[str, Any], not_started: bool) -> None:
        """Raise the failure a job that did not succeed ends in, each named by its cause (``plan.failure``)."""
        from airflow_gpumarket.operators.plan import Failure, failure, may_be_credit

        rental, ended = result.rental, result.outcome
        assert ended is not None  # a job is always waited for
        credit = self._held().credit_ran_out() if may_be_credit(ended) else None
        why = failure(ended, not_started=not_started, credit_ran_out=credit is not None)
        sentence = ended.describe(rental.instance_id)
        if why is Failure.MAX_COST:
            mine = done["rentals"][-1]  # max_cost bounds one rental
            raise failures.GpuMarketBudgetExceeded(
                f"The job on instance {rental.instance_id} reached max_cost=${self.max_cost:g}: "
                f"it cost {cost.text(mine['cost'], mine['cost_kind'])} (compute at ${rental.hourly_price:g}/h while "
                f"it ran, disk at ${rental.disk_hourly:g}/h from its creation). Its log was read and the instance "
                "destroyed; raise max_cost, or make the job shorter."
            )
        if why is Failure.CREDIT:
            assert credit is not None  # the cause is the credit only when it was read
            left = f"{'-' if credit <= -0.005 else ''}${abs(credit):.2f}"
            raise failures.GpuMarketBudgetExceeded(
                f"The account's credit ran out ({left} left), and the service stopped every instance of the account, "
                f"instance {rental.instance_id} of this job too. It is destroyed; add credit before running the job "
                f"again. What the task saw: {sentence}."
            )
        if why is Failure.HOST_LOST:
            self._held().remember_lost(rental, ended)
            raise failures.GpuMarketHostFailed(
                f"{sentence[0].upper()}{sentence[1:]}. The host failed, not the job: a retry rents again, elsewhere "
                "while host memory keeps this machine."
            )
        if why is Failure.NOT_STARTED:
            raise failures.GpuMarketStagingFailed(
                f"The job on instance {rental.instance_id} did not start: its staged data did not arrive (see "
                "the wrapper's lines above; on_restore_failure, staging_timeout). The instance is destroyed."
            )
        if why is Failure.JOB_FAILED:
            raise failures.GpuMarketJobFailed(sentence, exit_status=ended.exit_status)
        raise failures.GpuMarketOutcomeUnknown(sentence)

    def _staging_gave_up(self, result: RentalResult) -> bool:
        """Whether the job wrapper ended without starting the job: its staged data did not arrive."""
        from airflow_gpumarket.job_script import NOT_STARTED

        plan = None if self.spec is None else self.spec.data_plan
        if plan is None or not plan.active or result.outcome is None or result.kind is not outcome.EventKind.JOB_FAILED:
            return False
        return any(NOT_STARTED in line for line in result.outcome.log_tail)

    def _held(self) -> RentalSession:
        assert self.session is not None  # made by execute and execute_complete
        return self.session
