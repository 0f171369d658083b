"""Interruptible (bid) rentals against the simulator: outbid, fail over or wait, resume from the job's own state.

An "outbidder" thread plays the market: each time a bid instance of the test's job is running its command, it
outbids it (``MarketSimulator.outbid``), a given number of times. The job's command runs for real; it finishes at
once on the attempt the test wants it to finish on, and sleeps (until it is killed) on the others.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from airflow_gpumarket._compat import AirflowException

from .conftest import alive, task_states
from .test_money_safety import context, healthy_market, job  # noqa: F401 (an autouse fixture)

#: Finishes on the third run (after two preemptions), printing what the provider told it.
THIRD_RUN_FINISHES = (
    'echo "run attempt=$GPUMARKET_ATTEMPT preemptions=$GPUMARKET_PREEMPTIONS"; '
    '[ "$GPUMARKET_ATTEMPT" -ge 3 ] || sleep 60; echo "finished on attempt $GPUMARKET_ATTEMPT"'
)

#: What a resumed job does (given its checkpoint's path): waits for the Outbidder's release, then ends.
RESUMED_ONCE_RELEASED = "until [ -f {0}.go ]; do sleep 0.05; done; echo resumed; exit 0;"


def task_read_since(sim, t: float) -> bool:
    """Whether the task has seen the simulator's state at simulated time ``t``: it read the instance twice since
    (the second read began after the change)."""
    reads = [r for r in sim.requests() if r["t"] > t and r["status"] == 200]
    return sum(r["op"] in ("get_instance", "list_instances", "list_instances_v1") for r in reads) >= 2


class MarketPlayer:
    """A thread that plays the market against the test's task while the ``with`` block runs (``_run``)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def join(self) -> None:
        """Until the player is done."""
        self._thread.join()

    def _run(self) -> None:
        raise NotImplementedError


class Outbidder(MarketPlayer):
    """Outbids each newly running bid instance whose command started, ``times`` times (with ``resume_after``: the
    bid wins again that many simulated seconds later, and not before the task has seen the stop).

    ``by_market=False`` outbids through the admin surface; ``by_market=True`` as the market does, by a competing
    bid for the instance's machine above its bid, which falls away again.

    ``release``: a file the resumed job waits for before it ends, made once the task has seen the instance run
    again. With both waits no real time decides the outcome on a slow machine: the task sees the stop and the
    return, which a fast resumed job would otherwise hide between two polls. The task has seen a state once it
    has read the instance twice since (the second read began after the change)."""

    #: How long an admin outbid holds the machine at most (simulated seconds): the clock is moved to its end once
    #: the task has seen the stop.
    HOLD = 86_400.0

    def __init__(
        self,
        sim,
        times: int,
        resume_after: float | None = None,
        marker: str = "run attempt=",
        *,
        by_market: bool = False,
        release: Path | None = None,
    ) -> None:
        self.sim, self.times, self.resume_after, self.marker = sim, times, resume_after, marker
        self.by_market, self.release = by_market, release
        self.outbid: list[int] = []
        self._outbid_at: tuple[dict, float] | None = None  # the instance waiting to resume, when it was outbid
        self._resumed: dict | None = None  # the resumed instance, until its job is released
        self._running_at: float | None = None  # when the simulator had it running again
        super().__init__()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            if self._outbid_at is not None:
                self._resume_once_seen(*self._outbid_at)
            if self._resumed is not None:
                self._release_once_seen_running(self._resumed)
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
            else:
                self.sim.outbid(instance["id"], None if self.resume_after is None else self.HOLD)
            if self.resume_after is not None:
                self._outbid_at = (instance, self.sim.now())
            self.outbid.append(instance["id"])
            return

    def _resume_once_seen(self, instance: dict, outbid_at: float) -> None:
        if not task_read_since(self.sim, outbid_at) or self.sim.now() < outbid_at + self.resume_after:
            return
        if self.by_market:
            self.sim.set_competing_bid(instance["offer_id"], None)
        else:
            self.sim.advance(outbid_at + self.HOLD - self.sim.now())  # the admin's hold ends now
        self._outbid_at, self._resumed = None, instance if self.release is not None else None

    def _release_once_seen_running(self, instance: dict) -> None:
        if self._running_at is None:
            if any(i["id"] == instance["id"] and i["actual_status"] == "running" for i in self.sim.alive_instances()):
                self._running_at = self.sim.now()
        elif task_read_since(self.sim, self._running_at):
            self.release.touch()
            self._resumed = None


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
        f'echo "run attempt=$GPUMARKET_ATTEMPT"; [ -f {marker} ] && {{ {RESUMED_ONCE_RELEASED.format(marker)} }}; '
        f"touch {marker}; echo checkpointed; sleep 60"
    )
    op = job(command=command, interruptible=True, on_preemption="wait", max_outbid_wait=600)
    release = tmp_path / "checkpoint.go"
    with Outbidder(sim, times=1, resume_after=600, marker="checkpointed", by_market=by_market, release=release):
        result = op.execute(context())
    assert result["job_status"] == "succeeded" and result["preemptions"] == 1  # the task saw the outbid, and waited
    (instance,) = sim.state()["instances"]
    assert "resumed" in sim.onstart_result(instance["id"])["output"]
    assert alive(sim) == []


def test_rule_on_preemption_wait_in_deferred_mode_resumes_on_the_same_instance(example_dag, sim, monkeypatch, tmp_path):
    monkeypatch.setenv("GPUMARKET_TEST_MARKER", str(tmp_path / "checkpoint"))
    release = tmp_path / "checkpoint.go"
    with Outbidder(sim, times=1, resume_after=600, marker="checkpointed", by_market=True, release=release):
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


class PriceRise(MarketPlayer):
    """Plays a rising competing bid against the test's one bid instance once its command runs (``steps``: the
    competing bid as a share of the instance's first bid, each set once the task has read the instance since the
    one before)."""

    def __init__(self, sim, *steps: float, marker: str = "run attempt=") -> None:
        self.sim, self.steps, self.marker = sim, list(steps), marker
        self.first_bid: float | None = None
        super().__init__()

    def _run(self) -> None:
        instance, since = None, 0.0
        while self.steps and not self._stop.wait(0.02):
            if instance is None:
                instance = next((i for i in self.sim.alive_instances() if self._runs_its_command(i)), None)
                if instance is not None:
                    self.first_bid = instance["bid_price"]
                continue
            if task_read_since(self.sim, since):
                since = self.sim.now()
                self.sim.set_competing_bid(instance["offer_id"], self.first_bid * self.steps.pop(0))

    def _runs_its_command(self, instance: dict) -> bool:
        result = self.sim.onstart_result(instance["id"]) or {}
        return instance.get("actual_status") == "running" and self.marker in result.get("output", "")


def run_to_the_end(op, ctx: dict | None = None):
    """Run a renting operator as Airflow would (in ``ctx``), each deferral through its trigger in this process."""
    import asyncio

    from airflow_gpumarket._compat import TaskDeferred

    async def first_event(trigger):
        async for event in trigger.run():
            return event.payload

    ctx, step = ctx or context(), None
    while True:
        try:
            return op.execute(ctx) if step is None else step()
        except TaskDeferred as deferred:
            event = asyncio.run(first_event(deferred.trigger))
            step = lambda d=deferred, e=event: getattr(op, d.method_name)(ctx, e)  # noqa: E731


def test_rule_hold_raises_the_bid_as_the_competing_bid_rises_and_keeps_the_machine(sim, tmp_path, task_log):
    go = tmp_path / "go"
    command = f'echo "run attempt=$GPUMARKET_ATTEMPT"; until [ -f {go} ]; do sleep 0.05; done; echo done'
    op = job(command=command, interruptible=True, bid_strategy="hold")
    with PriceRise(sim, 0.99, 1.02) as market:  # 1.02: would have outbid the first bid
        thread = threading.Thread(target=lambda: (market.join(), go.touch()), daemon=True)
        thread.start()
        result = op.execute(context())
    (instance,) = sim.state()["instances"]
    assert result["job_status"] == "succeeded" and result["preemptions"] == 0
    assert instance["outbids"] == 0 and instance["bid_price"] > market.first_bid * 1.02
    assert result["bid"] == instance["bid_price"]
    assert task_log().count("Raised the bid of instance") == 2
    assert alive(sim) == []


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_rule_hold_bids_again_after_a_preemption_and_the_job_resumes_on_the_same_machine(sim, tmp_path, deferrable):
    marker = tmp_path / "checkpoint"
    command = (
        f'echo "run attempt=$GPUMARKET_ATTEMPT"; [ -f {marker} ] && {{ echo resumed; exit 0; }}; '
        f"touch {marker}; echo checkpointed; sleep 60"
    )
    op = job(command=command, interruptible=True, bid_strategy="hold", deferrable=deferrable, log_interval=0.2)
    with PriceRise(sim, 1.3, marker="checkpointed") as market:
        result = run_to_the_end(op)
    (instance,) = sim.state()["instances"]  # no failover: the same machine, won back
    assert instance["outbids"] == 1 and instance["bid_price"] >= market.first_bid * 1.3
    assert "resumed" in sim.onstart_result(instance["id"])["output"]
    assert result["job_status"] == "succeeded" and result["preemptions"] == 1
    assert alive(sim) == []


def test_rule_hold_fails_over_when_no_bid_up_to_its_cap_wins_the_machine(sim, task_log):
    command = 'echo "run attempt=$GPUMARKET_ATTEMPT"; [ "$GPUMARKET_ATTEMPT" -ge 2 ] || sleep 60; echo finished'
    op = job(command=command, interruptible=True, bid_strategy="hold")
    with PriceRise(sim, 3.0) as market:  # above the on-demand price, the cap without max_bid
        result = op.execute(context())
    assert result["job_status"] == "succeeded" and result["preemptions"] == 1
    first, _ = assert_bid_rentals_one_at_a_time(sim, 2)
    assert first["bid_price"] == market.first_bid and "Raised the bid" not in task_log()
