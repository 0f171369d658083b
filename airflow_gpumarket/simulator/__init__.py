"""The embedded GPU marketplace simulator: a real HTTP service that follows ``api-reference.md``.

``from airflow_gpumarket.simulator import MarketSimulator`` is cheap: the server (FastAPI, uvicorn) is only
imported when a simulator starts. See docs/simulator.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_gpumarket.simulator.server import MarketSimulator

__all__ = ["MarketSimulator"]


def __getattr__(name: str) -> Any:
    if name == "MarketSimulator":
        from airflow_gpumarket.simulator.server import MarketSimulator

        return MarketSimulator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
