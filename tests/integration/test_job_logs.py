"""The job's own output in the task log, on the simulator with onstart really run (both modes, dag.test())."""

from __future__ import annotations

import re

import pytest

from airflow_gpumarket._compat import AirflowException
from airflow_gpumarket.operators.instances import GpuMarketRunJobOperator

from .conftest import POLL, alive


def computed_line(sim) -> str:
    (instance,) = sim.state()["instances"]
    output = sim.onstart_result(instance["id"])["output"]
    return re.search(r"^computed [0-9a-f]{12}$", output, re.M).group(0)


@pytest.mark.parametrize("mode", ["sync", "deferred"])
def test_a_failed_jobs_output_and_exit_status_reach_the_task_log(example_dag, sim, capsys, mode):
    run = example_dag(f"gpm_log_exit3_{mode}").test()
    assert run.state == "failed"
    log = capsys.readouterr().out
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


@pytest.mark.parametrize("mode", ["sync", "deferred"])
def test_a_running_jobs_lines_reach_the_task_log_while_it_runs_each_once(example_dag, sim, capsys, mode):
    run = example_dag(f"gpm_log_ticks_{mode}").test()
    assert run.state == "failed"
    instance_id = sim.state()["instances"][0]["id"]
    log = capsys.readouterr().out
    forwarded = re.findall(rf"\[instance {instance_id}\] (tick \d)", log)
    assert forwarded == [f"tick {i}" for i in range(1, 9)]
    # Read while the job ran: the first lines are in the log before the stop was seen.
    assert log.index(f"[instance {instance_id}] tick 1") < log.index("status 'stopped'")
    assert alive(sim) == []


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
