"""The logs endpoint (live service; not in the spec): request, wait for the upload, fetch it without the key.

From the official client's source: ``PUT /api/v0/instances/request_logs/{id}/`` with an optional body (``tail``
as a string, ``filter``, ``daemon_logs: "true"``) answers ``result_url``, fetched with a plain GET that is tried
again while the upload has not landed.
"""

from __future__ import annotations

import pytest
from hook_fakes import API_KEY, AUTH_HEADER, url

from airflow_gpumarket import api, job_logs
from airflow_gpumarket.exceptions import GpuMarketError, GpuMarketNotFoundError, GpuMarketValidationError

LOGS = "/api/v0/instances/request_logs/7001/"
STORAGE = "https://storage.example.net/logs/tok-3f9a1c"


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
