"""GpuMarketPendingPriceIncreaseTrigger (triggers/price_increases.py)."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

from airflow_gpumarket.exceptions import GpuMarketAuthError, GpuMarketServerError
from airflow_gpumarket.triggers.price_increases import GpuMarketPendingPriceIncreaseTrigger

INCREASE = {"pending_price_increase_id": 5, "contract_id": 42, "old_gpu_costpersec": 0.2, "new_gpu_costpersec": 0.3}


def test_price_trigger_serialize_round_trip():
    trigger = GpuMarketPendingPriceIncreaseTrigger(gpumarket_conn_id="c", contract_ids=[1], poll_interval=5)
    path, kwargs = trigger.serialize()
    assert path == "airflow_gpumarket.triggers.price_increases.GpuMarketPendingPriceIncreaseTrigger"
    assert GpuMarketPendingPriceIncreaseTrigger(**kwargs).serialize() == (path, kwargs)


class PendingList:
    """An async hook whose pending price increase list answers from a script (an exception instance is raised)."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.closed = False

    async def list_pending_price_increases(self):
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def aclose(self):
        self.closed = True


def first_event(trigger, hook, monkeypatch) -> dict:
    monkeypatch.setattr(trigger, "_hook", lambda: hook)

    async def run():
        async with aclosing(trigger.run()) as events:
            async for event in events:
                return event.payload

    return asyncio.run(run())


def test_the_trigger_polls_until_an_increase_of_its_contracts_is_pending(monkeypatch):
    hook = PendingList(
        GpuMarketServerError("HTTP 503 after retries", status_code=503),  # retries may mend it: still polling
        {"pending_price_increases": [{**INCREASE, "contract_id": 7}]},  # not one of its contracts
        {"pending_price_increases": [INCREASE], "truncated": True},
    )
    trigger = GpuMarketPendingPriceIncreaseTrigger(contract_ids=[42], poll_interval=0)
    assert first_event(trigger, hook, monkeypatch) == {"status": "found", "pending": [INCREASE], "truncated": True}
    assert hook.answers == [] and hook.closed


def test_a_failure_no_retry_mends_ends_the_wait_with_an_error_event(monkeypatch):
    hook = PendingList(GpuMarketAuthError("HTTP 401: the API key was refused", status_code=401))
    event = first_event(GpuMarketPendingPriceIncreaseTrigger(poll_interval=0), hook, monkeypatch)
    assert event == {"status": "error", "message": "HTTP 401: the API key was refused"}
    assert hook.closed
