"""The API key never shows: not in log records, exception text, tracebacks or reprs. Secrets the service returns
(instance_api_key, backup codes) are handed to ``mask_secret`` as soon as they arrive.

The ``masked`` fixture replaces Airflow's masker, so these tests see what the hook itself writes.
"""

from __future__ import annotations

import logging
import pickle
import traceback

import pytest
from hook_fakes import API_KEY, HOOK_LOGGER, url

from airflow_gpumarket.exceptions import (
    GpuMarketAmbiguousCreateError,
    GpuMarketAuthError,
    GpuMarketServerError,
    GpuMarketValidationError,
)
from airflow_gpumarket.hooks.gpumarket import GpuMarketHook


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

    warnings = [r for r in caplog.records if r.name == HOOK_LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 3  # one per retry: the error was logged each time
    assert all("Bearer ***" in w.getMessage() for w in warnings)
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


def test_settings_hook_and_session_auth_reprs_hide_the_key(requests_mock, hook):
    requests_mock.get(url("/api/v1/instances/"), json={"instances": []})
    hook.list_instances()

    assert hook.settings.api_key == API_KEY  # the key is there...
    assert API_KEY not in repr(hook.settings)  # ...but not in any repr
    assert API_KEY not in str(hook.settings)
    assert API_KEY not in repr(hook.session.auth)
    assert API_KEY not in repr(hook)


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


def test_backup_codes_are_masked_when_received(requests_mock, hook, masked):
    codes = [f"code-{i}-zz81" for i in range(10)]
    requests_mock.put(url("/api/v0/tfa/regen-backup-codes"), json={"msg": "new codes", "backup_codes": codes})

    hook.regenerate_backup_codes(backup_code="old-code-1")

    assert [c for c in masked if c in codes] == codes


def test_default_airflow_logger_output_leaves_the_key_out(requests_mock, capfd):
    """The hook's own (structlog) logger, as Airflow runs it: the retry warnings reach stdout/stderr key-free."""
    requests_mock.get(url("/api/v1/instances/"), status_code=503, json={"msg": f"echo {API_KEY}"})
    hook = GpuMarketHook()

    with pytest.raises(GpuMarketServerError):
        hook.list_instances()

    out, err = capfd.readouterr()
    assert "retrying in" in out + err  # the warnings were written, so the check below means something
    assert API_KEY not in out + err
