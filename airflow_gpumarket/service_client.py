"""A rented service as the tasks that use it reach it: ``connect_service("serve")`` in a task of the same DAG run.

The service's setup task (``GpuMarketServiceOperator``) returned its instance, label, connection and certificate;
nothing secret. Here the instance is read again (its address as it is now) and the credential derived again from
the connection's API key and the label, masked in the task's log; it is never written anywhere. The clients speak
TLS and trust the rental's own certificate only.

    @task
    def infer(shard):
        from airflow_gpumarket.service_client import connect_service

        service = connect_service("serve")
        with service.client() as client:
            return client.post("/v1/completions", json={...}).json()
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_gpumarket import api, services
from airflow_gpumarket.exceptions import GpuMarketValidationError

log = logging.getLogger(__name__)

#: Seconds a request waits by default: a model's answer may take a while.
DEFAULT_TIMEOUT_SECONDS = 300.0


class GpuMarketService:
    """One rented service: its ``base_url`` and the ``headers`` that carry its credential.

    ``client()`` and ``async_client()`` are ``httpx`` clients with both set, pinned to the rental's certificate. A
    request of theirs that cannot reach the server reads the instance: when it no longer runs,
    ``GpuMarketServiceGone`` is raised (retrying cannot bring it back); otherwise the transport's error stands.
    ``check()`` asks the same at any time.
    """

    def __init__(
        self, *, base_url: str, credential: str, instance_id: int, hook: Any, certificate: str | None = None
    ) -> None:
        self.base_url = base_url
        self.instance_id = instance_id
        self.certificate = certificate  # the rental's own (DER, base64), pinned by the clients; None: plain HTTP
        self._credential = credential
        self._hook = hook

    def ssl_context(self) -> Any:
        """An SSL context that trusts the rental's certificate only (for a client other than ``client()``)."""
        if self.certificate is None:
            raise GpuMarketValidationError("certificate", "this service has none: it is reached over plain HTTP")
        return services.pinned_context(self.certificate)

    def __repr__(self) -> str:
        return f"GpuMarketService(instance_id={self.instance_id}, base_url={self.base_url!r})"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._credential}"}

    def client(self, **kwargs: Any) -> Any:
        """An ``httpx.Client`` for the service (``kwargs`` go to it; ``timeout`` defaults to 300 s)."""
        import httpx

        check = self.check

        class Transport(httpx.HTTPTransport):
            def handle_request(self, request: Any) -> Any:
                try:
                    return super().handle_request(request)
                except httpx.TransportError:
                    check()
                    raise

        kwargs.setdefault("timeout", DEFAULT_TIMEOUT_SECONDS)
        kwargs.setdefault("transport", Transport(**self._verify()))
        return httpx.Client(base_url=self.base_url, headers=self.headers, **kwargs)

    def async_client(self, **kwargs: Any) -> Any:
        """An ``httpx.AsyncClient`` for the service, as ``client``."""
        import asyncio

        import httpx

        check = self.check

        class Transport(httpx.AsyncHTTPTransport):
            async def handle_async_request(self, request: Any) -> Any:
                try:
                    return await super().handle_async_request(request)
                except httpx.TransportError:
                    await asyncio.to_thread(check)
                    raise

        kwargs.setdefault("timeout", DEFAULT_TIMEOUT_SECONDS)
        kwargs.setdefault("transport", Transport(**self._verify()))
        return httpx.AsyncClient(base_url=self.base_url, headers=self.headers, **kwargs)

    def _verify(self) -> dict[str, Any]:
        return {} if self.certificate is None else {"verify": self.ssl_context()}

    def check(self) -> None:
        """Raise ``GpuMarketServiceGone`` when the service's instance no longer runs."""
        _running(self._hook, self.instance_id)


def connect_service(task_id: str, *, context: Any = None, conn_id: str | None = None) -> GpuMarketService:
    """The service that task ``task_id`` (a ``GpuMarketServiceOperator``) of this DAG run handed over.

    :param task_id: the service's setup task.
    :param context: the task's context (default: the current one).
    :param conn_id: the connection (default: the one the setup task used).
    :raises GpuMarketValidationError: ``task_id`` returned no service.
    :raises GpuMarketServiceGone: its instance no longer runs.
    """
    from airflow_gpumarket._compat import get_current_context, mask_secret
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
    from airflow_gpumarket.ui import records

    context = context if context is not None else get_current_context()
    handed = context["ti"].xcom_pull(task_ids=task_id)
    if not isinstance(handed, dict) or not handed.get("label") or "instance_id" not in handed:
        raise GpuMarketValidationError(
            "task_id", f"task {task_id!r} of this DAG run returned no service; name a GpuMarketServiceOperator task"
        )
    hook = GpuMarketHook(gpumarket_conn_id=conn_id or handed.get("conn_id") or GpuMarketHook.default_conn_name)
    instance_id = int(handed["instance_id"])
    instance = _running(hook, instance_id)
    certificate = handed.get("certificate")
    base_url = services.base_url(instance, tls=certificate is not None)
    if base_url is None:
        raise _gone(instance_id, "it shows no address for the service port")
    credential = services.token(hook.settings.api_key, str(handed["label"]))
    mask_secret(credential)
    records.push_use(context, log, instance_id, hook.service_now())  # the page lists the tasks that used it
    return GpuMarketService(
        base_url=base_url, credential=credential, instance_id=instance_id, hook=hook, certificate=certificate
    )


def _running(hook: Any, instance_id: int) -> Any:
    instance = hook.find_instance(instance_id)
    if instance is None:
        raise _gone(instance_id, "it is gone")
    if instance.get("actual_status") != api.STATUS_RUNNING:
        raise _gone(instance_id, f"it is {instance.get('actual_status')!r}")
    return instance


def _gone(instance_id: int, why: str) -> Exception:
    from airflow_gpumarket.operators.failures import GpuMarketServiceGone

    return GpuMarketServiceGone(
        f"The service on instance {instance_id} cannot answer: {why}. Run its task group again for a new one."
    )
