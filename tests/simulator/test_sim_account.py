"""Host volume listings, serverless endpoints, deployments, two-factor backup codes and account listings."""

from __future__ import annotations

import pytest

from gpumarket_simulator.totp import totp


@pytest.fixture
def machines(sim):
    ms = sim.state()["machines"]
    return {
        "owned_online": [m["id"] for m in ms if m["owned"] and m["online"]],
        "owned_offline": [m["id"] for m in ms if m["owned"] and not m["online"]],
        "not_owned": [m["id"] for m in ms if not m["owned"]],
    }


# --- volume listings ----------------------------------------------------------------------------------------
def test_world_has_owned_and_not_owned_machines(machines):
    assert len(machines["owned_online"]) >= 2 and machines["owned_offline"] and machines["not_owned"]


def test_volume_listing_for_one_machine(api, sim, machines):
    machine = machines["owned_online"][0]
    body = {"machine": machine}
    response = api.post("/api/v0/volumes", body)
    assert response.status_code == 200
    result = response.json()
    assert result["success"] is True and result["you_sent"] == body
    [item] = result["results"]
    assert item["machine_id"] == machine and item["user_id"] == sim.state()["user_id"]
    assert item["extended"] == 0 and item["upd_contracts"] == []
    [contract] = item["new_contracts"]
    assert isinstance(contract["id"], int) and contract["size"] > 0


def test_volume_listing_again_updates_the_ask(api, machines):
    machine = machines["owned_online"][0]
    first = api.post("/api/v0/volumes", {"machine": machine}).json()["results"][0]["new_contracts"][0]["id"]
    item = api.post("/api/v0/volumes", {"machine": machine, "hidden_listing": True}).json()["results"][0]
    assert item["new_contracts"] == [] and item["upd_contracts"] == [first]


def test_machines_overrides_machine(api, machines):
    ids = machines["owned_online"][:2]
    result = api.post("/api/v0/volumes", {"machine": 123456789, "machines": ids}).json()
    assert [r["machine_id"] for r in result["results"]] == ids


def test_hidden_listing_is_recorded(api, sim, machines):
    machine = machines["owned_online"][0]
    api.post("/api/v0/volumes", {"machine": machine, "hidden_listing": True})
    assert [a["hidden"] for a in sim.state()["volume_asks"] if a["machine_id"] == machine] == [True]


@pytest.mark.parametrize("body", [{}, {"machine": "abc"}, {"machine": -3}, {"machines": []}, {"machines": [1, "x"]}])
def test_invalid_machine_id_is_400(api, body):
    response = api.post("/api/v0/volumes", body)
    assert response.status_code == 400 and response.json()["msg"] == "Invalid machine id"


def test_machine_of_another_account_is_400_no_such_machine(api, machines):
    response = api.post("/api/v0/volumes", {"machine": machines["not_owned"][0]})
    assert response.status_code == 400 and response.json()["msg"] == "No such machine(s) for your account"


def test_machine_that_does_not_exist_is_400_no_such_machine(api):
    response = api.post("/api/v0/volumes", {"machines": [987654321]})
    assert response.status_code == 400 and response.json()["msg"] == "No such machine(s) for your account"


def test_offline_machine_is_402_with_success_false(api, machines):
    response = api.post("/api/v0/volumes", {"machine": machines["owned_offline"][0]})
    assert response.status_code == 402
    body = response.json()
    assert body["success"] is False and "online machine" in body["msg"]


def test_taking_a_machine_offline_makes_volume_listing_402(api, sim, machines):
    machine = machines["owned_online"][0]
    sim.set_machine_online(machine, False)
    assert api.post("/api/v0/volumes", {"machine": machine}).status_code == 402
    sim.set_machine_online(machine, True)
    assert api.post("/api/v0/volumes", {"machine": machine}).status_code == 200


@pytest.mark.parametrize("hidden", ["yes", 1, [True]])
def test_hidden_listing_not_a_boolean_is_422(api, machines, hidden):
    response = api.post("/api/v0/volumes", {"machine": machines["owned_online"][0], "hidden_listing": hidden})
    assert response.status_code == 422 and response.json()["error"]


# --- serverless endpoints -----------------------------------------------------------------------------------
def test_create_endpoint_returns_success_and_result(api, sim):
    body = {
        "endpoint_name": "my-llm",
        "min_load": 10,
        "target_util": 0.8,
        "cold_mult": 2,
        "cold_workers": 3,
        "max_workers": 12,
        "max_queue_time": 60,
        "target_queue_time": 30,
        "endpoint_state": "suspended",
        "autoscaler_instance": "prod",
        "inactivity_timeout": 600,
        "overrecruit_ratio": 1.5,
        "min_cold_load": 5,
    }
    response = api.post("/api/v0/endptjobs", body)
    assert response.status_code == 200
    result = response.json()
    assert result["success"] is True and isinstance(result["result"], int)
    [endpoint] = [e for e in sim.state()["endpoints"] if e["id"] == result["result"]]
    assert {k: endpoint[k] for k in body} == body


def test_endpoint_fields_are_all_optional(api, sim):
    endpoint_id = api.post("/api/v0/endptjobs", {}).json()["result"]
    [endpoint] = [e for e in sim.state()["endpoints"] if e["id"] == endpoint_id]
    assert endpoint["endpoint_state"] == "active"


def test_endpoint_ids_are_unique(api):
    assert len({api.post("/api/v0/endptjobs", {}).json()["result"] for _ in range(3)}) == 3


def test_target_queue_time_over_max_queue_time_is_400(api):
    response = api.post("/api/v0/endptjobs", {"max_queue_time": 10, "target_queue_time": 11})
    assert response.status_code == 400 and response.json()["error"] == "invalid_queue_time"


def test_target_queue_time_equal_to_max_queue_time_is_accepted(api):
    assert api.post("/api/v0/endptjobs", {"max_queue_time": 10, "target_queue_time": 10}).status_code == 200


def test_bad_endpoint_state_is_400(api):
    response = api.post("/api/v0/endptjobs", {"endpoint_state": "paused"})
    assert response.status_code == 400 and response.json()["error"] == "invalid_endpoint_state"


@pytest.mark.parametrize(
    "body",
    [
        {"min_load": -1},
        {"cold_workers": 1.5},
        {"max_workers": "5"},
        {"endpoint_name": ""},
        {"target_util": True},
    ],
)
def test_bad_endpoint_field_types_are_400(api, body):
    assert api.post("/api/v0/endptjobs", body).status_code == 400


# --- deployments --------------------------------------------------------------------------------------------
def deployments(sim, name):
    return [d for d in sim.state()["deployments"] if d["name"] == name]


def test_delete_deployments_by_name_soft_deletes_all_tags(api, sim):
    assert len(deployments(sim, "llm-serve")) == 2
    response = api.delete("/api/v0/deployments", {"name": "llm-serve"})
    assert response.status_code == 200 and response.json() == {"success": True, "count": 2}
    assert all(d["deleted"] for d in deployments(sim, "llm-serve"))
    assert not any(d["deleted"] for d in deployments(sim, "embedder"))


def test_delete_deployments_by_name_and_tag(api, sim):
    assert api.delete("/api/v0/deployments", {"name": "llm-serve", "tag": "v2"}).json()["count"] == 1
    assert {d["tag"]: d["deleted"] for d in deployments(sim, "llm-serve")} == {"v1": False, "v2": True}


def test_delete_deployments_cascades_to_endpoints_and_workers(api, sim):
    api.delete("/api/v0/deployments", {"name": "embedder"})
    [deployment] = deployments(sim, "embedder")
    assert deployment["endpoints"] and all(e["deleted"] for e in deployment["endpoints"])
    assert deployment["workers"] and all(w["deleted"] for w in deployment["workers"])
    endpoint_ids = {e["id"] for e in deployment["endpoints"]}
    assert all(e["deleted"] for e in sim.state()["endpoints"] if e["id"] in endpoint_ids)


def test_delete_deployments_twice_counts_zero_the_second_time(api):
    api.delete("/api/v0/deployments", {"name": "embedder"})
    assert api.delete("/api/v0/deployments", {"name": "embedder"}).json() == {"success": True, "count": 0}


def test_delete_unknown_deployment_counts_zero(api):
    assert api.delete("/api/v0/deployments", {"name": "nothing-here"}).json() == {"success": True, "count": 0}


@pytest.mark.parametrize("body", [{}, {"tag": "v1"}, {"name": ""}, {"name": 5}, {"name": "x", "tag": 5}])
def test_delete_deployments_without_a_valid_name_is_400(api, body):
    response = api.delete("/api/v0/deployments", body)
    assert response.status_code == 400 and response.json()["error"]


# --- two-factor backup codes --------------------------------------------------------------------------------
REGEN = "/api/v0/tfa/regen-backup-codes"


def test_regen_with_a_valid_totp_code(api, sim):
    tfa = sim.state()["tfa"]
    code = totp(tfa["totp_secret"], sim.now())
    response = api.put(REGEN, {"tfa_method": "totp", "code": code})
    assert response.status_code == 200
    body = response.json()
    assert body["msg"] and len(body["backup_codes"]) == 10 and len(set(body["backup_codes"])) == 10


def test_totp_follows_the_simulated_clock(api, sim):
    secret = sim.state()["tfa"]["totp_secret"]
    old_code = totp(secret, sim.now())
    sim.advance(600)
    assert api.put(REGEN, {"tfa_method": "totp", "code": old_code}).status_code == 400
    assert api.put(REGEN, {"tfa_method": "totp", "code": totp(secret, sim.now())}).status_code == 200


def test_totp_by_method_id(api, sim):
    tfa = sim.state()["tfa"]
    method_id = next(m["id"] for m in tfa["methods"] if m["method"] == "totp")
    response = api.put(REGEN, {"tfa_method_id": method_id, "code": totp(tfa["totp_secret"], sim.now())})
    assert response.status_code == 200


def test_state_shows_the_current_totp_code(sim):
    tfa = sim.state()["tfa"]
    assert tfa["totp_code"] == totp(tfa["totp_secret"], sim.now())


@pytest.mark.parametrize("method", ["sms", "email"])
def test_regen_with_sms_or_email_code_and_secret(api, sim, method):
    tfa = sim.state()["tfa"]
    response = api.put(REGEN, {"tfa_method": method, "code": tfa["code"], "secret": tfa["tfa_secret"]})
    assert response.status_code == 200 and len(response.json()["backup_codes"]) == 10


def test_sms_code_works_once(api, sim):
    tfa = sim.state()["tfa"]
    body = {"tfa_method": "sms", "code": tfa["code"], "secret": tfa["tfa_secret"]}
    assert api.put(REGEN, body).status_code == 200
    assert api.put(REGEN, body).status_code == 400
    assert sim.state()["tfa"]["code"] != tfa["code"]


@pytest.mark.parametrize("method", ["sms", "email"])
def test_missing_secret_for_sms_or_email_is_400(api, sim, method):
    response = api.put(REGEN, {"tfa_method": method, "code": sim.state()["tfa"]["code"]})
    assert response.status_code == 400 and "secret" in response.json()["msg"]


def test_wrong_secret_is_400(api, sim):
    tfa = sim.state()["tfa"]
    response = api.put(REGEN, {"tfa_method": "email", "code": tfa["code"], "secret": "0" * 32})
    assert response.status_code == 400 and response.json()["error"] == "invalid_code"


def test_wrong_totp_code_is_400(api, sim):
    secret = sim.state()["tfa"]["totp_secret"]
    wrong = f"{(int(totp(secret, sim.now())) + 1) % 10**6:06d}"
    response = api.put(REGEN, {"tfa_method": "totp", "code": wrong})
    assert response.status_code == 400 and response.json()["error"] == "invalid_code"


def test_regen_with_a_backup_code(api, sim):
    code = sim.state()["tfa"]["backup_codes"][0]
    assert api.put(REGEN, {"backup_code": code}).status_code == 200


def test_backup_code_is_single_use(api, sim):
    codes = sim.state()["tfa"]["backup_codes"]
    api.put(REGEN, {"backup_code": codes[0]})
    response = api.put(REGEN, {"backup_code": codes[0]})
    assert response.status_code == 400 and response.json()["error"] == "invalid_backup_code"


def test_new_backup_codes_replace_the_old_ones(api, sim):
    old = sim.state()["tfa"]["backup_codes"]
    new = api.put(REGEN, {"backup_code": old[0]}).json()["backup_codes"]
    assert sim.state()["tfa"]["backup_codes"] == new
    assert api.put(REGEN, {"backup_code": old[1]}).status_code == 400
    assert api.put(REGEN, {"backup_code": new[0]}).status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"code": "123456"},
        {"tfa_method": "push", "code": "123456"},
        {"tfa_method_id": 99, "code": "123456"},
        {"tfa_method_id": 1, "tfa_method": "sms", "code": "123456", "secret": "x"},
    ],
)
def test_incomplete_or_inconsistent_tfa_body_is_400(api, body):
    assert api.put(REGEN, body).status_code == 400


# --- pending price increases, API keys, cloud integrations --------------------------------------------------
PENDING = "/api/v0/instances/pending-price-increases"
PENDING_FIELDS = {
    "pending_price_increase_id",
    "contract_id",
    "host_id",
    "new_gpu_costpersec",
    "new_disk_ram_costpersec",
    "old_gpu_costpersec",
    "old_disk_ram_costpersec",
    "contract_end_date",
    "ask_end_date",
    "created_at",
}


def test_pending_price_increases_have_all_ten_fields(api):
    body = api.get(PENDING).json()
    assert body["success"] is True and body["truncated"] is False
    assert body["count"] == len(body["pending_price_increases"]) > 0
    for item in body["pending_price_increases"]:
        assert set(item) == PENDING_FIELDS
        assert item["new_gpu_costpersec"] > item["old_gpu_costpersec"]


def test_pending_list_is_cut_at_the_list_limit(api, sim):
    sim.add_pending_price_increases(10)
    sim.set_list_limit(5)
    body = api.get(PENDING).json()
    assert body["count"] == 5 and len(body["pending_price_increases"]) == 5 and body["truncated"] is True


def test_pending_list_not_truncated_at_exactly_the_limit(api, sim):
    sim.set_list_limit(len(api.get(PENDING).json()["pending_price_increases"]))
    assert api.get(PENDING).json()["truncated"] is False


def test_add_pending_price_increases_for_a_contract(api, sim):
    instance_id = api.create()["new_contract"]
    sim.add_pending_price_increases(2, contract_id=instance_id)
    items = api.get(PENDING).json()["pending_price_increases"]
    assert [i["contract_id"] for i in items].count(instance_id) == 2


def test_api_keys_listing_hides_key_values(api):
    response = api.get("/api/v0/auth/apikeys")
    assert response.status_code == 200
    keys = response.json()["apikeys"]
    assert keys and all(k["key"] is None for k in keys)
    fields = {"id", "user_id", "key", "key_type", "name", "team_id", "team_name", "team_owner"}
    assert all(fields <= set(k) for k in keys)


def test_cloud_integrations_is_a_json_array(api):
    response = api.get("/api/v0/users/cloud_integrations")
    assert response.status_code == 200
    items = response.json()
    assert isinstance(items, list) and items
    assert all({"id", "cloud_type", "name"} <= set(i) for i in items)
