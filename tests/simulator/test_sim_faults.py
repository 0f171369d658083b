"""Fault injection: scripted and random statuses, rate limits, latency, dropped connections, lost offers."""

from __future__ import annotations

import time

import pytest
import requests

from .helpers import Api


def get_status(api, path="/api/v0/instances/"):
    return api.get(path).status_code


def test_status_fault_answers_the_status_the_next_times_requests(sim, api):
    sim.set_faults([{"endpoint": "list_instances", "kind": "status", "status": 503, "times": 2}])
    first = api.get("/api/v0/instances/")
    assert first.status_code == 503 and {"error", "msg"} <= set(first.json())
    assert [get_status(api) for _ in range(3)] == [503, 200, 200]


def test_status_fault_only_hits_its_operation(sim, api):
    sim.set_faults([{"endpoint": "get_instance", "kind": "status", "status": 500, "times": 5}])
    assert get_status(api) == 200
    assert api.post("/api/v0/bundles/", {}).status_code == 200


def test_status_fault_on_every_operation(sim, api):
    sim.set_faults([{"endpoint": "*", "kind": "status", "status": 502}])
    assert get_status(api) == 502
    assert api.post("/api/v0/bundles/", {}).status_code == 502
    assert api.get("/_sim/state").status_code == 200  # never the admin surface


def test_status_fault_with_retry_after(sim, api):
    sim.set_faults([{"endpoint": "list_instances", "kind": "status", "status": 429, "times": 1, "retry_after": 2}])
    response = api.get("/api/v0/instances/")
    assert response.status_code == 429 and response.headers["Retry-After"] == "2"


def test_random_status_fault_is_seeded(sim, api):
    def pattern():
        sim.reset()
        sim.set_faults([{"endpoint": "list_instances", "kind": "status", "status": 500, "probability": 0.5}])
        return [get_status(api) for _ in range(40)]

    first = pattern()
    assert first == pattern()
    assert 5 < first.count(500) < 35


def test_rate_limit_answers_429_with_retry_after_over_budget(sim, api):
    sim.set_faults([{"kind": "rate_limit", "endpoint": "list_instances", "capacity": 3, "per_second": 0.01}])
    statuses = [api.get("/api/v0/instances/") for _ in range(5)]
    assert [r.status_code for r in statuses] == [200, 200, 200, 429, 429]
    assert int(statuses[3].headers["Retry-After"]) >= 1
    assert statuses[3].json()["error"] == "rate_limited"


def test_rate_limit_without_retry_after(sim, api):
    rule = {"kind": "rate_limit", "endpoint": "list_instances", "capacity": 1, "per_second": 0.01}
    sim.set_faults([{**rule, "retry_after": False}])
    api.get("/api/v0/instances/")
    response = api.get("/api/v0/instances/")
    assert response.status_code == 429 and "Retry-After" not in response.headers


def test_rate_limit_buckets_are_per_api_key(sim, api):
    instance = api.create()
    sim.set_faults([{"kind": "rate_limit", "endpoint": "*", "capacity": 1, "per_second": 0.01}])
    assert get_status(api) == 200
    assert get_status(api) == 429
    other = Api(sim, instance["instance_api_key"])
    assert other.put(f"/api/v0/instances/{instance['new_contract']}/", {"state": "stopped"}).status_code == 200


def test_rate_limit_refills_in_real_time(sim, api):
    sim.set_faults([{"kind": "rate_limit", "endpoint": "list_instances", "capacity": 1, "per_second": 50}])
    assert get_status(api) == 200
    deadline = time.monotonic() + 2
    while get_status(api) == 429:  # the bucket refills within ~20 ms of real time
        assert time.monotonic() < deadline


def test_latency_fault_delays_the_answer(sim, api):
    sim.set_faults([{"kind": "latency", "endpoint": "list_instances", "seconds": 0.2}])
    t0 = time.perf_counter()
    assert get_status(api) == 200
    assert time.perf_counter() - t0 >= 0.2


def test_drop_before_closes_the_connection_without_processing(sim, api):
    offer = api.cheapest()
    sim.set_faults([{"kind": "drop", "endpoint": "create_instance", "times": 1, "after": False}])
    with pytest.raises(requests.ConnectionError):
        api.put(f"/api/v0/asks/{offer['id']}/", {"image": "u", "label": "ambiguous"})
    assert sim.state()["instances"] == []
    assert api.create(offer["id"])["success"] is True


def test_drop_after_creates_the_instance_then_closes_the_connection(sim, api):
    offer = api.cheapest()
    sim.set_faults([{"kind": "drop", "endpoint": "create_instance", "times": 1, "after": True}])
    with pytest.raises(requests.ConnectionError):
        api.put(f"/api/v0/asks/{offer['id']}/", {"image": "u", "label": "ambiguous"})
    listed = api.get("/api/v0/instances/").json()["instances"]
    assert [i["label"] for i in listed] == ["ambiguous"]
    assert sim.state()["requests"][-2]["dropped"] is True


def test_server_keeps_serving_after_a_drop(sim, api):
    sim.set_faults([{"kind": "drop", "endpoint": "list_instances", "times": 1}])
    with pytest.raises(requests.ConnectionError):
        api.get("/api/v0/instances/")
    assert get_status(api) == 200


def test_clear_faults(sim, api):
    sim.set_faults([{"endpoint": "*", "kind": "status", "status": 500}])
    sim.clear_faults()
    assert get_status(api) == 200


def test_set_faults_replaces_the_rules(sim, api):
    sim.set_faults([{"endpoint": "*", "kind": "status", "status": 500}])
    sim.set_faults([{"endpoint": "get_instance", "kind": "status", "status": 500}])
    assert get_status(api) == 200


def test_reset_clears_faults(sim, api):
    sim.set_faults([{"endpoint": "*", "kind": "status", "status": 500}])
    sim.reset()
    assert get_status(api) == 200


def test_vanished_offer_fails_the_next_create(sim, api):
    offer = api.cheapest()
    sim.vanish_offer(offer["id"])
    response = api.put(f"/api/v0/asks/{offer['id']}/", {"image": "u"})
    assert response.status_code == 409


@pytest.mark.parametrize(
    "rules",
    [
        {"kind": "status"},
        [{"kind": "explode"}],
        [{"kind": "status", "status": 200}],
        [{"kind": "status", "status": 500, "endpoint": "no_such_op"}],
        [{"kind": "status", "status": 500, "times": -1}],
        [{"kind": "status", "status": 500, "probability": 2}],
        [{"kind": "status", "status": 500, "times": 1, "probability": 0.5}],
        [{"kind": "rate_limit", "capacity": 0, "per_second": 1}],
        [{"kind": "latency", "seconds": "slow"}],
        [{"kind": "drop", "after": "yes"}],
    ],
)
def test_invalid_fault_rules_are_refused(sim, api, rules):
    with pytest.raises(ValueError):
        sim.set_faults(rules)
    response = api.put("/_sim/faults", rules)
    assert response.status_code == 400 and response.json()["error"] == "invalid_args"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/api/v0/instances/request_logs/5/"),
        ("PUT", "/api/v0/instances/bid_price/5/"),
        ("GET", "/api/v0/charges/"),
        ("GET", "/api/v1/invoices/"),
        ("GET", "/api/v1/instances/"),
    ],
)
def test_rule_every_operation_the_wire_names_can_be_given_a_fault(method, path):
    """A rule may name any operation the simulator tells requests apart by (the log request's among them)."""
    from gpumarket_simulator import faults, wire

    operation = wire.classify(method, wire.tolerant_path(path))
    assert operation is not None, (method, path)
    (rule,) = faults.parse_rules([{"endpoint": operation, "kind": "latency", "seconds": 1}])
    assert rule.applies_to(operation)
