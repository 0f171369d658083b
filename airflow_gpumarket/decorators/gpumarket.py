"""``@task.gpumarket``: run a Python function on a rented GPU instance; its JSON return value goes to XCom.

Everything ``GpuMarketRunJobOperator`` guarantees holds underneath (offer choice and failover, labels, the destroy
on every failure path, deferrable waits, ``execution_timeout``, lost workers). What it adds: the function's
source and its arguments travel inside the job's command (see ``airflow_gpumarket.python_job``), the job wrapper
stops (not destroys) the instance after exit 0 so that the log carrying the return value can be read, and the
operator destroys the instance right after reading it.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import python_job
from airflow_gpumarket._compat import DecoratedOperator, task_decorator_factory
from airflow_gpumarket.exceptions import GpuMarketError, GpuMarketValidationError
from airflow_gpumarket.lifecycle import task_key
from airflow_gpumarket.operators.guard import destroy_rentals_on_failure
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator
from airflow_gpumarket.operators.spec import Terms
from airflow_gpumarket.utils import RunTimeModule, is_templated, resolved_at_run_time

if TYPE_CHECKING:
    from airflow_gpumarket import assets, job_logs, lifecycle, metrics, outcome
    from airflow_gpumarket.operators import cost
    from airflow_gpumarket.operators.result import RentalResult
else:  # what only a running task needs
    assets, metrics = RunTimeModule("airflow_gpumarket.assets"), RunTimeModule("airflow_gpumarket.metrics")
    job_logs, lifecycle = RunTimeModule("airflow_gpumarket.job_logs"), RunTimeModule("airflow_gpumarket.lifecycle")
    cost, outcome = RunTimeModule("airflow_gpumarket.operators.cost"), RunTimeModule("airflow_gpumarket.outcome")

#: Lines of the job's log read for the return value (the marker line comes after everything the function printed).
RESULT_TAIL_LINES = 100
#: Parameters Airflow fills from the task's context in a local task; there is no context on the instance.
_CONTEXT_KEYS = frozenset(
    {
        "conn", "dag", "dag_run", "data_interval_end", "data_interval_start", "ds", "ds_nodash", "exception",
        "inlet_events", "inlets", "logical_date", "macros", "outlet_events", "outlets", "params", "run_id", "task",
        "task_instance", "task_instance_key_str", "templates_dict", "test_mode", "ti", "triggering_asset_events",
        "try_number", "ts", "ts_nodash", "ts_nodash_with_tz", "var",
    }
)  # fmt: skip
_PLACEHOLDER_KEY = "0" * 12


def function_source(python_callable: Callable[..., Any]) -> tuple[str, str]:
    """The (source without decorators, name) of a function defined with ``def`` in a file.

    Raises a validation error for anything else: a lambda, a method, a function typed into a console.
    """
    name = getattr(python_callable, "__name__", "")
    try:
        source = textwrap.dedent(inspect.getsource(python_callable))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError) as exc:
        raise GpuMarketValidationError(
            "python_callable", f"the source of {name or python_callable!r} cannot be read ({exc}); define it with def "
        ) from None
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)), None)
    if node is None or node.name != name or isinstance(node, ast.AsyncFunctionDef):
        raise GpuMarketValidationError(
            "python_callable", f"{name or python_callable!r} must be a plain function defined with def (not async)"
        )
    lines = source.splitlines()[node.lineno - 1 : node.end_lineno]
    return "\n".join(lines) + "\n", name


class _GpuMarketDecoratedOperator(DecoratedOperator, GpuMarketRunJobOperator):
    """The operator behind ``@task.gpumarket`` (see ``gpumarket_task``)."""

    custom_operator_name = "@task.gpumarket"
    template_fields: Sequence[str] = (
        *DecoratedOperator.template_fields,
        *(name for name in GpuMarketRunJobOperator.template_fields if name != "command"),
    )
    template_fields_renderers = {
        **GpuMarketRunJobOperator.template_fields_renderers,
        **DecoratedOperator.template_fields_renderers,
    }

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Collection[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        requirements: Sequence[str] | None = None,
        python: str = "python3",
        **kwargs: Any,
    ) -> None:
        self.requirements = [python_job.validate_requirement(r) for r in requirements or ()]
        self.python = python
        source, name = function_source(python_callable)
        self._source, self._name = source, name
        _refuse_context_parameters(python_callable, op_kwargs or {})
        command = self._command(_PLACEHOLDER_KEY, list(op_args or ()), dict(op_kwargs or {}), parse_time=True)
        with self._fits():
            super().__init__(
                python_callable=python_callable,
                op_args=op_args,
                op_kwargs=op_kwargs,
                command=command,
                terms=Terms(reads_result=True),  # the return value is read from the log after exit 0
                **kwargs,
            )

    def _command(self, key: str, args: list[Any], kwargs: dict[str, Any], *, parse_time: bool = False) -> str:
        """The job's command.

        At parse time, arguments known only at run time (an upstream task's output, Jinja) stand in as None, so the size
        check is of the function alone; it is repeated with the real values before anything is rented.
        """
        if parse_time:
            args = [None if is_templated(v) or resolved_at_run_time(v) else v for v in args]
            kwargs = {k: None if is_templated(v) or resolved_at_run_time(v) else v for k, v in kwargs.items()}
        return python_job.build_command(
            source=self._source,
            name=self._name,
            key=key,
            args=args,
            kwargs=kwargs,
            requirements=self.requirements,
            python=self.python,
        )

    @contextmanager
    def _fits(self) -> Iterator[None]:
        """A job script too long for onstart is named as the function and its arguments."""
        try:
            yield
        except GpuMarketValidationError as exc:
            if exc.field not in ("command", "onstart"):
                raise
            raise GpuMarketValidationError(
                "python_callable",
                f"{self._name} and its arguments do not fit in the onstart script ({exc.problem}); pass large "
                "inputs through object storage (give the function their paths) and keep the function small",
            ) from None

    def execute(self, context: Any) -> Any:
        # The arguments are rendered and resolved now: the real command is built, and checked against the
        # onstart limit (by the renting flow's validation), before anything billable is sent.
        self.command = self._command(task_key(self, context), list(self.op_args), dict(self.op_kwargs))
        with self._fits():
            return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any], **kwargs: Any) -> Any:
        # A resumed task is a fresh operator: an interruptible job preempted while deferred rents again from here,
        # with the same command.
        self.command = self._command(task_key(self, context), list(self.op_args), dict(self.op_kwargs))
        with self._fits():
            return super().execute_complete(context, event, **kwargs)

    def _complete(self, result: RentalResult) -> Any:
        from airflow_gpumarket.operators.failures import GpuMarketOutcomeUnknown
        from airflow_gpumarket.operators.result import summary
        from airflow_gpumarket.operators.session import Outcome

        session, rental, ended = self._held(), result.rental, result.outcome
        assert ended is not None  # a job is always waited for
        if ended.destroyed_itself:  # stopped after success, so gone means someone destroyed it
            session.end(rental, Outcome.GONE, metric=metrics.LOST, why="destroyed before its value was read")
            raise GpuMarketOutcomeUnknown(
                f"instance {rental.instance_id} was destroyed before the function's return value was read from its "
                "log (by hand, or by the reaper after its lease ran out); the value is lost"
            )
        if result.kind not in (outcome.EventKind.JOB_FAILED, outcome.EventKind.JOB_SUCCEEDED):
            return super()._complete(result)
        # The wait's final read forwarded the output but keeps no whole marker line: the value is read again.
        text = self._result_log(rental)
        lines = job_logs.split_lines(text, complete_only=False)
        status = job_logs.exit_status(lines)
        if status is None:
            status = ended.exit_status  # what the wait's final read saw
        found, value = python_job.read_result(text, session.key)
        if status == 0 and found:
            session.end(rental, Outcome.SUCCEEDED, metric=metrics.SUCCEEDED)
            done = summary(rental, result.status, self.hook.service_now)
            self.log.info(
                "%s returned on instance %s after %s; cost %s%s (%s)",
                self._name,
                rental.instance_id,
                lifecycle.format_duration(done["elapsed_seconds"]),
                cost.text(done["cost"], done["cost_kind"]),
                cost.breakdown(done["rentals"]),
                cost.rate(done["rentals"], rental.hourly),
            )
            assets.annotate_outlet_events(result.context, done)
            return value
        tail = ended.log_tail
        if text:
            tail = tuple(
                [line for line in lines if not python_job.is_marker_line(line)][-job_logs.FAILURE_TAIL_LINES :]
            )
        read = ended.log_read if ended.log_read is not None else bool(text)
        ended = replace(ended, kind=outcome.EventKind.JOB_FAILED, exit_status=status, log_tail=tail, log_read=read)
        if status == 0:
            session.end(rental, Outcome.DESTROYED, metric=metrics.JOB_FAILED, why="its return value was unreadable")
            raise GpuMarketOutcomeUnknown(
                f"{self._name} returned on instance {rental.instance_id}, but its return value could not be read "
                "from the instance's log; the instance is destroyed"
            )
        return super()._complete(result._replace(outcome=ended))

    def _result_log(self, rental: lifecycle.Rental) -> str:
        try:
            return self.hook.get_instance_logs(
                rental.instance_id, tail=RESULT_TAIL_LINES, key_digests=(rental.key_digest, *rental.secret_digests)
            )
        except GpuMarketError as exc:
            self.log.warning("Could not read the log of instance %s: %s", rental.instance_id, exc)
            return ""


def _refuse_context_parameters(python_callable: Callable[..., Any], op_kwargs: Mapping[str, Any]) -> None:
    """Refuse, at parse time, parameters named like Airflow context keys unless given explicitly.

    A parameter named like a context key (``ti``, ``ds``, ...) would be filled locally, but the function runs on the
    instance, where there is no context.
    """
    for name in inspect.signature(python_callable).parameters:
        if name in _CONTEXT_KEYS and name not in op_kwargs:
            raise GpuMarketValidationError(
                "python_callable",
                f"parameter {name!r} is an Airflow context key, but the function runs on a rented instance without "
                f"the Airflow context; pass what it needs as an argument (a templated string such as "
                f"'{{{{ {name} }}}}' works for ds, run_id, ts and the like)",
            )


def _with_destroy_callback(callbacks: Any) -> list[Any]:
    listed = [] if callbacks is None else list(callbacks) if isinstance(callbacks, list | tuple) else [callbacks]
    return listed if destroy_rentals_on_failure in listed else [*listed, destroy_rentals_on_failure]


def gpumarket_task(
    python_callable: Callable[..., Any] | None = None, multiple_outputs: bool | None = None, **kwargs: Any
) -> Any:
    """``@task.gpumarket(...)``: run the decorated function on a rented GPU instance and push its return value.

    Takes every argument of ``GpuMarketRunJobOperator`` but ``command`` (``offer_filters``, ``max_dph``, ``image``,
    ``env``, ``max_runtime``, ``deferrable``, ...), plus ``requirements`` (pip requirements installed with the
    image's ``python3`` first) and ``python`` (the interpreter, default ``python3``). The function must be
    self-contained (imports inside it), take JSON arguments and return a JSON value of at most 64 KiB; larger
    inputs and outputs belong in object storage (pass and return their paths). Works with ``.expand()``,
    ``multiple_outputs`` and ``deferrable=True``.
    """
    kwargs["on_failure_callback"] = _with_destroy_callback(kwargs.get("on_failure_callback"))
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=_GpuMarketDecoratedOperator,
        **kwargs,
    )
