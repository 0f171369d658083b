"""Every validation rule of the spec: rejected with GpuMarketValidationError naming the field, and nothing sent.

The ``wire`` fixture answers any request with 200, so a rule that is not enforced shows up as a request sent
(and as no exception raised).
"""

from __future__ import annotations

import base64
import gzip
import random
import re
import string

import pytest
from hook_fakes import url

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import (
    GpuMarketValidationError,
)


def assert_rejected(wire, call, field: str, *words: str) -> GpuMarketValidationError:
    with pytest.raises(GpuMarketValidationError) as caught:
        call()
    exc = caught.value
    assert exc.field == field
    assert str(exc).startswith(f"{field}: ")
    for word in words:
        assert word in str(exc)
    assert wire.call_count == 0, "a request was sent although the arguments break a rule"
    return exc


# --- Create instance ---------------------------------------------------------------------------------------
def test_create_instance_requires_image_or_template_hash_id(wire, hook):
    assert_rejected(wire, lambda: hook.create_instance(101, label="x"), "image", "template_hash_id")


@pytest.mark.parametrize("runtype", ["ssh_tunnel", "SSH", "", "jupyter-direct"])
def test_create_instance_runtype_must_be_one_of_the_seven(wire, hook, runtype):
    assert_rejected(wire, lambda: hook.create_instance(101, image="img", runtype=runtype), "runtype", "ssh_direct")


@pytest.mark.parametrize("runtype", api.RUNTYPES)
def test_create_instance_accepts_every_documented_runtype(wire, hook, runtype):
    hook.create_instance(101, image="img", runtype=runtype)

    assert wire.last_request.json() == {"image": "img", "runtype": runtype}


@pytest.mark.parametrize("state", ["paused", "Running", "exited"])
def test_create_instance_target_state_must_be_running_or_stopped(wire, hook, state):
    assert_rejected(wire, lambda: hook.create_instance(101, image="img", target_state=state), "target_state", "running")


@pytest.mark.parametrize("env", ["-e FOO=bar -p 8080:8080", [("FOO", "bar")]], ids=["flag-string", "list"])
def test_create_instance_env_must_be_an_object(wire, hook, env):
    assert_rejected(wire, lambda: hook.create_instance(101, image="img", env=env), "env", "dict", "templates")


@pytest.mark.parametrize("value", [1, True, None, 3.5])
def test_create_instance_env_values_must_be_strings(wire, hook, value):
    assert_rejected(
        wire, lambda: hook.create_instance(101, image="img", env={"BATCH": value}), "env['BATCH']", "must be strings"
    )


@pytest.mark.parametrize(
    "key", ["-p 8080", "-p 8080:", "-p8080:8080", "-e FOO", "-p 70000:8000", "-p 0:0", "-p 99999:70000"]
)
def test_create_instance_port_mapping_key_must_be_dash_p_port_colon_port(wire, hook, key):
    with pytest.raises(GpuMarketValidationError) as caught:
        hook.create_instance(101, image="img", env={key: "1"})
    assert caught.value.field.startswith("env")
    assert key in str(caught.value)
    assert wire.call_count == 0


@pytest.mark.parametrize("value", ["0", 1, "true", ""])
def test_create_instance_port_mapping_value_must_be_string_1(wire, hook, value):
    assert_rejected(
        wire,
        lambda: hook.create_instance(101, image="img", env={"-p 8080:8080": value}),
        "env['-p 8080:8080']",
        '"1"',
    )


def test_create_instance_onstart_over_4048_characters_is_rejected_pointing_to_pack_onstart(wire, hook):
    assert_rejected(
        wire,
        lambda: hook.create_instance(101, image="img", onstart="x" * 4049),
        "onstart",
        "4049",
        "4048",
        "pack_onstart",
    )


def test_create_instance_onstart_of_exactly_4048_characters_is_sent(wire, hook):
    hook.create_instance(101, image="img", onstart="x" * 4048)

    assert wire.last_request.json()["onstart"] == "x" * 4048


def test_create_instance_onstart_must_be_a_string(wire, hook):
    assert_rejected(wire, lambda: hook.create_instance(101, image="img", onstart=["echo hi"]), "onstart")


def test_create_instance_args_str_requires_runtype_args(wire, hook):
    assert_rejected(
        wire, lambda: hook.create_instance(101, image="img", runtype="ssh", args_str="serve"), "args_str", "'args'"
    )
    assert_rejected(wire, lambda: hook.create_instance(101, image="img", args_str="serve"), "args_str", "ignored")


def test_create_instance_onstart_with_runtype_args_is_rejected(wire, hook):
    assert_rejected(
        wire, lambda: hook.create_instance(101, image="img", runtype="args", onstart="echo hi"), "onstart", "args"
    )


@pytest.mark.parametrize("price", [0, -0.1, "0.3", True, float("nan"), float("inf")])
def test_create_instance_price_must_be_a_positive_number(wire, hook, price):
    assert_rejected(wire, lambda: hook.create_instance(101, image="img", price=price), "price", "on-demand")


@pytest.mark.parametrize("disk", [0, -8, "16", False])
def test_create_instance_disk_must_be_a_positive_number(wire, hook, disk):
    assert_rejected(wire, lambda: hook.create_instance(101, image="img", disk=disk), "disk")


@pytest.mark.parametrize(
    ("volume_info", "field"),
    [
        ("vol-55:/data", "volume_info"),
        ({"volume_id": 55, "mount_path": "/data", "size": 10}, "volume_info"),
        ({"mount_path": "/data"}, "volume_info.volume_id"),
        ({"volume_id": "55", "mount_path": "/data"}, "volume_info.volume_id"),
        ({"volume_id": 55, "mount_path": "data"}, "volume_info.mount_path"),
        ({"volume_id": 55}, "volume_info.mount_path"),
    ],
    ids=["not-a-dict", "unknown-key", "missing-volume-id", "volume-id-not-int", "relative-mount-path", "no-mount-path"],
)
def test_create_instance_volume_info_shape(wire, hook, volume_info, field):
    assert_rejected(wire, lambda: hook.create_instance(101, image="img", volume_info=volume_info), field)


@pytest.mark.parametrize("name", ["use_jupyter_lab", "python_utf8", "lang_utf8", "cancel_unavail", "vm"])
@pytest.mark.parametrize("value", ["true", 1])
def test_create_instance_boolean_fields_must_be_booleans(wire, hook, name, value):
    assert_rejected(wire, lambda: hook.create_instance(101, image="img", **{name: value}), name, "true or false")


@pytest.mark.parametrize(
    "image_login",
    ["robot:ghp_SECRETTOKEN@ghcr.io", "-u robot -p ghp_SECRETTOKEN", "-p ghp_SECRETTOKEN -u robot ghcr.io"],
)
def test_create_instance_image_login_malformed_is_rejected_without_echoing_the_token(wire, hook, image_login):
    exc = assert_rejected(
        wire, lambda: hook.create_instance(101, image="img", image_login=image_login), "image_login", "-u <user>"
    )
    assert "ghp_SECRETTOKEN" not in str(exc)
    assert "ghp_SECRETTOKEN" not in repr(exc.args)


@pytest.mark.parametrize("offer_id", [0, -1, "101", 1.5, True, None])
def test_create_instance_offer_id_must_be_a_positive_integer(wire, hook, offer_id):
    assert_rejected(wire, lambda: hook.create_instance(offer_id, image="img"), "offer_id")


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda h: h.create_instance(101, image=""), "image"),
        (lambda h: h.create_instance(101, template_hash_id="  "), "template_hash_id"),
        (lambda h: h.create_instance(101, image="img", label=5), "label"),
        (lambda h: h.create_instance(101, image="img", jupyter_dir=""), "jupyter_dir"),
    ],
    ids=["empty-image", "blank-template", "label-not-string", "empty-jupyter-dir"],
)
def test_create_instance_text_fields_must_be_non_empty_strings(wire, hook, call, field):
    assert_rejected(wire, lambda: call(hook), field)


@pytest.mark.parametrize(
    "call",
    [lambda h: h.get_instance(0), lambda h: h.stop_instance(-3), lambda h: h.destroy_instance("7")],
    ids=["get", "stop", "destroy"],
)
def test_instance_id_must_be_a_positive_integer(wire, hook, call):
    assert_rejected(wire, lambda: call(hook), "instance_id")


# --- onstart packing ---------------------------------------------------------------------------------------
def _unpack(packed: str) -> str:
    match = re.search(r"echo '([A-Za-z0-9+/=]+)' \| base64 -d \| gunzip", packed)
    assert match, packed[:200]
    return gzip.decompress(base64.b64decode(match.group(1))).decode()


def test_pack_onstart_packs_a_long_compressible_script_under_the_limit_and_it_round_trips():
    script = "".join(
        f"echo 'step {i}: preparing dataset shard {i % 7}'\npython prep.py --shard {i}\n" for i in range(200)
    )
    assert len(script) > api.ONSTART_MAX_CHARS

    packed = api.pack_onstart(script)

    assert len(packed) <= api.ONSTART_MAX_CHARS
    assert packed.startswith("#!/bin/sh\n")
    assert _unpack(packed) == script


def test_packed_onstart_is_accepted_by_create_instance(wire, hook):
    script = "pip install -r requirements.txt && python train.py --epochs 3\n" * 200
    packed = api.pack_onstart(script)

    hook.create_instance(101, image="img", onstart=packed)

    assert _unpack(wire.last_request.json()["onstart"]) == script


def test_pack_onstart_leaves_a_script_that_fits_unchanged():
    assert api.pack_onstart("echo hi") == "echo hi"
    assert api.pack_onstart("y" * 4048) == "y" * 4048


def test_pack_onstart_fails_clearly_on_an_incompressible_too_long_script():
    rng = random.Random(1234)
    script = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(6000))

    with pytest.raises(GpuMarketValidationError) as caught:
        api.pack_onstart(script)

    assert caught.value.field == "onstart"
    assert "6000 characters" in str(caught.value)
    assert "4048" in str(caught.value)


# --- Search offers -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("filters", "field", "word"),
    [
        ({"gpu_name": "RTX 4090"}, "filters['gpu_name']", "one operator"),
        ({"num_gpus": {"gte": 1, "eq": 2}}, "filters['num_gpus']", "one operator"),
        ({"num_gpus": {}}, "filters['num_gpus']", "one operator"),
        ({"gpu_name": {"in": "RTX 4090"}}, "filters['gpu_name']", "'in' takes a list"),
        ({"num_gpus": {">=": 1}}, "filters['num_gpus']", "eq, gte, in"),
        ({"type": {"eq": "bid"}}, "filters", "offer_type"),
        ({"limit": {"eq": 3}}, "filters", "limit"),
        ({"order": {"eq": "x"}}, "filters", "order"),
    ],
    ids=[
        "bare-value",
        "two-operators",
        "no-operator",
        "in-without-list",
        "bad-operator-name",
        "reserved-type",
        "reserved-limit",
        "reserved-order",
    ],
)
def test_search_offers_filter_shape(wire, hook, filters, field, word):
    assert_rejected(wire, lambda: hook.search_offers(filters), field, word)


@pytest.mark.parametrize("filters", [[("gpu_name", {"eq": "RTX 4090"})], "gpu_name=RTX 4090"], ids=["list", "string"])
def test_search_offers_filters_must_be_an_object(wire, hook, filters):
    assert_rejected(wire, lambda: hook.search_offers(filters), "filters", "dict")


@pytest.mark.parametrize(
    ("order", "field"),
    [
        ("dph_total", "order"),
        ([["dph_total"]], "order"),
        ([("dph_total", "asc", "x")], "order"),
        ([[1, "asc"]], "order"),
        ([["dph_total", "descending"]], "order['dph_total']"),
        ([["dph_total", "DESC"]], "order['dph_total']"),
    ],
    ids=["not-a-list", "pair-too-short", "pair-too-long", "field-not-string", "bad-direction", "direction-case"],
)
def test_search_offers_order_shape_and_direction(wire, hook, order, field):
    assert_rejected(wire, lambda: hook.search_offers(order=order), field)


@pytest.mark.parametrize("offer_type", ["spot", "interruptible", "OnDemand", None])
def test_search_offers_offer_type_must_be_ondemand_on_demand_or_bid(wire, hook, offer_type):
    assert_rejected(wire, lambda: hook.search_offers(offer_type=offer_type), "offer_type", "bid")


@pytest.mark.parametrize("limit", [0, -5, "10", 2.5])
def test_search_offers_limit_must_be_a_positive_integer(wire, hook, limit):
    assert_rejected(wire, lambda: hook.search_offers(limit=limit), "limit")


# --- Serverless endpoint -----------------------------------------------------------------------------------
@pytest.mark.parametrize("state", ["running", "ACTIVE", ""])
def test_create_endpoint_endpoint_state_must_be_active_suspended_or_stopped(wire, hook, state):
    assert_rejected(wire, lambda: hook.create_endpoint(endpoint_state=state), "endpoint_state", "suspended")


def test_create_endpoint_target_queue_time_must_not_exceed_max_queue_time(wire, hook):
    assert_rejected(
        wire,
        lambda: hook.create_endpoint(max_queue_time=10, target_queue_time=10.5),
        "target_queue_time",
        "less than or equal to max_queue_time",
    )


def test_create_endpoint_target_queue_time_equal_to_max_queue_time_is_sent(wire, hook):
    hook.create_endpoint(max_queue_time=10, target_queue_time=10)

    assert wire.last_request.json() == {"max_queue_time": 10, "target_queue_time": 10}


@pytest.mark.parametrize(
    "name",
    [
        "min_load",
        "min_cold_load",
        "target_util",
        "cold_mult",
        "cold_workers",
        "max_workers",
        "max_queue_time",
        "inactivity_timeout",
        "overrecruit_ratio",
    ],
)
def test_create_endpoint_numbers_must_not_be_negative(wire, hook, name):
    assert_rejected(wire, lambda: hook.create_endpoint(**{name: -1}), name)


@pytest.mark.parametrize(("name", "value"), [("cold_workers", 1.5), ("max_workers", "4"), ("min_load", "1")])
def test_create_endpoint_numbers_must_be_numbers_of_the_right_kind(wire, hook, name, value):
    assert_rejected(wire, lambda: hook.create_endpoint(**{name: value}), name)


@pytest.mark.parametrize("name", ["endpoint_name", "autoscaler_instance"])
def test_create_endpoint_text_fields_must_be_non_empty(wire, hook, name):
    assert_rejected(wire, lambda: hook.create_endpoint(**{name: " "}), name)


def test_create_endpoint_rejects_an_unknown_keyword_before_sending(wire, hook):
    assert_rejected(wire, lambda: hook.create_endpoint(max_worker=3), "max_worker", "max_workers")


# --- Volume listings ---------------------------------------------------------------------------------------
def test_create_volume_listings_needs_machine_or_machines(wire, hook):
    assert_rejected(wire, lambda: hook.create_volume_listings(hidden_listing=True), "machine", "machines")
    assert_rejected(wire, lambda: hook.create_volume_listings(machines=[]), "machine", "machines")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"machine": "17"}, "machine"),
        ({"machine": 0}, "machine"),
        ({"machines": [17, "18"]}, "machines[]"),
        ({"machines": 17}, "machines"),
        ({"machine": 17, "machines": []}, "machines"),
        ({"machine": 17, "hidden_listing": "yes"}, "hidden_listing"),
    ],
    ids=["machine-str", "machine-zero", "machines-item-str", "machines-not-list", "machines-empty", "hidden-not-bool"],
)
def test_create_volume_listings_field_types(wire, hook, kwargs, field):
    assert_rejected(wire, lambda: hook.create_volume_listings(**kwargs), field)


# --- Two-factor backup codes -------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["SMS", "authenticator", "webauthn"])
def test_regenerate_backup_codes_tfa_method_must_be_sms_totp_or_email(wire, hook, method):
    assert_rejected(wire, lambda: hook.regenerate_backup_codes(tfa_method=method, code="1"), "tfa_method", "totp")


@pytest.mark.parametrize("method", ["sms", "email"])
def test_regenerate_backup_codes_secret_required_for_sms_and_email(wire, hook, method):
    assert_rejected(
        wire, lambda: hook.regenerate_backup_codes(tfa_method=method, code="123456"), "secret", "tfa_secret"
    )


def test_regenerate_backup_codes_totp_needs_no_secret(wire, hook):
    wire.put(url(api.PATH_REGEN_BACKUP_CODES), json={"msg": "ok", "backup_codes": ["c"] * 10})
    hook.regenerate_backup_codes(tfa_method="totp", code="123456")

    assert wire.last_request.json() == {"tfa_method": "totp", "code": "123456"}


def test_regenerate_backup_codes_needs_a_code_or_a_backup_code(wire, hook):
    assert_rejected(wire, lambda: hook.regenerate_backup_codes(tfa_method="totp"), "code", "backup_code")
    assert_rejected(wire, lambda: hook.regenerate_backup_codes(), "code", "backup_code")


def test_regenerate_backup_codes_code_needs_a_method(wire, hook):
    assert_rejected(wire, lambda: hook.regenerate_backup_codes(code="123456"), "tfa_method")


@pytest.mark.parametrize("name", ["code", "secret", "backup_code"])
def test_regenerate_backup_codes_blank_secret_values_rejected_without_echo(wire, hook, name):
    kwargs = {"tfa_method": "sms", "code": "123456", "secret": "s3cr3t-value"}
    kwargs[name] = "   "
    exc = assert_rejected(wire, lambda: hook.regenerate_backup_codes(**kwargs), name, "value not shown")
    assert "s3cr3t-value" not in str(exc)


def test_regenerate_backup_codes_tfa_method_id_must_be_a_positive_integer(wire, hook):
    assert_rejected(wire, lambda: hook.regenerate_backup_codes(tfa_method_id="3", code="1"), "tfa_method_id")


# --- Deployments -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["", "   ", None])
def test_delete_deployments_needs_a_non_empty_name(wire, hook, name):
    assert_rejected(wire, lambda: hook.delete_deployments(name), "name")


def test_delete_deployments_tag_when_given_must_be_non_empty(wire, hook):
    assert_rejected(wire, lambda: hook.delete_deployments("llama", tag=""), "tag")


# --- Helpers -------------------------------------------------------------------------------------------------
def test_port_mappings_builds_env_entries_for_each_port():
    assert api.port_mappings(8080, 22) == {"-p 8080:8080": "1", "-p 22:22": "1"}


@pytest.mark.parametrize("port", [0, 65536, 69999, 100000, "22", True])
def test_port_mappings_rejects_invalid_ports(port):
    with pytest.raises(GpuMarketValidationError) as caught:
        api.port_mappings(port)
    assert caught.value.field == "port_mappings"


def test_rule_an_identity_port_from_70000_is_a_port_mapping(wire, hook):
    assert api.port_mappings(70000) == {"-p 70000:70000": "1"}
    api.validate_env({"-p 70000:70000": "1", "-p 99999:99999": "1"})


def test_port_mappings_pass_env_validation_and_are_sent_as_given(wire, hook):
    env = {"MODEL": "llama", **api.port_mappings(8080, 22)}

    hook.create_instance(101, image="img", runtype="jupyter_direct", env=env)

    assert wire.last_request.json()["env"] == {"MODEL": "llama", "-p 8080:8080": "1", "-p 22:22": "1"}
    assert wire.last_request.url == url("/api/v0/asks/101/")


def test_env_variables_drops_port_mappings():
    assert api.env_variables({"A": "1", "-p 22:22": "1"}) == {"A": "1"}


@pytest.mark.parametrize(("instance_id", "price"), [(0, 0.3), (7, 0), (7, "cheap"), (True, 0.3)])
def test_change_bid_refuses_bad_arguments_before_sending(wire, hook, instance_id, price):
    from airflow_gpumarket.exceptions import GpuMarketValidationError

    with pytest.raises(GpuMarketValidationError):
        hook.change_bid(instance_id, price)
    assert wire.call_count == 0
