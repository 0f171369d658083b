"""Request budgets, patience and the retry policy (``api/retry.py``): how long to wait before another try, what may be
sent again, which calls wait out 429s, and the slot each call waits for in its budget."""

from __future__ import annotations

import time

import pytest
from hook_fakes import page, url

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import (
    GpuMarketError,
    GpuMarketQuotaExceededError,
    GpuMarketRateLimitError,
    GpuMarketServerError,
    GpuMarketTransportError,
)

INSTANCE_7 = url(api.PATH_INSTANCE.format(instance_id=7))
CALLS = {
    "create_instance": lambda hook: hook.create_instance(101, image="img"),
    "destroy_instance": lambda hook: hook.destroy_instance(7),
    "search_offers": lambda hook: hook.search_offers(),
    "label_instance": lambda hook: hook.label_instance(7, "x"),
    "stop_instance": lambda hook: hook.stop_instance(7),
    # A periodic read of a running job's log: one try only, but in its slot all the same.
    "request_instance_logs": lambda hook: hook.request_instance_logs(7, retry=False),
}
V1 = url(api.PATH_INSTANCES_V1)
ASK = url(api.PATH_CREATE_INSTANCE.format(offer_id=101))


# --- The pure retry decisions ------------------------------------------------------------------------------
def test_retry_wait_seconds_uses_retry_after_capped_at_max_retry_after():
    policy = api.RetryPolicy(min_wait=1, max_wait=60, max_retry_after=300)
    limited = GpuMarketRateLimitError("x", retry_after=12.5)

    assert api.retry_wait_seconds(limited, 1, policy, 0.0) == 12.5
    assert api.retry_wait_seconds(GpuMarketRateLimitError("x", retry_after=9999), 1, policy, 0.0) == 300
    assert api.retry_wait_seconds(GpuMarketRateLimitError("x"), 3, policy, 1.0) == 4.0


def test_retry_wait_seconds_backoff_doubles_and_caps():
    policy = api.RetryPolicy(min_wait=1, max_wait=10)
    waits = [api.retry_wait_seconds(GpuMarketServerError("x"), attempt, policy, 1.0) for attempt in range(1, 7)]

    assert waits == [1, 2, 4, 8, 10, 10]


@pytest.mark.parametrize(
    ("exc", "surely_not_processed"),
    [
        (GpuMarketRateLimitError("x", status_code=429), True),
        (GpuMarketServerError("x", status_code=503), True),
        (GpuMarketServerError("x", status_code=502), False),
        (GpuMarketServerError("x", status_code=500), False),
        (GpuMarketTransportError("x", request_sent=False), True),
        (GpuMarketTransportError("x", request_sent=True), False),
    ],
    ids=["429", "503", "502", "500", "never-connected", "maybe-sent"],
)
def test_create_surely_not_processed(exc, surely_not_processed):
    assert api.create_surely_not_processed(exc) is surely_not_processed


# --- Patience: the calls that wait out 429s, within bounds -----------------------------------------------------
def test_a_search_keeps_trying_through_429s_beyond_max_retries(requests_mock, hook):
    # A fleet starting at once searches at once; a refused search did nothing, so it waits its turn.
    requests_mock.post(
        url(api.PATH_SEARCH_OFFERS),
        [{"status_code": 429, "text": "API requests too frequent"}] * 8 + [{"json": {"offers": []}}],
    )

    assert hook.search_offers() == []
    assert requests_mock.call_count == 9  # the connection allows 3 retries


def test_live_plain_text_429_without_retry_after_backs_off_with_jitter(requests_mock, hook, sleeps, set_conn):
    set_conn(extra={"max_retries": 6, "retry_min_wait": 1, "retry_max_wait": 60, "rate_limit_scale": 0})
    requests_mock.get(
        INSTANCE_7,
        [{"status_code": 429, "text": "API requests too frequent"}] * 6 + [{"json": {"instances": {"id": 7}}}],
    )

    assert hook.get_instance(7) == {"id": 7}
    assert len(sleeps) == 6
    # exponential from 1 s, each in the upper half of its step, never above the plain-429 cap
    for attempt, waited in enumerate(sleeps, start=1):
        step = min(api.RATE_LIMIT_BACKOFF_CAP_SECONDS, 2 ** (attempt - 1))
        assert step / 2 <= waited <= step


def test_a_retry_after_longer_than_the_cap_fails_at_once(requests_mock, hook, sleeps):
    requests_mock.get(INSTANCE_7, status_code=429, headers={"Retry-After": "3600"}, text="slow down")

    with pytest.raises(GpuMarketQuotaExceededError):
        hook.get_instance(7)
    assert sleeps == []


def test_destroy_storm_keeps_destroying_through_429s_beyond_max_retries(requests_mock, hook, sleeps):
    rejections = [{"status_code": 429, "text": "API requests too frequent"}] * 12
    requests_mock.delete(INSTANCE_7, [*rejections, {"json": {"success": True}}])

    assert hook.destroy_instance(7) == {"success": True}
    assert requests_mock.call_count == 13  # the connection allows 3 retries; a destroy does not give up on 429s


def test_destroy_with_retries_off_is_still_patient_with_429s(requests_mock, hook, set_conn):
    set_conn(extra={"max_retries": 0, "retry_min_wait": 0, "retry_max_wait": 0})
    requests_mock.delete(INSTANCE_7, [{"status_code": 429, "text": "too frequent"}, {"json": {"success": True}}])

    assert hook.destroy_instance(7) == {"success": True}


def test_destroy_still_stops_after_max_retries_of_5xx(requests_mock, hook):
    requests_mock.delete(INSTANCE_7, status_code=503, json={"msg": "down"})

    with pytest.raises(GpuMarketError):
        hook.destroy_instance(7)
    assert requests_mock.call_count == 4


# --- Request budgets: each call waits for a slot of its budget -------------------------------------------------
def test_live_list_pages_are_spaced_a_little_wider_than_the_published_list_rate(requests_mock, hook, sleeps):
    requests_mock.get(V1, [page([{"id": 1}], next_token="t1"), page([{"id": 2}])])

    hook.list_instances()

    from airflow_gpumarket.hooks.core import slot_seconds

    assert len(sleeps) == 1
    assert 1 / api.LIST_RATE_PER_SECOND < sleeps[0] <= slot_seconds("list_instances") <= 1.2 / api.LIST_RATE_PER_SECOND


def test_a_rate_limited_list_page_is_retried_in_a_slot_of_the_list_budget_of_its_own(requests_mock, hook, sleeps):
    """A retry sent outside the budget draws the next page's 429 (each refusal costs a penalty token): the retry
    books its own slot, after its backoff."""
    requests_mock.get(V1, [{"status_code": 429, "text": "API requests too frequent"}, page([{"id": 1}])])

    assert hook.list_instances() == [{"id": 1}]

    from airflow_gpumarket.hooks.core import slot_seconds

    backoff, slot = sleeps
    assert backoff == 0.0  # the connection's retry_min_wait is 0
    assert 1 / api.LIST_RATE_PER_SECOND < slot <= slot_seconds("list_instances")


@pytest.fixture
def answers(requests_mock):
    requests_mock.put(ASK, json={"success": True, "new_contract": 7, "instance_api_key": "k" * 24})
    requests_mock.delete(INSTANCE_7, json={"success": True})
    requests_mock.put(INSTANCE_7, json={"success": True})
    requests_mock.post(url(api.PATH_SEARCH_OFFERS), json={"offers": []})
    requests_mock.put(url(api.PATH_REQUEST_LOGS.format(instance_id=7)), json={"success": True, "result_url": "x"})
    return requests_mock


@pytest.mark.parametrize("operation", sorted(CALLS))
def test_calls_of_every_hook_take_turns_in_their_budget(answers, sleeps, operation):
    """Twenty mapped tasks renting (or failing) at once on one key: each call books a slot a little wider than
    the budget's interval, so none draws a 429 and its penalty."""
    from airflow_gpumarket.hooks.core import slot_seconds
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    for _ in range(3):
        CALLS[operation](GpuMarketHook())

    rate = api.rate_budget(operation)[1]
    assert len(sleeps) == 2
    assert all(1 / rate < wait <= slot_seconds(operation) for wait in sleeps)


def test_a_label_and_a_stop_share_the_budget_of_changing_an_instance(answers, sleeps):
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    CALLS["label_instance"](GpuMarketHook())
    CALLS["stop_instance"](GpuMarketHook())
    assert len(sleeps) == 1 and sleeps[0] > 1 / api.CHANGE_RATE_PER_SECOND


def test_rate_limit_scale_extra_scales_the_budgets_and_zero_turns_pacing_off(requests_mock, sleeps, set_conn):
    from airflow_gpumarket.hooks.core import slot_seconds
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    requests_mock.delete(INSTANCE_7, json={"success": True})
    set_conn(extra={"rate_limit_scale": "10"})  # as a URI gives it: a string
    GpuMarketHook().destroy_instance(7)
    GpuMarketHook().destroy_instance(7)
    assert sleeps == [pytest.approx(slot_seconds("destroy_instance", 10), abs=0.05)]
    assert slot_seconds("destroy_instance", 10) < 1 / api.DESTROY_RATE_PER_SECOND / 5

    sleeps.clear()
    set_conn(extra={"rate_limit_scale": 0})  # a server without limits: the simulator's spec profile
    GpuMarketHook().destroy_instance(7)
    GpuMarketHook().destroy_instance(7)
    assert sleeps == []


def test_list_calls_of_every_hook_of_this_process_share_one_budget(requests_mock, sleeps):
    """Two hooks (two tasks of one worker, a reaper beside a sensor) on one key: the second waits for its slot."""
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    requests_mock.get(V1, **page([{"id": 1}]))
    started = time.time()
    GpuMarketHook().list_instances()
    GpuMarketHook().list_instances()

    # spaced from the first booking by the list's interval, of which the time the calls took is already gone
    assert len(sleeps) == 1 and sleeps[0] > 1 / api.LIST_RATE_PER_SECOND - (time.time() - started)


def test_successive_listings_of_one_hook_are_spaced_too(requests_mock, hook, sleeps):
    requests_mock.get(V1, **page([{"id": 1}]))

    started = time.time()
    hook.list_instances()
    hook.list_instances()  # the shared poller's next round, right after the last page of this one

    assert len(sleeps) == 1 and sleeps[0] > 1 / api.LIST_RATE_PER_SECOND - (time.time() - started)
