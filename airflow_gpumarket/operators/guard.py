"""Destroy on every failure path: the object a renting task holds for what it rented, and the failure callback.

What a try rented is ended (``ending.end_rental``) when the try fails in any way: an exception
(``RentalGuard.on_failure``), SIGTERM or ``execution_timeout`` (``RentalGuard.kill`` from the operator's
``on_kill``), a worker lost without a trace (``destroy_rentals_on_failure``, which Airflow runs elsewhere). The
session ends its rentals through ``RentalGuard.end`` too. A retry adopts what an earlier try left
(``RentalGuard.adopt``) rather than renting again.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import api
from airflow_gpumarket._compat import AirflowException, TaskDeferred
from airflow_gpumarket.exceptions import GpuMarketError
from airflow_gpumarket.operators.base import GpuMarketBaseOperator
from airflow_gpumarket.utils import RunTimeModule

if TYPE_CHECKING:
    from airflow_gpumarket import job_logs, lifecycle, metrics
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
    from airflow_gpumarket.operators.budget import Budget
    from airflow_gpumarket.operators.ending import Disposal
    from airflow_gpumarket.ui.records import RentalRecorder
else:  # what only a running task needs: not imported when a DAG file is parsed
    job_logs, lifecycle = RunTimeModule("airflow_gpumarket.job_logs"), RunTimeModule("airflow_gpumarket.lifecycle")
    metrics = RunTimeModule("airflow_gpumarket.metrics")

#: The task state store's key (Airflow 3.3+) of the rental a task instance holds: a retry reconnects to it.
STATE_KEY = "gpumarket_rental"


def destroy_rentals(
    hook: GpuMarketHook, key: str, log: Any, reason: str, end: Callable[[int], Any], *, keep: Collection[int] = ()
) -> None:
    """End (``end``) every instance whose label carries the task instance's ``key``, but those in ``keep``."""
    for instance in lifecycle.rentals_of(hook.list_instances(), key):
        if instance.get("id") in keep:
            continue
        log.warning("%s: destroying instance %s so it stops billing", reason, instance["id"])
        end(int(instance["id"]))


def destroy_rentals_on_failure(context: Any) -> None:
    """Failure callback that every renting operator adds to its ``on_failure_callback`` list.

    Airflow runs failure callbacks in the worker after a failed try, and in the DAG processor when the scheduler
    fails a task whose worker stopped heartbeating. Either way, this destroys every instance carrying the task
    instance's label key. Mapped tasks (``partial()`` skips the operator's ``__init__``) pass it themselves:
    ``.partial(..., on_failure_callback=destroy_rentals_on_failure)``; ``@task.gpumarket`` does it itself.
    """
    task: Any = context.get("task") if isinstance(context, Mapping) else None
    operator_class: Any = getattr(task, "operator_class", type(task))  # a mapped task names its class
    if not (isinstance(operator_class, type) and getattr(operator_class, "rents_instances", False)):
        return
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    hook: GpuMarketHook
    if isinstance(task, GpuMarketBaseOperator):
        hook = task.hook
    else:  # a mapped task is never unmapped here: its connection comes from the partial() arguments
        partial_kwargs = getattr(task, "partial_kwargs", None) or {}
        hook = GpuMarketHook(partial_kwargs.get("gpumarket_conn_id", GpuMarketHook.default_conn_name))
    from airflow_gpumarket.operators.ending import Books, Disposal, end_rental

    log = getattr(task, "log", None) or hook.log
    books = Books(hook, log, conn_id=getattr(hook, "gpumarket_conn_id", ""))

    def end(instance_id: int) -> None:
        end_rental(books, instance_id, Disposal.DESTROY, metric=metrics.TASK_FAILED, why="the task failed")

    destroy_rentals(hook, task_key(task, context), log, "The task failed", end)


def task_key(task: Any, context: Any) -> str:
    """The label key of ``task``'s task instance in ``context``: the same for every try (``lifecycle.rental_key``)."""
    ti = context.get("ti") if isinstance(context, Mapping) else None
    run_id = context.get("run_id") if isinstance(context, Mapping) else None
    map_index = getattr(ti, "map_index", -1) if ti is not None else -1
    return lifecycle.rental_key(task.dag_id or "", str(run_id), task.task_id, map_index)


class RentalGuard:
    """What one try of a renting task rented, and the duty to destroy it whenever the try fails.

    :param hook: the task's hook.
    :param log: the task's logger.
    :param key: the task instance's label key (``lifecycle.rental_key``).
    :param store: the task state store (Airflow 3.3+, ``durable=True``), else None.
    :param recorder: the writer of the GPU rentals page's records, else None.
    :param budget: the try's budget reservations, settled as their instances end, else None.
    """

    def __init__(
        self,
        hook: GpuMarketHook,
        log: Any,
        key: str,
        *,
        store: Any = None,
        recorder: RentalRecorder | None = None,
        budget: Budget | None = None,
    ) -> None:
        self.hook = hook
        self.log = log
        self.key = key
        self.store = store
        self.recorder = recorder
        self.budget = budget
        self.instance_id: int | None = None  # the instance this try holds and must destroy on failure
        self.creating_label: str | None = None  # a create in flight: its instance is found by this label
        self.attempts: lifecycle.Attempts | None = None  # the task instance's attempts: their kept checkpoint source
        self.killed = False
        self._rental: lifecycle.Rental | None = None  # the rental held: what it cost is known when it ends
        self._counted: set[int] = set()  # the instances whose end the metrics counted

    @contextmanager
    def on_failure(self) -> Iterator[None]:
        """Destroy what this try holds when anything fails; deferring is not a failure."""
        try:
            yield
        except TaskDeferred:
            raise
        except BaseException as exc:
            for instance_id in self._held(self.instance_id or self.find_in_flight()):
                self.log.warning("Task failed (%s): destroying instance %s so it stops billing", exc, instance_id)
                self.end(instance_id, metric=metrics.TASK_FAILED, why="the task failed")
            raise

    def kill(self) -> None:
        """SIGTERM or execution_timeout: destroy now (the process may be killed for good any moment)."""
        self.killed = True
        for instance_id in self._held(self.instance_id or self.find_in_flight()):
            try:
                self.end(instance_id, metric=metrics.TASK_FAILED, why="the task was killed")
            except Exception as exc:  # on_kill must not raise; the message names the instance
                self.log.error("Task killed: %s", exc)

    def _held(self, instance_id: int | None) -> list[int]:
        """What a failure destroys: the instance held and a kept checkpoint source."""
        return [i for i in (instance_id, self._source_id()) if i is not None]

    def _source_id(self) -> int | None:
        return None if self.attempts is None else self.attempts.source_id

    def follow(self, attempts: lifecycle.Attempts) -> None:
        """Destroy on failure the checkpoint source that ``attempts`` keeps, whenever it keeps one."""
        self.attempts = attempts

    def take(self, instance_id: int) -> None:
        """This try holds ``instance_id`` (a resumed task, before it reads anything else of its event)."""
        self.instance_id = instance_id

    def creating(self, label: str | None) -> None:
        """A create is in flight (``label``), or ended without making anything (None)."""
        self.creating_label = label

    def stop_if_killed(self, instance_id: int) -> None:
        if self.killed:
            # Untyped on purpose: the task is being killed, and its on_kill ends what it holds; nothing retries on this.
            raise AirflowException(f"Task was killed while waiting for instance {instance_id}")

    def find_in_flight(self) -> int | None:
        """A create whose answer never came may still have made an instance: look for its label."""
        if self.creating_label is None:
            return None
        try:
            found = api.find_by_label(self.hook.list_instances(label=self.creating_label), self.creating_label)
        except GpuMarketError as exc:
            self.log.error("Could not check for an instance labelled %s: %s", self.creating_label, exc)
            return None
        return int(found["id"]) if found else None

    def hold(self, rental: lifecycle.Rental) -> None:
        """This try holds ``rental`` from now on: recorded, and saved for a retry to reconnect to."""
        self.instance_id, self.creating_label, self._rental = rental.instance_id, None, rental
        self._store_call("set", {"instance_id": rental.instance_id, "label": rental.label, "offer_id": rental.offer_id})

    def resumed(self, rental: lifecycle.Rental) -> None:
        """After a deferral: this try holds ``rental`` again (saved for a retry when it was first held)."""
        self.instance_id, self._rental = rental.instance_id, rental

    def end(
        self,
        instance_id: int,
        disposal: Disposal | None = None,
        *,
        metric: str | None,
        why: str,
        failover: bool = False,
    ) -> None:
        """This try is done with ``instance_id``: ended through ``ending.end_rental``, then no longer held.

        Destroyed by default; handed over or kept, it is only no longer this try's to destroy.
        """
        from airflow_gpumarket.operators.ending import Books, Disposal, end_rental

        disposal = Disposal.DESTROY if disposal is None else disposal
        if instance_id in self._counted:  # an end that failed to destroy is tried again, and counted once
            metric = None
        elif metric is not None:
            self._counted.add(instance_id)
        books = Books(
            self.hook,
            self.log,
            rental=self._rental,
            record_end=None if self.recorder is None else self.recorder.end,
            release=None if self.budget is None else self.budget.ended,
        )
        end_rental(books, instance_id, disposal, metric=metric, why=why, read_charge=not self.killed, failover=failover)
        if self.instance_id == instance_id:
            self.instance_id = None
        if disposal in (Disposal.HAND_OVER, Disposal.KEEP):
            return
        if self.attempts is not None and self.attempts.source_id == instance_id:
            self.attempts.source_id = None
        if self._saved_instance_id() == instance_id:
            self._store_call("delete")

    def destroy_duplicates(self, rental: lifecycle.Rental) -> None:
        """After an ambiguous create: destroy every instance of this task's key but ``rental``'s and a kept source."""
        why = "a duplicate left by an ambiguous create"
        destroy_rentals(
            self.hook,
            self.key,
            self.log,
            why[0].upper() + why[1:],
            lambda instance_id: self.end(instance_id, metric=None, why=why),
            keep=self._held(rental.instance_id),
        )

    def adopt(self, try_number: int, *, waits_for_job: bool) -> Mapping[str, Any] | None:
        """On a retry, what earlier tries of this task instance rented: the one kept, the rest destroyed.

        Kept: one booting or running, or (``waits_for_job``) stopped after its job printed exit status 0, whose
        success the wait then reads from the log instead of running the job again. The first try skips this.
        """
        if try_number <= 1:
            return None
        earlier = lifecycle.rentals_of(self.hook.list_instances(), self.key)
        saved = self._saved_instance_id()
        if saved is not None:  # reconnect to the one an earlier try saved first; the label finds any other
            self.log.info("Retry: the task state store names instance %s, rented by an earlier try", saved)
            earlier = sorted(earlier, key=lambda instance: instance.get("id") == saved)
        adopted = None
        for instance in reversed(earlier):
            if adopted is None and self._may_adopt(instance, waits_for_job):
                adopted = instance
            else:
                self.log.warning("Destroying instance %s left by an earlier try", instance.get("id"))
                self.end(int(instance["id"]), metric=None, why="left by an earlier try")
        if adopted is not None:
            self.instance_id = int(adopted["id"])
            self.log.warning(
                "Retry: adopting instance %s (status %r) rented by an earlier try instead of renting again",
                adopted["id"],
                adopted.get("actual_status"),
            )
        return adopted

    def _may_adopt(self, instance: Mapping[str, Any], waits_for_job: bool) -> bool:
        status = instance.get("actual_status")
        if api.is_booting(status) or status == api.STATUS_RUNNING:
            return True
        return status == api.STATUS_STOPPED and waits_for_job and self._job_succeeded(instance)

    def _job_succeeded(self, instance: Mapping[str, Any]) -> bool:
        """Whether a stopped instance's log ends with exit status 0; a log that cannot be read proves nothing."""
        try:
            text = self.hook.get_instance_logs(int(instance["id"]))
        except GpuMarketError as exc:
            self.log.warning("Cannot read the log of instance %s to see how its job ended (%s)", instance["id"], exc)
            return False
        return job_logs.exit_status(job_logs.split_lines(text, complete_only=False)) == 0

    def _saved_instance_id(self) -> int | None:
        saved = self._store_call("get")
        found = saved.get("instance_id") if isinstance(saved, Mapping) else None
        return found if isinstance(found, int) else None

    def _store_call(self, method: str, *args: Any) -> Any:
        """One call to the task state store; a store that fails is reported and the label path goes on alone."""
        if self.store is None:
            return False
        try:
            result = getattr(self.store, method)(STATE_KEY, *args)
        except Exception as exc:  # noqa: BLE001 - durability is a help; the label still finds the rental
            self.log.warning(
                "The task state store failed (%s %s: %s); a retry finds the rental by its label", method, STATE_KEY, exc
            )
            return False
        if method == "set":
            self.log.info("Instance %s saved in the task state store (key %r)", args[0]["instance_id"], STATE_KEY)
        return result
