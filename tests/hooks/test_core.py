"""What both hooks do, written once as flows (``hooks/core.py``): retries of reads, stop and destroy (429 honouring
Retry-After, 5xx, connection errors); a create never re-sent blindly; the logs endpoint; the key kept secret; reads,
labels and the service's clock."""

from __future__ import annotations

import logging
import pickle
import sys
import traceback
from http.client import RemoteDisconnected

import pytest
import requests
from hook_fakes import API_KEY, AUTH_HEADER, HOOK_LOGGER, methods_and_paths, methods_and_urls, page, url
from urllib3.exceptions import MaxRetryError, NewConnectionError, ProtocolError

from airflow_gpumarket import api, job_logs
from airflow_gpumarket.exceptions import (
    GpuMarketAmbiguousCreateError,
    GpuMarketAuthError,
    GpuMarketCreateRefusedError,
    GpuMarketError,
    GpuMarketNotFoundError,
    GpuMarketRateLimitError,
    GpuMarketServerError,
    GpuMarketTransportError,
    GpuMarketValidationError,
)
from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

INSTANCES = url("/api/v1/instances/")
ASK = url("/api/v0/asks/101/")
CREATED = {"success": True, "new_contract": 7001, "instance_api_key": "inst-key-0123456789abcdef"}
REFUSED_BID = {
    "success": False,
    "new_contract": 4242,
    "instance_api_key": "inst-key-0123456789abcdef",
    "msg": "Your bid is below the machine's minimum bid: the instance was created stopped.",
}
LOGS = "/api/v0/instances/request_logs/7001/"
STORAGE = "https://storage.example.net/logs/tok-3f9a1c"
V1 = url(api.PATH_INSTANCES_V1)
INSTANCE_7 = url(api.PATH_INSTANCE.format(instance_id=7))


@pytest.fixture(autouse=True)
def _no_pacing(monkeypatch):
    """The retry policy is exercised through list, create and destroy calls here; the budgets' slot waits, which
    every try takes too (tests/api/test_retry.py), would mix with the backoffs recorded."""
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


def test_rule_retries_that_fail_the_same_way_are_quoted_whole_once(requests_mock, hook, sleeps, caplog):
    caplog.set_level(logging.DEBUG, logger=HOOK_LOGGER)
    requests_mock.get(INSTANCES, [fail(503), fail(503), fail(503), ok({"instances": []})])

    assert hook.list_instances() == []

    lines = [(r.levelno, r.getMessage()) for r in caplog.records if "retrying in" in r.getMessage()]
    assert [level for level, _ in lines] == [logging.WARNING, logging.INFO, logging.INFO]
    assert "HTTP 503" in lines[0][1] and lines[1][1].startswith("Try 2 failed the same way; retrying in")


def test_429_without_retry_after_is_retried_with_backoff(requests_mock, hook, sleeps):
    requests_mock.get(INSTANCES, [fail(429), ok({"instances": []})])

    assert hook.list_instances() == []

    assert requests_mock.call_count == 2
    assert sleeps == [0.0]  # the connection's retry_min_wait is 0


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


# --- Create instance: answered success=false -------------------------------------------------------------------
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


# --- Logs (live service): request, wait for the upload, fetch it without the key -------------------------------
def answer_with(requests_mock, *uploads, status=200):
    requests_mock.put(url(LOGS), json={"success": True, "result_url": STORAGE, "msg": "soon"}, status_code=status)
    requests_mock.get(STORAGE, uploads or [{"text": "hello\n"}])


def test_request_logs_sends_the_clients_body_shape_with_the_key(hook, requests_mock):
    answer_with(requests_mock)
    result = hook.request_instance_logs(7001, tail=200, filter="loss", daemon_logs=True)
    assert result["result_url"] == STORAGE
    sent = requests_mock.request_history[0]
    assert (sent.method, sent.url) == ("PUT", url(LOGS))
    assert sent.headers["Authorization"] == AUTH_HEADER
    assert sent.json() == {"tail": "200", "filter": "loss", "daemon_logs": "true"}


def test_request_logs_without_options_sends_an_empty_object(hook, requests_mock):
    answer_with(requests_mock)
    hook.request_instance_logs(7001)
    assert requests_mock.request_history[0].json() == {}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tail": 0}, "tail"),
        ({"tail": "ten"}, "tail"),
        ({"tail": True}, "tail"),
        ({"filter": ""}, "filter"),
        ({"daemon_logs": "yes"}, "daemon_logs"),
        ({"instance_id": 0}, "instance_id"),
    ],
)
def test_bad_log_arguments_are_refused_before_anything_is_sent(hook, wire, kwargs, field):
    instance_id = kwargs.pop("instance_id", 7001)
    with pytest.raises(GpuMarketValidationError, match=field):
        hook.get_instance_logs(instance_id, **kwargs)
    assert wire.request_history == []


def test_the_log_is_fetched_without_the_api_key_once_uploaded(hook, requests_mock, sleeps):
    answer_with(requests_mock, {"status_code": 404}, {"status_code": 403}, {"text": "line 1\nline 2\n"})
    assert hook.get_instance_logs(7001) == "line 1\nline 2\n"
    put, *gets = requests_mock.request_history
    assert put.json() == {"tail": str(api.LOG_TAIL_DEFAULT)}
    assert len(gets) == 3
    assert all("Authorization" not in g.headers and API_KEY not in str(g.headers) for g in gets)
    assert sleeps == [api.LOG_FETCH_INTERVAL_SECONDS] * 3


def test_a_log_never_uploaded_fails_after_the_bounded_tries_without_repeating_the_url(hook, requests_mock, sleeps):
    answer_with(requests_mock, {"status_code": 404})
    with pytest.raises(GpuMarketError, match="not at its result URL on storage.example.net") as caught:
        hook.get_instance_logs(7001)
    assert "tok-3f9a1c" not in str(caught.value)
    assert len(requests_mock.request_history) == 1 + api.LOG_FETCH_TRIES


def test_an_answer_without_an_http_result_url_is_an_error(hook, requests_mock):
    requests_mock.put(url(LOGS), json={"success": True, "result_url": "file:///etc/passwd"})
    with pytest.raises(GpuMarketError, match="no http\\(s\\) result_url"):
        hook.get_instance_logs(7001)
    assert len(requests_mock.request_history) == 1


def test_an_unknown_instance_is_not_found(hook, requests_mock):
    requests_mock.put(url(LOGS), status_code=404, json={"error": "invalid_id", "msg": "no such instance"})
    with pytest.raises(GpuMarketNotFoundError):
        hook.get_instance_logs(7001)


def test_a_single_try_is_sent_when_retry_is_off(hook, requests_mock):
    requests_mock.put(url(LOGS), status_code=503, json={"error": "unavailable", "msg": "busy"})
    with pytest.raises(GpuMarketError):
        hook.get_instance_logs(7001, retry=False)
    assert len(requests_mock.request_history) == 1


def test_keys_are_masked_in_the_fetched_text(hook, requests_mock):
    instance_key = "ab" * 24
    text = f"{API_KEY}\n{instance_key}\nCONTAINER_API_KEY=zzz999\n"
    answer_with(requests_mock, {"text": text})
    out = hook.get_instance_logs(7001, key_digests=[job_logs.key_digest(instance_key)])
    assert API_KEY not in out and instance_key not in out and "zzz999" not in out


def test_instance_keys_this_process_created_are_masked_without_being_passed(hook, requests_mock):
    instance_key = "cd" * 24
    requests_mock.put(
        url("/api/v0/asks/5/"), json={"success": True, "new_contract": 7001, "instance_api_key": instance_key}
    )
    hook.create_instance(5, image="img")
    answer_with(requests_mock, {"text": f"key={instance_key}\n"})
    assert instance_key not in hook.get_instance_logs(7001)


def test_only_the_end_of_a_huge_log_is_kept_from_a_whole_line(hook, requests_mock, monkeypatch):
    monkeypatch.setattr(api.paths, "LOG_MAX_BYTES", 100)
    answer_with(requests_mock, {"text": "".join(f"line {i:04d}\n" for i in range(1000))})
    out = hook.get_instance_logs(7001)
    assert len(out) <= 100 and out.startswith("line ") and out.endswith("line 0999\n")


# --- Secrets: the key never shows in logs, exceptions or tracebacks; what the service returns is masked --------
def assert_key_absent_from_logs(caplog) -> None:
    for record in caplog.records:
        assert API_KEY not in record.getMessage(), record.getMessage()
        assert API_KEY not in repr(record.args)
        assert API_KEY not in (record.exc_text or "")
    assert API_KEY not in caplog.text


def assert_key_absent_from_exception(exc: BaseException) -> None:
    text = "".join(traceback.format_exception(exc))
    assert API_KEY not in text
    assert API_KEY not in repr(exc)
    assert API_KEY not in repr(vars(exc))
    assert API_KEY not in repr(pickle.loads(pickle.dumps(exc)).__dict__)


def test_401_leaves_the_key_out_of_logs_and_exception(requests_mock, hook, caplog):
    caplog.set_level(logging.DEBUG)
    requests_mock.get(url("/api/v1/instances/"), status_code=401, json={"error": "auth_error", "msg": "Invalid key"})

    with pytest.raises(GpuMarketAuthError) as caught:
        hook.list_instances()

    assert any("GET /api/v1/instances/ -> HTTP 401" in r.getMessage() for r in caplog.records)  # logs were captured
    assert_key_absent_from_logs(caplog)
    assert_key_absent_from_exception(caught.value)


def test_500_retried_leaves_the_key_out_of_logs_and_redacts_an_echo(requests_mock, hook, caplog):
    caplog.set_level(logging.DEBUG)
    echo = {"error": "server_error", "msg": f"upstream rejected Authorization: Bearer {API_KEY}"}
    requests_mock.get(url("/api/v1/instances/"), status_code=500, json=echo)

    with pytest.raises(GpuMarketServerError) as caught:
        hook.list_instances()

    retries = [r for r in caplog.records if r.name == HOOK_LOGGER and "retrying in" in r.getMessage()]
    assert len(retries) == 3  # one per retry: the error quoted whole the first time
    assert "Bearer ***" in retries[0].getMessage()
    assert_key_absent_from_logs(caplog)
    assert "upstream rejected Authorization: Bearer ***" in str(caught.value)
    assert caught.value.msg == "upstream rejected Authorization: Bearer ***"
    assert_key_absent_from_exception(caught.value)


def test_server_error_text_body_echoing_the_key_is_redacted(requests_mock, hook):
    requests_mock.get(url("/api/v0/auth/apikeys"), status_code=400, text=f"bad header: Bearer {API_KEY}")

    with pytest.raises(Exception) as caught:
        hook.list_api_keys()

    assert "bad header: Bearer ***" in str(caught.value)
    assert_key_absent_from_exception(caught.value)


def test_error_field_echoing_the_key_is_redacted(requests_mock, hook):
    requests_mock.get(url("/api/v0/auth/apikeys"), status_code=403, json={"error": f"key {API_KEY} revoked"})

    with pytest.raises(GpuMarketAuthError) as caught:
        hook.list_api_keys()

    assert caught.value.error == "key *** revoked"
    assert_key_absent_from_exception(caught.value)


def test_ambiguous_create_leaves_the_key_out(requests_mock, hook, caplog):
    caplog.set_level(logging.DEBUG)
    requests_mock.put(url("/api/v0/asks/101/"), status_code=502, json={"msg": f"proxy saw {API_KEY}"})

    with pytest.raises(GpuMarketAmbiguousCreateError) as caught:
        hook.create_instance(101, image="img")

    assert "proxy saw ***" in str(caught.value)
    assert_key_absent_from_exception(caught.value)
    assert caplog.records, "the hook logged nothing, so this test would prove nothing"
    assert_key_absent_from_logs(caplog)


def test_ambiguous_create_with_label_logs_without_the_key(requests_mock, hook, caplog):
    caplog.set_level(logging.DEBUG)
    requests_mock.put(url("/api/v0/asks/101/"), status_code=504, json={"msg": f"timeout {API_KEY}"})
    requests_mock.get(url("/api/v1/instances/"), json={"instances": [{"id": 3, "label": "job"}]})

    assert hook.create_instance(101, image="img", label="job")["new_contract"] == 3

    assert any("Found instance 3" in r.getMessage() for r in caplog.records)
    assert_key_absent_from_logs(caplog)


def test_validation_failures_leave_the_key_out(wire, hook, caplog, set_conn):
    caplog.set_level(logging.DEBUG)
    with pytest.raises(GpuMarketValidationError) as login_error:
        hook.create_instance(101, image="img", image_login=f"-u me -p {API_KEY}")
    assert_key_absent_from_exception(login_error.value)

    set_conn(host="http://api.example.com")
    with pytest.raises(GpuMarketValidationError) as conn_error:
        GpuMarketHook().list_instances()
    assert_key_absent_from_exception(conn_error.value)
    assert_key_absent_from_logs(caplog)
    assert wire.call_count == 0


def test_api_key_is_masked_as_soon_as_it_is_read(hook, masked):
    assert masked == []

    hook.settings  # noqa: B018 - reading the connection

    assert masked == [API_KEY]


def test_instance_api_key_is_masked_when_received(requests_mock, hook, masked):
    instance_key = "inst-restricted-key-4f1e2d3c"
    requests_mock.put(
        url("/api/v0/asks/101/"), json={"success": True, "new_contract": 5, "instance_api_key": instance_key}
    )

    hook.create_instance(101, image="img")

    assert instance_key in masked


def test_default_airflow_logger_output_leaves_the_key_out(requests_mock, capfd):
    """The hook's own (structlog) logger, as Airflow runs it: the retry warnings reach stdout/stderr key-free."""
    requests_mock.get(url("/api/v1/instances/"), status_code=503, json={"msg": f"echo {API_KEY}"})
    hook = GpuMarketHook()
    # Airflow 2.11 binds its console handlers to the output captured when an earlier test ran a DAG: to this one's.
    bound = [
        (handler, handler.setStream(sys.stderr))
        for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
        if isinstance(logger, logging.Logger)
        for handler in logger.handlers
        if type(handler) is logging.StreamHandler  # not a file, nor a handler that looks up sys.stderr itself
    ]
    try:
        with pytest.raises(GpuMarketServerError):
            hook.list_instances()
    finally:
        for handler, stream in bound:
            if stream is not None:
                handler.setStream(stream)

    out, err = capfd.readouterr()
    assert "retrying in" in out + err  # the warnings were written, so the check below means something
    assert API_KEY not in out + err


# --- Reads, labels and the service's clock ---------------------------------------------------------------------
def test_find_instance_believes_gone_only_when_the_list_agrees(requests_mock, hook):
    requests_mock.get(INSTANCE_7, json={"instances": None})
    requests_mock.get(V1, [page([{"id": 7, "actual_status": "running"}]), page([])])

    assert hook.find_instance(7) == {"id": 7, "actual_status": "running"}  # the read was wrong: still listed
    assert hook.find_instance(7) is None  # read and list agree


def test_find_instance_returns_the_read_without_listing(requests_mock, hook):
    requests_mock.get(INSTANCE_7, json={"instances": {"id": 7, "actual_status": "loading"}})

    assert hook.find_instance(7) == {"id": 7, "actual_status": "loading"}
    assert requests_mock.call_count == 1


def test_label_instance_puts_the_label_as_the_live_service_does(requests_mock, hook):
    requests_mock.put(INSTANCE_7, json={"success": True})

    hook.label_instance(7, "afgm-new")

    assert requests_mock.last_request.json() == {"label": "afgm-new"}


def test_a_lease_renewal_writes_the_renewed_label_and_a_refused_one_is_only_reported(requests_mock, hook, caplog):
    from airflow_gpumarket import lifecycle, waiting

    key = "0" * 12
    watch = waiting.Watch(label=lifecycle.make_label(key, 100), keepalive=90, lease_cap=1000)
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
