"""Secrets from Airflow reach the job's environment and nowhere else a person or a downstream task can see."""

from __future__ import annotations

import json

import pytest

from .conftest import _stored_texts, alive, first_event, task_states

TOKEN = "hf_s3cretT0kenValue4f7b9c2d8e1a"
REGISTRY_PASSWORD = "rEg1stry-pa55word-9d3c7e"


@pytest.fixture
def airflow_secrets(monkeypatch):
    monkeypatch.setenv("AIRFLOW_VAR_GPM_HF_TOKEN", TOKEN)
    conn = {"conn_type": "generic", "login": "robot", "password": REGISTRY_PASSWORD, "host": "registry.example.com"}
    monkeypatch.setenv("AIRFLOW_CONN_GPM_REGISTRY", json.dumps(conn))


@pytest.mark.parametrize("mode", ["sync", "deferred"])
def test_secrets_reach_the_job_and_are_masked_everywhere_else(example_dag, sim, task_log, airflow_secrets, mode):
    run = example_dag(f"gpm_secrets_{mode}").test()
    assert run.state == "failed", task_states(run)  # the job exits 4 after printing
    (created,) = [i for i in sim._market.world.instances.values()]
    assert created.config["env"]["HF_TOKEN"] == TOKEN
    assert created.config["env"]["REGISTRY_PASS"] == REGISTRY_PASSWORD
    assert created.config["env"]["PLAIN"] == "not-a-secret"
    log = task_log()
    assert f"token length {len(TOKEN)}" in log  # the job had the value
    assert "token=***" in log and "REGISTRY_PASS=***" in log
    seen = [log, *_stored_texts()]
    assert not [text for text in seen if TOKEN in text or REGISTRY_PASSWORD in text]
    assert alive(sim) == []


@pytest.mark.parametrize("mode", ["sync", "deferred"])
def test_rule_a_token_put_in_env_is_masked_by_value_and_said_to_belong_in_secrets(
    example_dag, sim, task_log, airflow_secrets, mode
):
    run = example_dag(f"gpm_env_secret_{mode}").test()
    assert run.state == "success", task_states(run)
    log = task_log()
    assert "token=***" in log and "parallel=false" in log  # a setting named like TOKENIZERS_* is not a secret
    assert "env sets HF_TOKEN, named like a secret" in log and "secrets=" in log
    assert not [text for text in [log, *_stored_texts()] if TOKEN in text]
    assert alive(sim) == []


def test_the_registry_connection_logs_the_service_in(example_dag, sim, airflow_secrets):
    example_dag("gpm_secrets_sync").test()
    (create,) = [r for r in sim.requests() if r["op"] == "create_instance"]
    assert create["body"]["image_login"] == f"-u robot -p {REGISTRY_PASSWORD} registry.example.com"
    assert create["status"] == 200
    assert alive(sim) == []


def test_a_missing_variable_fails_before_anything_is_rented(example_dag, sim, task_log, monkeypatch):
    conn = {"conn_type": "generic", "login": "robot", "password": REGISTRY_PASSWORD, "host": "registry.example.com"}
    monkeypatch.setenv("AIRFLOW_CONN_GPM_REGISTRY", json.dumps(conn))
    run = example_dag("gpm_secrets_sync").test()
    assert run.state == "failed"
    log = task_log()
    assert "secrets['HF_TOKEN']" in log and "Variable 'gpm_hf_token' is not set" in log
    assert sim.state()["instances"] == []


def test_the_secrets_example_runs_with_its_variable_and_registry(example_dag, sim, monkeypatch):
    monkeypatch.setenv("AIRFLOW_VAR_HF_TOKEN", TOKEN)
    conn = {"conn_type": "generic", "login": "robot", "password": REGISTRY_PASSWORD, "host": "ghcr.io"}
    monkeypatch.setenv("AIRFLOW_CONN_PRIVATE_REGISTRY", json.dumps(conn))
    run = example_dag("example_gpumarket_secrets").test()
    assert run.state == "success", task_states(run)
    (instance,) = sim.state()["instances"]
    assert "downloading our-team/base-7b with a token" in sim.onstart_result(instance["id"])["output"]
    assert alive(sim) == []


def test_the_trigger_masks_a_secret_it_only_knows_by_salted_digest(sim):
    """The triggerer never holds the value: a deferred task's rental carries only its salted digest."""
    from airflow_gpumarket import job_secrets
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
    from airflow_gpumarket.job_script import build_job_onstart

    hook = GpuMarketHook()
    offer = hook.search_offers({"num_gpus": {"gte": 1}}, order=[["dph_total", "asc"]], limit=1)[0]
    script = build_job_onstart('echo "got $HF_TOKEN."; exit 1', base_url=hook.settings.base_url)
    made = hook.create_instance(offer["id"], image="img", onstart=script, runtype="ssh", env={"HF_TOKEN": TOKEN})
    # As it travels in the trigger's kwargs: JSON, so a list.
    event = first_event(made["new_contract"], {"secret_digests": list(job_secrets.digests([TOKEN]))})
    assert event["status"] == "job_failed" and "got ***." in event["log_tail"]
    assert TOKEN not in str(event)
    hook.destroy_instance(made["new_contract"])
    assert alive(sim) == []
