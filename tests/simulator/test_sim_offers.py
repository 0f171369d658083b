"""Search offers (POST /api/v0/bundles/) and the seeded world behind it."""

from __future__ import annotations

import pytest

from gpumarket_simulator import MarketSimulator

OFFER_FIELDS = {
    "id",
    "num_gpus",
    "gpu_name",
    "gpu_ram",
    "dph_total",
    "reliability",
    "verified",
    "rentable",
    "direct_port_count",
    "dlperf_per_dphtotal",
}


def test_search_returns_offers_with_all_ten_fields(api):
    offers = api.search()
    assert offers
    for offer in offers:
        assert set(offer) >= OFFER_FIELDS
        assert isinstance(offer["id"], int) and isinstance(offer["num_gpus"], int)
        assert isinstance(offer["verified"], bool) and isinstance(offer["rentable"], bool)
        assert 0 <= offer["reliability"] <= 1


def test_gpu_ram_is_in_megabytes(api):
    offer = api.cheapest("RTX 4090")
    assert offer["gpu_ram"] > 20_000  # a 24 GB card, in MB


def test_world_has_enough_variety(sim):
    offers = sim.state()["offers"]
    assert len(offers) >= 20
    assert len({o["gpu_name"] for o in offers}) >= 4
    assert {o["verified"] for o in offers} == {True, False}
    assert any(not o["rentable"] for o in offers)
    assert len({o["reliability"] for o in offers}) > 10


def test_search_returns_only_rentable_offers_by_default(api, sim):
    unrentable = {o["id"] for o in sim.state()["offers"] if not o["rentable"]}
    assert unrentable
    assert not unrentable & {o["id"] for o in api.search()}


def test_rentable_filter_can_show_unrentable_offers(api):
    offers = api.search({"rentable": {"eq": False}})
    assert offers and all(not o["rentable"] for o in offers)


def test_rented_offer_disappears_from_search(api):
    offer = api.cheapest()
    api.create(offer["id"])
    assert offer["id"] not in {o["id"] for o in api.search()}


def test_filter_eq(api):
    assert {o["gpu_name"] for o in api.search({"gpu_name": {"eq": "A100 SXM4"}})} == {"A100 SXM4"}


def test_filter_gte(api):
    offers = api.search({"num_gpus": {"gte": 4}})
    assert offers and all(o["num_gpus"] >= 4 for o in offers)


def test_filter_in(api):
    offers = api.search({"gpu_name": {"in": ["RTX 3090", "H100 SXM"]}})
    assert {o["gpu_name"] for o in offers} == {"RTX 3090", "H100 SXM"}


@pytest.mark.parametrize(
    ("operator", "check"),
    [
        ("lte", lambda v: v <= 0.5),
        ("lt", lambda v: v < 0.5),
        ("gt", lambda v: v > 0.5),
        ("neq", lambda v: v != 0.5),
    ],
)
def test_tolerated_operators(api, operator, check):
    offers = api.search({"dph_total": {operator: 0.5}})
    assert offers and all(check(o["dph_total"]) for o in offers)


def test_filters_combine_with_and(api):
    offers = api.search({"verified": {"eq": True}, "reliability": {"gte": 0.98}, "gpu_ram": {"gte": 40000}})
    assert offers
    assert all(o["verified"] and o["reliability"] >= 0.98 and o["gpu_ram"] >= 40000 for o in offers)


def test_order_desc(api):
    prices = [o["dph_total"] for o in api.search({"order": [["dph_total", "desc"]]})]
    assert prices == sorted(prices, reverse=True)


def test_order_by_two_fields(api):
    offers = api.search({"order": [["gpu_name", "asc"], ["dlperf_per_dphtotal", "desc"]]})
    keys = [(o["gpu_name"], -o["dlperf_per_dphtotal"]) for o in offers]
    assert keys == sorted(keys)


def test_default_order_is_cheapest_first(api):
    prices = [o["dph_total"] for o in api.search()]
    assert prices == sorted(prices)


def test_limit(api):
    assert len(api.search({"limit": 3})) == 3


@pytest.mark.parametrize("offer_type", ["ondemand", "on-demand", "bid"])
def test_type_accepts_both_spellings_and_bid(api, offer_type):
    assert api.search({"type": offer_type})


def test_unknown_operator_is_400(api):
    response = api.post("/api/v0/bundles/", {"num_gpus": {"between": [1, 2]}})
    assert response.status_code == 400
    assert {"error", "msg"} <= set(response.json())


@pytest.mark.parametrize(
    "body",
    [
        {"gpu_nme": {"eq": "RTX 4090"}},
        {"num_gpus": 1},
        {"num_gpus": {"gte": "many"}},
        {"verified": {"gte": True}},
        {"gpu_name": {"in": "RTX 4090"}},
        {"type": "spot"},
        {"limit": 0},
        {"limit": "5"},
        {"order": [["dph_total", "up"]]},
        {"order": "dph_total"},
        [],
    ],
)
def test_bad_search_bodies_are_400(api, body):
    response = api.post("/api/v0/bundles/", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]


def test_empty_search_body_returns_all_rentable_offers(api):
    response = api.call("POST", "/api/v0/bundles/", data=b"")
    assert response.status_code == 200
    assert len(response.json()["offers"]) == len(api.search({}))


def test_same_seed_gives_the_same_world():
    with MarketSimulator(speed=0, seed=42) as a, MarketSimulator(speed=0, seed=42) as b:
        sa, sb = a.state(), b.state()
    for key in ("offers", "machines", "templates", "deployments", "api_keys", "cloud_integrations", "tfa"):
        assert sa[key] == sb[key], key
    assert a.api_key == b.api_key


def test_different_seeds_give_different_worlds():
    with MarketSimulator(speed=0, seed=1) as a, MarketSimulator(speed=0, seed=2) as b:
        assert a.state()["offers"] != b.state()["offers"]


def test_reset_with_the_same_seed_restores_the_same_world(sim, api):
    before = sim.state()
    api.create()
    sim.vanish_offer(before["offers"][5]["id"])
    sim.reset()
    after = sim.state()
    assert after["offers"] == before["offers"]
    assert after["instances"] == []


def test_cheapest_offer_of_each_gpu_type_boots_fine(sim):
    offers = [o for o in sim.state()["offers"] if o["rentable"]]
    gpus = {o["gpu_name"] for o in offers}
    assert len(gpus) > 1, "the market has several GPU types"
    for gpu in gpus:
        cheapest = min((o for o in offers if o["gpu_name"] == gpu), key=lambda o: o["dph_total"])
        assert cheapest["fate"] == "running", gpu
        assert cheapest["reliability"] >= 0.95 and cheapest["verified"]


def test_failing_hosts_have_low_reliability(sim):
    failing = [o for o in sim.state()["offers"] if o["fate"] != "running"]
    assert len(failing) >= 3
    assert {o["fate"] for o in failing} == {"exited", "unknown", "offline"}
    assert all(o["reliability"] < 0.9 for o in failing)


def test_the_live_profile_filters_offers_on_bandwidth_prices_and_the_spec_profile_refuses_them():
    from gpumarket_simulator.errors import ApiError
    from gpumarket_simulator.rules import offer_matches, validate_search

    query = validate_search({"inet_down_cost": {"lte": 0.005}, "order": [["inet_up_cost", "asc"]]}, lenient=True)
    assert query.filters == [("inet_down_cost", "lte", 0.005)] and query.order == [("inet_up_cost", False)]
    assert offer_matches({"inet_down_cost": 0.004}, query.filters)
    assert not offer_matches({"inet_down_cost": 0.01}, query.filters)
    with pytest.raises(ApiError, match="not a filterable offer field"):
        validate_search({"inet_down_cost": {"lte": 0.005}})
