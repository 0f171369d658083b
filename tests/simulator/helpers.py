"""Helpers of the simulator's own tests."""

from __future__ import annotations

import time
from typing import Any

import requests

from gpumarket_simulator import MarketSimulator


class Api:
    """A bare HTTP client written from the spec (deliberately not the provider's hook)."""

    def __init__(self, sim: MarketSimulator, key: str | None) -> None:
        self.base = sim.url
        self.key = key
        self.session = requests.Session()
        self.session.trust_env = False

    def call(self, method: str, path: str, body: Any = None, *, key: Any = "default", **kwargs: Any) -> Any:
        key = self.key if key == "default" else key
        headers = dict(kwargs.pop("headers", {}))
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        if body is not None:
            kwargs["json"] = body
        return self.session.request(method, self.base + path, headers=headers, timeout=10, **kwargs)

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.call("GET", path, **kwargs)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return self.call("POST", path, body, **kwargs)

    def put(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return self.call("PUT", path, body, **kwargs)

    def delete(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return self.call("DELETE", path, body, **kwargs)

    # --- spec operations used by many tests -----------------------------------------------------------------
    def search(self, body: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        response = self.post("/api/v0/bundles/", body or {})
        assert response.status_code == 200, response.text
        return response.json()["offers"]

    def cheapest(self, gpu_name: str = "RTX 4090") -> dict[str, Any]:
        return self.search({"gpu_name": {"eq": gpu_name}, "order": [["dph_total", "asc"]], "limit": 1})[0]

    def create(self, offer_id: int | None = None, body: dict[str, Any] | None = None) -> dict[str, Any]:
        offer_id = offer_id or self.cheapest()["id"]
        response = self.put(f"/api/v0/asks/{offer_id}/", body if body is not None else {"image": "ubuntu:22.04"})
        assert response.status_code == 200, response.text
        return response.json()

    def instance(self, instance_id: int) -> dict[str, Any]:
        response = self.get(f"/api/v0/instances/{instance_id}/")
        assert response.status_code == 200, response.text
        return response.json()["instances"]

    def status(self, instance_id: int) -> str | None:
        return self.instance(instance_id)["actual_status"]


def ledger(sim: MarketSimulator, instance_id: int) -> dict[str, Any]:
    return next(i for i in sim.state()["instances"] if i["id"] == instance_id)


def boot(sim: MarketSimulator) -> None:
    """Move past the longest boot the spec allows (5 minutes)."""
    sim.advance(301)


def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``predicate`` (real time, bounded) until it returns something truthy: for real subprocesses."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(interval)


def finished_onstart(sim: MarketSimulator, instance_id: int, timeout: float = 10.0) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        result = sim.onstart_result(instance_id)
        return result if result is not None and not result["running"] else None

    return wait_for(done, timeout)
