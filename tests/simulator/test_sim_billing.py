"""The billing ledger: the spec's billing facts, exactly, on the simulated clock."""

from __future__ import annotations

import pytest

from .helpers import ledger


def running_instance(sim, api, disk=8):
    offer = api.cheapest()
    instance_id = api.create(offer["id"], {"image": "ubuntu", "disk": disk})["new_contract"]
    sim.advance(301)
    assert api.status(instance_id) == "running"
    return instance_id, offer


def storage_cost(sim, seconds, disk=8):
    price = sim.state()["disk_price_per_gb_month"]
    return seconds / (30 * 86400) * disk * price


def test_compute_is_billed_only_while_running(sim, api):
    instance_id = api.create()["new_contract"]
    record = ledger(sim, instance_id)
    assert record["compute_seconds"] == 0
    sim.advance(301)
    record = ledger(sim, instance_id)
    assert 0 < record["compute_seconds"] <= 301 - 60
    assert record["compute_seconds"] == pytest.approx(301 - (record["first_running_at"] - record["created_at"]))


def test_compute_is_billed_at_the_offer_dph_total(sim, api):
    instance_id, offer = running_instance(sim, api)
    before = ledger(sim, instance_id)
    sim.advance(3600)
    after = ledger(sim, instance_id)
    assert after["compute_seconds"] - before["compute_seconds"] == pytest.approx(3600)
    assert after["compute_cost"] - before["compute_cost"] == pytest.approx(offer["dph_total"])


def test_storage_is_billed_from_creation(sim, api):
    instance_id = api.create()["new_contract"]
    sim.advance(30)
    record = ledger(sim, instance_id)
    assert record["actual_status"] is None or record["actual_status"] == "loading"
    assert record["storage_seconds"] == pytest.approx(30)
    assert record["compute_seconds"] == 0


def test_storage_is_billed_per_gb_month_of_the_requested_disk(sim, api):
    instance_id, _ = running_instance(sim, api, disk=100)
    sim.advance(30 * 86400 - 301)
    record = ledger(sim, instance_id)
    assert record["storage_seconds"] == pytest.approx(30 * 86400)
    assert record["storage_cost"] == pytest.approx(100 * sim.state()["disk_price_per_gb_month"])


def test_stop_halts_compute_billing(sim, api):
    instance_id, _ = running_instance(sim, api)
    api.put(f"/api/v0/instances/{instance_id}/", {"state": "stopped"})
    before = ledger(sim, instance_id)
    sim.advance(3600)
    after = ledger(sim, instance_id)
    assert after["compute_seconds"] == before["compute_seconds"]
    assert after["compute_cost"] == before["compute_cost"]


def test_storage_billing_continues_while_stopped(sim, api):
    instance_id, _ = running_instance(sim, api)
    api.put(f"/api/v0/instances/{instance_id}/", {"state": "stopped"})
    before = ledger(sim, instance_id)
    sim.advance(3600)
    after = ledger(sim, instance_id)
    assert after["storage_seconds"] - before["storage_seconds"] == pytest.approx(3600)
    assert after["storage_cost"] - before["storage_cost"] == pytest.approx(storage_cost(sim, 3600))


def test_instance_created_stopped_pays_storage_only(sim, api):
    instance_id = api.create(body={"image": "ubuntu", "target_state": "stopped"})["new_contract"]
    sim.advance(1000)
    record = ledger(sim, instance_id)
    assert record["compute_seconds"] == 0 and record["storage_seconds"] == pytest.approx(1000)


def test_failed_instance_keeps_accruing_storage_until_destroyed(sim, api):
    failing = next(o for o in sim.state()["offers"] if o["fate"] == "exited" and o["rentable"])
    instance_id = api.create(failing["id"])["new_contract"]
    sim.advance(301)
    assert api.status(instance_id) == "exited"
    before = ledger(sim, instance_id)
    sim.advance(7200)
    after = ledger(sim, instance_id)
    assert after["compute_seconds"] == 0
    assert after["storage_seconds"] - before["storage_seconds"] == pytest.approx(7200)


def test_destroy_stops_billing(sim, api):
    instance_id, _ = running_instance(sim, api)
    sim.advance(600)
    api.delete(f"/api/v0/instances/{instance_id}/")
    before = ledger(sim, instance_id)
    sim.advance(86400)
    after = ledger(sim, instance_id)
    assert after == before
    assert after["cost"] > 0


def test_destroy_of_a_stopped_instance_stops_storage_billing(sim, api):
    instance_id, _ = running_instance(sim, api)
    api.put(f"/api/v0/instances/{instance_id}/", {"state": "stopped"})
    sim.advance(100)
    api.delete(f"/api/v0/instances/{instance_id}/")
    before = ledger(sim, instance_id)
    sim.advance(86400)
    assert ledger(sim, instance_id)["storage_seconds"] == before["storage_seconds"]


def test_restart_resumes_compute_billing_once_running(sim, api):
    instance_id, _ = running_instance(sim, api)
    api.put(f"/api/v0/instances/{instance_id}/", {"state": "stopped"})
    api.put(f"/api/v0/instances/{instance_id}/", {"state": "running"})
    before = ledger(sim, instance_id)
    sim.advance(10)
    assert ledger(sim, instance_id)["compute_seconds"] == before["compute_seconds"]  # still loading
    sim.advance(3600)
    assert ledger(sim, instance_id)["compute_seconds"] > before["compute_seconds"]


def test_cost_is_compute_plus_storage(sim, api):
    instance_id, _ = running_instance(sim, api)
    sim.advance(5000)
    record = ledger(sim, instance_id)
    assert record["cost"] == pytest.approx(record["compute_cost"] + record["storage_cost"])


def test_billing_follows_exact_transition_times_whatever_the_polling(sim, api):
    """Advancing in one jump or in many small steps gives the same ledger."""

    def run(steps):
        sim.reset()
        instance_id = api.create()["new_contract"]
        for _ in range(steps):
            sim.advance(1000 / steps)
        return ledger(sim, instance_id)

    one, many = run(1), run(50)
    assert one["compute_seconds"] == pytest.approx(many["compute_seconds"])
    assert one["storage_seconds"] == pytest.approx(many["storage_seconds"])
