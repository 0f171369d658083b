"""Every example DAG runs end to end with dag.test() against the simulator, and leaves nothing alive."""

from __future__ import annotations

import shutil

import pytest

from airflow_gpumarket import lifecycle

from .conftest import alive, offers_rented_twice_at_once, rented_offers, task_states


def test_training_pipeline_in_explicit_steps(example_dag, sim):
    run = example_dag("example_gpumarket_training").test()
    assert run.state == "success", task_states(run)
    assert alive(sim) == []
    (instance,) = sim.state()["instances"]
    output = sim.onstart_result(instance["id"])
    assert output["exit_code"] == 0 and "model saved" in output["output"]
    assert lifecycle.parse_label(instance["label"]) is not None


def test_batch_job_mapped_over_inputs(example_dag, sim):
    run = example_dag("example_gpumarket_batch").test()
    assert run.state == "success", task_states(run)
    assert alive(sim) == []
    offers = rented_offers(sim)
    assert len(offers) == 3 and offers_rented_twice_at_once(sim) == []  # three rentals, never two at once
    outputs = [sim.onstart_result(i["id"])["output"] for i in sim.state()["instances"]]
    assert sorted(line for out in outputs for line in out.splitlines() if line.startswith("embedding")) == [
        "embedding shard-000",
        "embedding shard-001",
        "embedding shard-002",
    ]


def test_reaper_destroys_expired_leases_only(example_dag, sim):
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    hook = GpuMarketHook()
    offers = hook.search_offers({"rentable": {"eq": True}}, order=[["dph_total", "asc"]], limit=3)
    expired = lifecycle.make_label(lifecycle.rental_key("d", "r", "t", -1), 1_000_000_000)
    leased = lifecycle.make_label(lifecycle.rental_key("d", "r", "u", -1), 4_000_000_000)
    made = {}
    for offer, label in zip(offers, [expired, leased, "made-by-hand"], strict=True):
        made[label] = hook.create_instance(offer["id"], image="img", label=label)["new_contract"]

    run = example_dag("example_gpumarket_reaper").test()
    assert run.state == "success", task_states(run)
    still_alive = {i["id"] for i in alive(sim)}
    assert made[expired] not in still_alive
    assert {made[leased], made["made-by-hand"]} <= still_alive
    for instance_id in still_alive:
        hook.destroy_instance(instance_id)
    # The end of what it destroyed, for the GPU rentals page: the label names the DAG whose spend it counts toward.
    from airflow_gpumarket.ui import records

    from .test_gpu_rentals_page import xcoms_of

    end = xcoms_of(run, "reap_orphans")[records.end_key(made[expired])]
    assert end["end_only"] and end["label"] == expired and end["ended_by"] == "reap_orphans"


def test_reaper_finds_an_expired_lease_beyond_the_first_page_of_the_live_list(example_dag, sim, monkeypatch):
    from airflow_gpumarket import api
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    monkeypatch.setattr(api.listing, "LIST_PAGE_LIMIT", 2)  # five instances make three pages of the v1 list
    hook = GpuMarketHook()
    offers = hook.search_offers({"rentable": {"eq": True}}, order=[["dph_total", "asc"]], limit=5)
    labels = [f"made-by-hand-{n}" for n in range(4)]
    labels.append(lifecycle.make_label(lifecycle.rental_key("d", "r", "late", -1), 1_000_000_000))
    made = [
        hook.create_instance(o["id"], image="img", label=lb)["new_contract"]
        for o, lb in zip(offers, labels, strict=True)
    ]
    assert max(made) == made[-1]  # the expired one is on the last page

    run = example_dag("example_gpumarket_reaper").test()
    assert run.state == "success", task_states(run)
    still_alive = {i["id"] for i in alive(sim)}
    assert made[-1] not in still_alive and set(made[:-1]) <= still_alive
    pages = [r for r in sim.state()["requests"] if r["path"] == api.PATH_INSTANCES_V1]
    assert len(pages) >= 3
    for instance_id in still_alive:
        hook.destroy_instance(instance_id)


def test_serverless_rollout_creates_the_endpoint_and_retires_the_previous_deployment(example_dag, sim):
    run = example_dag("example_gpumarket_serverless").test()
    assert run.state == "success", task_states(run)
    state = sim.state()
    assert any(e.get("endpoint_name") == "llm-serve-v3" for e in state["endpoints"])
    deleted = {(d["name"], d["tag"]): d["deleted"] for d in state["deployments"]}
    assert deleted[("llm-serve", "v1")] is True and deleted[("llm-serve", "v2")] is False


def test_host_volume_listing_across_several_machines(example_dag, sim):
    run = example_dag("example_gpumarket_volume_listing").test()
    assert run.state == "success", task_states(run)
    xcom = run.get_task_instance("list_volumes").xcom_pull(task_ids="list_volumes")
    assert [r["machine_id"] for r in xcom["results"]] == [9001, 9002]


def test_host_volume_listing_on_an_offline_machine_fails_saying_so(example_dag, sim):
    run = example_dag("example_gpumarket_volume_listing").test(run_conf={"machines": [9003]})
    assert run.state == "failed"


def test_daily_price_increase_check_alerts_when_increases_are_pending(example_dag, sim):
    assert sim.state()["pending_price_increases"], "the simulator's default world has pending increases"
    assert example_dag("example_gpumarket_price_increases").test().state == "failed"


def test_daily_price_increase_check_is_quiet_when_none_concern_our_contracts(sim):
    from airflow_gpumarket.sensors.price_increases import GpuMarketPendingPriceIncreaseSensor

    sensor = GpuMarketPendingPriceIncreaseSensor(task_id="t", mode="alert", check_once=True, contract_ids=[1])
    assert sensor.poke({}).xcom_value == []


def test_price_increase_sensor_warns_when_the_server_truncates_the_list(sim, task_log):
    from airflow_gpumarket.sensors.price_increases import GpuMarketPendingPriceIncreaseSensor

    sim.set_list_limit(1)
    result = GpuMarketPendingPriceIncreaseSensor(task_id="t", deferrable=False).poke({})
    assert len(result.xcom_value) == 1
    assert "truncated the pending price increase list" in task_log()


def test_backup_codes_regenerated_through_the_hook_are_never_logged(sim):
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    tfa = sim.state()["tfa"]
    result = GpuMarketHook().regenerate_backup_codes(tfa_method="totp", code=tfa["totp_code"])
    assert len(result["backup_codes"]) == 10
    assert result["backup_codes"] == sim.state()["tfa"]["backup_codes"]  # scanned after the test (R3)


def test_r3_scan_finds_a_key_planted_in_real_task_output(example_dag, sim, task_log):
    from .conftest import leaks

    run = example_dag("example_gpumarket_batch").test()
    output = task_log()
    assert "embed_shard" in output  # the scan reads the real task log stream
    keys = {inst.api_key for inst in sim._market.world.instances.values()}
    assert len(keys) == 3 and run.state == "success"
    assert leaks([output], keys | {sim.api_key}, account_key=sim.api_key) == []
    planted = output + f"oops {sorted(keys)[0]}"
    assert leaks([planted], keys | {sim.api_key}, account_key=sim.api_key) == ["instance key or backup code"]


def test_arguments_from_upstream_tasks_and_expand_are_accepted_and_used(example_dag, sim):
    """XComArgs (a task's return value, ``.output``, an item of it) and expanded values pass parse-time checks
    and reach the request once resolved."""
    run = example_dag("gpm_xcom_arguments").test()
    assert run.state == "success", task_states(run)
    disks = sorted(i["disk_space"] for i in sim.state()["instances"] if i["disk_space"] in (10, 12, 16))
    assert disks == [10, 12, 16]  # the job's disk from an upstream task, the mapped tasks' from expand()
    assert len(sim.state()["instances"]) == 4  # and the create/destroy pair, on the offer read from search.output
    assert alive(sim) == []


def test_a_bad_value_from_an_upstream_task_fails_before_anything_is_rented(example_dag, sim):
    run = example_dag("gpm_xcom_bad_argument").test()
    assert run.state == "failed"
    assert sim.state()["instances"] == []


def test_taskflow_training_pipeline_returns_its_metrics_to_the_next_task(example_dag, sim, task_log):
    run = example_dag("example_gpumarket_taskflow").test()
    assert run.state == "success", task_states(run)
    assert alive(sim) == []
    assert len(sim.state()["instances"]) == 1
    out = task_log()
    assert "s3://example-bucket/datasets/mnist-2026-01/model-e3.pt: validation loss 0.1225 -> promote" in out


def test_a_fan_out_whose_jobs_fit_its_budget_reserves_each_and_settles_it_under_its_team(example_dag, sim, monkeypatch):
    import json

    from airflow import settings

    from airflow_gpumarket import ledger

    monkeypatch.setenv("AIRFLOW_VAR_GPUMARKET_BUDGETS", json.dumps({"example_gpumarket_budgets": {"run": 0.35}}))
    run = example_dag("example_gpumarket_budgets").test()
    assert set(task_states(run).values()) == {"success"}
    entries = ledger.entries(settings.engine, since=0)
    # Each reserves max_cost and one poll; each settles at what it cost before the next one reserves.
    assert len(entries) == 4 and {e["team"] for e in entries} == {"vision"}
    assert all(e["reserved"] <= 0.1002 and e["cost"] is not None and e["cost"] < e["reserved"] for e in entries)
    assert alive(sim) == []


def test_a_fan_out_whose_jobs_exceed_its_budget_fails_each_before_renting(example_dag, sim, monkeypatch):
    import json

    monkeypatch.setenv("AIRFLOW_VAR_GPUMARKET_BUDGETS", json.dumps({"example_gpumarket_budgets": {"run": 0.05}}))
    run = example_dag("example_gpumarket_budgets").test()
    assert set(task_states(run).values()) == {"failed"}
    assert sim.state()["instances"] == []


# --- The spend report and the credit watch ------------------------------------------------------------------------
DAY = 86400
SIM_CREDIT = 100.0  # what the simulator's account holds (GET /api/v0/users/current)


def test_spend_report_example_alerts_when_the_credit_is_at_or_below_the_threshold(example_dag, sim, task_log):
    run = example_dag("example_gpumarket_spend_report").test(
        run_conf={"credit_threshold": SIM_CREDIT + 50, "runway_days": None}
    )
    states = task_states(run)
    assert states["watch_credit[-1]"] == "success", states
    figures = run.get_task_instance("watch_credit").xcom_pull(task_ids="watch_credit")
    assert figures["available"] == SIM_CREDIT and figures["low"] is True
    log = task_log()
    assert f"GPU Market credit is low: ${SIM_CREDIT} left" in log  # the example's notifier, on the sensor's success
    assert states["spend_report[-1]"] == "success", states


def test_spend_report_example_watch_ends_skipped_on_a_day_the_credit_stays_healthy(example_dag, sim, task_log):
    dag = example_dag("example_gpumarket_spend_report")
    dag.get_task("watch_credit").timeout = 0  # the day is over at its first read
    run = dag.test(run_conf={"runway_days": None})
    assert task_states(run)["watch_credit[-1]"] == "skipped"
    log = task_log()
    assert f"The account's credit is ${SIM_CREDIT:.2f}: above the threshold of $25.00" in log
    assert "GPU Market credit is low" not in log


def test_spend_report_example_attributes_charges_to_the_dag_that_rented_and_flags_the_rest(example_dag, sim):
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    rented = example_dag("example_gpumarket_run_job").test()
    assert rented.state == "success", task_states(rented)
    (recorded,) = [i["id"] for i in sim.state()["instances"]]
    hook = GpuMarketHook()
    (offer,) = hook.search_offers({"rentable": {"eq": True}}, order=[["dph_total", "asc"]], limit=1)
    by_hand = hook.create_instance(offer["id"], image="img", label="made-by-hand")["new_contract"]
    sim.advance(3600)
    hook.destroy_instance(by_hand)

    dag = example_dag("example_gpumarket_spend_report")
    report = dag.get_task("spend_report")
    report.window_start, report.window_end = sim.now() - DAY, sim.now() + 60  # the simulator's clock, not ours
    dag.get_task("watch_credit").timeout = 0
    run = dag.test(run_conf={"runway_days": None})
    assert task_states(run)["spend_report[-1]"] == "success", task_states(run)
    result = run.get_task_instance("spend_report").xcom_pull(task_ids="spend_report")
    assert result["per_dag"]["example_gpumarket_run_job"] > 0
    assert result["per_team"]["(no team)"] == result["per_dag"]["example_gpumarket_run_job"]
    leaked = [leak["instance_id"] for leak in result["leaked"]]
    assert by_hand in leaked and recorded not in leaked
    charged = hook.charges(report.window_start, report.window_end - 1)
    assert result["charges"] == len(charged)
    assert abs(result["total"] - sum(c.amount for c in charged)) < 0.0001
    assert alive(sim) == []


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the service's certificate")
def test_a_service_for_a_task_group_serves_every_shard_then_the_teardown_destroys_it(example_dag, sim, task_log):
    run = example_dag("example_gpumarket_service").test()
    assert run.state == "success", task_states(run)
    assert alive(sim) == []
    (instance,) = sim.state()["instances"]
    states = task_states(run)
    assert [states[f"embed[{i}]"] for i in range(3)] == ["success"] * 3 and states["stop[-1]"] == "success"
    gathered = next(ti for ti in run.get_task_instances() if ti.task_id == "gather").xcom_pull(task_ids="gather")
    assert gathered == 1 + 2 + 3 + 4 + 5 + 1  # each text's length, summed over the shards
    from airflow.utils.session import create_session

    from airflow_gpumarket.ui import sources

    with create_session() as session:  # the GPU rentals page lists the tasks that used the service
        users = sources.users(session, [instance["id"]])
    assert sorted(users[instance["id"]]) == [(run.dag_id, run.run_id, "embed", i) for i in range(3)]
