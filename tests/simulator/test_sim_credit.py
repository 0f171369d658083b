"""The account's prepaid credit and the $0 stop: when the credit runs out, everything that runs stops.

Both profiles run the ledger and the stop (the spec's billing facts hold in both); these tests use the spec
profile's frozen clock, and a live simulator where the live answer is the point.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpumarket_simulator import MarketSimulator
from gpumarket_simulator.billing import CREDIT_STOP_MSG

from .helpers import Api, boot, ledger

SECONDS_PER_MONTH = 30 * 86_400
DISK = 20
REFUSED = {
    "success": False,
    "error": "insufficient_credit",
    "msg": "Your account's credit is $0.00: add credit before creating or starting instances.",
}


def rent(api: Api, n: int, **body: Any) -> list[int]:
    """``n`` instances on the cheapest offers whose hosts boot fine (reliability >= 0.9)."""
    offers = api.search({"reliability": {"gte": 0.9}, "order": [["dph_total", "asc"]]})
    return [api.create(o["id"], {"image": "img", "disk": DISK, **body})["new_contract"] for o in offers[:n]]


def spend_rate(sim: MarketSimulator, ids: list[int]) -> float:
    """Dollars per second the running instances ``ids`` cost: compute at dph_total plus their disks."""
    disk_price = sim.state()["disk_price_per_gb_month"]
    return sum(ledger(sim, i)["dph_total"] / 3600 + DISK * disk_price / SECONDS_PER_MONTH for i in ids)


def admin(api: Api, method: str, body: Any = None) -> Any:
    return api.call(method, "/_sim/account", body, key=None)


def out_of_credit(sim: MarketSimulator, api: Api) -> list[int]:
    """Two running instances, then the credit set to $0: both stopped at once."""
    ids = rent(api, 2)
    boot(sim)
    sim.set_credit(0)
    assert [api.status(i) for i in ids] == ["stopped", "stopped"]
    return ids


# --- the credit -----------------------------------------------------------------------------------------------
def test_the_default_world_starts_with_100_dollars_of_credit(sim):
    account = sim.account()
    assert account["credit"] == account["balance"] == 100.0 and not account["exhausted"]
    [invoice] = account["invoices"]
    assert invoice["added"] == 100.0 and invoice["when"] == sim.state()["start_time"]


def test_credit_is_drawn_down_by_everything_billed_as_the_clock_moves(sim, api):
    ids = rent(api, 2)
    credits = []
    for _ in range(4):
        sim.advance(1800)
        credits.append(sim.account()["credit"])
    assert credits == sorted(credits, reverse=True) and len(set(credits)) == 4
    assert credits[-1] == pytest.approx(100.0 - sum(ledger(sim, i)["cost"] for i in ids), abs=1e-9)


def test_credit_keeps_what_destroyed_instances_were_billed(sim, api):
    gone, kept = rent(api, 2)
    sim.advance(3600)
    api.delete(f"/api/v0/instances/{gone}/")
    sim.advance(3600)
    billed = ledger(sim, gone)["cost"] + ledger(sim, kept)["cost"]
    assert ledger(sim, gone)["cost"] > 0
    assert sim.account()["credit"] == pytest.approx(100.0 - billed, abs=1e-9)


def test_admin_top_up_adds_credit_and_records_an_invoice(sim, api):
    sim.advance(600)
    response = admin(api, "POST", {"top_up": 25})
    assert response.status_code == 200
    account = response.json()
    assert account["credit"] == 125.0
    assert account["invoices"][-1] == {
        "invoice_id": 2,
        "when": sim.now(),
        "added": 25.0,
        "service": "sim_admin",
        "source": "admin",
        "description": "Top-up of $25.00 by the simulator's admin",
    }
    assert admin(api, "GET").json() == account


def test_admin_sets_the_credit_recording_the_difference_as_an_invoice(sim, api):
    rent(api, 1)
    sim.advance(3600)
    before = sim.account()["credit"]
    account = admin(api, "POST", {"credit": 12.5}).json()
    assert account["credit"] == pytest.approx(12.5, abs=1e-9)
    assert account["invoices"][-1]["added"] == pytest.approx(12.5 - before)


@pytest.mark.parametrize(
    "body",
    [{}, {"credit": "12"}, {"credit": None}, {"top_up": True}, {"credit": 1, "top_up": 1}, [12.5], {"amount": 3}],
)
def test_admin_account_route_refuses_bad_bodies_with_400(sim, api, body):
    response = admin(api, "POST", body)
    assert response.status_code == 400 and response.json()["error"], response.text
    assert sim.account()["credit"] == 100.0 and len(sim.account()["invoices"]) == 1


def test_starting_credit_comes_from_the_world_file_or_the_credit_option():
    with MarketSimulator(speed=0, world={"credit": 7.5}) as sim:
        assert sim.account()["credit"] == 7.5
        sim.top_up(1)
        sim.reset()
        assert sim.account()["credit"] == 7.5 and len(sim.account()["invoices"]) == 1
    with MarketSimulator(speed=0, world={"credit": 7.5}, credit=0) as broke:
        api = Api(broke, broke.api_key)
        assert broke.account()["exhausted"] and broke.account()["invoices"] == []
        response = api.put(f"/api/v0/asks/{api.cheapest()['id']}/", {"image": "img"})
        assert response.status_code == 402 and response.json() == REFUSED
    with pytest.raises(ValueError, match="credit"):
        MarketSimulator(world={"credit": "plenty"})


# --- the $0 stop ----------------------------------------------------------------------------------------------
def test_credit_reaching_zero_stops_every_running_instance_at_that_exact_moment(sim, api):
    ids = rent(api, 2)
    boot(sim)
    assert [api.status(i) for i in ids] == ["running", "running"]
    t0 = sim.now()
    sim.set_credit(1.0)
    sim.advance(86_400)
    [stop] = sim.account()["stops"]
    assert stop["t"] == pytest.approx(t0 + 1.0 / spend_rate(sim, ids), abs=1e-6)
    assert stop["stopped"] == ids and abs(stop["credit"]) < 1e-9
    for instance_id in ids:
        record = ledger(sim, instance_id)
        assert record["actual_status"] == record["intended_status"] == "stopped"
        assert record["status_msg"] == CREDIT_STOP_MSG
        assert record["first_running_at"] + record["compute_seconds"] == pytest.approx(stop["t"], abs=1e-6)


def test_storage_keeps_billing_after_the_zero_stop_so_the_credit_goes_below_zero(sim, api):
    ids = rent(api, 2)
    boot(sim)
    sim.set_credit(0.5)
    sim.advance(86_400)
    computed = [ledger(sim, i)["compute_seconds"] for i in ids]
    before = sim.account()["credit"]
    sim.advance(3600)
    disk_price = sim.state()["disk_price_per_gb_month"]
    assert [ledger(sim, i)["compute_seconds"] for i in ids] == computed
    assert sim.account()["credit"] == pytest.approx(before - 2 * 3600 * DISK * disk_price / SECONDS_PER_MONTH)
    assert before < 0


def test_the_zero_stop_is_in_the_request_log(sim, api):
    ids = rent(api, 1)
    boot(sim)
    sim.set_credit(0.01)
    sim.advance(3600)
    [entry] = [r for r in sim.requests() if r["op"] == "credit_exhausted"]
    [stop] = sim.account()["stops"]
    assert entry["t"] == stop["t"] and entry["stopped"] == ids
    assert (entry["method"], entry["key"], entry["status"]) == ("EVENT", "service", None)


def test_setting_the_credit_to_zero_stops_booting_instances_too(sim, api):
    [instance_id] = rent(api, 1)
    sim.advance(10)
    assert api.status(instance_id) in (None, "loading")
    sim.set_credit(0)
    sim.advance(600)
    assert api.status(instance_id) == "stopped" and ledger(sim, instance_id)["compute_seconds"] == 0


def test_create_is_refused_with_402_insufficient_credit_while_the_credit_is_zero_or_less(sim, api):
    out_of_credit(sim, api)
    offer = api.cheapest()
    response = api.put(f"/api/v0/asks/{offer['id']}/", {"image": "img"})
    assert response.status_code == 402 and response.json() == REFUSED
    assert offer["id"] in [o["id"] for o in api.search()]  # the offer is not used up
    sim.advance(3600)  # storage pushes the credit below zero: still refused
    assert api.put(f"/api/v0/asks/{offer['id']}/", {"image": "img"}).status_code == 402


def test_start_of_a_stopped_instance_is_refused_while_the_credit_is_zero_or_less(sim, api):
    ids = out_of_credit(sim, api)
    instance_key = ledger(sim, ids[0])["instance_api_key"]
    for key in ("default", instance_key):
        response = api.put(f"/api/v0/instances/{ids[0]}/", {"state": "running"}, key=key)
        assert response.status_code == 402 and response.json() == REFUSED
    sim.advance(600)
    assert api.status(ids[0]) == "stopped"
    assert api.put(f"/api/v0/instances/{ids[0]}/", {"state": "stopped"}).status_code == 200


def test_destroy_works_while_the_credit_is_zero_or_less(sim, api):
    ids = out_of_credit(sim, api)
    for instance_id in ids:
        assert api.delete(f"/api/v0/instances/{instance_id}/").json() == {"success": True}
    assert sim.alive_instances() == []


def test_a_top_up_does_not_restart_instances_but_lets_the_user_start_them(sim, api):
    ids = out_of_credit(sim, api)
    sim.top_up(50)
    sim.advance(600)
    assert [api.status(i) for i in ids] == ["stopped", "stopped"]
    assert api.put(f"/api/v0/instances/{ids[0]}/", {"state": "running"}).status_code == 200
    boot(sim)
    assert api.status(ids[0]) == "running" and api.status(ids[1]) == "stopped"
    assert api.create()["success"] is True


def test_a_bid_waiting_for_its_machine_does_not_come_back_while_the_credit_is_gone(sim, api):
    offer = api.cheapest()
    [instance_id] = rent(api, 1, price=offer["dph_total"])
    boot(sim)
    sim.set_competing_bid(offer["id"], offer["dph_total"] * 2)  # outbid: it waits for its bid to win
    sim.set_credit(0)
    sim.set_competing_bid(offer["id"], None)  # its bid wins again, but nothing starts without credit
    sim.top_up(10)  # nor after a top-up: the user starts it
    sim.advance(600)
    assert api.status(instance_id) == "stopped" and ledger(sim, instance_id)["awaiting_bid"] is False


def test_a_copys_bytes_that_spend_the_last_of_the_credit_stop_everything():
    world = {"offers": [{"id": 1, "gpu_name": "X", "dph_total": 0.01, "inet_up_cost": 1000.0}], "credit": 0.5}
    with MarketSimulator(speed=0, profile="spec", world=world) as sim:
        api = Api(sim, sim.api_key)
        instance_id = api.create(1)["new_contract"]
        boot(sim)
        sim.put_disk_file(instance_id, "data/blob.bin", b"x" * 1_000_000)  # $1 to upload
        body = {"src": "/data/", "dst": "out/", "instance_id": instance_id, "selected": 1}
        assert api.post("/api/v0/commands/rclone/", {**body, "transfer": "Instance To Cloud"}).status_code == 200
        now = sim.advance(60)
        [stop] = sim.account()["stops"]
        assert stop["t"] == now and stop["stopped"] == [instance_id]
        assert api.status(instance_id) == "stopped" and sim.account()["credit"] < -0.4


def test_live_start_refused_for_want_of_credit_changes_nothing_else():
    with MarketSimulator(speed=0, rate_limits=False, credit=0.01) as sim:
        api = Api(sim, sim.api_key)
        instance_id = api.create()["new_contract"]
        sim.advance(3600)
        assert api.status(instance_id) == "stopped"
        response = api.put(f"/api/v0/instances/{instance_id}/", {"state": "running", "label": "again"})
        assert response.status_code == 402 and response.json()["error"] == "insufficient_credit"
        assert api.instance(instance_id)["label"] == ""
        assert api.put(f"/api/v0/instances/{instance_id}/", {"label": "kept"}).status_code == 200
