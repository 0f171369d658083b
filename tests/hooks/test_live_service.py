"""The live service where it has moved past api-reference.md (see the README's "live service" section).

Each test is named after one fact of the live service from public reports: the paged v1 instance list, the
error shapes of a bad key and of a missing instance, and its rate limits.
"""

from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from hook_fakes import API_KEY, conn_json, methods_and_paths, url

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import (
    GpuMarketAuthError,
    GpuMarketError,
    GpuMarketNotFoundError,
    GpuMarketOfferUnavailableError,
    GpuMarketQuotaExceededError,
    GpuMarketRateLimitError,
)

V1 = url(api.PATH_INSTANCES_V1)
V0 = url(api.PATH_INSTANCES)
INSTANCE_7 = url(api.PATH_INSTANCE.format(instance_id=7))
ASK = url(api.PATH_CREATE_INSTANCE.format(offer_id=101))
AUTH_404 = {"status_code": 404, "json": {"error": "auth_error", "msg": "Invalid user key"}}
DEPRECATED_410 = {
    "status_code": 410,
    "json": {
        "success": False,
        "error": "deprecated_endpoint",
        "msg": "/api/v0/instances/ is deprecated. Use /api/v1/instances/ instead.",
    },
}


def page(instances, next_token=None, total=None):
    return {
        "json": {
            "instances": instances,
            "instances_found": len(instances),
            "total_instances": len(instances) if total is None else total,
            "next_token": next_token,
        }
    }


def query(request) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(request.url).query).items()}


# --- listing -----------------------------------------------------------------------------------------------
def test_live_list_follows_next_token_to_the_last_page(requests_mock, hook):
    requests_mock.get(
        V1,
        [
            page([{"id": 1}, {"id": 2}], next_token="t1", total=5),
            page([{"id": 3}, {"id": 4}], next_token="t2", total=5),
            page([{"id": 5}], next_token=None, total=5),
        ],
    )

    assert [i["id"] for i in hook.list_instances()] == [1, 2, 3, 4, 5]
    sent = [query(r) for r in requests_mock.request_history]
    assert [q.get("after_token") for q in sent] == [None, "t1", "t2"]
    assert all(q["limit"] == str(api.LIST_PAGE_LIMIT) for q in sent)


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


CALLS = {
    "create_instance": lambda hook: hook.create_instance(101, image="img"),
    "destroy_instance": lambda hook: hook.destroy_instance(7),
    "search_offers": lambda hook: hook.search_offers(),
    "label_instance": lambda hook: hook.label_instance(7, "x"),
    "stop_instance": lambda hook: hook.stop_instance(7),
    # A periodic read of a running job's log: one try only, but in its slot all the same.
    "request_instance_logs": lambda hook: hook.request_instance_logs(7, retry=False),
}


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


def test_a_search_keeps_trying_through_429s_beyond_max_retries(requests_mock, hook):
    # A fleet starting at once searches at once; a refused search did nothing, so it waits its turn.
    requests_mock.post(
        url(api.PATH_SEARCH_OFFERS),
        [{"status_code": 429, "text": "API requests too frequent"}] * 8 + [{"json": {"offers": []}}],
    )

    assert hook.search_offers() == []
    assert requests_mock.call_count == 9  # the connection allows 3 retries


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
    GpuMarketHook().list_instances()
    GpuMarketHook().list_instances()

    assert len(sleeps) == 1 and sleeps[0] > 1 / api.LIST_RATE_PER_SECOND


def test_live_list_v0_410_is_never_used_when_v1_answers(requests_mock, hook):
    requests_mock.get(V0, **DEPRECATED_410)
    requests_mock.get(V1, **page([{"id": 1}]))

    assert hook.list_instances() == [{"id": 1}]
    assert [p for _, p in methods_and_paths(requests_mock)] == [V1]


def test_live_list_by_label_is_one_filtered_call(requests_mock, hook):
    requests_mock.get(V1, **page([{"id": 9, "label": "afgm-x"}]))

    assert hook.list_instances(label="afgm-x") == [{"id": 9, "label": "afgm-x"}]
    assert requests_mock.call_count == 1
    assert json.loads(query(requests_mock.last_request)["select_filters"]) == {"label": {"eq": "afgm-x"}}


def test_live_list_filters_are_applied_again_when_the_server_ignores_them(requests_mock, hook):
    requests_mock.get(V1, **page([{"id": 1, "label": "other"}, {"id": 2, "label": "mine"}, {"id": 3}]))

    assert hook.list_instances(label="mine") == [{"id": 2, "label": "mine"}]
    assert hook.list_instances(ids=[3, 1]) == [{"id": 1, "label": "other"}, {"id": 3}]


def test_live_list_by_ids_asks_in_chunks_of_one_page(requests_mock, hook):
    ids = list(range(1, 31))
    requests_mock.get(V1, [page([{"id": i} for i in ids[:25]]), page([{"id": i} for i in ids[25:]])])

    assert sorted(i["id"] for i in hook.list_instances(ids=ids)) == ids
    chunks = [json.loads(query(r)["select_filters"])["id"]["in"] for r in requests_mock.request_history]
    assert chunks == [ids[:25], ids[25:]]


def test_live_list_by_no_ids_sends_nothing(requests_mock, hook):
    assert hook.list_instances(ids=[]) == []
    assert requests_mock.call_count == 0


def test_live_list_a_repeated_next_token_fails_instead_of_looping(requests_mock, hook):
    requests_mock.get(V1, [page([{"id": 1}], next_token="same"), page([{"id": 2}], next_token="same")])

    with pytest.raises(GpuMarketError, match="kept answering with more pages"):
        hook.list_instances()


def test_live_list_stops_after_the_page_bound(requests_mock, hook, monkeypatch):
    monkeypatch.setattr(api.listing, "MAX_LIST_PAGES", 3)
    requests_mock.get(V1, [page([{"id": n}], next_token=f"t{n}") for n in range(1, 10)])

    with pytest.raises(GpuMarketError, match="3 read"):
        hook.list_instances()
    assert requests_mock.call_count == 3


@pytest.mark.parametrize("status", [404, 405])
def test_spec_only_server_without_v1_falls_back_to_the_v0_list_and_remembers(requests_mock, hook, status):
    requests_mock.get(V1, status_code=status, json={"error": "not_found", "msg": "No such path"})
    requests_mock.get(V0, json={"instances_found": 1, "instances": [{"id": 4, "label": "a"}]})

    assert hook.list_instances() == [{"id": 4, "label": "a"}]
    assert hook.list_instances(label="b") == []
    assert [p for _, p in methods_and_paths(requests_mock)] == [V1, V0, V0]


def test_live_list_bad_key_404_auth_error_is_an_auth_error_not_a_fallback(requests_mock, hook):
    requests_mock.get(V1, **AUTH_404)
    requests_mock.get(V0, json={"instances": []})

    with pytest.raises(GpuMarketAuthError, match="Invalid user key"):
        hook.list_instances()
    assert requests_mock.call_count == 1


def test_test_connection_succeeds_on_the_live_v1_list_with_one_row(requests_mock, hook):
    requests_mock.get(V1, **page([{"id": 1}], next_token="t", total=40))

    ok, message = hook.test_connection()

    assert ok, message
    assert "40 instance(s)" in message
    assert query(requests_mock.last_request)["limit"] == "1"


def test_test_connection_succeeds_on_a_spec_only_server(requests_mock, hook):
    requests_mock.get(V1, status_code=404, json={"error": "not_found"})
    requests_mock.get(V0, json={"instances_found": 2, "instances": [{"id": 1}, {"id": 2}]})

    ok, message = hook.test_connection()

    assert ok, message
    assert "2 instance(s)" in message


def test_test_connection_reports_a_live_bad_key(requests_mock, hook):
    requests_mock.get(V1, **AUTH_404)

    ok, message = hook.test_connection()

    assert not ok
    assert "API key" in message and API_KEY not in message


# --- error shapes ------------------------------------------------------------------------------------------
def test_live_bad_key_404_auth_error_on_destroy_is_an_auth_error_never_already_gone(requests_mock, hook):
    requests_mock.delete(INSTANCE_7, **AUTH_404)

    with pytest.raises(GpuMarketAuthError):
        hook.destroy_instance(7)
    assert requests_mock.call_count == 1  # not retried: a wrong key stays wrong


def test_live_bad_key_404_auth_error_on_read_is_an_auth_error_not_gone(requests_mock, hook):
    requests_mock.get(INSTANCE_7, **AUTH_404)

    with pytest.raises(GpuMarketAuthError):
        hook.get_instance(7)


def test_auth_error_in_a_200_success_false_body_is_an_auth_error(requests_mock, hook):
    requests_mock.get(INSTANCE_7, json={"success": False, "error": "auth_error", "msg": "Invalid user key"})

    with pytest.raises(GpuMarketAuthError):
        hook.get_instance(7)


def test_live_read_of_a_missing_instance_answers_null_which_is_not_found(requests_mock, hook):
    requests_mock.get(INSTANCE_7, json={"instances": None})

    with pytest.raises(GpuMarketNotFoundError, match="instance 7 does not exist"):
        hook.get_instance(7)


def test_a_read_without_an_instances_key_is_an_error_not_gone(requests_mock, hook):
    requests_mock.get(INSTANCE_7, json={"result": "maintenance"})

    with pytest.raises(GpuMarketError) as caught:
        hook.get_instance(7)
    assert not isinstance(caught.value, GpuMarketNotFoundError)


def test_live_destroy_of_a_destroyed_instance_404_no_such_instance_is_already_gone(requests_mock, hook):
    requests_mock.delete(INSTANCE_7, status_code=404, json={"error": "no_such_instance", "msg": "no such instance"})

    assert hook.destroy_instance(7) == {"success": True, "already_gone": True}


def test_a_404_without_the_service_error_object_is_not_already_gone(requests_mock, hook):
    requests_mock.delete(INSTANCE_7, status_code=404, text="<html>Not Found</html>")

    with pytest.raises(GpuMarketError, match="base URL") as caught:
        hook.destroy_instance(7)
    assert not isinstance(caught.value, GpuMarketNotFoundError)


def test_find_instance_believes_gone_only_when_the_list_agrees(requests_mock, hook):
    requests_mock.get(INSTANCE_7, json={"instances": None})
    requests_mock.get(V1, [page([{"id": 7, "actual_status": "running"}]), page([])])

    assert hook.find_instance(7) == {"id": 7, "actual_status": "running"}  # the read was wrong: still listed
    assert hook.find_instance(7) is None  # read and list agree


def test_find_instance_returns_the_read_without_listing(requests_mock, hook):
    requests_mock.get(INSTANCE_7, json={"instances": {"id": 7, "actual_status": "loading"}})

    assert hook.find_instance(7) == {"id": 7, "actual_status": "loading"}
    assert requests_mock.call_count == 1


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (404, {"error": "invalid_args", "msg": "error 404/3603: no_such_ask  Instance type 101 is not available."}),
        (410, {"error": "no_such_ask", "msg": "Offer 101 is no longer available"}),
    ],
)
def test_live_offer_gone_at_create_is_offer_unavailable(requests_mock, hook, status, body):
    requests_mock.put(ASK, status_code=status, json=body)

    with pytest.raises(GpuMarketOfferUnavailableError):
        hook.create_instance(101, image="img", cancel_unavail=status == 410)
    assert requests_mock.call_count == 1


def test_live_bad_key_404_on_create_is_an_auth_error_not_offer_unavailable(requests_mock, hook):
    requests_mock.put(ASK, **AUTH_404)

    with pytest.raises(GpuMarketAuthError):
        hook.create_instance(101, image="img")


def test_label_instance_puts_the_label_as_the_live_service_does(requests_mock, hook):
    requests_mock.put(INSTANCE_7, json={"success": True})

    hook.label_instance(7, "afgm-new")

    assert requests_mock.last_request.json() == {"label": "afgm-new"}


def test_a_lease_renewal_writes_the_renewed_label_and_a_refused_one_is_only_reported(requests_mock, hook, caplog):
    from airflow_gpumarket import lifecycle

    key = "0" * 12
    watch = lifecycle.Watch(label=lifecycle.make_label(key, 100), keepalive=90, lease_cap=1000)
    log = logging.getLogger("test.renewal")
    requests_mock.put(INSTANCE_7, [{"status_code": 400, "json": {"error": "invalid_args", "msg": "no"}}, {"json": {}}])

    assert hook.run_flow(hook.renew_lease_flow(7, watch, 20, log)) is None  # 80 of 90 s left: not due
    assert not requests_mock.called
    with caplog.at_level(logging.WARNING, logger="test.renewal"):
        assert hook.run_flow(hook.renew_lease_flow(7, watch, 50, log)) is None
    assert watch.label == lifecycle.make_label(key, 100)  # refused: the old lease stands, the next read tries again
    assert "Could not renew the lease of instance 7" in caplog.text
    renewed = hook.run_flow(hook.renew_lease_flow(7, watch, 50, log))
    assert renewed == watch.label == lifecycle.make_label(key, 140)
    assert requests_mock.last_request.json() == {"label": renewed}


# --- rate limits -------------------------------------------------------------------------------------------
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


def test_live_plain_text_429_body_is_quoted_in_the_error(requests_mock, hook, set_conn):
    set_conn(extra={"max_retries": 0})
    requests_mock.get(INSTANCE_7, status_code=429, text="GET /api/v0/instances/7/ endpoint threshold=2.0")

    with pytest.raises(GpuMarketRateLimitError, match="threshold=2.0"):
        hook.get_instance(7)


@pytest.mark.parametrize("reset", ["7", "reset-epoch"])
def test_x_ratelimit_reset_is_honoured_as_seconds_or_epoch(requests_mock, hook, sleeps, reset):
    import time

    value = str(int(time.time()) + 7) if reset == "reset-epoch" else reset
    requests_mock.get(
        INSTANCE_7, [{"status_code": 429, "headers": {"X-RateLimit-Reset": value}}, {"json": {"instances": {"id": 7}}}]
    )

    hook.get_instance(7)

    assert 5 <= sleeps[0] <= 7


def test_live_search_quota_exceeded_fails_at_once_with_the_reset_time(requests_mock, hook, sleeps):
    requests_mock.post(
        url(api.PATH_SEARCH_OFFERS),
        status_code=429,
        headers={"Retry-After": str(5 * 3600)},
        json={"error": "search_quota_exceeded", "msg": "Daily search quota exceeded"},
    )

    with pytest.raises(GpuMarketQuotaExceededError, match="resets in about 5 h 0 min") as caught:
        hook.search_offers()
    assert requests_mock.call_count == 1 and sleeps == []
    assert caught.value.retry_after == 5 * 3600


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


# --- the async twin ----------------------------------------------------------------------------------------
def _async_hook(monkeypatch, handler):
    from airflow_gpumarket.hooks.gpumarket import GpuMarketAsyncHook

    monkeypatch.setenv("AIRFLOW_CONN_GPUMARKET_DEFAULT", conn_json())
    hook = GpuMarketAsyncHook()
    real = httpx.AsyncClient

    def client(**kwargs):
        return real(transport=httpx.MockTransport(handler), **kwargs)

    monkeypatch.setattr(httpx, "AsyncClient", client)
    return hook


def test_async_live_list_follows_pages_and_falls_back_to_v0(monkeypatch):
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        if request.url.path == api.PATH_INSTANCES_V1:
            if "after_token" in request.url.params:
                return httpx.Response(200, json={"instances": [{"id": 2}], "next_token": None})
            return httpx.Response(200, json={"instances": [{"id": 1}], "next_token": "t1"})
        return httpx.Response(404, json={"error": "not_found"})

    hook = _async_hook(monkeypatch, handler)

    async def run():
        await hook.asettings()
        try:
            return await hook.list_instances()
        finally:
            await hook.aclose()

    monkeypatch.setattr(asyncio, "sleep", _no_sleep)
    assert [i["id"] for i in asyncio.run(run())] == [1, 2]
    assert len(seen) == 2


def test_async_spec_only_server_falls_back_to_v0(monkeypatch):
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == api.PATH_INSTANCES:
            return httpx.Response(200, json={"instances": [{"id": 5}]})
        if request.url.path == api.PATH_INSTANCE.format(instance_id=6):
            return httpx.Response(200, json={"instances": None})
        return httpx.Response(405, json={"error": "method_not_allowed"})

    hook = _async_hook(monkeypatch, handler)

    async def run():
        await hook.asettings()
        try:
            return await hook.list_instances(ids=[5]), await hook.find_instance(6)
        finally:
            await hook.aclose()

    listed, missing = asyncio.run(run())
    assert listed == [{"id": 5}]
    assert missing is None  # the read said null and the (v0) list agrees


async def _no_sleep(seconds: float) -> None:
    return None


def test_async_live_bad_key_on_destroy_is_an_auth_error(monkeypatch):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"error": "auth_error", "msg": "Invalid user key"})

    hook = _async_hook(monkeypatch, handler)

    async def run():
        await hook.asettings()
        try:
            await hook.destroy_instance(7)
        finally:
            await hook.aclose()

    with pytest.raises(GpuMarketAuthError):
        asyncio.run(run())


def test_async_client_keeps_idle_connections_shorter_than_servers_do(monkeypatch):
    from airflow_gpumarket.hooks import gpumarket

    captured = {}

    def client(**kwargs):
        captured.update(kwargs)
        return object()

    hook = gpumarket.GpuMarketAsyncHook()
    from airflow_gpumarket.hooks.connection import settings_from_connection

    hook.__dict__["settings"] = settings_from_connection("c", "https://api.example.com", None, "k", {})
    monkeypatch.setattr(httpx, "AsyncClient", client)
    hook.client  # noqa: B018 - building the client is what is tested

    # uvicorn's default idle timeout is 5 s and load balancers use 60 s: a pooled connection must expire first
    assert captured["limits"].keepalive_expiry < 5


def test_successive_listings_of_one_hook_are_spaced_too(requests_mock, hook, sleeps):
    requests_mock.get(V1, **page([{"id": 1}]))

    hook.list_instances()
    hook.list_instances()  # the shared poller's next round, right after the last page of this one

    assert len(sleeps) == 1 and sleeps[0] > 1 / api.LIST_RATE_PER_SECOND


def test_the_hook_learns_the_services_clock_from_the_date_header_of_its_answers(requests_mock, hook):
    import time
    from email.utils import formatdate

    ahead = time.time() + 3600
    requests_mock.get(V1, json={"instances": [], "next_token": None}, headers={"Date": formatdate(ahead, usegmt=True)})
    assert hook.service_clock_offset == 0.0  # nothing heard yet
    hook.list_instances()
    assert hook.service_clock_offset == pytest.approx(3600, abs=2)
    requests_mock.get(V1, json={"instances": [], "next_token": None}, headers={"Date": "not a date"})
    hook.list_instances()
    assert hook.service_clock_offset == pytest.approx(3600, abs=2)  # a bad header keeps what was known
