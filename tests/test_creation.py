"""The create request's pure functions (creation.py): the fields sent and the body they make."""

from __future__ import annotations

import pytest

from airflow_gpumarket.creation import creation_body, creation_fields
from airflow_gpumarket.exceptions import GpuMarketValidationError


def test_a_field_given_by_name_wins_over_the_instance_dict_which_wins_over_the_defaults():
    fields = creation_fields({"image": "a", "disk": 20, "cancel_unavail": False}, {"image": "b"})
    assert fields == {"image": "b", "disk": 20, "cancel_unavail": False}
    assert creation_fields(None, {"image": "c"}) == {"image": "c", "cancel_unavail": True}


def test_a_command_makes_runtype_default_to_ssh_proxy_and_excludes_onstart():
    assert creation_fields({"image": "a"}, {}, command="python train.py")["runtype"] == "ssh_proxy"
    assert creation_fields({"runtype": "ssh_direct"}, {}, command="true")["runtype"] == "ssh_direct"
    with pytest.raises(GpuMarketValidationError, match="^onstart: give command"):
        creation_fields({"onstart": "echo hi"}, {}, command="true")


@pytest.mark.parametrize(
    ("instance", "field"),
    [("image=a", "instance"), ({"label": "x"}, "instance"), ({"imagee": "a"}, "imagee")],
)
def test_a_bad_instance_dict_is_refused_naming_the_field(instance, field):
    with pytest.raises(GpuMarketValidationError) as caught:
        creation_fields(instance, {})
    assert caught.value.field == field


def test_the_body_carries_the_script_the_bid_and_the_run_of_an_interruptible_job():
    body = creation_body({"image": "a", "env": {"A": "1"}}, onstart="echo hi", label="l", bid=0.21, preemptions=2)
    assert body["onstart"] == "echo hi" and body["price"] == 0.21 and body["label"] == "l"
    assert body["env"] == {"A": "1", "GPUMARKET_ATTEMPT": "3", "GPUMARKET_PREEMPTIONS": "2"}


def test_an_on_demand_body_has_no_price_and_keeps_its_env():
    body = creation_body({"image": "a", "env": {"A": "1"}}, onstart=None, label=None)
    assert "price" not in body and body["env"] == {"A": "1"} and "onstart" not in body
