"""The durable-data rules: what a task may ask for, and what each rental copies."""

from __future__ import annotations

import pytest

from airflow_gpumarket import staging
from airflow_gpumarket.exceptions import GpuMarketValidationError


def plan(**given):
    values = {
        "checkpoint_dir": None,
        "checkpoint_uri": None,
        "cloud_integration": None,
        "inputs": None,
        "outputs": None,
        "on_restore_failure": "restart",
        "staging_timeout": 60.0,
    }
    values.update(given)
    return staging.make_plan(**values)


def test_a_checkpoint_dir_alone_restores_only_from_a_preempted_instance():
    p = plan(checkpoint_dir="/workspace/ckpt/")
    assert p.checkpoint_dir == "/workspace/ckpt"
    assert not p.stages_in(None) and not p.gated(None)
    assert p.stages_in(1001) and not p.gated(1001)


def test_checkpoint_uri_restores_from_the_cloud_unless_a_preempted_instance_holds_a_newer_one():
    p = plan(checkpoint_dir="/ckpt", checkpoint_uri="bucket/ckpt", cloud_integration="s3")
    assert p.restores_from_cloud(None) and not p.restores_from_cloud(1001)
    assert not p.gated(None) and not p.gated(1001)  # the restore's manifest tells the wrapper it arrived


def test_inputs_are_gated_on_every_rental():
    p = plan(inputs={"/data": "datasets/x"}, cloud_integration=7)
    assert p.gated(None) and p.gated(1001)


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"checkpoint_dir": "workspace"}, "checkpoint_dir"),
        ({"checkpoint_dir": "/a/../b"}, "checkpoint_dir"),
        ({"checkpoint_dir": "/"}, "checkpoint_dir"),
        ({"checkpoint_dir": "/work space/x"}, "checkpoint_dir"),
        ({"checkpoint_dir": staging.STATE_DIR + "/x"}, "checkpoint_dir"),
        ({"checkpoint_uri": "b/c", "cloud_integration": "s3"}, "checkpoint_uri"),
        ({"inputs": {"/data": "x"}}, "cloud_integration"),
        ({"outputs": ["/out"], "cloud_integration": "s3"}, "outputs"),
        ({"inputs": {"data": "x"}, "cloud_integration": "s3"}, "inputs key"),
        ({"inputs": {"/data": ""}, "cloud_integration": "s3"}, "inputs['/data']"),
        ({"on_restore_failure": "retry"}, "on_restore_failure"),
        ({"checkpoint_dir": "/w", "outputs": {"/w/out": "o"}, "cloud_integration": "s3"}, "outputs"),
        ({"inputs": {"/d": "x"}, "cloud_integration": ""}, "cloud_integration"),
    ],
)
def test_bad_durable_data_arguments_name_the_argument(given, field):
    with pytest.raises(GpuMarketValidationError) as raised:
        plan(**given)
    assert raised.value.field == field


def test_a_directory_is_sent_as_its_contents():
    assert staging.as_dir("/workspace/ckpt") == "/workspace/ckpt/"
    assert staging.as_dir("/workspace/ckpt/") == "/workspace/ckpt/"
