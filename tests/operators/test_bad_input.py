"""Bad input is refused when the DAG is parsed, with a message naming the argument; nothing is sent.

Each case breaks one rule of the spec (or of the operators) through an operator's documented arguments.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
from airflow_gpumarket.operators.reaper import GpuMarketReapOrphansOperator
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator
from airflow_gpumarket.operators.search import GpuMarketSearchOffersOperator
from airflow_gpumarket.operators.teardown import GpuMarketDestroyInstanceOperator, GpuMarketStopInstanceOperator
from airflow_gpumarket.sensors.instances import GpuMarketInstanceStatusSensor

OK = {"offer_filters": {"gpu_name": {"eq": "RTX 4090"}}, "image": "pytorch/pytorch"}
CREATE, JOB = GpuMarketCreateInstanceOperator, GpuMarketRunJobOperator

CASES = [
    # (operator, arguments, the argument the message must name)
    (CREATE, {"offer_filters": {}}, "image"),
    (CREATE, {"image": "x"}, "offer_id"),
    (CREATE, {**OK, "runtype": "ssh-direct"}, "runtype"),
    (CREATE, {**OK, "runtype": "SSH"}, "runtype"),
    (CREATE, {**OK, "target_state": "paused"}, "target_state"),
    (CREATE, {**OK, "env": "-e A=1 -p 22:22"}, "env"),
    (CREATE, {**OK, "env": ["A=1"]}, "env"),
    (CREATE, {**OK, "env": {"EPOCHS": 3}}, "env"),
    (CREATE, {**OK, "env": {"-p 8080": "1"}}, "env"),
    (CREATE, {**OK, "env": {"-p 8080:8080": 1}}, "env"),
    (CREATE, {**OK, "env": {"-p 70000:70000": "1"}}, "env"),
    (CREATE, {**OK, "onstart": "x" * 4049}, "onstart"),
    (CREATE, {**OK, "onstart": "echo hi", "runtype": "args"}, "onstart"),
    (CREATE, {**OK, "args_str": "--epochs 3"}, "args_str"),
    (CREATE, {**OK, "args_str": "--epochs 3", "runtype": "ssh"}, "args_str"),
    (CREATE, {**OK, "price": 0}, "price"),
    (CREATE, {**OK, "price": -0.2}, "price"),
    (JOB, {**OK, "command": "python train.py", "durable": "yes"}, "durable"),
    (CREATE, {**OK, "price": "cheap"}, "price"),
    (CREATE, {**OK, "disk": 0}, "disk"),
    (CREATE, {**OK, "disk": "8GB"}, "disk"),
    (CREATE, {**OK, "volume_info": 5}, "volume_info"),
    (CREATE, {**OK, "volume_info": {"volume_id": 5}}, "volume_info.mount_path"),
    (CREATE, {**OK, "volume_info": {"mount_path": "/data"}}, "volume_info.volume_id"),
    (CREATE, {**OK, "volume_info": {"volume_id": 5, "mount_path": "data"}}, "volume_info.mount_path"),
    (CREATE, {**OK, "volume_info": {"volume_id": 5, "mount_path": "/d", "size": 1}}, "volume_info"),
    (CREATE, {**OK, "use_jupyter_lab": "yes"}, "use_jupyter_lab"),
    (CREATE, {**OK, "python_utf8": 1}, "python_utf8"),
    (CREATE, {**OK, "lang_utf8": "true"}, "lang_utf8"),
    (CREATE, {**OK, "cancel_unavail": "no"}, "cancel_unavail"),
    (CREATE, {**OK, "vm": "false"}, "vm"),
    (CREATE, {**OK, "image": ""}, "image"),
    (CREATE, {**OK, "template_hash_id": ""}, "template_hash_id"),
    (CREATE, {**OK, "jupyter_dir": ""}, "jupyter_dir"),
    (CREATE, {**OK, "image_login": "user:token@registry"}, "image_login"),
    (CREATE, {**OK, "max_dph": 0}, "max_dph"),
    (CREATE, {**OK, "max_dph": -1}, "max_dph"),
    (CREATE, {**OK, "boot_timeout": 0}, "boot_timeout"),
    (CREATE, {**OK, "boot_timeout": timedelta(seconds=-5)}, "boot_timeout"),
    (CREATE, {**OK, "poll_interval": 0}, "poll_interval"),
    (CREATE, {**OK, "max_offer_attempts": 0}, "max_offer_attempts"),
    (CREATE, {**OK, "lease": 0}, "lease"),
    (CREATE, {**OK, "offer_id": 0, "offer_filters": None}, "offer_id"),
    (CREATE, {**OK, "offer_id": "abc", "offer_filters": None}, "offer_id"),
    (CREATE, {**OK, "offer_filters": {"gpu_name": "RTX 4090"}}, "filters['gpu_name']"),
    (CREATE, {**OK, "offer_filters": {"gpu_name": {"in": "RTX 4090"}}}, "filters['gpu_name']"),
    (CREATE, {**OK, "offer_filters": {"num_gpus": {"gte": 1, "eq": 2}}}, "filters['num_gpus']"),
    (CREATE, {**OK, "offer_filters": {"limit": {"eq": 3}}}, "filters"),
    (CREATE, {**OK, "offer_order": [["dph_total", "down"]]}, "order['dph_total']"),
    (CREATE, {**OK, "offer_order": ["dph_total"]}, "order"),
    (CREATE, {**OK, "offer_type": "spot"}, "offer_type"),
    (CREATE, {**OK, "command": "python train.py", "onstart": "echo"}, "onstart"),
    (CREATE, {**OK, "command": "python train.py", "runtype": "args"}, "runtype"),
    (JOB, {**OK, "command": "python train.py", "runtype": "args"}, "runtype"),
    (JOB, {**OK, "command": ""}, "command"),
    (JOB, {**OK, "command": "x", "onstart": "y"}, "onstart"),
    (JOB, {**OK, "command": "x", "max_runtime": 0}, "max_runtime"),
    (JOB, {**OK, "command": "x", "keepalive": 0}, "keepalive"),
    (JOB, {**OK, "command": "x", "keepalive": 20, "poll_interval": 10}, "keepalive"),
    (JOB, {**OK, "command": "x", "env": {"A": None}}, "env"),
    (JOB, {**OK, "command": "echo " + "y" * 9000 + "".join(str(i) for i in range(3000))}, "command"),
    (GpuMarketSearchOffersOperator, {"offer_filters": {"x": {"eq": 1, "gte": 2}}}, "filters['x']"),
    (GpuMarketSearchOffersOperator, {"offer_type": "spot"}, "offer_type"),
    (GpuMarketSearchOffersOperator, {"limit": 0}, "limit"),
    (GpuMarketSearchOffersOperator, {"max_dph": 0}, "max_dph"),
    (GpuMarketDestroyInstanceOperator, {"instance_id": "abc"}, "instance_id"),
    (GpuMarketDestroyInstanceOperator, {"instance_id": -3}, "instance_id"),
    (GpuMarketStopInstanceOperator, {"instance_id": "i-12"}, "instance_id"),
    (GpuMarketInstanceStatusSensor, {"instance_id": "abc"}, "instance_id"),
    (GpuMarketInstanceStatusSensor, {"instance_id": 3, "target_status": ""}, "target_status"),
    (GpuMarketInstanceStatusSensor, {"instance_id": 3, "poke_interval": 0}, "poke_interval"),
    (GpuMarketReapOrphansOperator, {"grace": -1}, "grace"),
]


@pytest.mark.parametrize(
    ("operator", "arguments", "field"),
    CASES,
    ids=[f"{op.__name__.removeprefix('GpuMarket')}-{field}-{i}" for i, (op, _, field) in enumerate(CASES)],
)
def test_bad_input_is_refused_at_parse_time_naming_the_argument(operator, arguments, field, requests_mock):
    with pytest.raises(GpuMarketValidationError) as caught:
        operator(task_id="t", **arguments)
    # The message starts with the argument, or a part of it such as env['EPOCHS'] or volume_info.volume_id.
    assert caught.value.field.startswith(field), str(caught.value)
    assert str(caught.value).startswith(caught.value.field + ": ")
    assert isinstance(caught.value, ValueError)
    assert requests_mock.call_count == 0


def test_there_are_at_least_fifty_bad_input_cases():
    assert len(CASES) >= 50


def test_templated_fields_are_checked_after_rendering_not_at_parse_time():
    op = CREATE(task_id="t", **OK, runtype="{{ params.runtype }}", disk="{{ params.disk }}")
    op.instance.update(runtype="bogus", disk=8)  # as rendering would make them
    with pytest.raises(GpuMarketValidationError, match="^runtype"):
        op._validate()


def test_good_arguments_build_a_body_with_only_given_fields():
    op = CREATE(task_id="t", **OK, disk=16, env={"A": "1", "-p 8080:8080": "1"})
    body = op._creation_body(label="afgm-0123456789ab-1", base_url=None)
    assert body == {
        "image": "pytorch/pytorch",
        "label": "afgm-0123456789ab-1",
        "disk": 16,
        "env": {"A": "1", "-p 8080:8080": "1"},
        "cancel_unavail": True,
    }


def test_run_job_defaults_to_an_onstart_runtype_and_wraps_the_command():
    op = JOB(task_id="t", **OK, command="python train.py")
    body = op._creation_body(label="afgm-0123456789ab-1", base_url="http://127.0.0.1:1")
    assert body["runtype"] == "ssh_proxy"
    assert "python train.py" in body["onstart"] and "CONTAINER_API_KEY" in body["onstart"]
    assert "http://127.0.0.1:1/api/v0/instances/" in body["onstart"]


def test_a_creation_field_is_one_line_of_the_api_table():
    """The renting operators take every creation field of api.CREATION_FIELDS by name (keyword-only, so
    default_args and expand() know them), documented, besides the one templated ``instance`` dict."""
    import inspect

    from airflow_gpumarket import api
    from airflow_gpumarket.operators.renting import GpuMarketRentingBaseOperator

    keywords = inspect.signature(GpuMarketRentingBaseOperator.__init__).parameters
    fields = {
        name
        for name, p in keywords.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and name in api.CREATION_FIELD_NAMES
    }
    assert fields == set(api.CREATION_FIELD_NAMES)
    assert all(keywords[name].default is None for name in fields)  # not given: the instance dict's value stands
    assert all(f":param {name}:" in (GpuMarketRentingBaseOperator.__doc__ or "") for name in fields)
    assert not set(api.CREATION_FIELD_NAMES) & set(GpuMarketRentingBaseOperator.template_fields)
    assert "instance" in GpuMarketRentingBaseOperator.template_fields


def test_a_field_the_spec_does_not_name_is_refused_naming_it():
    from airflow_gpumarket import api

    with pytest.raises(GpuMarketValidationError, match="gpu_count: is not a creation field of the spec"):
        api.build_create_instance_body(image="img", gpu_count=2)
