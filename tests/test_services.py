"""A rented service's rules: its address in the live service's shapes, its credential, its probe's arguments, its
lease (the server's wrapper runs for real with sh)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from airflow_gpumarket import services
from airflow_gpumarket.exceptions import GpuMarketValidationError

SSH = {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41022"}]}


def test_rule_the_service_is_reached_at_the_port_mapped_to_itself_at_public_ipaddr():
    instance = {
        "public_ipaddr": "203.0.113.7",
        "ports": {**SSH, "41234/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41234"}]},
    }
    assert services.address(instance) == ("203.0.113.7", 41234)
    assert services.base_url(instance) == "https://203.0.113.7:41234"
    assert services.base_url({**instance, "public_ipaddr": "2001:db8::1"}) == "https://[2001:db8::1]:41234"
    assert services.base_url(instance, tls=False) == "http://203.0.113.7:41234"


@pytest.mark.parametrize(
    "instance",
    [
        {"public_ipaddr": "203.0.113.7", "ports": SSH},  # only SSH's mapping: not there yet
        {"public_ipaddr": None, "ports": {"41234/tcp": [{"HostPort": "41234"}]}},
        {"public_ipaddr": "203.0.113.7", "ports": None},
        {"public_ipaddr": "203.0.113.7", "ports": {"41234/udp": [{"HostPort": "41234"}]}},
        {"public_ipaddr": "203.0.113.7", "ports": {"41234/tcp": [{"HostPort": "x"}]}},
        {"public_ipaddr": "203.0.113.7", "ports": {"5/tcp": [{"HostPort": "5"}], "6/tcp": [{"HostPort": "6"}]}},
    ],
    ids=["ssh-only", "no-address", "no-ports", "udp", "bad-port", "two-identities"],
)
def test_an_instance_without_one_clear_service_address_has_none(instance):
    assert services.address(instance) is None and services.base_url(instance) is None


def test_rule_the_credential_is_per_rental_and_per_key():
    one = services.token("key-a", "afgm-0123456789ab-1")
    assert one == services.token("key-a", "afgm-0123456789ab-1") and len(one) == 64
    assert one != services.token("key-a", "afgm-0123456789ab-2") and one != services.token(
        "key-b", "afgm-0123456789ab-1"
    )
    assert "key-a" not in one


@pytest.mark.parametrize("value", ["health", "/a b", 3, ""])
def test_a_ready_path_that_is_not_a_path_is_refused_naming_it(value):
    with pytest.raises(GpuMarketValidationError, match="ready_path"):
        services.ready_path(value)


@pytest.mark.parametrize("value", [99, 600, "200", True])
def test_a_ready_status_that_is_not_an_http_status_is_refused_naming_it(value):
    with pytest.raises(GpuMarketValidationError, match="ready_status"):
        services.ready_status(value)


def run(command: str, lease: float, port: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"}
    if port is not None:
        env["VAST_TCP_PORT_70000"] = port
    script = services.server_command(command, lease)
    return subprocess.run(
        [shutil.which("sh") or "/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=60
    )


def test_rule_the_server_learns_its_port_and_its_exit_status_is_kept():
    done = run("echo port=$GPUMARKET_SERVICE_PORT; exit 3", lease=30, port="41234")
    assert done.stdout.splitlines()[1:] == ["port=41234"] and done.returncode == 3
    assert run("echo port=$GPUMARKET_SERVICE_PORT", lease=30).stdout.splitlines()[-1] == "port=70000"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the service's certificate")
def test_rule_the_instance_makes_the_rentals_certificate_prints_it_and_keeps_its_key():
    command = 'cat "$GPUMARKET_SERVICE_CERT" > /dev/null && test -s "$GPUMARKET_SERVICE_KEY" && echo key-here'
    lines = run(command, lease=30).stdout.splitlines()
    certificate = services.certificate_in(lines)
    assert certificate and lines[-1] == "key-here" and not any("PRIVATE KEY" in line for line in lines)
    services.pinned_context(certificate)  # a certificate the client can pin
    assert services.certificate_in(["gpumarket: no service certificate (openssl failed)"]) == ""
    assert services.certificate_in(["other"]) is None


def test_rule_the_lease_ends_the_server_as_a_success_so_that_the_wrapper_destroys_the_instance():
    done = run("echo 'it'\"'\"'s up'; sleep 30", lease=1)
    assert done.returncode == 0
    assert done.stdout.splitlines()[1:] == ["it's up", "gpumarket: the service's lease of 1 s ended"]


def test_a_service_whose_env_is_a_template_parses_and_asks_for_its_port_once_rendered():
    from airflow_gpumarket.operators.service import GpuMarketServiceOperator
    from airflow_gpumarket.operators.spec import RentalSpec

    op = GpuMarketServiceOperator(
        task_id="serve", offer_filters={}, image="img", command="serve", env="{{ var.json.serve_env }}"
    )
    assert op.instance["env"] == "{{ var.json.serve_env }}"  # parsed: checked again once rendered
    op.instance = {**op.instance, "env": {"MODEL": "m"}}  # as Airflow renders it
    body = RentalSpec.of(op).creation_body(label="afgm-0123456789ab-1", base_url="https://x.invalid", service_key="k")
    assert body["env"][services.PORT_MAPPING] == "1" and body["env"]["MODEL"] == "m"
    assert body["env"][services.TOKEN_VARIABLE] == services.token("k", "afgm-0123456789ab-1")


def test_the_probe_connects_to_the_host_and_port_of_a_service_url_ipv6_included():
    from airflow_gpumarket.service_probe import _host_port

    assert _host_port("https://203.0.113.7:41234") == ("203.0.113.7", 41234)
    assert _host_port("https://[2001:db8::7]:41234") == ("2001:db8::7", 41234)
