"""Bad input is answered like the service would: a 4xx with the error object, never a 500 or a traceback."""

from __future__ import annotations

import pytest

from airflow_gpumarket.api import ONSTART_MAX_CHARS


@pytest.fixture
def ask_path(api):
    return f"/api/v0/asks/{api.cheapest()['id']}/"


def assert_error_object(response, status=400):
    assert response.status_code == status, response.text
    body = response.json()
    assert isinstance(body, dict) and ("error" in body or "msg" in body)
    assert "Traceback" not in response.text


def test_onstart_over_4048_characters_is_400(api, ask_path):
    response = api.put(ask_path, {"image": "u", "onstart": "x" * (ONSTART_MAX_CHARS + 1)})
    assert_error_object(response)
    assert response.json()["error"] == "onstart_too_long"


def test_onstart_of_exactly_4048_characters_is_accepted(api, ask_path):
    assert api.put(ask_path, {"image": "u", "onstart": "x" * ONSTART_MAX_CHARS}).status_code == 200


def test_malformed_json_is_400(api, ask_path):
    for raw in (b"{", b"{'image': 'u'}", b"not json", b'{"image": NaN}', b"\xff\xfe"):
        assert_error_object(api.call("PUT", ask_path, data=raw, headers={"Content-Type": "application/json"}))


def test_unknown_runtype_is_400(api, ask_path):
    assert_error_object(api.put(ask_path, {"image": "u", "runtype": "ssh_tunnel"}))


def test_unknown_target_state_is_400(api, ask_path):
    assert_error_object(api.put(ask_path, {"image": "u", "target_state": "paused"}))


@pytest.mark.parametrize("env", ["-e A=1 -p 22:22", ["A=1"], 5, True])
def test_env_not_an_object_is_400(api, ask_path, env):
    assert_error_object(api.put(ask_path, {"image": "u", "env": env}))


@pytest.mark.parametrize(
    "env",
    [
        {"-p 8080": "1"},
        {"-p 8080:8080": 1},
        {"-p 70000:8000": "1"},
        {"-e A": "1"},
        {"A=B": "1"},
        {"A": {"nested": 1}},
        {"A": None},
        {"": "x"},
    ],
)
def test_bad_env_entries_are_400(api, ask_path, env):
    assert_error_object(api.put(ask_path, {"image": "u", "env": env}))


@pytest.mark.parametrize(
    "body",
    [
        {"image": 5},
        {"image": ""},
        {"image": "u", "disk": "big"},
        {"image": "u", "disk": -1},
        {"image": "u", "disk": 10**400},
        {"image": "u", "label": 7},
        {"image": "u", "price": 0},
        {"image": "u", "cancel_unavail": "yes"},
        {"image": "u", "vm": 1},
        {"image": "u", "onstart": ["echo"]},
        {"image": "u", "image_login": "user:pass"},
        {"image": "u", "volume_info": {"volume_id": "a", "mount_path": "/x"}},
        {"image": "u", "volume_info": {"volume_id": 1, "mount_path": "relative"}},
        {"image": "u", "volume_info": {"volume_id": 1, "mount_path": "/x", "extra": 1}},
        {"template_hash_id": 12},
        {"image": "u", "runtype": ["ssh"]},
        {"image": "u", "target_state": {"x": 1}},
        [],
        "image",
        None,
    ],
)
def test_wrong_types_in_create_are_400(api, ask_path, body):
    assert_error_object(api.put(ask_path, body))


def test_null_optional_fields_count_as_not_sent(api, ask_path):
    assert api.put(ask_path, {"image": "u", "label": None, "env": None, "onstart": None}).status_code == 200


def test_unknown_create_fields_are_ignored(api, ask_path):
    assert api.put(ask_path, {"image": "u", "colour": "blue"}).status_code == 200


def test_non_integer_offer_id_is_404_no_such_ask(api):
    assert_error_object(api.put("/api/v0/asks/abc/", {"image": "u"}), 404)


def test_path_without_trailing_slash_is_404_error_object(api):
    assert_error_object(api.get("/api/v0/instances"), 404)
    assert_error_object(api.post("/api/v0/bundles", {}), 404)


def test_wrong_method_is_405_error_object(api):
    assert_error_object(api.call("PATCH", "/api/v0/instances/"), 405)


FUZZ_BODIES = [b"", b"{", b"[]", b"null", b"1", b'"x"', b"{}", b'{"a": {"b": [1, {"c": null}]}}', b"[" * 5000]
FUZZ_ROUTES = [
    ("POST", "/api/v0/bundles/"),
    ("PUT", "/api/v0/asks/{offer}/"),
    ("POST", "/api/v0/asks/{offer}/"),
    ("PUT", "/api/v0/instances/{instance}/"),
    ("DELETE", "/api/v0/instances/{instance}/"),
    ("GET", "/api/v0/instances/{instance}/"),
    ("POST", "/api/v0/volumes"),
    ("POST", "/api/v0/endptjobs"),
    ("PUT", "/api/v0/tfa/regen-backup-codes"),
    ("DELETE", "/api/v0/deployments"),
    ("GET", "/api/v0/instances/pending-price-increases"),
    ("GET", "/api/v0/auth/apikeys"),
    ("GET", "/api/v0/users/cloud_integrations"),
    ("POST", "/_sim/advance"),
    ("POST", "/_sim/reset"),
    ("PUT", "/_sim/faults"),
    ("POST", "/_sim/instances/{instance}/status"),
    ("POST", "/_sim/offers/{offer}/fate"),
    ("POST", "/_sim/machines/9001/online"),
    ("POST", "/_sim/pending-price-increases"),
    ("PUT", "/_sim/list-limit"),
    ("PUT", "/_sim/speed"),
]


def test_bad_input_never_yields_a_500(sim, api):
    offers = api.search({"limit": 2})
    instance_id = api.create(offers[1]["id"])["new_contract"]
    for method, template in FUZZ_ROUTES:
        path = template.format(offer=offers[0]["id"], instance=instance_id)
        for raw in FUZZ_BODIES:
            response = api.call(method, path, data=raw, headers={"Content-Type": "application/json"})
            assert response.status_code < 500, (method, path, raw[:20], response.text)
            assert "Traceback" not in response.text
    assert sim.state()["internal_errors"] == 0


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/api/v0/volumes", {"machines": [[1]]}),
        ("POST", "/api/v0/volumes", {"machine": {"id": 1}}),
        ("POST", "/api/v0/endptjobs", {"endpoint_state": ["active"]}),
        ("POST", "/api/v0/endptjobs", {"max_workers": 2.5}),
        ("PUT", "/api/v0/tfa/regen-backup-codes", {"tfa_method": ["totp"], "code": "1"}),
        ("PUT", "/api/v0/tfa/regen-backup-codes", {"tfa_method_id": 1.5, "code": "1"}),
        ("DELETE", "/api/v0/deployments", {"name": ["a"]}),
        ("POST", "/api/v0/bundles/", {"order": [[["x"], "asc"]]}),
        ("POST", "/api/v0/bundles/", {"gpu_name": {"eq": {"a": 1}}}),
    ],
)
def test_unhashable_values_are_4xx_not_500(sim, api, method, path, body):
    response = api.call(method, path, body)
    assert 400 <= response.status_code < 500, response.text
    assert sim.state()["internal_errors"] == 0


def test_a_genuine_bug_is_a_500_error_object(sim, api, monkeypatch):
    world = sim._market.world

    def broken(*args, **kwargs):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(world.price_increases, "listing", broken)
    response = api.get("/api/v0/instances/pending-price-increases")
    assert response.status_code == 500
    assert response.json()["error"] == "internal_error"
    assert "simulated bug" not in response.text
    assert sim.state()["internal_errors"] == 1
