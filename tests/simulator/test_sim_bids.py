"""The bid market: offers' minimum bids, bids below them, change bid, and a winning price that moves.

An outbid's effect on a running script (killed, run again on resume) is in test_sim_onstart.py.
"""

from __future__ import annotations

import pytest

from gpumarket_simulator import MarketSimulator

from .helpers import ledger

BID_STATES = ("actual_status", "intended_status", "cur_state", "next_state")


def rent_at(sim, api, price_share: float = 1.0) -> tuple[dict, int]:
    """A bid of ``price_share`` times the cheapest offer's min_bid, booted to running."""
    offer = api.cheapest()
    instance_id = api.create(offer["id"], {"image": "ubuntu:22.04", "price": round(offer["min_bid"] * price_share, 4)})[
        "new_contract"
    ]
    sim.advance(400)
    assert api.status(instance_id) == "running"
    return offer, instance_id


def min_bid_of(sim, offer_id: int) -> float:
    return next(o for o in sim.state()["offers"] if o["id"] == offer_id)["min_bid"]


def test_offers_carry_a_min_bid_below_their_on_demand_price(api):
    offer = api.cheapest()
    assert 0 < offer["min_bid"] < offer["dph_total"]


def test_a_bid_below_the_min_bid_still_makes_a_stopped_instance_and_answers_success_false(sim, api):
    offer = api.cheapest()
    body = api.create(offer["id"], {"image": "ubuntu:22.04", "price": offer["min_bid"] / 2})
    assert body["success"] is False and "minimum bid" in body["msg"]
    made = api.instance(body["new_contract"])
    assert made["actual_status"] == "stopped" and made["is_bid"] is True
    assert [i["id"] for i in sim.alive_instances()] == [body["new_contract"]]  # it bills storage until destroyed


def test_a_bid_at_the_min_bid_rents_and_boots(sim, api):
    offer = api.cheapest()
    body = api.create(offer["id"], {"image": "ubuntu:22.04", "price": offer["min_bid"]})
    assert body["success"] is True
    sim.advance(400)
    made = api.instance(body["new_contract"])
    assert made["actual_status"] == "running" and made["bid_price"] == offer["min_bid"]


def test_change_bid_sets_a_bid_instances_price(api):
    offer = api.cheapest()
    instance_id = api.create(offer["id"], {"image": "ubuntu:22.04", "price": 5.0})["new_contract"]
    response = api.put(f"/api/v0/instances/bid_price/{instance_id}/", {"client_id": "me", "price": 6.5})
    assert response.status_code == 200 and response.json() == {"success": True}
    assert api.instance(instance_id)["bid_price"] == 6.5


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"client_id": "me", "price": 0}, 400, "price must be a number"),
        ({"client_id": "me", "price": "high"}, 400, "price must be a number"),
        ({"client_id": "you", "price": 1.0}, 400, "client_id"),
    ],
)
def test_bad_change_bid_bodies_are_400_naming_the_field(api, body, status, words):
    instance_id = api.create(body={"image": "ubuntu:22.04", "price": 5.0})["new_contract"]
    response = api.put(f"/api/v0/instances/bid_price/{instance_id}/", body)
    assert response.status_code == status and words in response.json()["msg"]


def test_change_bid_of_an_on_demand_or_unknown_instance_is_refused_as_the_live_service_does(api):
    instance_id = api.create()["new_contract"]
    on_demand = api.put(f"/api/v0/instances/bid_price/{instance_id}/", {"client_id": "me", "price": 1.0})
    assert on_demand.status_code == 400 and on_demand.json()["msg"] == "Can't change price of on-demand contract."
    unknown = api.put("/api/v0/instances/bid_price/999/", {"client_id": "me", "price": 1.0})
    assert unknown.status_code == 404 and unknown.json()["error"] == "no_such_instance"


# --- a winning price that moves ------------------------------------------------------------------------------
def test_rule_min_bid_is_the_floor_or_a_higher_competing_bid(sim, api):
    offer = api.cheapest()
    floor = offer["min_bid"]
    sim.set_competing_bid(offer["id"], floor / 2)
    assert api.cheapest()["min_bid"] == floor  # a lower competing bid does not lower the floor
    sim.set_competing_bid(offer["id"], floor * 1.5)
    assert min_bid_of(sim, offer["id"]) == pytest.approx(floor * 1.5)


def test_rule_a_competing_bid_above_ours_stops_the_instance_and_it_resumes_when_ours_wins_again(sim, api):
    offer, instance_id = rent_at(sim, api, 1.05)
    sim.set_competing_bid(offer["id"], offer["min_bid"] * 1.2)
    seen = api.instance(instance_id)
    assert tuple(seen[k] for k in BID_STATES) == ("stopped",) * 4 and seen["status_msg"].startswith("Outbid")
    before = ledger(sim, instance_id)
    sim.advance(600)
    after = ledger(sim, instance_id)
    assert after["compute_seconds"] == before["compute_seconds"]  # no GPU billed while outbid
    assert after["storage_seconds"] == before["storage_seconds"] + 600  # the disk bills on
    assert api.status(instance_id) == "stopped"

    sim.set_competing_bid(offer["id"], None)
    back = api.instance(instance_id)
    assert (back["actual_status"], back["intended_status"], back["status_msg"]) == ("loading", "running", None)
    sim.advance(130)
    assert api.status(instance_id) == "running" and ledger(sim, instance_id)["outbids"] == 1


def test_rule_raising_a_bid_above_the_competing_bid_wins_the_machine_back_and_lowering_it_loses_it(sim, api):
    offer, instance_id = rent_at(sim, api, 1.05)
    high = offer["min_bid"] * 1.5
    sim.set_competing_bid(offer["id"], high)
    assert api.status(instance_id) == "stopped"

    assert api.put(f"/api/v0/instances/bid_price/{instance_id}/", {"client_id": "me", "price": high + 0.01}).ok
    assert api.instance(instance_id)["intended_status"] == "running"
    sim.advance(130)
    assert api.status(instance_id) == "running"

    assert api.put(f"/api/v0/instances/bid_price/{instance_id}/", {"client_id": "me", "price": high - 0.01}).ok
    assert api.status(instance_id) == "stopped" and ledger(sim, instance_id)["outbids"] == 2


def test_rule_a_stopped_instance_or_an_admin_outbid_is_not_resumed_by_the_market(sim, api):
    offer, stopped_id = rent_at(sim, api, 1.05)
    api.put(f"/api/v0/instances/{stopped_id}/", {"state": "stopped"})
    sim.set_competing_bid(offer["id"], offer["min_bid"] * 2)
    sim.set_competing_bid(offer["id"], None)
    assert api.status(stopped_id) == "stopped"  # the user stopped it: a price change does not start it

    other = api.search({"limit": 2})[1]
    held = api.create(other["id"], {"image": "ubuntu:22.04", "price": other["min_bid"] * 1.05})["new_contract"]
    sim.advance(400)
    sim.outbid(held, resume_after=300)
    sim.set_competing_bid(other["id"], other["min_bid"] * 2)
    sim.advance(300)
    assert api.status(held) == "stopped"  # the admin's outbid is over, but the competing bid is higher still
    sim.set_competing_bid(other["id"], None)
    assert api.instance(held)["intended_status"] == "running"


def test_rule_starting_a_bid_that_does_not_win_leaves_it_stopped_until_it_does(sim, api):
    offer, instance_id = rent_at(sim, api, 1.05)
    api.put(f"/api/v0/instances/{instance_id}/", {"state": "stopped"})
    sim.set_competing_bid(offer["id"], offer["min_bid"] * 2)
    api.put(f"/api/v0/instances/{instance_id}/", {"state": "running"})
    sim.advance(300)
    assert api.status(instance_id) == "stopped"
    sim.set_competing_bid(offer["id"], None)
    sim.advance(130)
    assert api.status(instance_id) == "running"


def test_rule_drifting_competing_bids_outbid_and_resume_instances_and_are_the_same_for_the_same_seed(sim, api):
    offer, instance_id = rent_at(sim, api, 1.05)
    sim.set_bid_drift(60, volatility=0.3)
    prices, statuses = [], []
    for _ in range(120):
        sim.advance(60)
        prices.append(min_bid_of(sim, offer["id"]))
        statuses.append(api.status(instance_id))
    assert len(set(prices)) > 10 and all(offer["min_bid"] <= p <= offer["dph_total"] for p in prices)
    assert "stopped" in statuses and statuses.count("running") > 10  # outbid, and back by itself
    assert ledger(sim, instance_id)["outbids"] >= 1

    sim.reset()
    offer, again = rent_at(sim, api, 1.05)
    sim.set_bid_drift(60, volatility=0.3)
    replay = []
    for _ in range(120):
        sim.advance(60)
        replay.append(min_bid_of(sim, offer["id"]))
    assert replay == prices
    sim.set_bid_drift(None)
    sim.advance(600)
    assert min_bid_of(sim, offer["id"]) == replay[-1]  # stopped moving


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/_sim/bid-drift", {}, 400, "drift is required"),
        ("/_sim/bid-drift", {"drift": {"interval": 0, "volatility": 0.3}}, 400, "drift.interval"),
        ("/_sim/bid-drift", {"drift": {"interval": 60, "volatility": "high"}}, 400, "drift.volatility"),
        ("/_sim/bid-drift", {"drift": {"interval": 60, "volatility": 0.3, "x": 1}}, 400, "drift must be"),
        ("/_sim/offers/{offer}/competing-bid", {}, 400, "price is required"),
        ("/_sim/offers/{offer}/competing-bid", {"price": -1}, 400, "price must be"),
        ("/_sim/offers/{offer}/competing-bid", {"price": True}, 400, "price must be"),
        ("/_sim/offers/99999999/competing-bid", {"price": 1.0}, 404, "no such id"),
    ],
)
def test_bad_bid_market_settings_are_refused_naming_the_field(sim, api, path, body, status, words):
    method = "PUT" if path == "/_sim/bid-drift" else "POST"
    response = api.session.request(method, sim.url + path.format(offer=api.cheapest()["id"]), json=body)
    assert response.status_code == status and words in response.json()["msg"], response.text


def test_a_world_file_sets_competing_bids_and_drift_and_refuses_bad_ones():
    offer = {"id": 77, "gpu_name": "B200", "dph_total": 5.0, "competing_bid": 3.0}
    with MarketSimulator(speed=0, profile="spec", world={"offers": [offer]}) as still:
        assert min_bid_of(still, 77) == 3.0  # above the 2.0 floor
        still.advance(3600)
        assert min_bid_of(still, 77) == 3.0
    world = {"offers": [offer], "bid_drift": {"interval": 60, "volatility": 0.5}}
    with MarketSimulator(speed=0, profile="spec", world=world) as drifting:
        drifting.advance(3600)
        assert min_bid_of(drifting, 77) != 3.0
    with pytest.raises(ValueError, match="drift.interval"):
        MarketSimulator(speed=0, world={"bid_drift": {"interval": -5, "volatility": 0.5}})
    with pytest.raises(ValueError, match="competing_bid"):
        MarketSimulator(speed=0, world={"offers": [{**offer, "competing_bid": "lots"}]})


def test_rule_a_changed_bid_is_billed_from_the_change_not_back_to_the_start(sim, api):
    offer, instance_id = rent_at(sim, api, price_share=1.2)
    first = api.instance(instance_id)["bid_price"]
    before = ledger(sim, instance_id)
    sim.advance(3600)
    api.put(f"/api/v0/instances/bid_price/{instance_id}/", {"client_id": "me", "price": first * 2})
    sim.advance(3600)
    after = ledger(sim, instance_id)
    assert after["compute_seconds"] - before["compute_seconds"] == pytest.approx(7200, abs=2)
    billed = after["compute_cost"] - before["compute_cost"]
    assert billed == pytest.approx(first + first * 2, rel=1e-3)  # an hour at each bid
