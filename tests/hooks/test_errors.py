"""Every documented error status mapped to the right exception, carrying the server's own words."""

from __future__ import annotations

import pytest
from hook_fakes import url

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import (
    GpuMarketAuthError,
    GpuMarketCreateRefusedError,
    GpuMarketError,
    GpuMarketNotFoundError,
    GpuMarketOfferUnavailableError,
    GpuMarketRateLimitError,
    GpuMarketServerError,
)

NO_RETRIES = {"retry_min_wait": 0, "retry_max_wait": 0, "max_retries": 0}


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


REFUSED_BID = {
    "success": False,
    "new_contract": 4242,
    "instance_api_key": "inst-key-0123456789abcdef",
    "msg": "Your bid is below the machine's minimum bid: the instance was created stopped.",
}


def test_a_create_answered_success_false_with_a_new_contract_destroys_that_instance(requests_mock, hook):
    """A bid below the machine's minimum makes a stopped instance and answers success=false: left alone, its storage
    bills until the lease and the reaper find it."""
    requests_mock.put(url("/api/v0/asks/101/"), json=REFUSED_BID)
    destroy = requests_mock.delete(url("/api/v0/instances/4242/"), json={"success": True})

    with pytest.raises(GpuMarketCreateRefusedError) as caught:
        hook.create_instance(101, image="img", price=0.01)

    assert destroy.call_count == 1
    assert caught.value.new_contract == 4242
    message = str(caught.value)
    assert "made instance 4242" in message and "minimum bid" in message and "nothing bills" in message
    assert REFUSED_BID["instance_api_key"] not in message


def test_a_refused_create_whose_destroy_fails_says_what_to_destroy_by_hand(requests_mock, hook):
    requests_mock.put(url("/api/v0/asks/101/"), json=REFUSED_BID)
    requests_mock.delete(url("/api/v0/instances/4242/"), status_code=403, json={"error": "forbidden", "msg": "no"})

    with pytest.raises(GpuMarketCreateRefusedError, match="destroy instance 4242 by hand"):
        hook.create_instance(101, image="img", price=0.01)


def test_a_create_answered_success_false_without_a_contract_is_a_plain_error(requests_mock, hook):
    requests_mock.put(url("/api/v0/asks/101/"), json={"success": False, "msg": "nope"})
    destroy = requests_mock.delete(url("/api/v0/instances/4242/"), json={"success": True})

    with pytest.raises(GpuMarketError, match="success=false") as caught:
        hook.create_instance(101, image="img")
    assert not isinstance(caught.value, GpuMarketCreateRefusedError)
    assert destroy.call_count == 0


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


def test_redirects_are_not_followed(requests_mock, hook):
    requests_mock.put(url("/api/v0/instances/5/"), status_code=302, headers={"Location": url("/elsewhere")})
    with pytest.raises(GpuMarketError, match="HTTP 302"):
        hook.stop_instance(5)
    assert requests_mock.call_count == 1


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


@pytest.mark.parametrize(("instance_id", "price"), [(0, 0.3), (7, 0), (7, "cheap"), (True, 0.3)])
def test_change_bid_refuses_bad_arguments_before_sending(wire, hook, instance_id, price):
    from airflow_gpumarket.exceptions import GpuMarketValidationError

    with pytest.raises(GpuMarketValidationError):
        hook.change_bid(instance_id, price)
    assert wire.call_count == 0
