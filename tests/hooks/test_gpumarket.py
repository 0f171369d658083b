"""GpuMarketHook and GpuMarketAsyncHook (``hooks/gpumarket.py``): one test per endpoint of the spec (the exact method,
URL with the spec's trailing slashes, headers and JSON body the hook sends, and the result it returns), the async
hook's twin of each, and ``test_connection``."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
from hook_fakes import API_KEY, AUTH_HEADER, BASE_URL, methods_and_urls, page, query, run, url

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import (
    GpuMarketAuthError,
    GpuMarketNotFoundError,
    GpuMarketServerError,
)
from airflow_gpumarket.hooks.gpumarket import GpuMarketAsyncHook

NO_BODY = object()
OFFERS = [
    {"id": 101, "num_gpus": 1, "gpu_name": "RTX 4090", "gpu_ram": 24564, "dph_total": 0.41, "rentable": True},
    {"id": 102, "num_gpus": 2, "gpu_name": "RTX 4090", "gpu_ram": 24564, "dph_total": 0.80, "rentable": True},
]
CREATED = {"success": True, "new_contract": 7001, "instance_api_key": "inst-key-0123456789abcdef"}
INSTANCE = {
    "id": 7001,
    "actual_status": "running",
    "label": "nightly-train",
    "ssh_host": "ssh4.example",
    "ssh_port": 2222,
}
VOLUME_RESULT = {
    "success": True,
    "you_sent": {"machine": 17},
    "results": [
        {"machine_id": 17, "user_id": 3, "extended": 0, "new_contracts": [{"id": 9, "size": 100}], "upd_contracts": []}
    ],
}
ENDPOINT_FIELDS = {
    "min_load": 10,
    "min_cold_load": 5,
    "target_util": 0.9,
    "cold_mult": 2.5,
    "cold_workers": 2,
    "max_workers": 16,
    "max_queue_time": 30.0,
    "target_queue_time": 10.0,
    "autoscaler_instance": "prod",
    "endpoint_state": "active",
    "endpoint_name": "llama-serve",
    "inactivity_timeout": 600,
    "overrecruit_ratio": 1.5,
}
BACKUP_CODES = [f"bkp-{i:02d}-x7y8z9" for i in range(10)]
V1 = url(api.PATH_INSTANCES_V1)
V0 = url(api.PATH_INSTANCES)
AUTH_404 = {"status_code": 404, "json": {"error": "auth_error", "msg": "Invalid user key"}}


def assert_sent(mocker, method: str, path: str, body=NO_BODY) -> None:
    """Exactly one request was sent, with this method, URL, bearer header and JSON body (or no body at all)."""
    assert methods_and_urls(mocker) == [(method, url(path))]
    request = mocker.last_request
    assert request.headers["Authorization"] == AUTH_HEADER
    assert request.headers["Accept"] == "application/json"
    if body is NO_BODY:
        assert request.body is None
        assert "Content-Type" not in request.headers
    else:
        assert request.headers["Content-Type"] == "application/json"
        assert request.json() == body


# --- Search offers: POST /api/v0/bundles/ ------------------------------------------------------------------


def test_search_offers_posts_filter_object_to_bundles_with_trailing_slash_and_returns_offers(requests_mock, hook):
    requests_mock.post(url("/api/v0/bundles/"), json={"offers": OFFERS})

    offers = hook.search_offers({"gpu_name": {"eq": "RTX 4090"}, "num_gpus": {"gte": 1}})

    assert offers == OFFERS
    assert_sent(
        requests_mock,
        "POST",
        "/api/v0/bundles/",
        {"gpu_name": {"eq": "RTX 4090"}, "num_gpus": {"gte": 1}, "type": "ondemand"},
    )


def test_search_offers_sends_in_as_array_type_limit_and_order_pairs(requests_mock, hook):
    requests_mock.post(url("/api/v0/bundles/"), json={"offers": []})

    offers = hook.search_offers(
        {"gpu_name": {"in": ("RTX 4090", "A100")}, "verified": {"eq": True}},
        offer_type="bid",
        limit=5,
        order=[("dlperf_per_dphtotal", "desc"), ["dph_total", "asc"]],
    )

    assert offers == []
    assert_sent(
        requests_mock,
        "POST",
        "/api/v0/bundles/",
        {
            "gpu_name": {"in": ["RTX 4090", "A100"]},
            "verified": {"eq": True},
            "type": "bid",
            "limit": 5,
            "order": [["dlperf_per_dphtotal", "desc"], ["dph_total", "asc"]],
        },
    )


def test_search_offers_without_filters_sends_only_the_offer_type(requests_mock, hook):
    requests_mock.post(url("/api/v0/bundles/"), json={"offers": OFFERS[:1]})

    assert hook.search_offers(offer_type="on-demand") == OFFERS[:1]
    assert_sent(requests_mock, "POST", "/api/v0/bundles/", {"type": "on-demand"})


def test_search_offers_accepts_offer_query_builder_filters(requests_mock, hook):
    from airflow_gpumarket.api import OfferQuery

    requests_mock.post(url("/api/v0/bundles/"), json={"offers": OFFERS})
    query = OfferQuery().eq("gpu_name", "RTX 4090").gte("reliability", 0.98).is_in("num_gpus", (1, 2))

    hook.search_offers(query.filters, limit=2)

    assert requests_mock.last_request.json() == {
        "gpu_name": {"eq": "RTX 4090"},
        "reliability": {"gte": 0.98},
        "num_gpus": {"in": [1, 2]},
        "type": "ondemand",
        "limit": 2,
    }


# --- Create instance: PUT /api/v0/asks/{offer_id}/ ---------------------------------------------------------


def test_create_instance_puts_only_given_fields_to_asks_offer_id_and_returns_the_response(requests_mock, hook):
    requests_mock.put(url("/api/v0/asks/101/"), json=CREATED)

    result = hook.create_instance(101, image="pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime")

    assert result == CREATED
    assert_sent(requests_mock, "PUT", "/api/v0/asks/101/", {"image": "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime"})


def test_create_instance_sends_every_creation_field_exactly(requests_mock, hook):
    requests_mock.put(url("/api/v0/asks/202/"), json=CREATED)
    fields = {
        "image": "ghcr.io/acme/trainer:1.4",
        "template_hash_id": "4e17788f74f075dd9aab7d0d4427968f",
        "label": "nightly-train",
        "disk": 40,
        "runtype": "jupyter_direct",
        "target_state": "stopped",
        "price": 0.35,
        "env": {"HF_HOME": "/workspace/hf", "-p 8080:8080": "1", "-p 22:22": "1"},
        "onstart": "cd /workspace && python train.py",
        "use_jupyter_lab": True,
        "jupyter_dir": "/workspace",
        "python_utf8": True,
        "lang_utf8": False,
        "image_login": "-u robot -p ghp_token123 ghcr.io",
        "cancel_unavail": True,
        "vm": False,
        "volume_info": {"volume_id": 55, "mount_path": "/workspace/data"},
    }

    hook.create_instance(202, **fields)

    assert_sent(requests_mock, "PUT", "/api/v0/asks/202/", fields)


def test_create_instance_with_template_only_sends_template_hash_id_without_image(requests_mock, hook):
    requests_mock.put(url("/api/v0/asks/303/"), json=CREATED)

    hook.create_instance(303, template_hash_id="4e17788f74f075dd9aab7d0d4427968f", label="from-template")

    assert_sent(
        requests_mock,
        "PUT",
        "/api/v0/asks/303/",
        {"template_hash_id": "4e17788f74f075dd9aab7d0d4427968f", "label": "from-template"},
    )


def test_create_instance_args_runtype_sends_args_str(requests_mock, hook):
    requests_mock.put(url("/api/v0/asks/404/"), json=CREATED)

    hook.create_instance(404, image="busybox", runtype="args", args_str="sleep 3600")

    assert requests_mock.last_request.json() == {"image": "busybox", "runtype": "args", "args_str": "sleep 3600"}


def test_create_instance_masks_the_instance_api_key_as_soon_as_it_is_received(requests_mock, hook, masked):
    requests_mock.put(url("/api/v0/asks/101/"), json=CREATED)

    hook.create_instance(101, image="busybox")

    assert CREATED["instance_api_key"] in masked


# --- Instances ---------------------------------------------------------------------------------------------


def test_get_instance_gets_instance_path_with_trailing_slash_and_unwraps_instances(requests_mock, hook):
    requests_mock.get(url("/api/v0/instances/7001/"), json={"instances": INSTANCE})

    assert hook.get_instance(7001) == INSTANCE
    assert_sent(requests_mock, "GET", "/api/v0/instances/7001/")


def test_get_instance_provisioning_status_null_is_returned_as_none(requests_mock, hook):
    requests_mock.get(url("/api/v0/instances/7001/"), json={"instances": {"id": 7001, "actual_status": None}})

    assert hook.get_instance(7001) == {"id": 7001, "actual_status": None}


def test_list_instances_gets_the_v1_list_with_trailing_slash_and_returns_the_list(requests_mock, hook):
    second = {**INSTANCE, "id": 7002, "label": "other"}
    requests_mock.get(url("/api/v1/instances/"), json={"instances_found": 2, "instances": [INSTANCE, second]})

    assert hook.list_instances() == [INSTANCE, second]
    assert_sent(requests_mock, "GET", "/api/v1/instances/?limit=25")


def test_list_instances_returns_empty_list_when_none(requests_mock, hook):
    requests_mock.get(url("/api/v1/instances/"), json={"instances_found": 0, "instances": []})

    assert hook.list_instances() == []


def test_stop_instance_puts_state_stopped_to_instance_path(requests_mock, hook):
    requests_mock.put(url("/api/v0/instances/7001/"), json={"success": True})

    assert hook.stop_instance(7001) == {"success": True}
    assert_sent(requests_mock, "PUT", "/api/v0/instances/7001/", {"state": "stopped"})


def test_destroy_instance_deletes_instance_path_without_body(requests_mock, hook):
    requests_mock.delete(url("/api/v0/instances/7001/"), json={"success": True})

    assert hook.destroy_instance(7001) == {"success": True}
    assert_sent(requests_mock, "DELETE", "/api/v0/instances/7001/")


def test_destroy_instance_already_gone_404_is_success_and_not_retried(requests_mock, hook):
    requests_mock.delete(url("/api/v0/instances/7001/"), status_code=404, json={"error": "no_such_instance"})

    assert hook.destroy_instance(7001) == {"success": True, "already_gone": True}
    assert requests_mock.call_count == 1


# --- Host volume listings: POST /api/v0/volumes ------------------------------------------------------------


def test_create_volume_listings_posts_machine_to_volumes_without_trailing_slash(requests_mock, hook):
    requests_mock.post(url("/api/v0/volumes"), json=VOLUME_RESULT)

    assert hook.create_volume_listings(machine=17) == VOLUME_RESULT
    assert_sent(requests_mock, "POST", "/api/v0/volumes", {"machine": 17})


def test_create_volume_listings_sends_machines_and_hidden_listing(requests_mock, hook):
    requests_mock.post(url("/api/v0/volumes"), json=VOLUME_RESULT)

    hook.create_volume_listings(machines=[17, 18], hidden_listing=True)

    assert_sent(requests_mock, "POST", "/api/v0/volumes", {"machines": [17, 18], "hidden_listing": True})


# --- Serverless: POST /api/v0/endptjobs, DELETE /api/v0/deployments ------------------------------------------


def test_create_endpoint_posts_all_thirteen_fields_to_endptjobs_and_returns_result(requests_mock, hook):
    requests_mock.post(url("/api/v0/endptjobs"), json={"success": True, "result": 4242})

    assert hook.create_endpoint(**ENDPOINT_FIELDS) == {"success": True, "result": 4242}
    assert_sent(requests_mock, "POST", "/api/v0/endptjobs", ENDPOINT_FIELDS)


def test_create_endpoint_sends_only_given_fields(requests_mock, hook):
    requests_mock.post(url("/api/v0/endptjobs"), json={"success": True, "result": 1})

    hook.create_endpoint(endpoint_name="small", max_workers=0)

    assert_sent(requests_mock, "POST", "/api/v0/endptjobs", {"endpoint_name": "small", "max_workers": 0})


def test_delete_deployments_sends_name_in_delete_body_and_returns_count(requests_mock, hook):
    requests_mock.delete(url("/api/v0/deployments"), json={"success": True, "count": 3})

    assert hook.delete_deployments("llama-serve") == {"success": True, "count": 3}
    assert_sent(requests_mock, "DELETE", "/api/v0/deployments", {"name": "llama-serve"})


def test_delete_deployments_sends_tag_when_given(requests_mock, hook):
    requests_mock.delete(url("/api/v0/deployments"), json={"success": True, "count": 1})

    assert hook.delete_deployments("llama-serve", tag="v2")["count"] == 1
    assert_sent(requests_mock, "DELETE", "/api/v0/deployments", {"name": "llama-serve", "tag": "v2"})


# --- Account: PUT /api/v0/tfa/regen-backup-codes and the three listings --------------------------------------


def test_regenerate_backup_codes_puts_tfa_fields_and_returns_codes(requests_mock, hook):
    requests_mock.put(url("/api/v0/tfa/regen-backup-codes"), json={"msg": "ok", "backup_codes": BACKUP_CODES})

    result = hook.regenerate_backup_codes(tfa_method="totp", code="123456", tfa_method_id=3)

    assert result == {"msg": "ok", "backup_codes": BACKUP_CODES}
    assert_sent(
        requests_mock,
        "PUT",
        "/api/v0/tfa/regen-backup-codes",
        {"tfa_method": "totp", "code": "123456", "tfa_method_id": 3},
    )


def test_regenerate_backup_codes_sms_sends_secret(requests_mock, hook):
    requests_mock.put(url("/api/v0/tfa/regen-backup-codes"), json={"msg": "ok", "backup_codes": BACKUP_CODES})

    hook.regenerate_backup_codes(tfa_method="sms", code="654321", secret="tfa-secret-from-send-step")

    assert requests_mock.last_request.json() == {
        "tfa_method": "sms",
        "code": "654321",
        "secret": "tfa-secret-from-send-step",
    }


def test_regenerate_backup_codes_with_backup_code_only(requests_mock, hook):
    requests_mock.put(url("/api/v0/tfa/regen-backup-codes"), json={"msg": "ok", "backup_codes": BACKUP_CODES})

    hook.regenerate_backup_codes(backup_code="old-backup-code-1")

    assert requests_mock.last_request.json() == {"backup_code": "old-backup-code-1"}


def test_regenerate_backup_codes_masks_every_new_code(requests_mock, hook, masked):
    requests_mock.put(url("/api/v0/tfa/regen-backup-codes"), json={"msg": "ok", "backup_codes": BACKUP_CODES})

    hook.regenerate_backup_codes(tfa_method="totp", code="123456")

    assert set(BACKUP_CODES) <= set(masked)


def test_list_pending_price_increases_gets_path_and_returns_whole_response_with_truncated(requests_mock, hook):
    body = {
        "success": True,
        "count": 1,
        "pending_price_increases": [
            {
                "pending_price_increase_id": 5,
                "contract_id": 7001,
                "host_id": 9,
                "new_gpu_costpersec": 0.0002,
                "new_disk_ram_costpersec": 0.00001,
                "old_gpu_costpersec": 0.0001,
                "old_disk_ram_costpersec": 0.00001,
                "contract_end_date": 1767225600.0,
                "ask_end_date": 1767225600.0,
                "created_at": 1764547200.0,
            }
        ],
        "truncated": True,
    }
    requests_mock.get(url("/api/v0/instances/pending-price-increases"), json=body)

    assert hook.list_pending_price_increases() == body
    assert_sent(requests_mock, "GET", "/api/v0/instances/pending-price-increases")


def test_list_api_keys_gets_auth_apikeys_and_returns_the_records(requests_mock, hook):
    records = [
        {
            "id": 1,
            "user_id": 3,
            "key": None,
            "key_type": "api",
            "name": "ci",
            "team_id": None,
            "team_name": None,
            "team_owner": None,
        },
        {
            "id": 2,
            "user_id": 3,
            "key": None,
            "key_type": "api",
            "name": "team",
            "team_id": 8,
            "team_name": "ml",
            "team_owner": 3,
        },
    ]
    requests_mock.get(url("/api/v0/auth/apikeys"), json={"apikeys": records})

    assert hook.list_api_keys() == records
    assert_sent(requests_mock, "GET", "/api/v0/auth/apikeys")


def test_list_cloud_integrations_gets_path_and_returns_the_array(requests_mock, hook):
    records = [{"id": 1, "cloud_type": "s3", "name": "datasets"}, {"id": 2, "cloud_type": "gdrive", "name": "x"}]
    requests_mock.get(url("/api/v0/users/cloud_integrations"), json=records)

    assert hook.list_cloud_integrations() == records
    assert_sent(requests_mock, "GET", "/api/v0/users/cloud_integrations")


def test_backup_codes_are_masked_when_received(requests_mock, hook, masked):
    codes = [f"code-{i}-zz81" for i in range(10)]
    requests_mock.put(url("/api/v0/tfa/regen-backup-codes"), json={"msg": "new codes", "backup_codes": codes})

    hook.regenerate_backup_codes(backup_code="old-code-1")

    assert [c for c in masked if c in codes] == codes


# --- GpuMarketAsyncHook: same wire format, results and retry rules as the sync hook ----------------------------
@pytest.fixture
def async_sleeps(monkeypatch) -> list[float]:
    """The waits the async hook asks for (recorded, never slept); a recorded wait moves the budget pacer's clock."""
    import time

    recorded: list[float] = []
    real_sleep = asyncio.sleep

    async def fake_sleep(seconds: float, *args, **kwargs) -> None:
        # Only the test's own loop (main thread) is recorded; another thread's loop, such as a simulator server
        # left running by an earlier test, keeps real time instead of spinning.
        if threading.current_thread() is not threading.main_thread():
            return await real_sleep(seconds, *args, **kwargs)
        recorded.append(seconds)

    class PacerClock:
        def __getattr__(self, name: str):
            return getattr(time, name)

        @staticmethod
        def time() -> float:
            return time.time() + sum(recorded)

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    monkeypatch.setattr("airflow_gpumarket.pacing.time", PacerClock())
    return recorded


def test_async_get_instance_path_headers_and_unwrap(server):
    server.add("GET", "/api/v0/instances/7001/", httpx.Response(200, json={"instances": INSTANCE}))

    assert run(lambda h: h.get_instance(7001)) == INSTANCE

    (request,) = server.requests
    assert (request.method, str(request.url)) == ("GET", url("/api/v0/instances/7001/"))
    assert request.headers["Authorization"] == AUTH_HEADER
    assert request.headers["Accept"] == "application/json"
    assert request.content == b""


def test_async_429_with_retry_after_then_200_is_retried_after_that_wait(server, async_sleeps):
    server.add(
        "GET",
        "/api/v0/instances/7001/",
        httpx.Response(429, headers={"Retry-After": "4"}, json={"msg": "slow down"}),
        httpx.Response(200, json={"instances": INSTANCE}),
    )

    assert run(lambda h: h.get_instance(7001)) == INSTANCE

    assert len(server.requests) == 2
    assert async_sleeps == [4.0]


def test_async_503_then_200_is_retried(server, async_sleeps):
    server.add(
        "GET",
        "/api/v1/instances/",
        httpx.Response(503),
        httpx.Response(200, json={"instances_found": 1, "instances": [INSTANCE]}),
    )

    assert run(lambda h: h.list_instances()) == [INSTANCE]
    assert len(server.requests) == 2


def test_async_connect_error_then_200_is_retried(server, async_sleeps):
    server.add(
        "GET",
        "/api/v1/instances/",
        httpx.ConnectError("refused"),
        httpx.Response(200, json={"instances": []}),
    )

    assert run(lambda h: h.list_instances()) == []
    assert len(server.requests) == 2


def test_async_retries_exhausted_raise_the_last_error(server, async_sleeps):
    server.add("GET", "/api/v1/instances/", httpx.Response(502, json={"msg": "gateway"}))

    with pytest.raises(GpuMarketServerError, match="gateway"):
        run(lambda h: h.list_instances())

    assert len(server.requests) == 4


def test_async_destroy_deletes_without_body(server):
    server.add("DELETE", "/api/v0/instances/7001/", httpx.Response(200, json={"success": True}))

    assert run(lambda h: h.destroy_instance(7001)) == {"success": True}
    (request,) = server.requests
    assert (request.method, str(request.url), request.content) == ("DELETE", url("/api/v0/instances/7001/"), b"")


def test_async_destroy_404_is_success(server):
    server.add("DELETE", "/api/v0/instances/7001/", httpx.Response(404, json={"error": "not_found"}))

    assert run(lambda h: h.destroy_instance(7001)) == {"success": True, "already_gone": True}
    assert len(server.requests) == 1


def test_async_get_instance_404_raises_not_found(server):
    server.add("GET", "/api/v0/instances/9/", httpx.Response(404, json={"msg": "No instance 9"}))

    with pytest.raises(GpuMarketNotFoundError, match="No instance 9"):
        run(lambda h: h.get_instance(9))


def test_async_401_raises_auth_error_without_the_key(server):
    server.add("GET", "/api/v1/instances/", httpx.Response(401, json={"msg": f"bad {API_KEY}"}))

    with pytest.raises(GpuMarketAuthError) as caught:
        run(lambda h: h.list_instances())

    assert API_KEY not in str(caught.value)
    assert "bad ***" in str(caught.value)
    assert len(server.requests) == 1


def test_async_list_pending_price_increases_returns_whole_response(server):
    body = {"success": True, "count": 0, "pending_price_increases": [], "truncated": False}
    server.add("GET", "/api/v0/instances/pending-price-increases", httpx.Response(200, json=body))

    assert run(lambda h: h.list_pending_price_increases()) == body
    assert str(server.requests[0].url) == url("/api/v0/instances/pending-price-increases")


def test_async_hook_masks_the_key_when_reading_the_connection(masked):
    async def main():
        hook = GpuMarketAsyncHook()
        assert masked == []
        settings = await hook.asettings()
        assert settings.base_url == BASE_URL
        assert masked == [API_KEY]

    asyncio.run(main())


def test_async_json_body_is_not_sent_for_reads(server):
    server.add("GET", "/api/v1/instances/", httpx.Response(200, content=json.dumps({"instances": []}).encode()))

    run(lambda h: h.list_instances())

    assert "content-type" not in server.requests[0].headers


def test_async_logs_are_requested_with_the_key_and_fetched_without_it(server, async_sleeps):
    storage = "https://storage.example.net/logs/tok-77"
    server.add(
        "PUT",
        "/api/v0/instances/request_logs/7001/",
        httpx.Response(200, json={"success": True, "result_url": storage}),
    )
    server.add(
        "GET",
        "/logs/tok-77",
        httpx.Response(404, text="NoSuchKey"),
        httpx.Response(200, text=f"epoch 1\nCONTAINER_API_KEY=k123\n{API_KEY}\n"),
    )

    text = run(lambda h: h.get_instance_logs(7001, tail=50, retry=False))

    assert text == "epoch 1\nCONTAINER_API_KEY=***\n***\n"
    put, *gets = server.requests
    assert put.headers["Authorization"] == AUTH_HEADER
    assert json.loads(put.content) == {"tail": "50"}
    assert [str(g.url) for g in gets] == [storage, storage]
    assert all("authorization" not in g.headers for g in gets)


def test_async_log_never_uploaded_fails_after_the_bounded_tries(server, async_sleeps):
    from airflow_gpumarket import api
    from airflow_gpumarket.exceptions import GpuMarketError

    server.add(
        "PUT",
        "/api/v0/instances/request_logs/7001/",
        httpx.Response(200, json={"success": True, "result_url": "https://storage.example.net/logs/t"}),
    )
    server.add("GET", "/logs/t", httpx.Response(404))
    with pytest.raises(GpuMarketError, match="not at its result URL"):
        run(lambda h: h.get_instance_logs(7001))
    assert len(server.requests) == 1 + api.LOG_FETCH_TRIES


def test_async_change_bid_puts_the_live_body_to_the_bid_price_path(server):
    server.add("PUT", "/api/v0/instances/bid_price/7001/", httpx.Response(200, json={"success": True}))

    assert run(lambda h: h.change_bid(7001, 0.35)) == {"success": True}
    (request,) = server.requests
    assert request.method == "PUT" and json.loads(request.content) == {"client_id": "me", "price": 0.35}


# --- test_connection: the spec, the live service, a spec-only server ---------------------------------------------
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


def test_test_connection_ok_on_200_names_the_base_url(requests_mock, hook):
    requests_mock.get(url("/api/v1/instances/"), json={"instances_found": 2, "instances": [{"id": 1}, {"id": 2}]})

    ok, message = hook.test_connection()

    assert ok is True
    assert BASE_URL in message
    assert "2 instance(s)" in message
    assert requests_mock.call_count == 1
    assert requests_mock.last_request.headers["Authorization"] == AUTH_HEADER


def test_test_connection_401_reports_failure_without_the_key(requests_mock, hook):
    requests_mock.get(url("/api/v1/instances/"), status_code=401, json={"msg": f"bad key {API_KEY}"})

    ok, message = hook.test_connection()

    assert ok is False
    assert "HTTP 401" in message
    assert "bad key ***" in message
    assert API_KEY not in message
    assert requests_mock.call_count == 1  # one cheap call, not retried


def test_test_connection_reports_a_bad_connection_instead_of_raising(wire, set_conn, hook):
    set_conn(host="http://api.example.com")

    ok, message = hook.test_connection()

    assert ok is False
    assert "plaintext http" in message
    assert wire.call_count == 0
