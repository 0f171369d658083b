"""The base of every operator of this provider: the connection, and a hook made once per operator."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow_gpumarket._compat import BaseOperator, has_retry_policies

if TYPE_CHECKING:
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook


class GpuMarketBaseOperator(BaseOperator):
    """Connection handling shared by every operator of this provider."""

    def __init__(self, *, gpumarket_conn_id: str = "gpumarket_default", **kwargs: Any) -> None:
        if "retry_policy" in kwargs and kwargs["retry_policy"] is None and not has_retry_policies():
            del kwargs["retry_policy"]  # gpumarket_retry_policy() before Airflow 3.3: the standard retries apply
        super().__init__(**kwargs)
        self.gpumarket_conn_id = gpumarket_conn_id

    @cached_property
    def hook(self) -> GpuMarketHook:
        from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

        return GpuMarketHook(self.gpumarket_conn_id)
