"""The /_sim/ admin surface over HTTP, and the Python methods of MarketSimulator that mirror it."""

from __future__ import annotations

import asyncio
import json

import pytest

from gpumarket_simulator.app import build_app
from gpumarket_simulator.market import Market

from .conftest import SEED


@pytest.fixture
def admin(api):
    """Admin calls carry no key: the surface needs none."""

    def call(method, path, body=None):
        response = api.call(method, path, body, key=None)
        assert response.headers["content-type"].startswith("application/json")
        return response

    return call


def test_state_has_every_documented_section(admin):
    state = admin("GET", "/_sim/state").json()
    for key in (
        "now",
        "offers",
        "instances",
        "machines",
        "deployments",
        "endpoints",
        "tfa",
        "requests",
        "templates",
        "faults",
        "pending_price_increases",
    ):
        assert key in state, key
    assert {"id", "online", "owned"} <= set(state["machines"][0])
    assert {"name", "tag", "deleted", "endpoints", "workers"} <= set(state["deployments"][0])
    assert {"totp_secret", "code", "tfa_secret"} <= set(state["tfa"])


def test_state_instances_carry_the_ledger(api, admin):
    api.create()
    [inst] = admin("GET", "/_sim/state").json()["instances"]
    fields = {
        "id",
        "offer_id",
        "machine_id",
        "label",
        "actual_status",
        "destroyed",
        "created_at",
        "destroyed_at",
    }
    assert fields | {"compute_seconds", "storage_seconds", "cost"} <= set(inst)


def test_python_state_equals_http_state(sim, admin):
    http_state = admin("GET", "/_sim/state").json()
    python_state = sim.state()
    for key in ("offers", "machines", "templates", "deployments", "tfa", "now"):
        assert python_state[key] == http_state[key]


def test_advance_moves_the_clock(sim, admin):
    before = sim.now()
    body = admin("POST", "/_sim/advance", {"seconds": 90}).json()
    assert body["now"] == pytest.approx(before + 90)
    assert sim.advance(10) == pytest.approx(before + 100)


def test_clock_is_frozen_at_speed_zero(sim, admin):
    assert admin("GET", "/_sim/clock").json() == {"now": sim.now(), "speed": 0}


def test_speed_makes_the_clock_run(sim, admin):
    before = sim.now()
    admin("PUT", "/_sim/speed", {"speed": 1_000_000})
    admin("PUT", "/_sim/speed", {"speed": 0})
    assert sim.now() > before


def test_reset_restores_the_world_and_clears_instances_logs_and_clock(sim, api, admin):
    start = sim.now()
    api.create()
    sim.advance(1000)
    body = admin("POST", "/_sim/reset", {}).json()
    assert body == {"now": start, "seed": 0}
    state = sim.state()
    assert state["instances"] == [] and state["requests"] == [] and state["now"] == start


def test_reset_with_another_seed(sim, admin):
    offers = sim.state()["offers"]
    assert admin("POST", "/_sim/reset", {"seed": 7}).json()["seed"] == 7
    assert sim.state()["offers"] != offers
    sim.reset(seed=0)
    assert sim.state()["offers"] == offers


def test_faults_get_put_delete(api, admin):
    rule = {"endpoint": "list_instances", "kind": "status", "status": 503, "times": 1}
    assert admin("PUT", "/_sim/faults", {"rules": [rule]}).status_code == 200
    assert admin("GET", "/_sim/faults").json()["rules"] == [{**rule, "times_left": 1}]
    assert api.get("/api/v0/instances/").status_code == 503
    assert admin("GET", "/_sim/faults").json()["rules"][0]["times_left"] == 0
    admin("PUT", "/_sim/faults", [rule])  # a bare list works too
    assert admin("DELETE", "/_sim/faults").json() == {"rules": []}
    assert api.get("/api/v0/instances/").status_code == 200


def test_force_status_over_http(api, admin):
    instance_id = api.create()["new_contract"]
    assert admin("POST", f"/_sim/instances/{instance_id}/status", {"status": "offline"}).json() == {"success": True}
    assert api.status(instance_id) == "offline"


def test_force_status_errors(api, admin):
    instance_id = api.create()["new_contract"]
    assert admin("POST", f"/_sim/instances/{instance_id}/status", {"status": "dancing"}).status_code == 400
    assert admin("POST", f"/_sim/instances/{instance_id}/status", {}).status_code == 400
    assert admin("POST", "/_sim/instances/1/status", {"status": "exited"}).status_code == 404


def test_offer_fate_over_http(sim, api, admin):
    offer = api.cheapest()
    assert admin("POST", f"/_sim/offers/{offer['id']}/fate", {"fate": "offline"}).status_code == 200
    instance_id = api.create(offer["id"])["new_contract"]
    sim.advance(301)
    assert api.status(instance_id) == "offline"
    assert admin("POST", f"/_sim/offers/{offer['id']}/fate", {"fate": "melted"}).status_code == 400
    assert admin("POST", "/_sim/offers/1/fate", {"fate": "exited"}).status_code == 404


def test_offer_gpu_check_over_http_makes_the_next_rentals_boot_without_a_gpu(sim, api, admin):
    offer = api.cheapest()
    assert admin("POST", f"/_sim/offers/{offer['id']}/gpu_check", {"gpu_check": "fail"}).status_code == 200
    instance_id = api.create(offer["id"])["new_contract"]
    sim.advance(600)
    (instance,) = [i for i in sim.state()["instances"] if i["id"] == instance_id]
    assert api.status(instance_id) == "running" and instance["gpu_fault"] is True
    assert admin("POST", f"/_sim/offers/{offer['id']}/gpu_check", {"gpu_check": "flaky"}).status_code == 400
    assert admin("POST", "/_sim/offers/1/gpu_check", {"gpu_check": "fail"}).status_code == 404


def test_offer_fate_running_restores_normal_boots(sim, api):
    failing = next(o for o in sim.state()["offers"] if o["fate"] != "running" and o["rentable"])
    sim.set_offer_fate(failing["id"], "running")
    instance_id = api.create(failing["id"])["new_contract"]
    sim.advance(301)
    assert api.status(instance_id) == "running"


def test_vanish_offer_over_http(api, admin):
    offer = api.cheapest()
    assert admin("POST", f"/_sim/offers/{offer['id']}/vanish").status_code == 200
    assert api.put(f"/api/v0/asks/{offer['id']}/", {"image": "u"}).status_code == 409


def test_machine_online_over_http(api, admin):
    assert admin("POST", "/_sim/machines/9001/online", {"online": False}).status_code == 200
    assert api.post("/api/v0/volumes", {"machine": 9001}).status_code == 402
    assert admin("POST", "/_sim/machines/9001/online", {"online": "no"}).status_code == 400
    assert admin("POST", "/_sim/machines/1/online", {"online": True}).status_code == 404


def test_pending_price_increases_and_list_limit_over_http(api, admin):
    added = admin("POST", "/_sim/pending-price-increases", {"n": 4, "contract_id": 77}).json()["added"]
    assert [a["contract_id"] for a in added] == [77] * 4
    assert admin("PUT", "/_sim/list-limit", {"limit": 2}).json() == {"limit": 2}
    body = api.get("/api/v0/instances/pending-price-increases").json()
    assert body["count"] == 2 and body["truncated"] is True
    assert admin("PUT", "/_sim/list-limit", {"limit": -1}).status_code == 400


def test_onstart_of_an_instance_without_a_script_is_404(api, admin):
    instance_id = api.create()["new_contract"]
    assert admin("GET", f"/_sim/instances/{instance_id}/onstart").status_code == 404


def test_alive_instances(sim, api, admin):
    offers = api.search({"limit": 2})
    kept, gone = (api.create(o["id"])["new_contract"] for o in offers)
    api.delete(f"/api/v0/instances/{gone}/")
    assert [i["id"] for i in admin("GET", "/_sim/alive-instances").json()["instances"]] == [kept]
    assert [i["id"] for i in sim.alive_instances()] == [kept]


def test_request_log(sim, api, admin):
    sim.advance(5)
    api.get("/api/v0/instances/")
    api.post("/api/v0/bundles/", {"limit": 1})
    admin("GET", "/_sim/state")  # the admin surface is not logged
    log = admin("GET", "/_sim/requests").json()["requests"]
    assert [(r["method"], r["path"], r["status"], r["key"], r["op"]) for r in log] == [
        ("GET", "/api/v0/instances/", 200, "account", "list_instances"),
        ("POST", "/api/v0/bundles/", 200, "account", "search_offers"),
    ]
    assert log[0]["t"] == sim.now()
    assert sim.requests() == log


def test_state_is_a_copy(sim):
    state = sim.state()
    state["offers"].clear()
    assert sim.state()["offers"]
    json.dumps(state)  # plain JSON types only


def test_request_log_holds_a_request_before_its_answer_leaves():
    # A client that reads the log as soon as its answer arrives must find its request there.
    market = Market(speed=0, seed=SEED, profile="spec")
    app = build_app(market)
    seen_at_answer: list[list[tuple[str, str, int]]] = []

    async def send(message):
        if message["type"] == "http.response.start":
            seen_at_answer.append([(r["method"], r["path"], r["status"]) for r in market.requests])

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/api/v0/instances/",
        "raw_path": b"/api/v0/instances/",
        "query_string": b"",
        "headers": [(b"authorization", f"Bearer {market.api_key}".encode())],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 80),
        "scheme": "http",
        "http_version": "1.1",
        "root_path": "",
    }
    asyncio.run(app(scope, receive, send))
    assert seen_at_answer == [[("GET", "/api/v0/instances/", 200)]]
    assert len(market.requests) == 1


def test_every_answer_says_the_simulated_time_in_its_date_header(sim, api, admin):
    from email.utils import parsedate_to_datetime

    sim.advance(86_400)  # a day ahead of any wall clock
    for response in (api.call("GET", "/api/v0/instances/"), admin("GET", "/_sim/clock"), api.call("GET", "/nope")):
        said = parsedate_to_datetime(response.headers["date"]).timestamp()
        assert said == pytest.approx(sim.now(), abs=1.0)  # an HTTP date has whole seconds
