"""Trigger that waits for a rented service's instance, then for its server to answer, holding no worker slot."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, cast

from airflow_gpumarket import service_probe
from airflow_gpumarket._compat import TriggerEvent
from airflow_gpumarket.outcome import EventKind
from airflow_gpumarket.triggers.instances import STEP_TIMEOUT_SECONDS, GpuMarketInstanceStatusTrigger


class GpuMarketServiceReadyTrigger(GpuMarketInstanceStatusTrigger):
    """Wait until the instance runs (as ``GpuMarketInstanceStatusTrigger``), then probe its server until it answers.

    The probe is ``service_probe``'s, the same rounds the task runs when it does not defer. Its last round goes into
    the event under ``probe`` once it settles (ready, the instance stopped, no certificate) or ``ready_timeout``
    passed on the service's clock (counted again by a copy handed to another triggerer); the task judges it when it
    resumes. Until that event the instance is still this
    trigger's: a task marked failed meanwhile destroys it (``destroy_on_kill``).

    :param probe: ``{"path", "status", "timeout"}``: the ``GpuMarketServiceOperator``'s ``ready_path``,
        ``ready_status`` and ``ready_timeout``.

    Other parameters: see ``GpuMarketInstanceStatusTrigger``.
    """

    def __init__(self, *, probe: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        path = probe.get("path")
        self.ready_path: str | None = None if path is None else str(path)
        self.ready_status = int(probe["status"])
        self.ready_timeout = float(probe["timeout"])

    def serialize(self) -> tuple[str, dict[str, Any]]:
        path, kwargs = super().serialize()
        probe = {"path": self.ready_path, "status": self.ready_status, "timeout": self.ready_timeout}
        return path, {**kwargs, "probe": probe}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        waited = cast(AsyncGenerator[TriggerEvent, None], super().run())
        async with contextlib.aclosing(waited):  # the instance's wait ends with its event
            event = await anext(waited, None)
        if event is None:
            return
        if event.payload.get("status") != EventKind.REACHED.value:
            yield event
            return
        self._fired = False  # not the task's again until the probe's event: a user's kill still destroys it
        seen = await self._probe()
        self._fired = True
        yield TriggerEvent({**event.payload, "probe": seen.to_dict()})

    async def _probe(self) -> service_probe.Round:
        """Rounds of the probe until one settles or ``timeout`` passed, on the service's clock."""
        hook = self._flow_hook
        label = str((self.rental or {}).get("label") or "")
        certificate, deadline = None, None
        while True:
            try:
                async with asyncio.timeout(STEP_TIMEOUT_SECONDS):
                    seen = await hook.run_flow(
                        service_probe.round_flow(
                            hook,
                            self.instance_id,
                            label=label,
                            certificate=certificate,
                            path=self.ready_path,
                            status=self.ready_status,
                        )
                    )
            finally:
                await hook.aclose()
            certificate = seen.certificate
            deadline = deadline if deadline is not None else hook.service_now() + self.ready_timeout
            if seen.settles or hook.service_now() >= deadline:
                return seen
            await asyncio.sleep(self.poll_interval)
