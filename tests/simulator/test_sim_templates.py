"""Templates: rules 1-6 of the spec's instance creation fields."""

from __future__ import annotations

import pytest

from gpumarket_simulator.worldgen import template_hash

from .helpers import ledger

PYTORCH = template_hash("pytorch-jupyter")
TRAINER = template_hash("private-trainer")


@pytest.fixture
def templates(sim):
    return {t["name"]: t for t in sim.state()["templates"]}


def create(api, body):
    return api.create(body=body)["new_contract"]


def test_world_has_several_templates_with_hash_ids(templates):
    assert len(templates) >= 3
    assert templates["pytorch-jupyter"]["hash_id"] == PYTORCH


def test_template_hash_ids_do_not_depend_on_the_seed(sim):
    before = {t["hash_id"] for t in sim.state()["templates"]}
    sim.reset(seed=99)
    assert {t["hash_id"] for t in sim.state()["templates"]} == before


def test_template_makes_image_optional(api, templates):
    inst = api.instance(create(api, {"template_hash_id": PYTORCH}))
    assert inst["image"] == templates["pytorch-jupyter"]["image"]
    assert inst["runtype"] == "jupyter_direct"
    assert inst["template_hash_id"] == PYTORCH


def test_missing_image_without_template_is_400(api):
    response = api.put(f"/api/v0/asks/{api.cheapest()['id']}/", {"label": "x"})
    assert response.status_code == 400 and response.json()["error"] == "missing_image"


def test_template_env_flag_string_is_read_as_variables_and_ports(api):
    env = api.instance(create(api, {"template_hash_id": PYTORCH}))["env"]
    assert env == {"JUPYTER_DIR": "/", "DATA_DIR": "/workspace", "-p 8080:8080": "1"}


def test_template_env_keys_are_kept(api):
    env = api.instance(create(api, {"template_hash_id": TRAINER, "env": {"EXTRA": "1"}}))["env"]
    assert env["MODE"] == "train" and env["EPOCHS"] == "3"


def test_template_env_merge_adds_new_request_keys(api):
    env = api.instance(create(api, {"template_hash_id": TRAINER, "env": {"EXTRA": "1"}}))["env"]
    assert env == {"MODE": "train", "EPOCHS": "3", "EXTRA": "1"}


def test_template_env_merge_request_wins(api):
    env = api.instance(create(api, {"template_hash_id": TRAINER, "env": {"EPOCHS": "10"}}))["env"]
    assert env["EPOCHS"] == "10"


def test_template_volume_info_is_not_applied(api, templates):
    assert templates["private-trainer"]["volume_info"]
    assert api.instance(create(api, {"template_hash_id": TRAINER}))["volume_info"] is None


def test_request_volume_info_is_applied(api):
    volume = {"volume_id": 5, "mount_path": "/mnt/data"}
    assert api.instance(create(api, {"template_hash_id": TRAINER, "volume_info": volume}))["volume_info"] == volume


def test_template_login_fields_carry_over_to_the_instance(sim, api, templates):
    instance_id = create(api, {"template_hash_id": TRAINER})
    record = ledger(sim, instance_id)
    for field in ("docker_login_repo", "docker_login_user", "docker_login_pass"):
        assert record[field] == templates["private-trainer"][field]


def test_login_password_is_not_shown_in_the_api(api, templates):
    instance_id = create(api, {"template_hash_id": TRAINER})
    assert templates["private-trainer"]["docker_login_pass"] not in api.get(f"/api/v0/instances/{instance_id}/").text


def test_request_image_login_overrides_template_login(sim, api):
    instance_id = create(api, {"template_hash_id": TRAINER, "image_login": "-u me -p tok ghcr.io"})
    record = ledger(sim, instance_id)
    assert (record["docker_login_user"], record["docker_login_pass"], record["docker_login_repo"]) == (
        "me",
        "tok",
        "ghcr.io",
    )


@pytest.mark.parametrize(
    ("field", "value", "shown_as"),
    [
        ("image", "my/image:2", "image"),
        ("runtype", "ssh_proxy", "runtype"),
        ("disk", 64, "disk_space"),
        ("onstart", "echo mine", "onstart"),
        ("args_str", "--flag", "args_str"),
    ],
)
def test_request_values_override_template_values(api, field, value, shown_as):
    assert api.instance(create(api, {"template_hash_id": PYTORCH, field: value}))[shown_as] == value


def test_template_values_apply_when_request_omits_them(api, templates):
    inst = api.instance(create(api, {"template_hash_id": PYTORCH}))
    assert inst["disk_space"] == templates["pytorch-jupyter"]["disk"]
    assert inst["onstart"] == templates["pytorch-jupyter"]["onstart"]


def test_unknown_template_is_400_no_such_template(api):
    response = api.put(f"/api/v0/asks/{api.cheapest()['id']}/", {"template_hash_id": "f" * 32})
    assert response.status_code == 400 and response.json()["error"] == "no_such_template"


def test_env_without_template_is_taken_as_given(api):
    env = {"A": "1", "-p 8000:8000": "1"}
    assert api.instance(create(api, {"image": "u", "env": env}))["env"] == env
