"""The doctor's checks that need no service: the connection's TLS, the pacing, and how a line reads."""

from __future__ import annotations

from airflow_gpumarket.commands.common import key_hint
from airflow_gpumarket.commands.doctor import FAIL, OK, WARN, Check, connection_check, rate_limit_check
from airflow_gpumarket.hooks.connection import settings_from_connection


def settings(host: str, **extra):
    return settings_from_connection("c", host, None, "k" * 40, extra)


def test_tls_is_verified_against_the_systems_store_or_an_existing_ca_bundle(tmp_path):
    check = connection_check(settings("https://api.example.com"))
    assert check.status == OK and "TLS, certificates verified against the system's CA store" in check.detail
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    assert (
        f"verified against {bundle}"
        in connection_check(settings("https://api.example.com", ca_bundle=str(bundle))).detail
    )
    missing = connection_check(settings("https://api.example.com", ca_bundle=str(tmp_path / "nope.pem")))
    assert missing.status == FAIL and missing.fails and "ca_bundle" in missing.fix


def test_plain_http_is_named_as_the_loopback_only_simulator():
    check = connection_check(settings("127.0.0.1:8000"))
    assert check.status == OK and check.detail.startswith("http://127.0.0.1:8000: plain http")


def test_no_pacing_towards_the_live_service_is_a_warning_with_its_fix_and_fine_towards_a_loopback_host():
    live = rate_limit_check(settings("https://api.example.com", rate_limit_scale=0))
    assert live.status == WARN and not live.fails and "remove the connection's extra rate_limit_scale" in live.fix
    assert rate_limit_check(settings("127.0.0.1:8000", rate_limit_scale=0)).status == OK


def test_the_pacing_shows_the_budgets_spacing_and_the_next_free_list_slot(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUMARKET_PACING_DIR", str(tmp_path))
    check = rate_limit_check(settings("https://api.example.com"))
    assert check.status == OK and "a list every 2.30 s, a create every 5.05 s, a destroy every 3.40 s" in check.detail
    assert f"shared by this machine's processes in {tmp_path}" in check.detail and "free now" in check.detail


def test_a_line_shows_its_fix_only_when_the_check_did_not_pass():
    assert Check("clock", OK, "in sync", "sync it").line() == "ok    clock        in sync"
    assert Check("clock", WARN, "off.", "sync it", needed=False).line() == "warn  clock        off. Fix: sync it"


def test_a_key_shows_its_last_four_characters_and_nothing_of_a_short_one():
    assert key_hint("0123456789abcdef") == "…cdef"
    assert "abc" not in key_hint("abcdefgh")


def test_the_api_servers_provider_version_is_compared_with_this_processs(monkeypatch):
    from types import SimpleNamespace

    import pytest

    from airflow_gpumarket import __version__
    from airflow_gpumarket._compat import is_airflow_2
    from airflow_gpumarket.commands import doctor
    from airflow_gpumarket.operators import budget

    if is_airflow_2():
        pytest.skip("Airflow 2's tasks keep the ledger in the metadata database: no api-server route")
    answers = {}

    def versions(conn_id):
        if isinstance(answers["seen"], Exception):
            raise answers["seen"]
        return answers["seen"]

    server = SimpleNamespace(url="http://api:8080/gpumarket/ledger", versions=versions)
    monkeypatch.setattr(budget, "api_server_ledger", lambda hook: server)
    checked = SimpleNamespace(gpumarket_conn_id="c")
    answers["seen"] = {"provider": __version__, "airflow": "3.3.2"}
    same = doctor.api_server_check(checked)
    assert same.status == OK and f"provider {__version__}, Airflow 3.3.2" in same.detail
    answers["seen"] = {"provider": "0.0.1", "airflow": "3.3.2"}
    older = doctor.api_server_check(checked)
    assert older.status == WARN and not older.fails and "same provider version" in older.fix
    answers["seen"] = OSError("connection refused")
    down = doctor.api_server_check(checked)
    assert down.status == WARN and "not reached at http://api:8080" in down.detail and "ledger_url" in down.fix
