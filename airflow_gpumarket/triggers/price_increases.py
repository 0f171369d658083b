"""Trigger that waits in the triggerer until host-requested price increases are pending."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow_gpumarket import api, price_increases
from airflow_gpumarket._compat import BaseTrigger, TriggerEvent
from airflow_gpumarket.exceptions import GpuMarketError


class GpuMarketPendingPriceIncreaseTrigger(BaseTrigger):
    """Poll the pending price increase list until it holds an increase (for ``contract_ids`` when given).

    Fires ``{"status": "found", "pending": [...], "truncated": bool}``, or ``{"status": "error", "message"}`` on
    a failure that retries cannot fix (a wrong key, for instance).
    """

    def __init__(
        self,
        *,
        gpumarket_conn_id: str = "gpumarket_default",
        contract_ids: list[int] | None = None,
        poll_interval: float = price_increases.CHECK_INTERVAL_SECONDS,
    ) -> None:
        super().__init__()
        self.gpumarket_conn_id = gpumarket_conn_id
        self.contract_ids = contract_ids
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "gpumarket_conn_id": self.gpumarket_conn_id,
                "contract_ids": self.contract_ids,
                "poll_interval": self.poll_interval,
            },
        )

    def _hook(self):
        from airflow_gpumarket.hooks.gpumarket import GpuMarketAsyncHook

        return GpuMarketAsyncHook(self.gpumarket_conn_id)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = self._hook()
        try:
            while True:
                try:
                    response = await hook.list_pending_price_increases()
                except GpuMarketError as exc:
                    if not api.is_retryable(exc):
                        error = price_increases.PriceIncreaseEvent.ERROR.value
                        yield TriggerEvent({"status": error, "message": str(exc)})
                        return
                    self.log.warning("Listing pending price increases failed (%s); still polling", exc)
                else:
                    pending = price_increases.select(response, self.contract_ids)
                    if pending:
                        yield TriggerEvent(
                            {
                                "status": price_increases.PriceIncreaseEvent.FOUND.value,
                                "pending": pending,
                                "truncated": bool(response.get("truncated")),
                            }
                        )
                        return
                await asyncio.sleep(self.poll_interval)
        finally:
            await hook.aclose()
