"""Connection rules (``hooks/connection.py``): base URL from the host, API key from the password (never in a repr),
extras, plaintext http only to loopback."""

from __future__ import annotations

import pytest
from hook_fakes import API_KEY, AUTH_HEADER, url

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import (
    GpuMarketValidationError,
)
from airflow_gpumarket.hooks.connection import ConnectionSettings, settings_from_connection
from airflow_gpumarket.hooks.gpumarket import GpuMarketHook


def settings(host="https://api.example.com", port=None, password=API_KEY, extra=None) -> ConnectionSettings:
    return settings_from_connection("gpumarket_default", host, port, password, extra or {})


# --- Host and password -------------------------------------------------------------------------------------
@pytest.mark.parametrize("host", [None, ""])
def test_empty_host_is_an_error_with_no_hidden_default(host):
    with pytest.raises(GpuMarketValidationError) as caught:
        settings(host=host)
    assert caught.value.field == "connection 'gpumarket_default' host"
    assert "base URL" in str(caught.value)


@pytest.mark.parametrize("password", [None, ""])
def test_empty_password_is_an_error(password):
    with pytest.raises(GpuMarketValidationError) as caught:
        settings(password=password)
    assert caught.value.field == "connection 'gpumarket_default' password"
    assert "API key" in str(caught.value)


@pytest.mark.parametrize(
    "host", ["http://api.example.com", "http://10.0.0.5:8080", "HTTP://api.example.com/", "http://localhost.evil.com"]
)
def test_plaintext_http_to_a_non_loopback_host_is_refused(host):
    with pytest.raises(GpuMarketValidationError, match="plaintext http") as caught:
        settings(host=host)
    assert caught.value.field == "connection 'gpumarket_default' host"


def test_plaintext_http_to_a_non_loopback_host_sends_nothing(wire, set_conn, hook):
    set_conn(host="http://api.example.com")

    with pytest.raises(GpuMarketValidationError, match="https://"):
        hook.list_instances()

    assert wire.call_count == 0


@pytest.mark.parametrize(
    ("host", "base_url"),
    [
        ("http://127.0.0.1:8765", "http://127.0.0.1:8765"),
        ("http://localhost:8765/", "http://localhost:8765"),
        ("http://[::1]:8765", "http://[::1]:8765"),
        ("127.0.0.1:8765", "http://127.0.0.1:8765"),
        ("api.example.com", "https://api.example.com"),
        ("https://api.example.com/", "https://api.example.com"),
        ("https://gw.example.com/gpumarket/", "https://gw.example.com/gpumarket"),
    ],
)
def test_base_url_from_host(host, base_url):
    assert settings(host=host).base_url == base_url


def test_bare_loopback_host_with_connection_port_gives_an_http_base_url():
    assert settings(host="127.0.0.1", port=8765).base_url == "http://127.0.0.1:8765"


def test_connection_port_is_added_to_an_https_host_without_one():
    assert settings(host="https://api.example.com", port=8443).base_url == "https://api.example.com:8443"
    assert settings(host="https://api.example.com:9443", port=8443).base_url == "https://api.example.com:9443"


@pytest.mark.parametrize("host", ["ftp://api.example.com", "https://"])
def test_host_that_is_not_a_base_url_is_refused(host):
    with pytest.raises(GpuMarketValidationError, match="not a base URL"):
        settings(host=host)


def test_loopback_simulator_url_is_used_for_requests(requests_mock, set_conn, hook):
    set_conn(host="http://127.0.0.1:8765")
    requests_mock.get("http://127.0.0.1:8765/api/v1/instances/", json={"instances": []})

    assert hook.list_instances() == []
    assert requests_mock.last_request.url == "http://127.0.0.1:8765/api/v1/instances/?limit=25"
    assert requests_mock.last_request.headers["Authorization"] == AUTH_HEADER


def test_host_path_prefix_is_kept_before_the_api_path(requests_mock, set_conn, hook):
    set_conn(host="https://gw.example.com/gpumarket/")
    requests_mock.get("https://gw.example.com/gpumarket/api/v1/instances/", json={"instances": []})

    hook.list_instances()

    assert requests_mock.last_request.url == "https://gw.example.com/gpumarket/api/v1/instances/?limit=25"


# --- Extras ------------------------------------------------------------------------------------------------
def test_defaults_when_no_extras():
    s = settings()
    assert (s.timeout, s.verify, s.rate_limit_scale) == (30.0, True, 1.0)
    assert s.retry == api.RetryPolicy()


def test_extras_are_read():
    s = settings(
        extra={
            "timeout": 12,
            "max_retries": "2",
            "retry_min_wait": 0.5,
            "retry_max_wait": 9,
            "ca_bundle": "/ca.pem",
            "rate_limit_scale": "10",
        }
    )
    assert (s.timeout, s.rate_limit_scale) == (12.0, 10.0)
    assert (s.retry.max_retries, s.retry.min_wait, s.retry.max_wait) == (2, 0.5, 9.0)
    assert s.verify == "/ca.pem"


def test_empty_extra_values_mean_the_default():
    s = settings(extra={"timeout": "", "max_retries": "", "ca_bundle": ""})
    assert (s.timeout, s.retry.max_retries, s.verify) == (30.0, api.RetryPolicy.max_retries, True)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("timeout", "fast"),
        ("max_retries", -1),
        ("retry_min_wait", [1]),
        ("retry_max_wait", "-5"),
        ("max_retries", "inf"),
        ("timeout", "nan"),
        ("rate_limit_scale", "fast"),
        ("rate_limit_scale", -1),
    ],
)
def test_bad_extra_value_is_a_clear_error(name, value):
    with pytest.raises(GpuMarketValidationError) as caught:
        settings(extra={name: value})
    assert caught.value.field == f"connection 'gpumarket_default' extra {name!r}"
    assert "must be a number" in str(caught.value)


def test_timeout_extra_is_used_on_every_request(requests_mock, set_conn, hook):
    set_conn(extra={"timeout": 5, "max_retries": 0})
    requests_mock.get(url("/api/v1/instances/"), json={"instances": []})

    hook.list_instances()

    assert requests_mock.last_request.timeout == (5.0, 5.0)


def test_ca_bundle_extra_is_used_for_tls_verification(set_conn, hook):
    set_conn(extra={"ca_bundle": "/etc/ssl/private-ca.pem"})

    assert hook.session.verify == "/etc/ssl/private-ca.pem"


def test_hook_reads_the_named_connection(requests_mock, monkeypatch):
    from hook_fakes import conn_json

    monkeypatch.setenv("AIRFLOW_CONN_GPU_STAGING", conn_json(host="https://staging.example.com", password="k-stage-1"))
    requests_mock.get("https://staging.example.com/api/v1/instances/", json={"instances": []})

    GpuMarketHook(gpumarket_conn_id="gpu_staging").list_instances()

    assert requests_mock.last_request.headers["Authorization"] == "Bearer k-stage-1"


def test_hook_class_attributes_name_the_connection_type():
    assert GpuMarketHook.conn_type == "gpumarket"
    assert GpuMarketHook.default_conn_name == "gpumarket_default"
    assert GpuMarketHook.conn_name_attr == "gpumarket_conn_id"
    assert GpuMarketHook().gpumarket_conn_id == "gpumarket_default"


def test_settings_hook_and_session_auth_reprs_hide_the_key(requests_mock, hook):
    requests_mock.get(url("/api/v1/instances/"), json={"instances": []})
    hook.list_instances()

    assert hook.settings.api_key == API_KEY  # the key is there...
    assert API_KEY not in repr(hook.settings)  # ...but not in any repr
    assert API_KEY not in str(hook.settings)
    assert API_KEY not in repr(hook.session.auth)
    assert API_KEY not in repr(hook)
