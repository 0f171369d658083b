"""Serverless endpoints and deployments: what the account has, creating an endpoint and deleting deployments."""

from __future__ import annotations

from typing import Any

ENDPOINT_DEFAULTS: dict[str, Any] = {
    "min_load": 0.0,
    "min_cold_load": 0.0,
    "target_util": 0.9,
    "cold_mult": 2.5,
    "cold_workers": 5,
    "max_workers": 20,
    "max_queue_time": 30.0,
    "target_queue_time": 10.0,
    "autoscaler_instance": "prod",
    "endpoint_state": "active",
    "inactivity_timeout": None,
    "overrecruit_ratio": 1.0,
}


class Serverless:
    """The account's endpoints and deployments (their workers inside), by id."""

    def __init__(self, endpoints: list[dict[str, Any]], deployments: list[dict[str, Any]]) -> None:
        self.endpoints = {e["id"]: e for e in endpoints}
        self.deployments = {d["id"]: d for d in deployments}
        self._next_id = max(self.endpoints, default=100) + 1

    def create_endpoint(self, fields: dict[str, Any], now: float) -> int:
        endpoint_id = self._next_id
        self._next_id += 1
        self.endpoints[endpoint_id] = {
            "id": endpoint_id,
            **ENDPOINT_DEFAULTS,
            "endpoint_name": f"endpoint-{endpoint_id}",
            **fields,
            "deployment_id": None,
            "deleted": False,
            "created_at": now,
        }
        return endpoint_id

    def delete_deployments(self, name: str, tag: str | None, now: float) -> int:
        matches = [
            d
            for d in self.deployments.values()
            if d["name"] == name and (tag is None or d["tag"] == tag) and not d["deleted"]
        ]
        for deployment in matches:
            deployment["deleted"] = True
            deployment["deleted_at"] = now
            for endpoint_id in deployment["endpoint_ids"]:
                if endpoint_id in self.endpoints:
                    self.endpoints[endpoint_id]["deleted"] = True
            for worker in deployment["workers"]:
                worker["deleted"] = True
        return len(matches)

    def deployment_view(self, deployment: dict[str, Any]) -> dict[str, Any]:
        view = {k: v for k, v in deployment.items() if k not in ("endpoint_ids", "workers")}
        view["endpoints"] = [dict(self.endpoints[i]) for i in deployment["endpoint_ids"] if i in self.endpoints]
        view["workers"] = [dict(w) for w in deployment["workers"]]
        return view

    def view(self) -> dict[str, Any]:
        """The endpoints and deployments as ``/_sim/state`` shows them."""
        return {
            "deployments": [self.deployment_view(d) for d in self.deployments.values()],
            "endpoints": [dict(e) for e in self.endpoints.values()],
        }
