"""Durable data against the simulator: every instance has a disk of its own, and data moves only by the service.

A checkpoint survives a preemption by ``copy_direct`` from the paused instance, a task's end and its retries by
``checkpoint_uri`` in a cloud integration (the simulator's buckets are folders); inputs arrive before the job
starts and outputs leave before the destroy. No test passes through a shared folder: the jobs write only below
``GPUMARKET_INSTANCE_ROOT``.
"""

from __future__ import annotations

import re
import time

import pytest

from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
from airflow_gpumarket.operators.failures import GpuMarketStagingFailed

from .conftest import AIRFLOW_2, alive, task_states
from .test_interruptible import MarketPlayer, Outbidder, run_to_the_end
from .test_money_safety import context, healthy_market, job  # noqa: F401 (an autouse fixture)

CKPT = "/workspace/ckpt"
INTEGRATION = "training-data"  # id 1 in the simulator's default world
#: Ten epochs; the checkpoint (written whole, then renamed) after each; a run starts from the last one.
EPOCHS = (
    'e=$(cat "$GPUMARKET_CHECKPOINT_DIR/epoch" 2>/dev/null || echo 0); '
    'echo "attempt $GPUMARKET_ATTEMPT resumes at epoch $e from [$GPUMARKET_RESUMED_FROM]"; '
    'while [ "$e" -lt 10 ]; do sleep 0.05; e=$((e+1)); echo "$e" > "$GPUMARKET_CHECKPOINT_DIR/epoch.tmp"; '
    'mv "$GPUMARKET_CHECKPOINT_DIR/epoch.tmp" "$GPUMARKET_CHECKPOINT_DIR/epoch"; '
    # the wrapper's manifest names the checkpoint (within a second): only then is the epoch announced as kept
    'until grep -qx epoch "$GPUMARKET_CHECKPOINT_DIR/.gpumarket-manifest"; do sleep 0.05; done; '
    'echo "epoch $e done"; done'
)


class CheckpointOutbidder(Outbidder):
    """Outbids each running job once its disk holds a checkpoint newer than the one it started from.

    It reads the instance's disk (``checkpoint_dir`` and the wrapper's manifest naming the file), so nothing depends on
    how fast the job runs.
    """

    def __init__(self, sim, times: int, checkpoint_dir: str) -> None:
        super().__init__(sim, times)
        self.checkpoint_dir = checkpoint_dir
        self.started_from: dict[int, int] = {}

    def _epoch(self, instance_id: int, name: str) -> int | None:
        try:
            return int(self.sim.read_disk_file(instance_id, f"{self.checkpoint_dir}/{name}").split()[0])
        except Exception:  # noqa: BLE001 - not there yet
            return None

    def _outbid_a_running_job(self) -> None:
        for instance in self.sim.alive_instances():
            iid = instance["id"]
            if iid in self.outbid or instance.get("actual_status") != "running":
                continue
            output = (self.sim.onstart_result(iid) or {}).get("output", "")
            started = re.search(r"resumes at epoch (\d+)", output)
            if started is None:
                continue
            try:
                manifest = self.sim.read_disk_file(iid, f"{self.checkpoint_dir}/.gpumarket-manifest").decode()
            except Exception:  # noqa: BLE001 - not written yet
                continue
            epoch = self._epoch(iid, "epoch")
            if "epoch" not in manifest.split() or epoch is None or epoch <= int(started.group(1)):
                continue
            self.sim.outbid(iid)
            self.outbid.append(iid)
            return


#: The example DAGs' runs take most of this module's time; on 2.11 the rules above run, the examples on 3.3 only.
EXAMPLE_RUN = pytest.mark.skipif(AIRFLOW_2, reason="the examples' durable data run on Airflow 3.3; the rules on both")


def outputs_in_order(sim) -> list[str]:
    instances = sorted(sim.state()["instances"], key=lambda i: i["id"])
    return [(sim.onstart_result(i["id"]) or {}).get("output", "") for i in instances]


def epochs_done(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"^epoch (\d+) done$", text, re.MULTILINE)]


def test_rule_an_interruptible_job_outbid_twice_resumes_from_its_checkpoint_on_its_third_machine(sim):
    op = job(command=EPOCHS, interruptible=True, checkpoint_dir=CKPT, max_runtime=600)
    with Outbidder(sim, times=2, marker=" done"):
        result = op.execute(context())
    assert result["job_status"] == "succeeded"
    first, second, third = outputs_in_order(sim)
    assert "resumes at epoch 0 from []" in first
    ids = sorted(i["id"] for i in sim.state()["instances"])
    assert f"from [{ids[0]}]" in second and f"gpumarket: restored the checkpoint from instance {ids[0]}" in second
    assert f"from [{ids[1]}]" in third
    done = epochs_done(first) + epochs_done(second) + epochs_done(third)
    # An outbid may land between an epoch's checkpoint and its "done" line: the next rental resumes after it.
    starts = [int(re.search(r"resumes at epoch (\d+)", o).group(1)) for o in (first, second, third)]
    checkpointed = {n for start in starts for n in range(1, start + 1)}
    assert set(done) | checkpointed == set(range(1, 11)), (done, starts)
    assert len(done) - len(set(done)) <= 2, f"more than one epoch lost per preemption: {done}"
    assert alive(sim) == []


def test_rule_each_instance_sees_only_its_own_disk(sim):
    op = job(command='w="$GPUMARKET_INSTANCE_ROOT/workspace"; mkdir -p "$w" && echo mine > "$w/a"; ls "$w"')
    op.execute(context(run_id="one"))
    other = job(command='ls "$GPUMARKET_INSTANCE_ROOT/workspace" 2>&1 || echo "no workspace"')
    other.execute(context(run_id="two"))
    first, second = outputs_in_order(sim)
    assert "\na\n" in first and "no workspace" in second
    assert alive(sim) == []


def test_rule_the_paused_source_is_destroyed_only_after_its_checkpoint_reached_the_next_instance(sim):
    op = job(command=EPOCHS, interruptible=True, checkpoint_dir=CKPT, max_runtime=600)
    with Outbidder(sim, times=1, marker=" done"):
        op.execute(context())
    source, successor = sorted(sim.state()["instances"], key=lambda i: i["id"])
    (restore,) = [c for c in sim.copies() if c["kind"] == "copy_direct"]
    assert restore["state"] == "finished"
    assert source["destroyed_at"] >= restore["ended_at"]
    assert successor["created_at"] < source["destroyed_at"]
    assert alive(sim) == []


def test_rule_a_failed_checkpoint_copy_under_fail_fails_the_task_saying_so_and_leaves_nothing(sim):
    sim.set_copy_faults([{"times": 5, "after_fraction": 0.0, "kind": "copy_direct"}])
    op = job(command=EPOCHS, interruptible=True, checkpoint_dir=CKPT, on_restore_failure="fail", staging_timeout=3)
    with Outbidder(sim, times=1, marker=" done"), pytest.raises(GpuMarketStagingFailed, match="fail"):
        op.execute(context())
    assert alive(sim) == []


def test_rule_a_failed_checkpoint_copy_under_restart_starts_from_scratch_and_says_so(sim):
    sim.set_copy_faults([{"times": 1, "after_fraction": 0.0, "kind": "copy_direct"}])
    op = job(command=EPOCHS, interruptible=True, checkpoint_dir=CKPT, staging_timeout=60, max_runtime=600)
    with Outbidder(sim, times=1, marker=" done"):
        assert op.execute(context())["job_status"] == "succeeded"
    _, second = outputs_in_order(sim)
    assert "the job starts from scratch (on_restore_failure='restart')" in second
    assert "resumes at epoch 0 from []" in second
    assert alive(sim) == []


RENTAL_TYPES = pytest.mark.parametrize(
    ("interruptible", "deferrable"),
    [(False, False), (False, True), (True, False), (True, True)],
    ids=["on-demand-sync", "on-demand-deferred", "interruptible-sync", "interruptible-deferred"],
)


PARTIAL = "ckpt/partial"


def job_restoring_a_partial_checkpoint(sim, **kwargs):
    """A job under on_restore_failure="fail" whose checkpoint_uri holds a manifest naming a file that never arrived
    there (a save cut short): its wrapper gives up staging."""
    sim.put_bucket_file(1, f"{PARTIAL}/epoch", b"4\n")
    sim.put_bucket_file(1, f"{PARTIAL}/.gpumarket-manifest", b"epoch\nweights\n")
    return job(
        command=EPOCHS,
        checkpoint_dir=CKPT,
        checkpoint_uri=PARTIAL,
        cloud_integration=INTEGRATION,
        on_restore_failure="fail",
        **kwargs,
    )


@RENTAL_TYPES
def test_rule_a_wrapper_that_gives_up_staging_fails_the_task_and_never_rents_again(sim, interruptible, deferrable):
    op = job_restoring_a_partial_checkpoint(sim, interruptible=interruptible, deferrable=deferrable)
    with pytest.raises(GpuMarketStagingFailed, match="did not start"):
        run_to_the_end(op)
    (instance,) = sim.state()["instances"]  # one rental: a wrapper's exit 75 is neither a preemption nor a host
    output = (sim.onstart_result(instance["id"]) or {}).get("output", "")
    assert "the job does not start" in output and "resumes at epoch" not in output
    saves = [c for c in sim.copies() if c["direction"] == "Instance To Cloud" and PARTIAL in c["dst"]]
    assert saves == []  # a job that never started has no checkpoint to save over the one there
    assert alive(sim) == []


class ExitedOnceStopped(MarketPlayer):
    """Shows an instance its job wrapper stopped as "exited", as the live service is reported to show it."""

    def __init__(self, sim) -> None:
        self.sim = sim
        super().__init__()

    def _run(self) -> None:
        shown: set[int] = set()
        while not self._stop.wait(0.005):
            for instance in self.sim.alive_instances():
                iid = instance["id"]
                output = (self.sim.onstart_result(iid) or {}).get("output", "")
                if iid not in shown and instance["actual_status"] == "stopped" and "job exited with status" in output:
                    self.sim.force_status(iid, "exited")
                    shown.add(iid)


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_rule_a_wrapper_that_gave_up_staging_and_shows_exited_is_not_a_failed_host(sim, deferrable):
    op = job_restoring_a_partial_checkpoint(sim, deferrable=deferrable)
    with ExitedOnceStopped(sim), pytest.raises(GpuMarketStagingFailed, match="did not start"):
        run_to_the_end(op)
    (instance,) = sim.state()["instances"]
    assert instance["actual_status"] == "exited"
    assert alive(sim) == []


#: The simulator's clock in these tests (see conftest): service seconds per real second.
SPEED = 600
#: A test's staging_timeout: the wrapper's own bound is 30 s more, 21 000 service seconds at this clock.
BOUND = 5


@RENTAL_TYPES
def test_rule_a_gate_lost_to_a_storage_outage_fails_the_task_before_the_wrapper_gives_up(
    sim, interruptible, deferrable
):
    sim.put_bucket_file(1, "datasets/d/train.csv", b"1,2\n")
    # the outage begins after the input's copy: the gate's way out to the cloud fails, and every retry of it
    sim.set_copy_faults([{"times": 9, "after_fraction": 0.0, "kind": "rclone", "direction": "Instance To Cloud"}])
    op = job(
        command="echo ran",
        cloud_integration=INTEGRATION,
        inputs={"/data": "datasets/d"},
        staging_timeout=BOUND,
        interruptible=interruptible,
        deferrable=deferrable,
    )
    with pytest.raises(GpuMarketStagingFailed, match="gate"):
        run_to_the_end(op)
    (instance,) = sim.state()["instances"]
    output = (sim.onstart_result(instance["id"]) or {}).get("output", "")
    assert "did not arrive" not in output and "\nran\n" not in output  # destroyed while the wrapper still waited
    assert alive(sim) == []


def test_rule_a_copy_failure_worded_without_fail_or_error_fails_at_once(sim):
    sim.put_bucket_file(1, "datasets/d/train.csv", b"1,2\n")
    aborted = "Cloud Copy Operation Aborted: the bucket is unreachable"
    sim.set_copy_faults([{"times": 1, "after_fraction": 0.0, "kind": "rclone", "status_msg": aborted}])
    op = job(command="echo ran", cloud_integration=INTEGRATION, inputs={"/data": "datasets/d"}, staging_timeout=60)
    with pytest.raises(GpuMarketStagingFailed, match="Aborted: the bucket is unreachable"):
        op.execute(context())
    assert alive(sim) == []


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_rule_a_restore_reported_done_that_moved_nothing_fails_under_fail_without_a_third_rental(sim, deferrable):
    sim.set_copy_faults([{"times": 1, "after_fraction": 0.0, "kind": "copy_direct", "ends": "finished"}])
    op = job(
        command=EPOCHS,
        interruptible=True,
        checkpoint_dir=CKPT,
        on_restore_failure="fail",
        staging_timeout=BOUND,
        deferrable=deferrable,
    )
    with Outbidder(sim, times=1, marker=" done"), pytest.raises(GpuMarketStagingFailed, match="did not start"):
        run_to_the_end(op)
    source, successor = sorted(sim.state()["instances"], key=lambda i: i["id"])
    (restore,) = [c for c in sim.copies() if c["kind"] == "copy_direct" and c["src"].endswith("ckpt/")]
    assert restore["state"] == "finished" and restore["files_done"] == 0
    # destroyed seconds after the service showed the copy's end, not at the wrapper's own bound
    assert successor["destroyed_at"] - restore["ended_at"] < (BOUND + 30) * SPEED / 4
    assert alive(sim) == []


def test_rule_a_complete_cloud_restore_starts_the_job_without_the_gate(sim):
    sim.put_bucket_file(1, "ckpt/full/epoch", b"7\n")
    sim.put_bucket_file(1, "ckpt/full/.gpumarket-manifest", b"epoch\n")
    op = job(command=EPOCHS, checkpoint_dir=CKPT, checkpoint_uri="ckpt/full", cloud_integration=INTEGRATION)
    assert op.execute(context())["job_status"] == "succeeded"
    (output,) = outputs_in_order(sim)
    assert "resumes at epoch 7 from [cloud]" in output
    restores = [c for c in sim.copies() if c["direction"] == "Cloud To Instance"]
    assert [c["src"] for c in restores] == ["cloud.1:/ckpt/full"], restores  # no gate: the manifest sufficed
    assert alive(sim) == []


def test_rule_checkpoint_uri_keeps_the_checkpoint_across_task_runs(sim, task_log):
    uri = "ckpt/run-a"
    first = job(command=EPOCHS, checkpoint_dir=CKPT, checkpoint_uri=uri, cloud_integration=INTEGRATION)
    first.execute(context(run_id="a"))
    logged = task_log()
    assert "checkpoint_uri 'ckpt/run-a' holds nothing yet" in logged  # a first run: no warning
    assert "Restoring checkpoint_uri" not in logged, logged
    saved = {f["path"] for f in sim.bucket_files(1)}
    assert f"{uri}/epoch" in saved and f"{uri}/.gpumarket-manifest" in saved
    again = job(command=EPOCHS, checkpoint_dir=CKPT, checkpoint_uri=uri, cloud_integration=INTEGRATION)
    again.execute(context(run_id="b"))
    one, two = outputs_in_order(sim)
    assert "no checkpoint at checkpoint_uri yet" in one
    assert "resumes at epoch 10 from [cloud]" in two and "epoch 1 done" not in two
    assert alive(sim) == []


def test_rule_inputs_arrive_before_the_job_and_outputs_leave_before_the_destroy(sim):
    sim.put_bucket_file(1, "datasets/d/train.csv", b"1,2\n3,4\n")
    command = (
        'wc -l < "$GPUMARKET_INSTANCE_ROOT/data/train.csv" > /dev/null && mkdir -p "$GPUMARKET_INSTANCE_ROOT/out" && '
        'cat "$GPUMARKET_INSTANCE_ROOT/data/train.csv" | wc -l > "$GPUMARKET_INSTANCE_ROOT/out/rows"'
    )
    op = job(
        command=command,
        cloud_integration=INTEGRATION,
        inputs={"/data": "datasets/d"},
        outputs={"/out": "results/r1"},
    )
    assert op.execute(context())["job_status"] == "succeeded"
    assert sim.read_bucket_file(1, "results/r1/rows").strip() == b"2"
    (instance,) = sim.state()["instances"]
    (out,) = [c for c in sim.copies() if c["kind"] == "rclone" and "results/r1" in str(c)]
    assert out["state"] == "finished" and out["ended_at"] <= instance["destroyed_at"]
    assert alive(sim) == []


def test_rule_the_gate_goes_out_to_the_cloud_once_and_later_inputs_need_only_its_way_back(sim):
    sim.put_bucket_file(1, "datasets/d/train.csv", b"1,2\n3,4\n")
    command = 'echo "rows $(wc -l < "$GPUMARKET_INSTANCE_ROOT/data/train.csv")"'

    def gates_sent_out() -> int:
        return sum(c["direction"] == "Instance To Cloud" for c in sim.copies())

    for run, sent_out in ((1, 1), (2, 1)):  # the first use finds no gate in the cloud: it is sent out, once
        op = job(command=command, cloud_integration=INTEGRATION, inputs={"/data": "datasets/d"})
        assert op.execute(context(run_id=f"run-{run}"))["job_status"] == "succeeded"
        assert gates_sent_out() == sent_out
        assert "rows 2" in outputs_in_order(sim)[-1]
    assert sim.read_bucket_file(1, ".gpumarket/gate/gate").strip() == b"gpumarket"
    assert alive(sim) == []


def test_rule_a_way_back_that_brought_no_gate_sends_the_gate_out_and_the_job_starts(sim):
    sim.put_bucket_file(1, "datasets/d/train.csv", b"1,2\n")
    sim.put_bucket_file(1, ".gpumarket/gate/other", b"not the wrapper's gate\n")  # the copy ends, no gate arrives
    op = job(command="echo ran", cloud_integration=INTEGRATION, inputs={"/data": "datasets/d"})
    assert op.execute(context())["job_status"] == "succeeded"
    assert [c["direction"] for c in sim.copies()].count("Instance To Cloud") == 1
    assert "\nran\n" in outputs_in_order(sim)[-1]
    assert alive(sim) == []


def test_rule_inputs_that_bring_their_manifests_start_the_job_without_the_gate(sim, task_log):
    sim.put_bucket_file(1, "datasets/m/train.csv", b"1,2\n3,4\n")
    sim.put_bucket_file(1, "datasets/m/.gpumarket-manifest", b"train.csv\n")
    sim.put_bucket_file(1, "datasets/v/labels", b"a\n")
    sim.put_bucket_file(1, "datasets/v/.gpumarket-manifest", b"labels\n")
    command = (
        'echo "rows $(wc -l < "$GPUMARKET_INSTANCE_ROOT/data/train.csv") $(cat "$GPUMARKET_INSTANCE_ROOT/v/labels")"'
    )
    op = job(command=command, cloud_integration=INTEGRATION, inputs={"/data": "datasets/m", "/v": "datasets/v"})
    assert op.execute(context())["job_status"] == "succeeded"
    assert "rows 2 a" in outputs_in_order(sim)[-1]
    assert [c["src"] for c in sim.copies()] == ["cloud.1:/datasets/m", "cloud.1:/datasets/v"]  # no gate either way
    assert "input /v arrived (1 files, as its manifest lists)" in task_log()
    assert alive(sim) == []


def test_rule_outputs_leave_with_a_manifest_so_the_next_task_takes_them_as_inputs_without_the_gate(sim):
    make = 'o="$GPUMARKET_INSTANCE_ROOT/out"; mkdir -p "$o" && echo 5 > "$o/rows"'
    first = job(command=make, cloud_integration=INTEGRATION, outputs={"/out": "results/r9"})
    assert first.execute(context(run_id="a"))["job_status"] == "succeeded"
    assert sim.read_bucket_file(1, "results/r9/.gpumarket-manifest") == b"rows\n"
    use = job(
        command='cat "$GPUMARKET_INSTANCE_ROOT/in/rows"', cloud_integration=INTEGRATION, inputs={"/in": "results/r9"}
    )
    assert use.execute(context(run_id="b"))["job_status"] == "succeeded"
    assert "\n5\n" in outputs_in_order(sim)[-1]
    assert not [c for c in sim.copies() if ".gpumarket/gate" in str(c)]
    assert alive(sim) == []


def test_rule_an_input_whose_manifest_names_a_file_it_lacks_waits_for_the_gate(sim):
    sim.put_bucket_file(1, "datasets/p/train.csv", b"1\n")
    sim.put_bucket_file(1, "datasets/p/.gpumarket-manifest", b"train.csv\nlabels.csv\n")
    op = job(command="echo ran", cloud_integration=INTEGRATION, inputs={"/data": "datasets/p"})
    assert op.execute(context())["job_status"] == "succeeded"
    assert "\nran\n" in outputs_in_order(sim)[-1] and "arrived" not in outputs_in_order(sim)[-1]
    assert [c for c in sim.copies() if ".gpumarket/gate" in str(c)]  # the provider saw the copy end: the gate
    assert alive(sim) == []


def test_rule_a_failed_output_copy_fails_the_task_naming_the_output_and_destroys_the_instance(sim):
    sim.set_copy_faults([{"times": 5, "after_fraction": 0.0, "kind": "rclone", "direction": "Instance To Cloud"}])
    command = 'mkdir -p "$GPUMARKET_INSTANCE_ROOT/out" && echo r > "$GPUMARKET_INSTANCE_ROOT/out/model"'
    op = job(command=command, cloud_integration=INTEGRATION, outputs={"/out": "results/r2"}, staging_timeout=5)
    with pytest.raises(GpuMarketStagingFailed, match=r"/out -> 'results/r2'"):
        op.execute(context())
    assert alive(sim) == []


def test_rule_a_missing_input_fails_before_the_job_starts(sim):
    op = job(command="echo ran", cloud_integration=INTEGRATION, inputs={"/data": "datasets/none"}, staging_timeout=5)
    with pytest.raises(GpuMarketStagingFailed, match="datasets/none"):
        op.execute(context())
    (output,) = outputs_in_order(sim)
    assert "\nran\n" not in output
    assert alive(sim) == []


def test_rule_an_unknown_cloud_integration_fails_before_anything_is_rented(sim):
    op = job(command="echo ran", cloud_integration="no-such", inputs={"/data": "x"})
    with pytest.raises(Exception, match="cloud_integration"):
        op.execute(context())
    assert sim.state()["instances"] == []


def test_rule_no_storage_credential_is_in_any_create_request(sim):
    sim.put_bucket_file(1, "datasets/d/x", b"x")
    op = job(
        command="true",
        env={"MODE": "train"},
        cloud_integration=INTEGRATION,
        inputs={"/data": "datasets/d"},
        checkpoint_dir=CKPT,
        checkpoint_uri="ckpt/c",
    )
    op.execute(context())
    creates = [r for r in sim.requests() if r["op"] == "create_instance"]
    assert creates
    for request in creates:
        body = request["body"]
        assert set(body["env"]) <= {"MODE"}, body["env"]
        text = str(body).lower()
        for word in ("secret", "access_key", "aws_", "rclone_config", "token"):
            assert word not in text, word
    assert alive(sim) == []


@EXAMPLE_RUN
def test_the_interruptible_example_resumes_from_its_last_checkpoint_after_each_failover(example_dag, sim):
    with CheckpointOutbidder(sim, times=2, checkpoint_dir="/workspace/checkpoints"):
        run = example_dag("example_gpumarket_interruptible").test()
    assert run.state == "success", task_states(run)
    outputs = outputs_in_order(sim)
    assert len(outputs) == 3
    starts = [int(re.search(r"resumes at epoch (\d+)", o).group(1)) for o in outputs]
    assert starts[0] == 0 and starts[1] > 0 and starts[2] > starts[1]
    done = [n for o in outputs for n in epochs_done(o)]
    # An outbid may land between an epoch's checkpoint and its "done" line: the next rental resumes after it.
    checkpointed = {n for start in starts for n in range(1, start + 1)}
    assert set(done) | checkpointed == set(range(1, 11)), (done, starts)
    assert len(done) - len(set(done)) <= 2, f"more than one epoch lost per preemption: {done}"
    assert alive(sim) == []


@EXAMPLE_RUN
def test_the_staged_data_example_trains_on_its_inputs_and_leaves_its_outputs_in_the_bucket(example_dag, sim):
    run = example_dag("example_gpumarket_staged_data").test()
    assert run.state == "success", task_states(run)
    (output,) = outputs_in_order(sim)
    assert "training on 2 input files; resumes at step 0" in output
    files = {f["path"] for f in sim.bucket_files(1)}
    assert any(p.startswith("runs/") and p.endswith("/out/model.txt") for p in files), sorted(files)
    assert "checkpoints/example_gpumarket_staged_data/step" in files
    assert alive(sim) == []


def test_rule_keep_on_output_failure_keeps_the_stopped_instance_under_a_lease_of_its_own_key(sim):
    from airflow_gpumarket import lifecycle
    from airflow_gpumarket.lifecycle import task_key
    from airflow_gpumarket.operators.guard import destroy_rentals_on_failure

    sim.set_copy_faults([{"times": 5, "after_fraction": 0.0, "kind": "rclone", "direction": "Instance To Cloud"}])
    command = 'mkdir -p "$GPUMARKET_INSTANCE_ROOT/out" && echo r > "$GPUMARKET_INSTANCE_ROOT/out/model"'
    op = job(
        command=command,
        cloud_integration=INTEGRATION,
        outputs={"/out": "results/r3"},
        staging_timeout=5,
        keep_on_output_failure=3600,
    )
    with pytest.raises(GpuMarketStagingFailed, match="/out"):
        op.execute(context())
    destroy_rentals_on_failure({"task": op, "ti": context()["ti"], "run_id": "run-1"})  # Airflow's callback
    (kept,) = alive(sim)
    assert kept["actual_status"] == "stopped"
    key, lease = lifecycle.parse_label(kept["label"])
    assert key == lifecycle.kept_key(task_key(op, context())) and lease > time.time() + 3000
    assert sim.read_disk_file(kept["id"], "out/model") == b"r\n"
    GpuMarketHook().destroy_instance(kept["id"])  # what the reaper does once the lease ends
