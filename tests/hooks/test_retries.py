"""Retries: 429 (honouring Retry-After), 5xx and connection errors on reads, stop and destroy; creation never
re-sent blindly."""

from __future__ import annotations

import logging
from http.client import RemoteDisconnected

import pytest
import requests
from hook_fakes import HOOK_LOGGER, methods_and_paths, methods_and_urls, url
from urllib3.exceptions import MaxRetryError, NewConnectionError, ProtocolError

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import (
    GpuMarketAmbiguousCreateError,
    GpuMarketRateLimitError,
    GpuMarketServerError,
    GpuMarketTransportError,
)

INSTANCES = url("/api/v1/instances/")
ASK = url("/api/v0/asks/101/")
CREATED = {"success": True, "new_contract": 7001, "instance_api_key": "inst-key-0123456789abcdef"}


@pytest.fixture(autouse=True)
def _no_pacing(monkeypatch):
    """The retry policy is exercised through list, create and destroy calls here; the budgets' slot waits, which
    every try takes too (tests/hooks/test_live_service.py), would mix with the backoffs recorded."""
    from airflow_gpumarket.hooks.core import _GpuMarketHookBase

    monkeypatch.setattr(_GpuMarketHookBase, "_pace", lambda self, operation: 0.0)


def ok(json) -> dict:
    return {"status_code": 200, "json": json}


def fail(status: int, msg: str = "try later", **headers) -> dict:
    return {"status_code": status, "json": {"error": "x", "msg": msg}, "headers": headers}


# --- Reads ---------------------------------------------------------------------------------------------------
def test_429_with_retry_after_is_retried_after_exactly_that_wait(requests_mock, hook, sleeps, caplog):
    caplog.set_level(logging.DEBUG, logger=HOOK_LOGGER)
    requests_mock.get(INSTANCES, [fail(429, **{"Retry-After": "7"}), ok({"instances": [{"id": 1}]})])

    assert hook.list_instances() == [{"id": 1}]

    assert requests_mock.call_count == 2
    assert sleeps == [7.0]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "retrying in 7.0 s" in warnings[0]
    assert "HTTP 429" in warnings[0]


def test_429_without_retry_after_is_retried_with_backoff(requests_mock, hook, sleeps):
    requests_mock.get(INSTANCES, [fail(429), ok({"instances": []})])

    assert hook.list_instances() == []

    assert requests_mock.call_count == 2
    assert sleeps == [0.0]  # the connection's retry_min_wait is 0


def test_backoff_is_exponential_capped_at_retry_max_wait(requests_mock, hook, sleeps, set_conn, monkeypatch):
    set_conn(extra={"retry_min_wait": 2, "retry_max_wait": 5, "max_retries": 3})
    monkeypatch.setattr("airflow_gpumarket.hooks.core.random.random", lambda: 1.0)  # no jitter reduction
    requests_mock.get(INSTANCES, [fail(503), fail(503), fail(503), ok({"instances": []})])

    hook.list_instances()

    assert sleeps == [2.0, 4.0, 5.0]


def test_backoff_jitter_keeps_the_upper_half_of_the_wait(requests_mock, hook, sleeps, set_conn, monkeypatch):
    set_conn(extra={"retry_min_wait": 2, "retry_max_wait": 60, "max_retries": 2})
    monkeypatch.setattr("airflow_gpumarket.hooks.core.random.random", lambda: 0.0)
    requests_mock.get(INSTANCES, [fail(503), fail(503), ok({"instances": []})])

    hook.list_instances()

    assert sleeps == [1.0, 2.0]


def test_503_then_success_for_a_read(requests_mock, hook):
    requests_mock.get(url("/api/v0/instances/5/"), [fail(503), ok({"instances": {"id": 5}})])

    assert hook.get_instance(5) == {"id": 5}
    assert requests_mock.call_count == 2


@pytest.mark.parametrize(
    "exc",
    [requests.exceptions.ConnectionError, requests.exceptions.ReadTimeout, requests.exceptions.ConnectTimeout],
    ids=["connection-error", "read-timeout", "connect-timeout"],
)
def test_connection_error_or_timeout_then_success_for_a_read(requests_mock, hook, exc):
    requests_mock.get(url("/api/v0/auth/apikeys"), [{"exc": exc}, ok({"apikeys": [{"id": 1}]})])

    assert hook.list_api_keys() == [{"id": 1}]
    assert requests_mock.call_count == 2


def test_retries_exhausted_raise_the_last_error(requests_mock, hook, sleeps):
    requests_mock.get(INSTANCES, [fail(503, "first"), fail(502, "second"), fail(500, "third"), fail(504, "fourth")])

    with pytest.raises(GpuMarketServerError) as caught:
        hook.list_instances()

    assert requests_mock.call_count == 4  # 1 + max_retries (3)
    assert caught.value.status_code == 504
    assert "fourth" in str(caught.value)
    assert len(sleeps) == 3


def test_retries_exhausted_by_transport_errors_raise_a_transport_error(requests_mock, hook):
    requests_mock.get(INSTANCES, exc=requests.exceptions.ConnectionError)

    with pytest.raises(GpuMarketTransportError, match=r"list_instances: GET /api/v1/instances/ got no response"):
        hook.list_instances()

    assert requests_mock.call_count == 4


def test_max_retries_comes_from_the_connection_extras(requests_mock, hook, set_conn):
    set_conn(extra={"retry_min_wait": 0, "retry_max_wait": 0, "max_retries": 1})
    requests_mock.get(INSTANCES, status_code=503)

    with pytest.raises(GpuMarketServerError):
        hook.list_instances()

    assert requests_mock.call_count == 2


def test_destroy_is_retried_on_502(requests_mock, hook):
    requests_mock.delete(url("/api/v0/instances/7/"), [fail(502), ok({"success": True})])

    assert hook.destroy_instance(7) == {"success": True}
    assert methods_and_urls(requests_mock) == [("DELETE", url("/api/v0/instances/7/"))] * 2


def test_destroy_retried_then_404_counts_as_already_gone(requests_mock, hook):
    requests_mock.delete(url("/api/v0/instances/7/"), [{"exc": requests.exceptions.ReadTimeout}, fail(404)])

    assert hook.destroy_instance(7) == {"success": True, "already_gone": True}
    assert requests_mock.call_count == 2


def test_stop_is_retried_on_503_and_connection_error(requests_mock, hook):
    requests_mock.put(
        url("/api/v0/instances/7/"),
        [fail(503), {"exc": requests.exceptions.ConnectionError}, ok({"success": True})],
    )

    assert hook.stop_instance(7) == {"success": True}
    assert requests_mock.call_count == 3
    assert all(r.json() == {"state": "stopped"} for r in requests_mock.request_history)


def test_client_errors_are_not_retried(requests_mock, hook):
    requests_mock.get(INSTANCES, status_code=400, json={"msg": "bad"})

    with pytest.raises(Exception, match="bad"):
        hook.list_instances()

    assert requests_mock.call_count == 1


# --- Create instance: never re-sent blindly ----------------------------------------------------------------
def test_create_502_without_label_raises_ambiguous_error_and_sends_one_put(requests_mock, hook):
    requests_mock.put(ASK, [fail(502, "bad gateway"), ok(CREATED)])
    requests_mock.get(INSTANCES, json={"instances": []})

    with pytest.raises(GpuMarketAmbiguousCreateError) as caught:
        hook.create_instance(101, image="img")

    assert methods_and_urls(requests_mock) == [("PUT", ASK)]
    exc = caught.value
    assert exc.status_code == 502
    assert exc.operation == "create_instance"
    assert "list_instances()" in str(exc)
    assert "label" in str(exc)
    assert "bad gateway" in str(exc)


@pytest.mark.parametrize("status", [500, 504])
def test_create_500_or_504_without_label_is_ambiguous_too(requests_mock, hook, status):
    requests_mock.put(ASK, [fail(status), ok(CREATED)])

    with pytest.raises(GpuMarketAmbiguousCreateError):
        hook.create_instance(101, image="img")

    assert requests_mock.call_count == 1


def test_create_502_with_label_found_in_the_list_returns_that_instance_without_re_sending(requests_mock, hook):
    requests_mock.put(ASK, [fail(502), ok(CREATED)])
    requests_mock.get(
        INSTANCES,
        json={"instances": [{"id": 10, "label": "other"}, {"id": 8123, "label": "job-42", "actual_status": None}]},
    )

    result = hook.create_instance(101, image="img", label="job-42")

    assert result == {"success": True, "new_contract": 8123, "instance_api_key": None, "ambiguous": True}
    assert methods_and_paths(requests_mock) == [("PUT", ASK), ("GET", INSTANCES)]


def test_create_502_with_label_found_twice_returns_the_newest(requests_mock, hook):
    requests_mock.put(ASK, [fail(502)])
    requests_mock.get(INSTANCES, json={"instances": [{"id": 900, "label": "job-42"}, {"id": 950, "label": "job-42"}]})

    assert hook.create_instance(101, image="img", label="job-42")["new_contract"] == 950


def test_create_502_with_label_not_found_is_re_sent_and_succeeds(requests_mock, hook, masked):
    requests_mock.put(ASK, [fail(502), ok(CREATED)])
    requests_mock.get(INSTANCES, json={"instances": [{"id": 10, "label": "other"}]})

    result = hook.create_instance(101, image="img", label="job-42")

    assert result == {**CREATED, "ambiguous": True}  # re-sent: the caller should look for a late duplicate
    # looked at once, and again once the request's timeout has passed, before sending again
    assert methods_and_paths(requests_mock) == [("PUT", ASK), ("GET", INSTANCES), ("GET", INSTANCES), ("PUT", ASK)]
    assert [r.json() for r in requests_mock.request_history if r.method == "PUT"] == [
        {"image": "img", "label": "job-42"}
    ] * 2
    assert CREATED["instance_api_key"] in masked


def test_create_read_timeout_with_label_found_returns_that_instance(requests_mock, hook):
    requests_mock.put(ASK, [{"exc": requests.exceptions.ReadTimeout}, ok(CREATED)])
    requests_mock.get(INSTANCES, json={"instances": [{"id": 8124, "label": "job-43"}]})

    assert hook.create_instance(101, image="img", label="job-43") == {
        "success": True,
        "new_contract": 8124,
        "instance_api_key": None,
        "ambiguous": True,
    }
    assert [m for m, _ in methods_and_urls(requests_mock)] == ["PUT", "GET"]


def test_create_429_is_re_sent_after_retry_after(requests_mock, hook, sleeps):
    requests_mock.put(ASK, [fail(429, **{"Retry-After": "3"}), ok(CREATED)])

    assert hook.create_instance(101, image="img") == CREATED
    assert methods_and_urls(requests_mock) == [("PUT", ASK)] * 2
    assert sleeps == [3.0]


def test_create_503_is_re_sent(requests_mock, hook):
    requests_mock.put(ASK, [fail(503), ok(CREATED)])

    assert hook.create_instance(101, image="img") == CREATED
    assert methods_and_urls(requests_mock) == [("PUT", ASK)] * 2


def test_create_connect_timeout_is_re_sent_because_nothing_reached_the_server(requests_mock, hook):
    requests_mock.put(ASK, [{"exc": requests.exceptions.ConnectTimeout}, ok(CREATED)])

    assert hook.create_instance(101, image="img") == CREATED
    assert methods_and_urls(requests_mock) == [("PUT", ASK)] * 2


def _refused() -> requests.exceptions.ConnectionError:
    """What requests raises when the TCP connection is refused: nothing reached the server."""
    reason = NewConnectionError(None, "Failed to establish a new connection: [Errno 111] Connection refused")
    return requests.exceptions.ConnectionError(MaxRetryError(None, "/api/v0/asks/101/", reason=reason))


def _aborted() -> requests.exceptions.ConnectionError:
    """What requests raises when the server hangs up after the request was sent: it may have been processed."""
    return requests.exceptions.ConnectionError(
        ProtocolError("Connection aborted.", RemoteDisconnected("Remote end closed connection without response"))
    )


def test_create_connection_refused_is_re_sent(requests_mock, hook):
    requests_mock.put(ASK, [{"exc": _refused()}, ok(CREATED)])

    assert hook.create_instance(101, image="img") == CREATED
    assert requests_mock.call_count == 2


def test_create_connection_aborted_after_sending_without_label_is_ambiguous(requests_mock, hook):
    requests_mock.put(ASK, [{"exc": _aborted()}, ok(CREATED)])

    with pytest.raises(GpuMarketAmbiguousCreateError, match="may have reached the server"):
        hook.create_instance(101, image="img")

    assert requests_mock.call_count == 1


def test_create_read_timeout_without_label_is_ambiguous_and_sent_once(requests_mock, hook):
    requests_mock.put(ASK, [{"exc": requests.exceptions.ReadTimeout}, ok(CREATED)])

    with pytest.raises(GpuMarketAmbiguousCreateError) as caught:
        hook.create_instance(101, image="img")

    assert requests_mock.call_count == 1
    assert caught.value.status_code is None
    assert "ReadTimeout" in str(caught.value)


def test_create_keeps_trying_through_429s_beyond_max_retries(requests_mock, hook):
    # A 429 made nothing, so a create waits its turn: a fleet of tasks renting at once must not fail on the budget.
    requests_mock.put(ASK, [{"status_code": 429, "text": "API requests too frequent"}] * 12 + [ok(CREATED)])

    assert hook.create_instance(101, image="img")["new_contract"] == 7001
    assert requests_mock.call_count == 13  # the connection allows 3 retries


def test_create_429s_beyond_the_patience_raise_rate_limit_error(requests_mock, hook, monkeypatch):
    monkeypatch.setattr("airflow_gpumarket.api.retry.RATE_LIMIT_PATIENCE_SECONDS", 0.0)
    requests_mock.put(ASK, status_code=429)

    with pytest.raises(GpuMarketRateLimitError):
        hook.create_instance(101, image="img")
    assert requests_mock.call_count == 1


def test_create_still_stops_after_max_retries_of_503(requests_mock, hook):
    requests_mock.put(ASK, status_code=503, json={"msg": "down"})

    with pytest.raises(GpuMarketServerError):
        hook.create_instance(101, image="img")
    assert requests_mock.call_count == 4


# --- Other non-idempotent calls ----------------------------------------------------------------------------
def test_create_endpoint_is_not_re_sent_on_502(requests_mock, hook):
    requests_mock.post(url("/api/v0/endptjobs"), [fail(502), ok({"success": True, "result": 1})])

    with pytest.raises(GpuMarketServerError):
        hook.create_endpoint(endpoint_name="x")

    assert requests_mock.call_count == 1


def test_create_endpoint_is_not_re_sent_on_read_timeout(requests_mock, hook):
    requests_mock.post(url("/api/v0/endptjobs"), [{"exc": requests.exceptions.ReadTimeout}, ok({"success": True})])

    with pytest.raises(GpuMarketTransportError):
        hook.create_endpoint(endpoint_name="x")

    assert requests_mock.call_count == 1


def test_create_endpoint_is_re_sent_on_429(requests_mock, hook):
    requests_mock.post(url("/api/v0/endptjobs"), [fail(429), ok({"success": True, "result": 5})])

    assert hook.create_endpoint(endpoint_name="x") == {"success": True, "result": 5}
    assert requests_mock.call_count == 2


def test_regenerate_backup_codes_is_not_re_sent_on_502(requests_mock, hook):
    requests_mock.put(url("/api/v0/tfa/regen-backup-codes"), [fail(502), ok({"msg": "ok", "backup_codes": []})])

    with pytest.raises(GpuMarketServerError):
        hook.regenerate_backup_codes(tfa_method="totp", code="123456")

    assert requests_mock.call_count == 1


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


def test_after_an_ambiguous_create_the_label_is_looked_for_at_once(requests_mock, hook, sleeps):
    # A quick job may destroy its instance soon after it boots: look before it can vanish.
    requests_mock.put(ASK, [fail(502), ok(CREATED)])
    requests_mock.get(INSTANCES, json={"instances": [{"id": 8123, "label": "job-44"}]})
    assert hook.create_instance(101, image="img", label="job-44")["new_contract"] == 8123
    assert len(sleeps) == 1 and sleeps[0] < hook.settings.timeout
    assert [m for m, _ in methods_and_urls(requests_mock)] == ["PUT", "GET"]


def test_an_ambiguous_create_not_found_at_once_gets_the_request_timeout_to_land_before_a_second_look(
    requests_mock, hook, sleeps
):
    # A create still in flight on the server must be found by its label, not sent a second time.
    requests_mock.put(ASK, [fail(502), ok(CREATED)])
    requests_mock.get(INSTANCES, [{"json": {"instances": []}}, {"json": {"instances": [{"id": 8125, "label": "j"}]}}])
    assert hook.create_instance(101, image="img", label="j")["new_contract"] == 8125
    assert len(sleeps) == 2 and 0 < hook.settings.timeout - sleeps[1] < 1  # the rest of the timeout
    assert [m for m, _ in methods_and_urls(requests_mock)] == ["PUT", "GET", "GET"]
