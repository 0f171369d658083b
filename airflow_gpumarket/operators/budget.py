"""A renting task's part of budgets: reserve each rental's worst case before its create, settle it when it ends.

The ledger lives in the Airflow metadata database (``ledger.py``). A task reaches it directly where Airflow lets task
code use that database (Airflow 2, ``dag.test()``), else through the api-server, where the provider's plugin runs the
same transaction (``ui/ledger_api.py``); each request is signed with the connection's API key (``signing``). The
ledger reads the DAG's budgets from the Variable itself; the task reads it only when the ledger cannot be reached.
"""

from __future__ import annotations

import time
from typing import Any

from airflow_gpumarket import budgets, ledger, metrics
from airflow_gpumarket._compat import AirflowException
from airflow_gpumarket.exceptions import GpuMarketError, GpuMarketValidationError
from airflow_gpumarket.operators.failures import GpuMarketBudgetExceeded
from airflow_gpumarket.operators.signed_routes import APP_PATH, api_server_url, signed_post
from airflow_gpumarket.utils import metadata_engine

#: The plugin's ledger routes, under the provider's app in the api-server.
LEDGER_ROUTES = "/ledger"


class _Direct:
    """The ledger through the metadata database's engine, in this process."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def reserve(self, request: ledger.Request) -> ledger.Reservation:
        return ledger.reserve(self.engine, request, now=time.time())

    def last_attempt(self, **task_try: Any) -> int:
        return ledger.last_attempt(self.engine, **task_try)

    def attach(self, conn_id: str, reservation_id: int, instance_id: int) -> None:
        ledger.attach(self.engine, conn_id, reservation_id, instance_id)

    def entries(self, conn_id: str, since: float) -> list[dict[str, Any]]:
        return ledger.entries(self.engine, since=since, conn_id=conn_id)

    def settle(
        self,
        conn_id: str,
        *,
        reservation_id: int | None = None,
        instance_id: int | None = None,
        ended: Any = None,
        cost: float | None = None,
    ) -> Any:
        return ledger.settle(
            self.engine,
            conn_id,
            now=time.time(),
            reservation_id=reservation_id,
            instance_id=instance_id,
            ended=ended,
            cost=cost,
        )


class _ApiServer:
    """The ledger through the provider's routes in the api-server (Airflow 3 task processes)."""

    def __init__(self, base_url: str, api_key: str) -> None:
        self.app_url = base_url.rstrip("/") + APP_PATH
        self.url = self.app_url + LEDGER_ROUTES
        self._api_key = api_key

    def _post(self, route: str, body: dict[str, Any]) -> Any:
        name = f"The budget ledger at {self.url}"
        route = f"{LEDGER_ROUTES}/{route}"
        return signed_post(self.app_url, route, self._api_key, body, name=name, conflict=ledger.BudgetRefused)

    def reserve(self, request: ledger.Request) -> ledger.Reservation:
        return ledger.Reservation.from_json(self._post("reserve", request.to_json()))

    def versions(self, conn_id: str) -> dict[str, Any]:
        """The provider's and Airflow's versions in the api-server that answers."""
        return dict(self._post("version", {"conn_id": conn_id}))

    def last_attempt(self, **task_try: Any) -> int:
        return int(self._post("attempts", task_try)["last"])

    def attach(self, conn_id: str, reservation_id: int, instance_id: int) -> None:
        self._post("attach", {"conn_id": conn_id, "id": reservation_id, "instance_id": instance_id})

    def entries(self, conn_id: str, since: float) -> list[dict[str, Any]]:
        return list(self._post("entries", {"conn_id": conn_id, "since": since})["entries"])

    def settle(
        self,
        conn_id: str,
        *,
        reservation_id: int | None = None,
        instance_id: int | None = None,
        ended: Any = None,
        cost: float | None = None,
    ) -> Any:
        body = {"conn_id": conn_id, "id": reservation_id, "instance_id": instance_id, "ended": ended, "cost": cost}
        return self._post("settle", body).get("cost")


def ledger_client(hook: Any) -> _Direct | _ApiServer:
    """The ledger as this process may reach it (through the api-server: signed with ``hook``'s API key)."""
    engine = metadata_engine()
    if engine is not None:
        return _Direct(engine)
    return api_server_ledger(hook)


def api_server_ledger(hook: Any) -> _ApiServer:
    """The ledger's routes in the api-server, as a task process reaches them, signed with ``hook``'s API key."""
    return _ApiServer(api_server_url(), hook.settings.api_key)


def settle_ended(
    hook: Any,
    conn_id: str,
    instance_id: int,
    log: Any,
    cost: float | None = None,
    started: Any = None,
    ended: float | None = None,
) -> None:
    """An instance is gone: settle its reservation, if any, at ``cost`` when known (see ``ledger.settle``).

    ``started``: the instance's start_date, when it was read: its charge since then is then its cost. ``ended``: when
    it was destroyed, on the service's clock (default: now). Never raises.
    """
    try:
        service_now = getattr(hook, "service_now", None)
        if ended is None:
            ended = service_now() if callable(service_now) else None
        if cost is None and ended is not None:
            from airflow_gpumarket.operators.cost import charged_since

            cost = charged_since(hook, instance_id, started, ended)
        settled = ledger_client(hook).settle(conn_id, instance_id=instance_id, ended=ended, cost=cost)
    except Exception as exc:  # noqa: BLE001 - the reservation stays at its worst case, which is safe
        log.warning("Could not settle the budget reservation of instance %s: %s", instance_id, exc)
        return
    if settled is not None:
        metrics.budget_settled(settled)
        how = "what it cost" if cost is not None else "its rate over its life, estimated on the service's clock"
        log.info("Instance %s ended; its budget reservation is settled at $%.4f (%s)", instance_id, settled, how)


class Budget:
    """The reservations of one try: each rental's worst case reserved before its create, settled when it ends.

    A task resumed after a deferral makes a new one: it reads nothing until it is about to rent again.

    :param hook: the task's hook (the account's credit is read through it).
    :param log: the task's logger.
    :param context: the task's context (DAG, run and task instance).
    :param dag_id: the task's DAG, whose budgets apply.
    :param task_id: the task.
    :param conn_id: the task's connection: the account whose credit is checked.
    """

    def __init__(self, hook: Any, log: Any, context: Any, *, dag_id: str, task_id: str, conn_id: str) -> None:
        self.hook = hook
        self.conn_id = conn_id
        self.log = log
        ti = context.get("ti") if hasattr(context, "get") else None
        self.dag_id, self.task_id = dag_id, task_id
        self.run_id = str(context.get("run_id") if hasattr(context, "get") else "")
        map_index, try_number = getattr(ti, "map_index", None), getattr(ti, "try_number", None)
        self.map_index = map_index if isinstance(map_index, int) else -1
        self.try_number = try_number if isinstance(try_number, int) else 1
        dag = context.get("dag") if hasattr(context, "get") else None
        self.team = budgets.team_of(getattr(dag, "tags", None))
        self._client: _Direct | _ApiServer | None = None
        self._clock_said = False  # the warning that the service's clock runs faster than this host's was given
        self._attempt: int | None = None  # the try's last rental attempt, read from the ledger before the first
        self.reservation_id: int | None = None  # the reservation of the create in flight

    @property
    def client(self) -> _Direct | _ApiServer:
        if self._client is None:
            self._client = ledger_client(self.hook)
        return self._client

    def _next_attempt(self) -> int:
        """The rental attempt of this create: one more than the try's last, which the ledger is asked once.

        A task resumed after a deferral has a new Budget: asking the ledger keeps it off its earlier rentals' keys.
        """
        if self._attempt is None:
            self._attempt = self.client.last_attempt(**self._task_try())
        self._attempt += 1
        return self._attempt

    def _task_try(self) -> dict[str, Any]:
        """The connection and task try every reservation of this Budget names."""
        return {
            "conn_id": self.conn_id,
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "task_id": self.task_id,
            "map_index": self.map_index,
            "try_number": self.try_number,
        }

    def reserve(self, worst: budgets.WorstCase, *, started: float) -> None:
        """Reserve ``worst`` before a create at the service's time ``started``; raise ``GpuMarketBudgetExceeded`` when
        it does not fit."""
        available = self.credit()
        try:
            request = ledger.Request(
                **self._task_try(),
                worst=worst.amount,
                seconds=worst.seconds,
                hourly=worst.hourly,
                attempt=self._next_attempt(),
                available=available,
                team=self.team,
                started=started,
            )
            reservation = self.client.reserve(request)
        except ledger.BudgetRefused as exc:
            raise GpuMarketBudgetExceeded(str(exc)) from None
        except (AirflowException, GpuMarketValidationError) as exc:  # a ledger refusing the request cannot keep it
            self._without_ledger(exc, worst, available)
            return
        self.reservation_id = reservation.id
        metrics.budget_reserved(worst.amount)
        for warning in reservation.warnings:
            self.log.warning("%s", warning)
        self.log.info(
            "Reserved its worst case, %s, for this rental (reservation %s, attempt %s of try %s)%s",
            worst.describe(),
            reservation.id,
            request.attempt,
            self.try_number,
            "" if reservation.limits is None else f"; DAG budgets: {reservation.limits.given()}",
        )
        scale = getattr(getattr(self.hook, "settings", None), "rate_limit_scale", 1.0)
        if isinstance(scale, (int, float)) and scale > 1 and not self._clock_said:
            self._clock_said = True
            self.log.warning(
                "The service's clock runs %gx this host's (the connection's rate_limit_scale, as a sped-up simulator "
                "sets it): max_runtime and the lease count this host's seconds while the service bills its own, so a "
                "rental here can cost up to %gx its worst case. On the live service both clocks agree",
                scale,
                scale,
            )

    def _without_ledger(self, exc: Exception, worst: budgets.WorstCase, available: float | None) -> None:
        """The ledger cannot be reached: fail when a budget applies to the DAG (it cannot be kept), else rent on."""
        from airflow_gpumarket._compat import Variable

        try:
            raw = Variable.get(budgets.VARIABLE, None)  # the default is positional: Airflow 2 and 3 name it differently
            limits, warnings = ledger.dag_budgets(self.dag_id, raw)
        except ledger.BudgetRefused as refused:
            raise GpuMarketBudgetExceeded(str(refused)) from None
        if limits is not None:
            raise exc
        for warning in warnings:
            self.log.warning("%s", warning)
        self.log.warning("Renting without a ledger entry: %s", exc)
        why = budgets.refusal(None, {}, worst.amount, dag_id=self.dag_id, available=available)
        if why is not None:
            raise GpuMarketBudgetExceeded(why) from None

    def credit(self) -> float | None:
        """The account's credit, or None when the service does not tell it."""
        account = getattr(self.hook, "account", None)
        if account is None:
            return None
        try:
            return account().available
        except GpuMarketError as exc:
            self.log.info("The account's credit could not be read (%s); renting without the credit check", exc)
            return None

    def created(self, instance_id: int) -> None:
        """The create made ``instance_id``: its reservation names it from now on.

        The reservation is taken once: on_kill, in another thread, may attach it too (``ended``).
        """
        reservation_id, self.reservation_id = self.reservation_id, None
        if reservation_id is not None:
            try:
                self.client.attach(self.conn_id, reservation_id, instance_id)
            except BaseException:
                self.reservation_id = reservation_id  # ``ended`` attaches it again
                raise

    def not_created(self) -> None:
        """The create made nothing: its reservation is released."""
        reservation_id, self.reservation_id = self.reservation_id, None
        if reservation_id is not None:
            self.client.settle(self.conn_id, reservation_id=reservation_id)

    def ended(self, instance_id: int, cost: float | None = None) -> None:
        """The instance is gone: its reservation becomes ``cost``, else its estimate. Never raises (failure paths).

        A create whose answer never came left its reservation unattached: the instance found by its label is the one.
        """
        if self.reservation_id is not None:
            try:
                self.created(instance_id)
            except Exception as exc:  # noqa: BLE001 - the reservation stays at its worst case, which is safe
                self.log.warning("Could not attach instance %s to its budget reservation: %s", instance_id, exc)
        settle_ended(self.hook, self.conn_id, instance_id, self.log, cost)
