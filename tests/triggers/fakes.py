"""A fake async hook for the instance trigger and its shared poller, and a driver that runs a trigger to its first
event."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import GpuMarketNotFoundError
from airflow_gpumarket.hooks.gpumarket import GpuMarketAsyncHook


class FakeAsyncHook:
    """Answers from a script of statuses, one per round (an exception instance is raised).

    The naive trigger reads with find_instance_flow; the shared poller lists, and confirms a missing instance with
    get_instance.
    """

    service_clock_offset = 0.0  # the fake service's clock is this host's
    service_now = GpuMarketAsyncHook.service_now

    def __init__(self, script):
        self.script = list(script)
        self.reads = 0
        self.lists = 0
        self.destroyed: list[int] = []
        self.labels: list[tuple[int, str]] = []
        self.closed = False
        self._confirming: Exception | None = None
        self.log_texts = [""]
        self.log_reads: list[dict] = []
        self.bids: dict = {}  # bid_price and min_bid of instance 7, as the service shows them
        self.bid_changes: list[tuple[int, float]] = []

    def _next(self):
        self.reads += 1
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def _read(self, instance_id):
        if self._confirming is not None:
            item, self._confirming = self._confirming, None
        else:
            item = self._next()
        if isinstance(item, Exception):
            raise item
        return {"id": instance_id, "actual_status": item, **self.bids}

    async def get_instance(self, instance_id):
        return self._read(instance_id)

    async def list_instances(self, *, ids=None, label=None):
        self.lists += 1
        item = self._next()
        if isinstance(item, GpuMarketNotFoundError):
            self._confirming = item
            return []
        if isinstance(item, Exception):
            raise item
        return [{"id": 7, "actual_status": item, **self.bids}, {"id": 8, "actual_status": "running"}]

    # Flows, as the real hook's: answered at once, with nothing for the driver to send.
    def find_instance_flow(self, instance_id):
        try:
            return self._read(instance_id)
        except GpuMarketNotFoundError:
            return None
        yield

    def label_instance_flow(self, instance_id, label):
        self.labels.append((instance_id, label))
        return {"success": True}
        yield

    renew_lease_flow = GpuMarketAsyncHook.renew_lease_flow  # the real one, over the fake's label flow

    def get_instance_logs_flow(self, instance_id, **options):
        self.log_reads.append(options)
        text = self.log_texts.pop(0) if len(self.log_texts) > 1 else self.log_texts[0]
        if isinstance(text, Exception):
            raise text
        return text
        yield

    async def run_flow(self, flow):
        try:
            next(flow)
        except StopIteration as done:
            return done.value
        raise AssertionError("a fake flow asked the driver for something")

    def min_list_interval(self):
        return 1.0 / api.retry.LIST_RATE_PER_SECOND  # the published budget (tests/triggers/conftest.py speeds it up)

    def change_bid_flow(self, instance_id, price):
        self.bid_changes.append((instance_id, price))
        self.bids = {**self.bids, "bid_price": price}
        return {"success": True}
        yield

    async def asettings(self):
        """The connection as the trigger reads it before ending a rental (the fake service's address and key)."""
        from airflow_gpumarket.hooks.connection import ConnectionSettings

        self.settings = ConnectionSettings(base_url="http://127.0.0.1:9", api_key="k")
        return self.settings

    async def destroy_instance(self, instance_id):
        self.destroyed.append(instance_id)
        return {"success": True}

    async def aclose(self):
        self.closed = True


def _run(trigger, hook, monkeypatch):
    monkeypatch.setattr(trigger, "_hook", lambda: hook)

    async def first_event():
        async with aclosing(trigger.run()) as events:  # the triggerer closes a trigger once it fired
            async for event in events:
                return event.payload

    return asyncio.run(first_event())
