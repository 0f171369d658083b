"""The job's secrets: references checked as the DAG is parsed, values read, masked and known by digest."""

from __future__ import annotations

import json

import pytest

from airflow_gpumarket import job_logs, job_secrets
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.job_secrets import Reference
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator


def test_references_name_a_variable_or_a_connections_field():
    found = job_secrets.check(
        {"A": "variable:hf_token", "B": "connection:wandb", "C": "connection:reg:login", "D": "connection:odd:id"}
    )
    assert found == {
        "A": Reference("variable", "hf_token"),
        "B": Reference("connection", "wandb"),
        "C": Reference("connection", "reg", "login"),
        "D": Reference("connection", "odd:id"),  # no known field after the colon: a conn_id with a colon
    }


@pytest.mark.parametrize(
    ("secrets", "field", "words"),
    [
        ("variable:x", "secrets", "must be a dict"),
        ({"1BAD": "variable:x"}, "secrets", "not an environment variable name"),
        ({"GPUMARKET_X": "variable:x"}, "secrets['GPUMARKET_X']", "the provider's own"),
        ({"TOKEN": "hf_actual_value_pasted"}, "secrets['TOKEN']", "never goes in a DAG file"),
        ({"TOKEN": "variable:"}, "secrets['TOKEN']", '"variable:<key>"'),
        ({"PLAIN": "variable:x"}, "secrets['PLAIN']", "also set in env"),
    ],
)
def test_a_bad_reference_is_refused_when_the_dag_is_parsed(secrets, field, words):
    with pytest.raises(GpuMarketValidationError) as caught:
        GpuMarketRunJobOperator(
            task_id="job", offer_filters={}, image="img", command="true", env={"PLAIN": "x"}, secrets=secrets
        )
    assert caught.value.field == field and words in str(caught.value)


def test_a_pasted_value_is_not_echoed_in_the_error():
    with pytest.raises(GpuMarketValidationError) as caught:
        job_secrets.check({"TOKEN": "hf_actual_value_pasted"})
    assert "hf_actual_value_pasted" not in str(caught.value) and "not shown" in str(caught.value)


def test_registry_conn_id_and_image_login_together_are_refused():
    with pytest.raises(GpuMarketValidationError, match="registry_conn_id"):
        GpuMarketRunJobOperator(
            task_id="job",
            offer_filters={},
            image="img",
            command="true",
            image_login="-u a -p b c.io",
            registry_conn_id="reg",
        )


def test_values_are_read_through_airflow_and_masked_by_value(monkeypatch):
    masked = []
    monkeypatch.setattr("airflow_gpumarket._compat.mask_secret", masked.append, raising=False)
    monkeypatch.setenv("AIRFLOW_VAR_PLAIN_NAME", "value-of-a-variable")
    conn = {"conn_type": "generic", "login": "robot", "password": "pa55word-of-conn", "host": "r.io"}
    monkeypatch.setenv("AIRFLOW_CONN_REG", json.dumps(conn))
    values = job_secrets.read_values(job_secrets.check({"X": "variable:plain_name", "Y": "connection:reg"}))
    assert values == {"X": "value-of-a-variable", "Y": "pa55word-of-conn"}
    assert job_secrets.registry_login("reg") == "-u robot -p pa55word-of-conn r.io"
    assert masked == ["value-of-a-variable", "pa55word-of-conn", "pa55word-of-conn"]


@pytest.mark.parametrize(
    ("secrets", "words"),
    [
        ({"X": "variable:nowhere"}, "Variable 'nowhere' is not set"),
        ({"X": "connection:nowhere"}, "connection 'nowhere' does not exist"),
        ({"X": "connection:reg:schema"}, "connection 'reg' has no schema"),
        ({"X": "variable:short"}, "too short"),
    ],
)
def test_a_secret_that_cannot_be_read_names_its_variable_and_the_fix(monkeypatch, secrets, words):
    monkeypatch.setenv("AIRFLOW_VAR_SHORT", "abc")
    monkeypatch.setenv("AIRFLOW_CONN_REG", json.dumps({"conn_type": "generic", "password": "abcdefgh"}))
    with pytest.raises(GpuMarketValidationError) as caught:
        job_secrets.read_values(job_secrets.check(secrets))
    assert words in str(caught.value) and "abc" not in str(caught.value).split("holds")[-1][:10]


def test_a_log_masks_secrets_known_only_by_salted_digest():
    values = ["hf_abcDEF123.x/y", "p@ss!word"]
    digests = job_secrets.digests(values)
    assert not any(v in d for v in values for d in digests)
    assert job_secrets.digests(values[:1]) != digests[:1]  # salted: the same value never gives the same digest
    redact = job_logs.Redactor((), digests)
    text = "t hf_abcDEF123.x/y\nHF_TOKEN=hf_abcDEF123.x/y\nhttps://u:p@ss!word@host\nnot p@ss!wor"
    assert redact(text) == "t ***\nHF_TOKEN=***\nhttps://u:***@host\nnot p@ss!wor"


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("WANDB_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("DB_PASSWORD", True),
        ("TOKENIZERS_PARALLELISM", False),
        ("BASE_MODEL", False),
        ("-p 8000:8000", False),
    ],
)
def test_rule_an_env_name_names_a_secret_when_a_sensitive_word_is_a_whole_part_of_it(name, secret):
    assert job_secrets.looks_secret(name) is secret
