"""The job's own output in the task log, on the simulator with onstart really run (both modes, dag.test())."""

from __future__ import annotations

import re

import pytest

from airflow_gpumarket._compat import AirflowException
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

from .conftest import POLL, alive, first_event, task_states


def computed_line(sim) -> str:
    (instance,) = sim.state()["instances"]
    output = sim.onstart_result(instance["id"])["output"]
    return re.search(r"^computed [0-9a-f]{12}$", output, re.M).group(0)


@pytest.mark.parametrize("mode", ["sync", "deferred"])
def test_a_failed_jobs_output_and_exit_status_reach_the_task_log(example_dag, sim, task_log, mode):
    run = example_dag(f"gpm_log_exit3_{mode}").test()
    assert run.state == "failed"
    log = task_log()
    line = computed_line(sim)
    instance_id = sim.state()["instances"][0]["id"]
    assert f"[instance {instance_id}] {line}" in log or f"    {line}" in log
    assert "exit status 3" in log and "boom" in log
    assert alive(sim) == []


def test_a_failed_jobs_exception_names_its_exit_status_and_last_lines(sim):
    from .dags.gpumarket_log_dags import COMMON, COMPUTED_THEN_EXIT_3

    op = GpuMarketRunJobOperator(task_id="job", command=COMPUTED_THEN_EXIT_3, deferrable=False, **COMMON)
    with pytest.raises(AirflowException) as caught:
        op.execute({"run_id": "r", "ti": None})
    message = str(caught.value)
    assert "exit status 3" in message and computed_line(sim) in message and "boom" in message
    assert alive(sim) == []


@pytest.mark.parametrize(
    "mode",
    [
        "sync",
        "deferred",
    ],
)
def test_a_running_jobs_lines_reach_the_task_log_while_it_runs_each_once(example_dag, sim, task_log, mode):
    run = example_dag(f"gpm_log_ticks_{mode}").test()
    assert run.state == "failed"
    instance_id = sim.state()["instances"][0]["id"]
    log = task_log()
    forwarded = re.findall(rf"\[instance {instance_id}\] (tick \d)", log)
    assert forwarded == [f"tick {i}" for i in range(1, 9)]
    # Read while the job ran: the first lines are in the log before the stop was seen.
    assert log.index(f"[instance {instance_id}] tick 1") < log.index("status 'stopped'")
    assert alive(sim) == []


@pytest.mark.parametrize("mode", ["sync", "deferred"])
def test_a_short_successful_jobs_every_line_reaches_the_task_log_before_its_instance_is_destroyed(
    example_dag, sim, task_log, mode
):
    run = example_dag(f"gpm_log_short_{mode}").test()
    assert run.state == "success"
    (instance,) = sim.state()["instances"]
    first = re.search(r"^first [0-9a-f]{12}$", sim.onstart_result(instance["id"])["output"], re.M).group(0)
    shown = re.findall(rf"\[instance {instance['id']}\] (first [0-9a-f]{{12}}|second|third)\b", task_log())
    assert shown == [first, "second", "third"]
    # Compute billing ended with the job (the wrapper's stop); only storage billed until the destroy.
    assert instance["destroyed"] and instance["storage_seconds"] >= instance["compute_seconds"]
    assert alive(sim) == []


@pytest.mark.parametrize("mode", ["sync", "deferred"])
def test_rule_each_line_of_a_successful_job_appears_once_in_the_task_log(example_dag, sim, task_log, mode):
    run = example_dag(f"gpm_log_ticks_success_{mode}").test()
    assert run.state == "success", task_states(run)
    (instance,) = sim.state()["instances"]
    printed = re.findall(r"^tick-\d+-[0-9a-f]{6}$", sim.onstart_result(instance["id"])["output"], re.M)
    assert len(printed) == 34  # computed as the job ran: no test can know them beforehand
    log = task_log()
    assert {line: log.count(line) for line in printed} == dict.fromkeys(printed, 1)
    assert alive(sim) == []


@pytest.mark.parametrize("mode", ["sync", "deferred"])
def test_a_job_printing_its_instance_key_shows_it_masked(example_dag, sim, task_log, mode):
    """The trigger never holds the instance key: it masks it by digest. The autouse leak check (R3) also scans
    this test's whole output for every key the simulator handed out."""
    run = example_dag(f"gpm_log_leaky_{mode}").test()
    assert run.state == "failed"
    out = task_log()
    assert "CONTAINER_API_KEY=***" in out and "key: ***." in out
    key = next(iter(sim._market.world.instances.values())).api_key
    assert key not in out
    print(out)  # handed back to the leak check


def test_log_interval_zero_sends_no_logs_request(sim):
    op = GpuMarketRunJobOperator(
        task_id="job",
        offer_filters={"num_gpus": {"gte": 1}},
        image="img",
        poll_interval=POLL,
        command="echo x; exit 2",
        deferrable=False,
        log_interval=0,
    )
    with pytest.raises(AirflowException, match="failed"):
        op.execute({"run_id": "r", "ti": None})
    assert not [r for r in sim.requests() if "request_logs" in r["path"]]
    assert alive(sim) == []


def test_the_trigger_masks_an_instance_key_it_only_knows_by_digest(sim, monkeypatch):
    """In a real deployment the triggerer never held the key: only its digest travels in the trigger's kwargs."""
    from airflow_gpumarket import job_logs
    from airflow_gpumarket.hooks import core
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
    from airflow_gpumarket.job_script import build_job_onstart

    hook = GpuMarketHook()
    offer = hook.search_offers({"num_gpus": {"gte": 1}}, order=[["dph_total", "asc"]], limit=1)[0]
    script = build_job_onstart('echo "mine: $CONTAINER_API_KEY"; exit 1', base_url=hook.settings.base_url)
    made = hook.create_instance(offer["id"], image="img", onstart=script, runtype="ssh")
    key = made["instance_api_key"]
    monkeypatch.setattr(core, "_INSTANCE_KEYS", type(core._INSTANCE_KEYS)())  # as in another process
    event = first_event(made["new_contract"], {"key_digest": job_logs.key_digest(key)})
    assert event["status"] == "job_failed" and "mine: ***" in event["log_tail"]
    assert key not in str(event)
    hook.destroy_instance(made["new_contract"])
    assert alive(sim) == []


@pytest.mark.parametrize(("fate", "said"), [("offline", "is offline"), ("exited", "container exited unexpectedly")])
def test_the_host_daemons_last_lines_are_logged_before_the_next_offer_is_tried(sim, task_log, fate, said):
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    first, second = GpuMarketHook().search_offers({"num_gpus": {"gte": 1}}, order=[["dph_total", "asc"]], limit=2)
    sim.set_offer_fate(first["id"], fate)
    sim.set_offer_fate(second["id"], "running")
    op = GpuMarketRunJobOperator(
        task_id="job", offer_filters={"num_gpus": {"gte": 1}}, image="img", poll_interval=POLL, command="true"
    )
    assert op.execute({"run_id": "r", "ti": None})["offer_id"] == second["id"]
    failed = sim.state()["instances"][0]["id"]
    out = task_log()
    assert f"The host daemon's log of instance {failed} ends with" in out
    assert f"[instance {failed} daemon]" in out and said in out
    assert alive(sim) == []
