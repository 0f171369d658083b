"""Create, read, stop, start and destroy instances: the spec's state table and its rules."""

from __future__ import annotations

from .helpers import boot


def first_boot_times(sim, api, instance_id):
    """Advance one simulated second at a time and record when each status first appears."""
    seen = {}
    for second in range(0, 320):
        seen.setdefault(api.status(instance_id), second)
        sim.advance(1)
    return seen


# --- create ------------------------------------------------------------------------------------------------
def test_create_returns_new_contract_and_instance_api_key(api):
    result = api.create()
    assert result["success"] is True
    assert isinstance(result["new_contract"], int)
    assert isinstance(result["instance_api_key"], str) and len(result["instance_api_key"]) >= 16
    assert "id" not in result


def test_new_contract_is_the_instance_id(api):
    result = api.create()
    assert api.instance(result["new_contract"])["id"] == result["new_contract"]


def test_post_form_of_create_also_works(api):
    offer = api.cheapest()
    response = api.post(f"/api/v0/asks/{offer['id']}/", {"image": "ubuntu"})
    assert response.status_code == 200 and response.json()["success"] is True


def test_instance_ids_are_unique_and_never_reused(sim, api):
    offers = api.search({"limit": 4})
    ids = [api.create(o["id"])["new_contract"] for o in offers[:2]]
    api.delete(f"/api/v0/instances/{ids[0]}/")
    ids += [api.create(o["id"])["new_contract"] for o in offers[2:]]
    sim.reset()
    ids.append(api.create()["new_contract"])
    assert len(set(ids)) == len(ids)


def test_instance_api_key_differs_per_instance(api):
    offers = api.search({"limit": 2})
    assert api.create(offers[0]["id"])["instance_api_key"] != api.create(offers[1]["id"])["instance_api_key"]


def test_instance_object_never_shows_the_instance_api_key(api):
    result = api.create()
    body = api.get(f"/api/v0/instances/{result['new_contract']}/").text
    listing = api.get("/api/v0/instances/").text
    assert result["instance_api_key"] not in body and result["instance_api_key"] not in listing


def test_instance_object_has_the_spec_fields(api):
    inst = api.instance(api.create()["new_contract"])
    assert {"id", "actual_status", "label", "ssh_host", "ssh_port"} <= set(inst)
    assert isinstance(inst["ssh_host"], str) and isinstance(inst["ssh_port"], int)


def test_default_disk_is_8_gb(api):
    assert api.instance(api.create()["new_contract"])["disk_space"] == 8


def test_create_on_a_rented_offer_is_409_offer_unavailable(api):
    offer = api.cheapest()
    api.create(offer["id"])
    response = api.put(f"/api/v0/asks/{offer['id']}/", {"image": "ubuntu"})
    assert response.status_code == 409
    assert response.json()["error"] == "offer_unavailable"
    assert str(offer["id"]) in response.json()["msg"]


def test_offer_is_taken_while_rented_and_back_on_the_market_after_its_instance_is_destroyed(api):
    offer = api.cheapest()
    instance_id = api.create(offer["id"])["new_contract"]
    assert api.put(f"/api/v0/asks/{offer['id']}/", {"image": "ubuntu"}).status_code == 409
    api.delete(f"/api/v0/instances/{instance_id}/")
    assert api.put(f"/api/v0/asks/{offer['id']}/", {"image": "ubuntu"}).status_code == 200


def test_offer_rented_by_someone_else_is_409(sim, api):
    offer = api.cheapest()
    sim.vanish_offer(offer["id"])
    response = api.put(f"/api/v0/asks/{offer['id']}/", {"image": "ubuntu"})
    assert response.status_code == 409 and response.json()["error"] == "offer_unavailable"


def test_cancel_unavail_fails_fast_with_the_same_409(sim, api):
    offer = api.cheapest()
    sim.vanish_offer(offer["id"])
    response = api.put(f"/api/v0/asks/{offer['id']}/", {"image": "ubuntu", "cancel_unavail": True})
    assert response.status_code == 409 and response.json()["error"] == "offer_unavailable"


def test_unrentable_offer_is_409(sim, api):
    offer = next(o for o in sim.state()["offers"] if not o["rentable"])
    assert api.put(f"/api/v0/asks/{offer['id']}/", {"image": "ubuntu"}).status_code == 409


def test_unknown_offer_is_404_no_such_ask(api):
    response = api.put("/api/v0/asks/999999999/", {"image": "ubuntu"})
    assert response.status_code == 404 and response.json()["error"] == "no_such_ask"


def test_bad_request_does_not_use_the_offer_up(api):
    offer = api.cheapest()
    assert api.put(f"/api/v0/asks/{offer['id']}/", {"image": "u", "runtype": "nope"}).status_code == 400
    api.create(offer["id"])


# --- states and transitions ---------------------------------------------------------------------------------
def test_new_instance_is_provisioning_with_null_status(api):
    assert api.status(api.create()["new_contract"]) is None


def test_boot_goes_null_then_loading_then_running(sim, api):
    seen = first_boot_times(sim, api, api.create()["new_contract"])
    assert list(seen) == [None, "loading", "running"]
    assert seen[None] < seen["loading"] < seen["running"]


def test_boot_takes_one_to_five_minutes(sim, api):
    offers = api.search({"verified": {"eq": True}, "reliability": {"gte": 0.95}, "limit": 3})
    assert len(offers) == 3
    for offer in offers:
        seen = first_boot_times(sim, api, api.create(offer["id"])["new_contract"])
        assert 60 <= seen["running"] <= 301


def test_boot_times_are_the_same_for_the_same_seed(sim, api):
    def run():
        sim.reset()
        instance_id = api.create()["new_contract"]
        return first_boot_times(sim, api, instance_id)

    assert run() == run()


def test_instance_on_a_failing_host_never_reaches_running(sim, api):
    failing = next(o for o in sim.state()["offers"] if o["fate"] == "exited" and o["rentable"])
    instance_id = api.create(failing["id"])["new_contract"]
    seen = first_boot_times(sim, api, instance_id)
    assert "running" not in seen and "exited" in seen
    sim.advance(3600)
    assert api.status(instance_id) == "exited"


def test_offer_fate_sets_the_final_status(sim, api):
    offer = api.cheapest()
    sim.set_offer_fate(offer["id"], "unknown")
    instance_id = api.create(offer["id"])["new_contract"]
    boot(sim)
    assert api.status(instance_id) == "unknown"


def test_target_state_stopped_creates_a_stopped_instance(sim, api):
    instance_id = api.create(body={"image": "ubuntu", "target_state": "stopped"})["new_contract"]
    assert api.status(instance_id) == "stopped"
    boot(sim)
    assert api.status(instance_id) == "stopped"


def test_stop_moves_a_running_instance_to_stopped(sim, api):
    instance_id = api.create()["new_contract"]
    boot(sim)
    response = api.put(f"/api/v0/instances/{instance_id}/", {"state": "stopped"})
    assert response.status_code == 200 and response.json() == {"success": True}
    assert api.status(instance_id) == "stopped"


def test_stop_is_idempotent(api):
    instance_id = api.create()["new_contract"]
    for _ in range(2):
        assert api.put(f"/api/v0/instances/{instance_id}/", {"state": "stopped"}).status_code == 200
    assert api.status(instance_id) == "stopped"


def test_start_boots_a_stopped_instance_again_through_loading(sim, api):
    instance_id = api.create()["new_contract"]
    boot(sim)
    api.put(f"/api/v0/instances/{instance_id}/", {"state": "stopped"})
    assert api.put(f"/api/v0/instances/{instance_id}/", {"state": "running"}).status_code == 200
    assert api.status(instance_id) == "loading"
    sim.advance(121)
    assert api.status(instance_id) == "running"


def test_start_of_an_instance_created_stopped_boots_from_provisioning(sim, api):
    instance_id = api.create(body={"image": "ubuntu", "target_state": "stopped"})["new_contract"]
    api.put(f"/api/v0/instances/{instance_id}/", {"state": "running"})
    assert api.status(instance_id) is None
    boot(sim)
    assert api.status(instance_id) == "running"


def test_a_failed_instance_never_runs_even_after_a_restart(sim, api):
    instance_id = api.create()["new_contract"]
    boot(sim)
    sim.force_status(instance_id, "exited")
    api.put(f"/api/v0/instances/{instance_id}/", {"state": "stopped"})
    api.put(f"/api/v0/instances/{instance_id}/", {"state": "running"})
    boot(sim)
    assert api.status(instance_id) == "exited"


def test_unknown_state_value_is_400(api):
    instance_id = api.create()["new_contract"]
    for body in ({"state": "paused"}, {"state": None}, {}, {"state": ["stopped"]}):
        response = api.put(f"/api/v0/instances/{instance_id}/", body)
        assert response.status_code == 400, body
        assert response.json()["error"]


def test_destroy_answers_success(api):
    instance_id = api.create()["new_contract"]
    response = api.delete(f"/api/v0/instances/{instance_id}/")
    assert response.status_code == 200 and response.json() == {"success": True}


def test_destroyed_instance_is_404_for_get_put_and_delete(api):
    instance_id = api.create()["new_contract"]
    api.delete(f"/api/v0/instances/{instance_id}/")
    for response in (
        api.get(f"/api/v0/instances/{instance_id}/"),
        api.put(f"/api/v0/instances/{instance_id}/", {"state": "stopped"}),
        api.delete(f"/api/v0/instances/{instance_id}/"),
    ):
        assert response.status_code == 404
        assert response.json()["error"] == "no_such_instance"


def test_destroy_works_in_every_status(sim, api):
    offers = api.search({"limit": 4})
    for index, status in enumerate([None, "loading", "exited", "stopped"]):
        instance_id = api.create(offers[index]["id"])["new_contract"]
        sim.force_status(instance_id, status)
        assert api.delete(f"/api/v0/instances/{instance_id}/").status_code == 200


def test_destroyed_instance_stays_visible_in_sim_state(sim, api):
    instance_id = api.create()["new_contract"]
    api.delete(f"/api/v0/instances/{instance_id}/")
    record = next(i for i in sim.state()["instances"] if i["id"] == instance_id)
    assert record["destroyed"] is True and record["destroyed_at"] is not None
    assert sim.alive_instances() == []


def test_list_instances_shows_only_instances_not_destroyed(api):
    offers = api.search({"limit": 2})
    kept, gone = (api.create(o["id"])["new_contract"] for o in offers)
    api.delete(f"/api/v0/instances/{gone}/")
    body = api.get("/api/v0/instances/").json()
    assert body["instances_found"] == 1
    assert [i["id"] for i in body["instances"]] == [kept]


def test_list_instances_when_none(api):
    assert api.get("/api/v0/instances/").json() == {"instances_found": 0, "instances": []}


def test_get_unknown_instance_is_404(api):
    for path in ("/api/v0/instances/424242/", "/api/v0/instances/abc/"):
        response = api.get(path)
        assert response.status_code == 404 and response.json()["error"] == "no_such_instance"


def test_pending_price_increases_route_is_not_shadowed_by_instance_route(api):
    response = api.get("/api/v0/instances/pending-price-increases")
    assert response.status_code == 200 and response.json()["success"] is True


def test_force_status_moves_an_instance(sim, api):
    instance_id = api.create()["new_contract"]
    for status in ("unknown", "offline", "running", "stopped", "exited"):
        sim.force_status(instance_id, status)
        assert api.status(instance_id) == status


def test_rule_a_stop_request_leaves_a_failed_hosts_status_as_the_host_reported_it(sim, api):
    """The container of a host that went offline may still reach the API (the job wrapper's stop on its way out):
    the instance stays offline, never turned into a stopped one that a start could boot again."""
    instance_id = api.create()["new_contract"]
    boot(sim)
    sim.force_status(instance_id, "offline")
    assert api.put(f"/api/v0/instances/{instance_id}/", {"state": "stopped"}).status_code == 200
    assert api.status(instance_id) == "offline"


def test_machine_going_offline_takes_its_instances_offline(sim, api):
    offer = api.cheapest()
    instance_id = api.create(offer["id"])["new_contract"]
    boot(sim)
    sim.set_machine_online(offer["machine_id"], False)
    assert api.status(instance_id) == "offline"
    sim.set_machine_online(offer["machine_id"], True)
    boot(sim)
    assert api.status(instance_id) == "offline"


def test_label_is_kept_and_listed(api):
    instance_id = api.create(body={"image": "ubuntu", "label": "dag.task.1"})["new_contract"]
    assert api.instance(instance_id)["label"] == "dag.task.1"
    assert [i["label"] for i in api.get("/api/v0/instances/").json()["instances"]] == ["dag.task.1"]


def test_direct_runtypes_get_ports(api):
    offers = api.search({"direct_port_count": {"gte": 8}, "limit": 2})
    ssh = api.instance(api.create(offers[0]["id"], {"image": "u", "runtype": "ssh_direct"})["new_contract"])
    jupyter = api.instance(
        api.create(offers[1]["id"], {"image": "u", "runtype": "jupyter_direct", "env": {"-p 9000:9000": "1"}})[
            "new_contract"
        ]
    )
    assert set(ssh["ports"]) == {"22/tcp"}
    assert set(jupyter["ports"]) == {"22/tcp", "8080/tcp", "9000/tcp"}
