"""The base of every operator of this provider: the connection, and a hook made once per operator."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

from airflow_gpumarket._compat import BaseOperator

if TYPE_CHECKING:
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook


class GpuMarketBaseOperator(BaseOperator):
    """Connection handling shared by every operator of this provider; each takes ``gpumarket_conn_id`` itself.

    No ``__init__`` here: Airflow wraps every level of one, and DAG files make these operators at each parse.
    """

    gpumarket_conn_id: str

    @cached_property
    def hook(self) -> GpuMarketHook:
        from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

        return GpuMarketHook(self.gpumarket_conn_id)
