"""Authentication: the account key, the restricted per-instance key, and the loopback-only admin surface."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from .helpers import Api


@pytest.fixture
def instance(api):
    return api.create()


@pytest.fixture
def instance_key(sim, instance):
    return Api(sim, instance["instance_api_key"])


ACCOUNT_ROUTES = [
    ("POST", "/api/v0/bundles/", {}),
    ("GET", "/api/v0/instances/", None),
    ("GET", "/api/v0/instances/pending-price-increases", None),
    ("POST", "/api/v0/volumes", {"machine": 9001}),
    ("POST", "/api/v0/endptjobs", {}),
    ("PUT", "/api/v0/tfa/regen-backup-codes", {"backup_code": "x"}),
    ("DELETE", "/api/v0/deployments", {"name": "x"}),
    ("GET", "/api/v0/auth/apikeys", None),
    ("GET", "/api/v0/users/cloud_integrations", None),
]


@pytest.mark.parametrize(("method", "path", "body"), ACCOUNT_ROUTES)
def test_missing_authorization_header_is_401(api, method, path, body):
    response = api.call(method, path, body, key=None)
    assert response.status_code == 401
    assert response.json()["error"]


@pytest.mark.parametrize("header", ["Basic abc", "Bearer", "Bearer ", "Token abc", "Bearer a b", "abc"])
def test_malformed_authorization_header_is_401(api, header):
    response = api.call("GET", "/api/v0/instances/", key=None, headers={"Authorization": header})
    assert response.status_code == 401


@pytest.mark.parametrize(("method", "path", "body"), ACCOUNT_ROUTES)
def test_unknown_key_is_403(api, method, path, body):
    response = api.call(method, path, body, key="not-a-key")
    assert response.status_code == 403
    assert response.json()["error"] == "invalid_api_key"


def test_bearer_scheme_is_case_insensitive(api, sim):
    response = api.call("GET", "/api/v0/instances/", key=None, headers={"Authorization": f"bearer {sim.api_key}"})
    assert response.status_code == 200


def test_create_instance_requires_the_account_key(api, instance_key):
    offer = api.search({"limit": 2})[1]
    assert api.put(f"/api/v0/asks/{offer['id']}/", {"image": "u"}, key=None).status_code == 401
    assert instance_key.put(f"/api/v0/asks/{offer['id']}/", {"image": "u"}).status_code == 403


def test_instance_key_can_stop_its_own_instance(api, instance, instance_key):
    path = f"/api/v0/instances/{instance['new_contract']}/"
    assert instance_key.put(path, {"state": "stopped"}).json() == {"success": True}
    assert api.status(instance["new_contract"]) == "stopped"


def test_instance_key_can_start_its_own_instance(api, instance, instance_key):
    path = f"/api/v0/instances/{instance['new_contract']}/"
    instance_key.put(path, {"state": "stopped"})
    assert instance_key.put(path, {"state": "running"}).status_code == 200
    assert api.status(instance["new_contract"]) in (None, "loading")  # booting again


def test_instance_key_can_destroy_its_own_instance(api, instance, instance_key):
    path = f"/api/v0/instances/{instance['new_contract']}/"
    assert instance_key.delete(path).json() == {"success": True}
    assert api.get(path).status_code == 404


def test_instance_key_gets_404_after_its_instance_is_destroyed(instance, instance_key):
    path = f"/api/v0/instances/{instance['new_contract']}/"
    instance_key.delete(path)
    assert instance_key.delete(path).status_code == 404


def test_instance_key_cannot_get_its_own_instance(instance, instance_key):
    assert instance_key.get(f"/api/v0/instances/{instance['new_contract']}/").status_code == 403


def test_instance_key_cannot_list_instances(instance_key):
    assert instance_key.get("/api/v0/instances/").status_code == 403


@pytest.mark.parametrize(("method", "path", "body"), ACCOUNT_ROUTES)
def test_instance_key_is_refused_everywhere_else(instance_key, method, path, body):
    response = instance_key.call(method, path, body)
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"


def test_instance_key_cannot_touch_another_instance(api, instance_key):
    other = api.create(api.search({"limit": 1})[0]["id"])["new_contract"]
    path = f"/api/v0/instances/{other}/"
    assert instance_key.put(path, {"state": "stopped"}).status_code == 403
    assert instance_key.delete(path).status_code == 403
    assert api.status(other) is None


def test_request_log_records_the_key_kind(sim, api, instance, instance_key):
    instance_key.get("/api/v0/instances/")
    api.get("/api/v0/instances/", key=None)
    api.get("/api/v0/instances/", key="wrong")
    kinds = [(r["key"], r["status"]) for r in sim.state()["requests"][-4:]]
    assert kinds[-3:] == [("instance", 403), ("none", 401), ("invalid", 403)]
    assert sim.state()["requests"][0]["key"] == "account"


def test_admin_surface_refuses_non_loopback_clients(sim):
    from gpumarket_simulator.app import build_app

    app = build_app(sim._market)

    async def from_remote_client():
        remote = httpx.ASGITransport(app=app, client=("192.0.2.10", 4242))
        async with httpx.AsyncClient(transport=remote, base_url="http://sim") as client:
            admin = await client.get("/_sim/state")
            api = await client.get("/api/v0/instances/", headers={"Authorization": f"Bearer {sim.api_key}"})
            return admin, api

    admin, api = asyncio.run(from_remote_client())
    assert admin.status_code == 403 and admin.json()["error"] == "forbidden"
    assert api.status_code == 200  # the API itself answers remote clients


def test_admin_surface_needs_no_key_from_loopback(api):
    assert api.get("/_sim/state", key=None).status_code == 200
