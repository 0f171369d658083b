"""Flows for fake sync hooks, answered from the fake's own methods.

The real hook's flows (``hooks.core``) call the service. A fake answers from ``find_instance``, ``label_instance``
and ``get_instance_logs`` instead, and the code under test still goes through ``run_flow``, as with the real hook.
"""

from __future__ import annotations

from typing import Any

from airflow_gpumarket.hooks.gpumarket import GpuMarketHook


class FlowsOverMethods:
    """Mix into a fake hook that has ``find_instance``, ``label_instance`` and/or ``get_instance_logs``."""

    renew_lease_flow = GpuMarketHook.renew_lease_flow  # the real one, over the fake's label flow
    service_clock_offset = 0.0  # the fake service's clock is this host's
    service_now = GpuMarketHook.service_now

    def find_instance_flow(self, instance_id: int) -> Any:
        return self.find_instance(instance_id)  # type: ignore[attr-defined]
        yield

    def label_instance_flow(self, instance_id: int, label: str) -> Any:
        return self.label_instance(instance_id, label)  # type: ignore[attr-defined]
        yield

    def get_instance_logs_flow(self, instance_id: int, **options: Any) -> Any:
        return self.get_instance_logs(instance_id, **options)  # type: ignore[attr-defined]
        yield

    def run_flow(self, flow: Any) -> Any:
        try:
            next(flow)
        except StopIteration as done:
            return done.value
        raise AssertionError("a fake hook's flow asked its driver for something")
