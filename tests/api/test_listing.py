"""The instance list (``api/listing.py``): the live service's paged v1 list, followed to its last page, and the
spec's v0 list as the fallback of a spec-only server; finding a rental by its label.

Each test is named after one fact of the live service from public reports (see the README's "live service" section).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from hook_fakes import async_hook, methods_and_paths, page, query, url

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import (
    GpuMarketAuthError,
    GpuMarketError,
)

V1 = url(api.PATH_INSTANCES_V1)
V0 = url(api.PATH_INSTANCES)
AUTH_404 = {"status_code": 404, "json": {"error": "auth_error", "msg": "Invalid user key"}}
DEPRECATED_410 = {
    "status_code": 410,
    "json": {
        "success": False,
        "error": "deprecated_endpoint",
        "msg": "/api/v0/instances/ is deprecated. Use /api/v1/instances/ instead.",
    },
}


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


# --- the async twin ----------------------------------------------------------------------------------------
def test_async_live_list_follows_pages_and_falls_back_to_v0(monkeypatch):
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        if request.url.path == api.PATH_INSTANCES_V1:
            if "after_token" in request.url.params:
                return httpx.Response(200, json={"instances": [{"id": 2}], "next_token": None})
            return httpx.Response(200, json={"instances": [{"id": 1}], "next_token": "t1"})
        return httpx.Response(404, json={"error": "not_found"})

    hook = async_hook(monkeypatch, handler)

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

    hook = async_hook(monkeypatch, handler)

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


# --- Finding a rental by its label -----------------------------------------------------------------------------
def test_find_by_label_returns_the_newest_match_or_none():
    instances = [{"id": 1, "label": "a"}, {"id": 3, "label": "a"}, {"id": 2, "label": "b"}]
    assert api.find_by_label(instances, "a") == {"id": 3, "label": "a"}
    assert api.find_by_label(instances, "c") is None
