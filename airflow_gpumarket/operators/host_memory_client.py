"""A renting task's (or a command's) way to host memory and to the task's history: the database here, or the
api-server's signed routes.

As the budget ledger is reached (``operators/budget.py``): directly where task code may use the metadata database
(``utils.metadata_engine``: Airflow 2, ``dag.test()``), else through the provider's routes in the api-server
(``ui/host_memory_api.py``), each request signed with the connection's API key.
"""

from __future__ import annotations

import time
from typing import Any

from airflow_gpumarket import host_memory, task_history
from airflow_gpumarket._compat import AirflowException
from airflow_gpumarket.operators.signed_routes import APP_PATH, api_server_url, signed_post
from airflow_gpumarket.utils import metadata_engine

#: The plugin's host memory routes, under the provider's app in the api-server.
HOSTS_ROUTES = "/hosts"
#: The plugin's route to the task's history, under the provider's app in the api-server.
HISTORY_ROUTES = "/history"


class DirectHostMemory:
    """Host memory through the metadata database's engine, in this process."""

    def __init__(self, engine: Any, api_key: str, clock: Any = time.time) -> None:
        self.engine = engine
        self.account = host_memory.account_of(api_key)
        self.clock = clock

    def remember(
        self, machine_id: int, reason: str, detail: str = "", ttl: float = host_memory.DEFAULT_TTL_SECONDS
    ) -> host_memory.Memory:
        return host_memory.remember(
            self.engine, self.account, machine_id, reason, now=self.clock(), ttl=ttl, detail=detail
        )

    def avoided(self) -> dict[int, host_memory.Memory]:
        return host_memory.avoided(self.engine, self.account, now=self.clock())

    def clear(self, machine_id: int | None = None) -> int:
        return host_memory.clear(self.engine, self.account, machine_id)

    def history(self, dag_id: str, task_id: str, image: str | None = None) -> task_history.Learned:
        """What the task's latest successes tell: its job's median running time, its image's size (``task_history``).

        :raises GpuMarketValidationError: ``dag_id``, ``task_id`` or ``image`` is no non-empty string (nothing is read).
        :raises AirflowException: the history could not be read.
        """
        task_history.check_task(dag_id, task_id)
        task_history.check_image(image)
        try:
            return task_history.learned(self.engine, dag_id, task_id, image)
        except Exception as exc:  # noqa: BLE001 - any failure of the read: the caller goes on without the figures
            raise AirflowException(f"Could not read the earlier runs of task {dag_id}.{task_id}: {exc}") from exc


class ApiServerHostMemory:
    """Host memory through the provider's routes in the api-server (Airflow 3 task processes)."""

    def __init__(self, base_url: str, api_key: str, conn_id: str) -> None:
        self.app_url = base_url.rstrip("/") + APP_PATH
        self.url = self.app_url + HOSTS_ROUTES
        self.history_url = self.app_url + HISTORY_ROUTES
        self._api_key = api_key
        self.conn_id = conn_id

    def _post(self, route: str, body: dict[str, Any], *, history: bool = False) -> Any:
        routes, name = (HISTORY_ROUTES, "The task history") if history else (HOSTS_ROUTES, "Host memory")
        body = {"conn_id": self.conn_id, **body}
        name = f"{name} at {self.app_url}{routes}"
        return signed_post(self.app_url, f"{routes}/{route}", self._api_key, body, name=name)

    def remember(
        self, machine_id: int, reason: str, detail: str = "", ttl: float = host_memory.DEFAULT_TTL_SECONDS
    ) -> host_memory.Memory:
        host_memory.check_machine_id(machine_id)
        host_memory.check_reason(reason)
        host_memory.check_ttl(ttl)
        body = {"machine_id": machine_id, "reason": reason, "detail": detail, "ttl_seconds": ttl}
        return host_memory.Memory.from_json(self._post("remember", body))

    def avoided(self) -> dict[int, host_memory.Memory]:
        machines = [host_memory.Memory.from_json(m) for m in self._post("avoided", {})["machines"]]
        return {m.machine_id: m for m in machines}

    def clear(self, machine_id: int | None = None) -> int:
        body = {"all": True} if machine_id is None else {"machine_id": host_memory.check_machine_id(machine_id)}
        return int(self._post("clear", body)["cleared"])

    def history(self, dag_id: str, task_id: str, image: str | None = None) -> task_history.Learned:
        """What the task's latest successes tell: its job's median running time, its image's size (``task_history``).

        :raises GpuMarketValidationError: ``dag_id``, ``task_id`` or ``image`` is no non-empty string (nothing is sent).
        :raises AirflowException: the api-server did not answer, or refused.
        """
        task_history.check_task(dag_id, task_id)
        task_history.check_image(image)
        answer = self._post("learned", {"dag_id": dag_id, "task_id": task_id, "image": image}, history=True)
        names = ("runtime_seconds", "image_gb", "image_gb_max")
        figures = [answer.get(name) if isinstance(answer, dict) else "" for name in names]
        if not all(f is None or (isinstance(f, int | float) and not isinstance(f, bool)) for f in figures):
            raise AirflowException(f"The task history at {self.history_url} answered no figures: {answer!r}")
        return task_history.Learned(*(None if f is None else float(f) for f in figures))


def host_memory_client(hook: Any, conn_id: str) -> DirectHostMemory | ApiServerHostMemory:
    """Host memory as this process may reach it, for the account of ``hook``'s API key."""
    engine = metadata_engine()
    if engine is not None:
        return DirectHostMemory(engine, hook.settings.api_key)
    return ApiServerHostMemory(api_server_url(), hook.settings.api_key, conn_id)
