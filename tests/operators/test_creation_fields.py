"""The creation fields as one templated ``instance`` dict, each also taken by name (the Databricks way).

Nothing here rents: these pin down how the renting operators merge, check and render the fields they send.
"""

from __future__ import annotations

import pytest

from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

FILTERS = {"gpu_name": {"eq": "RTX 4090"}}
LABEL = "afgm-0123456789ab-1"


def test_the_fields_may_come_as_one_instance_dict_and_are_sent_as_given():
    op = GpuMarketCreateInstanceOperator(
        task_id="t", offer_filters=FILTERS, instance={"image": "pytorch/pytorch", "disk": 40, "env": {"A": "1"}}
    )
    body = op._creation_body(label=LABEL, base_url=None)
    assert body == {
        "image": "pytorch/pytorch",
        "disk": 40,
        "env": {"A": "1"},
        "cancel_unavail": True,
        "label": LABEL,
    }


def test_a_field_given_by_name_wins_over_the_same_field_in_the_dict():
    op = GpuMarketCreateInstanceOperator(
        task_id="t", offer_filters=FILTERS, instance={"image": "a/old", "disk": 40}, image="b/new"
    )
    assert op.instance == {"cancel_unavail": True, "image": "b/new", "disk": 40}


def test_cancel_unavail_defaults_to_true_and_may_be_turned_off_either_way():
    by_name = GpuMarketCreateInstanceOperator(task_id="a", offer_filters=FILTERS, image="i", cancel_unavail=False)
    in_dict = GpuMarketCreateInstanceOperator(
        task_id="b", offer_filters=FILTERS, instance={"image": "i", "cancel_unavail": False}
    )
    assert by_name.instance["cancel_unavail"] is False and in_dict.instance["cancel_unavail"] is False


def test_a_command_stands_for_onstart_and_makes_runtype_default_to_ssh_proxy():
    op = GpuMarketRunJobOperator(task_id="t", offer_filters=FILTERS, instance={"image": "i"}, command="python t.py")
    assert op.instance["runtype"] == "ssh_proxy"
    assert "python t.py" in op._creation_body(label=LABEL, base_url="http://h")["onstart"]


def test_a_command_with_an_onstart_in_the_dict_is_refused_naming_onstart():
    with pytest.raises(GpuMarketValidationError, match="^onstart: give command .* or onstart, not both"):
        GpuMarketRunJobOperator(
            task_id="t", offer_filters=FILTERS, instance={"image": "i", "onstart": "echo"}, command="echo"
        )


@pytest.mark.parametrize("instance", ['{"image": "i"}', [("image", "i")], 3])
def test_an_instance_that_is_not_a_dict_is_refused_naming_instance(instance):
    with pytest.raises(GpuMarketValidationError, match="^instance: must be a dict of the spec's creation fields"):
        GpuMarketCreateInstanceOperator(task_id="t", offer_filters=FILTERS, instance=instance)


def test_a_label_in_the_dict_is_refused_the_operator_writes_it():
    with pytest.raises(GpuMarketValidationError, match="^instance: has a 'label': the operator writes the label"):
        GpuMarketCreateInstanceOperator(task_id="t", offer_filters=FILTERS, instance={"image": "i", "label": "x"})


def test_a_key_the_spec_does_not_name_is_refused_at_parse_time_even_beside_jinja():
    """A templated typed field puts the body's check off until rendering; the names are still checked at once."""
    with pytest.raises(GpuMarketValidationError, match="^gpu_count: is not a creation field of the spec"):
        GpuMarketCreateInstanceOperator(
            task_id="t", offer_filters=FILTERS, instance={"image": "i", "disk": "{{ params.d }}", "gpu_count": 2}
        )


def test_a_bad_value_in_the_dict_is_refused_at_parse_time_naming_the_field():
    with pytest.raises(GpuMarketValidationError, match="^runtype: "):
        GpuMarketCreateInstanceOperator(
            task_id="t", offer_filters=FILTERS, instance={"image": "i", "runtype": "ssh-direct"}
        )


def test_the_dict_is_the_one_rendered_template_field_and_its_values_render():
    op = GpuMarketCreateInstanceOperator(
        task_id="t",
        offer_filters=FILTERS,
        image="{{ params.image }}",
        instance={"jupyter_dir": "/data/{{ params.run }}", "env": {"RUN": "{{ params.run }}"}},
    )
    op.render_template_fields({"params": {"image": "pytorch/pytorch", "run": "r1"}})
    assert op.instance == {
        "cancel_unavail": True,
        "image": "pytorch/pytorch",
        "jupyter_dir": "/data/r1",
        "env": {"RUN": "r1"},
    }
    op._validate()


def test_a_field_rendered_to_a_bad_value_is_refused_before_anything_is_sent():
    op = GpuMarketCreateInstanceOperator(
        task_id="t", offer_filters=FILTERS, image="i", instance={"runtype": "{{ params.runtype }}"}
    )
    op.render_template_fields({"params": {"runtype": "bogus"}})
    with pytest.raises(GpuMarketValidationError, match="^runtype: "):
        op._validate()


def test_default_args_give_creation_fields_by_name():
    from airflow.providers.common.compat.sdk import DAG

    with DAG("d", schedule=None, default_args={"image": "from/default-args", "disk": 20}):
        op = GpuMarketCreateInstanceOperator(task_id="t", offer_filters=FILTERS, disk=30)
    assert op.instance["image"] == "from/default-args" and op.instance["disk"] == 30


def test_a_mapped_task_may_expand_over_a_creation_field_by_name():
    from airflow.providers.common.compat.sdk import DAG

    with DAG("d", schedule=None):
        mapped = GpuMarketRunJobOperator.partial(task_id="t", offer_filters=FILTERS, command="echo").expand(
            image=["a/one", "b/two"]
        )
    assert mapped.expand_input.value == {"image": ["a/one", "b/two"]}


def test_the_readmes_table_of_creation_fields_is_written_from_the_api_table():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "readme_fields.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
