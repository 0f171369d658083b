"""A simulated GPU marketplace: a real HTTP service that follows the service's published API reference.

``from gpumarket_simulator import MarketSimulator`` is cheap: the server (FastAPI, uvicorn) is only
imported when a simulator starts. See docs/simulator.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpumarket_simulator.server import MarketSimulator

__version__ = "0.1.0"

__all__ = ["MarketSimulator"]


def __getattr__(name: str) -> Any:
    if name == "MarketSimulator":
        from gpumarket_simulator.server import MarketSimulator

        return MarketSimulator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
