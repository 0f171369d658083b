"""Interruptible (bid) rentals against the simulator: outbid, fail over or wait, resume from the job's own state.

An "outbidder" thread plays the market: each time a bid instance of the test's job is running its command, it
outbids it (``MarketSimulator.outbid``), a given number of times. The job's command runs for real; it finishes at
once on the attempt the test wants it to finish on, and sleeps (until it is killed) on the others.
"""

from __future__ import annotations

import threading

import pytest

from airflow_gpumarket._compat import AirflowException

from .conftest import alive, task_states
from .test_money_safety import context, healthy_market, job  # noqa: F401 (an autouse fixture)

#: Finishes on the third run (after two preemptions), printing what the provider told it.
THIRD_RUN_FINISHES = (
    'echo "run attempt=$GPUMARKET_ATTEMPT preemptions=$GPUMARKET_PREEMPTIONS"; '
    '[ "$GPUMARKET_ATTEMPT" -ge 3 ] || sleep 60; echo "finished on attempt $GPUMARKET_ATTEMPT"'
)


class Outbidder:
    """Outbids each newly running bid instance whose command started, ``times`` times (with ``resume_after``: the
    bid wins again that many simulated seconds later).

    ``by_market=False`` outbids through the admin surface; ``by_market=True`` as the market does, by a competing
    bid for the instance's machine above its bid, which falls away again after ``resume_after``."""

    def __init__(
        self,
        sim,
        times: int,
        resume_after: float | None = None,
        marker: str = "run attempt=",
        *,
        by_market: bool = False,
    ) -> None:
        self.sim, self.times, self.resume_after, self.marker = sim, times, resume_after, marker
        self.by_market = by_market
        self.outbid: list[int] = []
        self._falls_away: dict[int, float] = {}  # offer id -> when its competing bid goes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Outbidder:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            for offer_id, at in list(self._falls_away.items()):
                if self.sim.now() >= at:
                    self.sim.set_competing_bid(offer_id, None)
                    del self._falls_away[offer_id]
            if len(self.outbid) < self.times:
                self._outbid_a_running_job()

    def _outbid_a_running_job(self) -> None:
        for instance in self.sim.alive_instances():
            if instance["id"] in self.outbid or instance.get("actual_status") != "running":
                continue
            result = self.sim.onstart_result(instance["id"]) or {}
            if not (result.get("running") and self.marker in result.get("output", "")):
                continue
            if self.by_market:
                self.sim.set_competing_bid(instance["offer_id"], instance["bid_price"] * 1.5)
                if self.resume_after is not None:
                    self._falls_away[instance["offer_id"]] = self.sim.now() + self.resume_after
            else:
                self.sim.outbid(instance["id"], self.resume_after)
            self.outbid.append(instance["id"])


#: Both ways an instance is outbid: by the admin surface, and by a competing bid that rises above the job's bid.
OUTBID_WAYS = pytest.mark.parametrize("by_market", [False, True], ids=["admin-outbid", "rising-price"])


def assert_bid_rentals_one_at_a_time(sim, n: int) -> list[dict]:
    instances = sorted(sim.state()["instances"], key=lambda i: i["created_at"])
    assert len(instances) == n, instances
    for earlier, later in zip(instances, instances[1:], strict=False):
        assert earlier["destroyed_at"] <= later["created_at"], "two rentals of one job were alive at once"
    assert len({i["machine_id"] for i in instances}) == n, "a machine that preempted the job was rented again"
    for i in instances:
        assert i["is_bid"] and i["bid_price"] < i["dph_total"], i
        assert i["compute_cost"] <= i["compute_seconds"] / 3600 * i["bid_price"] + 1e-9  # billed at the bid
    assert alive(sim) == []
    return instances


@OUTBID_WAYS
def test_rule_outbid_twice_the_job_fails_over_and_finishes_on_its_third_rental(sim, task_log, by_market):
    op = job(command=THIRD_RUN_FINISHES, interruptible=True)
    with Outbidder(sim, times=2, by_market=by_market):
        result = op.execute(context())
    assert result["job_status"] == "succeeded"
    instances = assert_bid_rentals_one_at_a_time(sim, 3)
    assert "finished on attempt 3" in sim.onstart_result(instances[-1]["id"])["output"]
    log = task_log()
    assert "run attempt=3 preemptions=2" in log
    assert "Preemption 2 of at most 3" in log
    assert "the service says 'Outbid" in log  # status_msg, shown as said, never parsed


@pytest.mark.parametrize(
    "dag_id", ["gpm_interruptible_deferred", "gpm_interruptible_decorated", "gpm_interruptible_decorated_sync"]
)
def test_rule_outbid_twice_a_dag_job_fails_over_and_finishes_on_its_third_rental(example_dag, sim, dag_id):
    with Outbidder(sim, times=2, by_market=True):
        run = example_dag(dag_id).test()
    assert run.state == "success", task_states(run)
    instances = assert_bid_rentals_one_at_a_time(sim, 3)
    assert "attempt" in sim.onstart_result(instances[-1]["id"])["output"]
    if dag_id.startswith("gpm_interruptible_decorated"):
        (ti,) = run.get_task_instances()
        assert ti.xcom_pull(task_ids="train") == {"attempt": 3, "preemptions": 2}


def test_rule_a_job_preempted_more_than_max_preemptions_fails_saying_so_and_leaves_nothing(sim):
    op = job(command=THIRD_RUN_FINISHES, interruptible=True, max_preemptions=1)
    with (
        Outbidder(sim, times=2),
        pytest.raises(AirflowException, match="preempted 2 times, more than max_preemptions=1"),
    ):
        op.execute(context())
    assert_bid_rentals_one_at_a_time(sim, 2)


def test_rule_fallback_on_demand_rents_on_demand_after_max_preemptions(sim):
    command = 'echo "run attempt=$GPUMARKET_ATTEMPT"; [ "$GPUMARKET_ATTEMPT" -ge 2 ] || sleep 60; echo finished'
    op = job(command=command, interruptible=True, max_preemptions=0, fallback_on_demand=True)
    with Outbidder(sim, times=1):
        assert op.execute(context())["job_status"] == "succeeded"
    first, second = sorted(sim.state()["instances"], key=lambda i: i["created_at"])
    assert first["is_bid"] and not second["is_bid"] and first["destroyed_at"] <= second["created_at"]
    assert alive(sim) == []


@OUTBID_WAYS
def test_rule_on_preemption_wait_resumes_on_the_same_instance_when_the_bid_wins_again(sim, tmp_path, by_market):
    marker = tmp_path / "checkpoint"  # the instance's disk survives an outbid: the job's own checkpoint
    command = (
        f'echo "run attempt=$GPUMARKET_ATTEMPT"; [ -f {marker} ] && echo resumed && exit 0; touch {marker}; sleep 60'
    )
    op = job(command=command, interruptible=True, on_preemption="wait", max_outbid_wait=600)
    # 1 s at 600x: the task sees it stopped, then back
    with Outbidder(sim, times=1, resume_after=600, by_market=by_market):
        result = op.execute(context())
    assert result["job_status"] == "succeeded" and result["preemptions"] == 1  # the task saw the outbid, and waited
    (instance,) = sim.state()["instances"]
    assert "resumed" in sim.onstart_result(instance["id"])["output"]
    assert alive(sim) == []


def test_rule_on_preemption_wait_in_deferred_mode_resumes_on_the_same_instance(example_dag, sim, monkeypatch, tmp_path):
    monkeypatch.setenv("GPUMARKET_TEST_MARKER", str(tmp_path / "checkpoint"))
    with Outbidder(sim, times=1, resume_after=600, by_market=True):
        run = example_dag("gpm_interruptible_wait_deferred").test()
    assert run.state == "success", task_states(run)
    (instance,) = sim.state()["instances"]
    assert instance["outbids"] == 1 and "resumed" in sim.onstart_result(instance["id"])["output"]
    assert alive(sim) == []


def test_rule_on_preemption_wait_fails_over_once_max_outbid_wait_runs_out(sim):
    op = job(command=THIRD_RUN_FINISHES, interruptible=True, on_preemption="wait", max_outbid_wait=1)
    with Outbidder(sim, times=2):  # never resumes by itself
        result = op.execute(context())
    assert result["job_status"] == "succeeded"
    assert_bid_rentals_one_at_a_time(sim, 3)


def test_rule_a_failed_job_on_a_bid_instance_is_a_failure_not_a_preemption(sim):
    with pytest.raises(AirflowException, match="failed: the instance is in status 'stopped'"):
        job(command="exit 4", interruptible=True).execute(context())
    assert len(sim.state()["instances"]) == 1 and alive(sim) == []


def test_the_interruptible_example_resumes_from_its_checkpoint_after_an_outbid(example_dag, sim, monkeypatch, tmp_path):
    monkeypatch.setenv("GPUMARKET_EXAMPLE_CHECKPOINT_URI", str(tmp_path))
    with Outbidder(sim, times=1, marker="epoch 1 done"):
        run = example_dag("example_gpumarket_interruptible").test()
    assert run.state == "success", task_states(run)
    outputs = [sim.onstart_result(i["id"])["output"] for i in sorted(sim.state()["instances"], key=lambda i: i["id"])]
    resumed = [o for o in outputs if "attempt 2 (after 1 preemptions) resumes at epoch" in o]
    assert resumed and "resumes at epoch 0" not in resumed[0] and "epoch 10 done" in resumed[0]
    assert alive(sim) == []
