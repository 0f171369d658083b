"""Reading answers (``api/responses.py``): every documented error status, and the live service's own error shapes
(a bad key's 404, a missing instance's null, plain-text 429s, quota errors), mapped to the right exception carrying
the server's own words."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from hook_fakes import async_hook, url

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import (
    GpuMarketAuthError,
    GpuMarketError,
    GpuMarketNotFoundError,
    GpuMarketOfferUnavailableError,
    GpuMarketQuotaExceededError,
    GpuMarketRateLimitError,
    GpuMarketServerError,
)

NO_RETRIES = {"retry_min_wait": 0, "retry_max_wait": 0, "max_retries": 0}
INSTANCE_7 = url(api.PATH_INSTANCE.format(instance_id=7))
ASK = url(api.PATH_CREATE_INSTANCE.format(offer_id=101))
AUTH_404 = {"status_code": 404, "json": {"error": "auth_error", "msg": "Invalid user key"}}


@pytest.fixture
def no_retries(set_conn):
    set_conn(extra=NO_RETRIES)


# --- Any endpoint: 401 or 403 ------------------------------------------------------------------------------
@pytest.mark.parametrize("status", [401, 403])
def test_invalid_api_key_401_or_403_raises_auth_error_without_retry(requests_mock, hook, status):
    requests_mock.get(url("/api/v1/instances/"), status_code=status, json={"error": "auth_error", "msg": "Invalid key"})

    with pytest.raises(GpuMarketAuthError) as caught:
        hook.list_instances()

    exc = caught.value
    assert (exc.status_code, exc.error, exc.msg, exc.operation) == (
        status,
        "auth_error",
        "Invalid key",
        "list_instances",
    )
    assert f"HTTP {status}" in str(exc)
    assert "auth_error: Invalid key" in str(exc)
    assert "password of the gpumarket connection" in str(exc)
    assert requests_mock.call_count == 1


def test_auth_error_without_a_body_still_explains(requests_mock, hook):
    requests_mock.post(url("/api/v0/bundles/"), status_code=401)

    with pytest.raises(GpuMarketAuthError, match=r"search_offers was refused \(HTTP 401\)") as caught:
        hook.search_offers()

    assert (caught.value.error, caught.value.msg) == (None, None)


# --- 404, 429, 5xx -----------------------------------------------------------------------------------------
def test_get_instance_404_raises_not_found_with_server_message(requests_mock, hook):
    requests_mock.get(url("/api/v0/instances/9/"), status_code=404, json={"error": "not_found", "msg": "No instance 9"})

    with pytest.raises(GpuMarketNotFoundError) as caught:
        hook.get_instance(9)

    assert caught.value.status_code == 404
    assert "No instance 9" in str(caught.value)
    assert requests_mock.call_count == 1


def test_get_instance_without_instance_object_raises_not_found(requests_mock, hook):
    requests_mock.get(url("/api/v0/instances/9/"), json={"instances": None})

    with pytest.raises(GpuMarketNotFoundError, match="no instance object"):
        hook.get_instance(9)


def test_429_raises_rate_limit_error_with_retry_after_parsed(requests_mock, hook, no_retries):
    requests_mock.get(
        url("/api/v0/auth/apikeys"),
        status_code=429,
        headers={"Retry-After": "12"},
        json={"error": "rate_limited", "msg": "Slow down"},
    )

    with pytest.raises(GpuMarketRateLimitError) as caught:
        hook.list_api_keys()

    exc = caught.value
    assert (exc.status_code, exc.retry_after, exc.msg) == (429, 12.0, "Slow down")
    assert "wait 12 s" in str(exc)
    assert "Slow down" in str(exc)
    assert requests_mock.call_count == 1  # max_retries 0 in the extras: no retry


def test_429_without_retry_after_has_retry_after_none(requests_mock, hook, no_retries):
    requests_mock.get(url("/api/v0/auth/apikeys"), status_code=429)

    with pytest.raises(GpuMarketRateLimitError) as caught:
        hook.list_api_keys()

    assert caught.value.retry_after is None


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_5xx_raises_server_error_with_server_message(requests_mock, hook, no_retries, status):
    requests_mock.get(url("/api/v1/instances/"), status_code=status, json={"error": "server_error", "msg": "db down"})

    with pytest.raises(GpuMarketServerError) as caught:
        hook.list_instances()

    assert caught.value.status_code == status
    assert "db down" in str(caught.value)


# --- Create instance: the offer is gone ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "body"),
    [
        (409, {"error": "conflict", "msg": "ask already rented"}),
        (404, {"error": "no_such_ask", "msg": "Instance type no longer available"}),
        (400, {"error": "invalid_args", "msg": "Offer no longer available"}),
        (410, {"msg": "gone"}),
    ],
    ids=["409", "404", "400-no-longer-available", "410"],
)
def test_create_instance_offer_rented_by_someone_else_raises_offer_unavailable_not_retried(
    requests_mock, hook, status, body
):
    requests_mock.put(url("/api/v0/asks/101/"), status_code=status, json=body)

    with pytest.raises(GpuMarketOfferUnavailableError) as caught:
        hook.create_instance(101, image="busybox")

    assert caught.value.status_code == status
    assert body["msg"] in str(caught.value)
    assert "Search again" in str(caught.value)
    assert requests_mock.call_count == 1


def test_create_instance_other_400_is_a_plain_error_not_offer_unavailable(requests_mock, hook):
    requests_mock.put(url("/api/v0/asks/101/"), status_code=400, json={"error": "invalid_args", "msg": "bad image"})

    with pytest.raises(GpuMarketError) as caught:
        hook.create_instance(101, image="busybox")

    assert type(caught.value) is GpuMarketError
    assert (caught.value.error, caught.value.msg) == ("invalid_args", "bad image")


def test_404_on_another_operation_is_not_found_not_offer_unavailable(requests_mock, hook):
    requests_mock.delete(url("/api/v0/deployments"), status_code=404, json={"msg": "no deployment named x"})

    with pytest.raises(GpuMarketNotFoundError) as caught:
        hook.delete_deployments("x")

    assert not isinstance(caught.value, GpuMarketOfferUnavailableError)
    assert "no deployment named x" in str(caught.value)


# --- Create volume listings: the four documented errors ----------------------------------------------------
@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, {"success": False, "error": "invalid_args", "msg": "Invalid machine id"}),
        (400, {"success": False, "error": "invalid_args", "msg": "No such machine(s) for your account"}),
        (402, {"success": False, "msg": "asks can only be created for an online machine"}),
        (422, {"error": "invalid_args", "msg": "disk ask update failed: size must be positive"}),
    ],
    ids=["400-invalid-machine-id", "400-no-such-machine", "402-machine-offline", "422-error-object"],
)
def test_create_volume_listings_documented_errors_carry_status_error_msg_and_words(requests_mock, hook, status, body):
    requests_mock.post(url("/api/v0/volumes"), status_code=status, json=body)

    with pytest.raises(GpuMarketError) as caught:
        hook.create_volume_listings(machine=17)

    exc = caught.value
    assert type(exc) is GpuMarketError
    assert (exc.status_code, exc.error, exc.msg, exc.operation) == (
        status,
        body.get("error"),
        body["msg"],
        "create_volume_listings",
    )
    assert f"HTTP {status}" in str(exc)
    assert body["msg"] in str(exc)
    assert requests_mock.call_count == 1


def test_200_with_success_false_raises_with_the_server_message(requests_mock, hook):
    requests_mock.put(url("/api/v0/instances/7/"), json={"success": False, "error": "bad_state", "msg": "cannot stop"})

    with pytest.raises(GpuMarketError) as caught:
        hook.stop_instance(7)

    assert caught.value.status_code == 200
    assert "success=false" in str(caught.value)
    assert "bad_state: cannot stop" in str(caught.value)


def test_non_json_error_body_text_is_in_the_message(requests_mock, hook):
    requests_mock.get(
        url("/api/v0/users/cloud_integrations"),
        status_code=400,
        text="<html><body>Request blocked by proxy</body></html>",
        headers={"Content-Type": "text/html"},
    )

    with pytest.raises(GpuMarketError) as caught:
        hook.list_cloud_integrations()

    assert "Request blocked by proxy" in str(caught.value)
    assert caught.value.status_code == 400


def test_create_endpoint_error_carries_server_words(requests_mock, hook):
    requests_mock.post(url("/api/v0/endptjobs"), status_code=400, json={"error": "invalid_args", "msg": "bad name"})

    with pytest.raises(GpuMarketError) as caught:
        hook.create_endpoint(endpoint_name="x")

    assert (caught.value.status_code, caught.value.msg) == (400, "bad name")
    assert "create_endpoint was rejected (HTTP 400)" in str(caught.value)


def test_regenerate_backup_codes_error_carries_server_words_not_the_code(requests_mock, hook):
    requests_mock.put(
        url("/api/v0/tfa/regen-backup-codes"), status_code=400, json={"error": "bad_code", "msg": "2FA code invalid"}
    )

    with pytest.raises(GpuMarketError) as caught:
        hook.regenerate_backup_codes(tfa_method="totp", code="987123")

    assert "2FA code invalid" in str(caught.value)
    assert "987123" not in str(caught.value)


@pytest.mark.parametrize(
    ("method", "path", "call"),
    [
        ("GET", api.PATH_INSTANCES_V1, lambda h: h.list_instances()),
        ("POST", api.PATH_SEARCH_OFFERS, lambda h: h.search_offers()),
        ("GET", api.PATH_API_KEYS, lambda h: h.list_api_keys()),
        ("GET", api.PATH_CLOUD_INTEGRATIONS, lambda h: h.list_cloud_integrations()),
        ("PUT", api.PATH_REGEN_BACKUP_CODES, lambda h: h.regenerate_backup_codes(backup_code="abc")),
    ],
)
def test_a_200_without_the_expected_list_is_an_error_not_an_empty_list(requests_mock, hook, method, path, call):
    # An empty list read from a proxy's page would "prove" after an ambiguous create that no instance exists.
    requests_mock.register_uri(method, url(path), status_code=200, text="<html>maintenance</html>")
    with pytest.raises(GpuMarketError, match="without a list"):
        call(hook)


def test_change_bid_puts_the_live_body_and_maps_the_on_demand_refusal(requests_mock, hook):
    path = url("/api/v0/instances/bid_price/7/")
    requests_mock.put(path, json={"success": True})
    assert hook.change_bid(7, 0.35) == {"success": True}
    assert requests_mock.last_request.json() == {"client_id": "me", "price": 0.35}

    requests_mock.put(path, status_code=400, json={"msg": "Can't change price of on-demand contract."})
    with pytest.raises(GpuMarketError, match="HTTP 400.*Can't change price of on-demand contract"):
        hook.change_bid(7, 0.35)
    requests_mock.put(path, status_code=404, json={"error": "no_such_instance", "msg": "Instance 7 does not exist"})
    with pytest.raises(GpuMarketNotFoundError, match="no_such_instance"):
        hook.change_bid(7, 0.35)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("7", 7.0),
        ("0", 0.0),
        ("2.5", 2.5),
        ("-3", 0.0),
        ("Wed, 21 Oct 2015 07:28:00 GMT", None),
        (None, None),
        ("inf", None),
    ],
)
def test_parse_retry_after(value, seconds):
    assert api.parse_retry_after(value) == seconds


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


def test_async_live_bad_key_on_destroy_is_an_auth_error(monkeypatch):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"error": "auth_error", "msg": "Invalid user key"})

    hook = async_hook(monkeypatch, handler)

    async def run():
        await hook.asettings()
        try:
            await hook.destroy_instance(7)
        finally:
            await hook.aclose()

    with pytest.raises(GpuMarketAuthError):
        asyncio.run(run())


# --- the async twin ----------------------------------------------------------------------------------------
# --- The pure helpers ------------------------------------------------------------------------------------------
def test_raise_for_response_returns_the_body_of_a_success():
    assert api.raise_for_response("op", 200, {"success": True, "x": 1}) == {"success": True, "x": 1}
    assert api.raise_for_response("op", 200, [1, 2]) == [1, 2]


def test_raise_for_response_message_is_cut_for_long_text_bodies():
    with pytest.raises(GpuMarketError) as caught:
        api.raise_for_response("op", 400, "x" * 1000)

    assert "x" * 200 in str(caught.value)
    assert "x" * 201 not in str(caught.value)


def test_redact_replaces_every_secret_of_four_or_more_characters():
    assert api.redact("a sk-123 b sk-123", ["sk-123"]) == "a *** b ***"
    assert api.redact("abc", ["abc"]) == "abc"  # too short to redact without mangling text
    assert api.redact("x", [None, ""]) == "x"


def test_decode_body_json_text_or_none():
    assert api.decode_body(b'{"a": 1}') == {"a": 1}
    assert api.decode_body(b"<html>oops</html>") == "<html>oops</html>"
    assert api.decode_body(b"") is None
