"""The job wrapper's staging: it waits for a restore and the inputs, then starts the job; it keeps a manifest.

The wrapper runs for real with sh, on a directory standing for the instance's disk (``GPUMARKET_INSTANCE_ROOT``),
as the simulator runs it; curl is a stand-in that records the call ending billing.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from airflow_gpumarket import staging
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.job_script import STARTED_LINE, WrapperStaging, build_job_onstart

BASE = "http://127.0.0.1:9999"
TOOLS = ("sh", "cat", "rm", "printf", "sleep", "echo", "mkdir", "find", "sed", "sort", "mv", "cp", "wc", "ls")
TOOLS += ("dirname", "base64", "gunzip", "gzip", "date")
CKPT = "/workspace/ckpt"
SHOW = 'echo "from=[$GPUMARKET_RESUMED_FROM] dir=$GPUMARKET_CHECKPOINT_DIR"; cat "$GPUMARKET_CHECKPOINT_DIR/epoch"'


def run_wrapper(disk: Path, staged: WrapperStaging, command: str = SHOW) -> subprocess.CompletedProcess[str]:
    bin_dir = disk.parent / "bin"
    bin_dir.mkdir(exist_ok=True)
    curl = bin_dir / "curl"
    curl.write_text("#!/bin/sh\nexit 0\n")
    curl.chmod(curl.stat().st_mode | stat.S_IEXEC)
    for tool in TOOLS:
        found = shutil.which(tool)
        if found and not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(found)
    script = disk.parent / "onstart.sh"
    script.write_text(build_job_onstart(command, base_url=BASE, stop_on_success=True, staged=staged))
    env = {
        "PATH": str(bin_dir),
        "CONTAINER_ID": "77",
        "CONTAINER_API_KEY": "ik",
        "TMPDIR": str(disk.parent),
        "GPUMARKET_INSTANCE_ROOT": str(disk),
    }
    return subprocess.run(["/bin/sh", str(script)], env=env, capture_output=True, text=True, timeout=60)


def staged_restore(disk: Path, files: dict[str, str], manifest: list[str] | None) -> None:
    restore = disk / staging.RESTORE_DIR.lstrip("/")
    restore.mkdir(parents=True)
    for name, text in files.items():
        (restore / name).parent.mkdir(parents=True, exist_ok=True)
        (restore / name).write_text(text)
    if manifest is not None:
        (restore / staging.MANIFEST_NAME).write_text("".join(f"{name}\n" for name in manifest))


def open_gate(disk: Path) -> None:
    gate = disk / staging.GATE_DIR.lstrip("/")
    gate.mkdir(parents=True)
    (gate / "gate").write_text("gpumarket\n")


@pytest.fixture
def disk(tmp_path: Path) -> Path:
    path = tmp_path / "disk"
    path.mkdir()
    return path


def test_a_complete_restore_from_an_instance_is_moved_in_before_the_job_starts(disk):
    staged_restore(disk, {"epoch": "7\n", "sub/w.pt": "w"}, ["epoch", "sub/w.pt"])
    done = run_wrapper(disk, WrapperStaging(CKPT, restore_from="instance 42", timeout=5))
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    restored = lines.index("gpumarket: restored the checkpoint from instance 42 (2 files)")
    assert restored < lines.index(STARTED_LINE)
    assert f"from=[42] dir={disk}{CKPT}" in lines
    assert "7" in lines
    assert (disk / "workspace/ckpt/sub/w.pt").read_text() == "w"
    assert not (disk / staging.RESTORE_DIR.lstrip("/")).exists()


def test_files_the_manifest_does_not_name_are_not_restored(disk):
    staged_restore(disk, {"epoch": "3\n", "late.pt": "partial"}, ["epoch"])
    done = run_wrapper(disk, WrapperStaging(CKPT, restore_from="instance 42", timeout=5))
    assert done.returncode == 0
    assert not (disk / "workspace/ckpt/late.pt").exists()


def test_an_incomplete_restore_under_fail_does_not_start_the_job_and_exits_75(disk):
    staged_restore(disk, {"epoch": "3\n"}, ["epoch", "weights.pt"])
    done = run_wrapper(disk, WrapperStaging(CKPT, restore_from="instance 42", timeout=1, on_restore_failure="fail"))
    assert done.returncode == staging.STAGING_FAILED_STATUS
    assert STARTED_LINE not in done.stdout
    assert "did not complete; the job does not start (on_restore_failure='fail')" in done.stdout
    assert f"gpumarket: job exited with status {staging.STAGING_FAILED_STATUS}" in done.stdout


def test_an_incomplete_restore_under_restart_starts_from_scratch_and_says_so(disk):
    staged_restore(disk, {"epoch": "3\n"}, ["epoch", "weights.pt"])
    done = run_wrapper(disk, WrapperStaging(CKPT, restore_from="instance 42", timeout=1), command=SHOW + " || true")
    assert done.returncode == 0
    assert "the job starts from scratch (on_restore_failure='restart')" in done.stdout
    assert "from=[] " in done.stdout
    assert not (disk / "workspace/ckpt/epoch").exists()


def test_an_empty_cloud_restore_behind_the_gate_is_no_checkpoint_yet(disk):
    open_gate(disk)
    done = run_wrapper(
        disk,
        WrapperStaging(CKPT, restore_from="cloud", gated=True, timeout=5),
        command="echo ran; ls -A $GPUMARKET_CHECKPOINT_DIR",
    )
    assert done.returncode == 0
    assert "gpumarket: no checkpoint at checkpoint_uri yet; the job starts from scratch" in done.stdout
    assert "ran" in done.stdout


def test_a_cloud_restore_is_complete_when_the_gate_and_every_named_file_arrived(disk):
    staged_restore(disk, {"epoch": "9\n"}, ["epoch"])
    open_gate(disk)
    done = run_wrapper(disk, WrapperStaging(CKPT, restore_from="cloud", gated=True, timeout=5))
    assert done.returncode == 0
    assert "from=[cloud] " in done.stdout
    assert "9" in done.stdout.splitlines()


def test_a_complete_cloud_restore_starts_the_job_without_waiting_for_the_gate(disk):
    staged_restore(disk, {"epoch": "9\n"}, ["epoch"])
    done = run_wrapper(disk, WrapperStaging(CKPT, restore_from="cloud", timeout=5))
    assert done.returncode == 0
    assert "gpumarket: restored the checkpoint from cloud (1 files)" in done.stdout
    assert "from=[cloud] " in done.stdout and "9" in done.stdout.splitlines()


def test_a_partial_cloud_restore_waits_for_the_gate_then_applies_on_restore_failure(disk):
    staged_restore(disk, {"epoch": "3\n"}, ["epoch", "weights.pt"])
    open_gate(disk)
    staged = WrapperStaging(CKPT, restore_from="cloud", timeout=5, on_restore_failure="fail")
    done = run_wrapper(disk, staged, command="echo ran")
    assert done.returncode == staging.STAGING_FAILED_STATUS and "ran" not in done.stdout.splitlines()
    assert "did not complete; the job does not start (on_restore_failure='fail')" in done.stdout


def test_a_cloud_restore_that_never_arrived_does_not_start_the_job_from_scratch(disk):
    done = run_wrapper(disk, WrapperStaging(CKPT, restore_from="cloud", timeout=1), command="echo ran")
    assert done.returncode == staging.STAGING_FAILED_STATUS
    assert "gpumarket: the staged data did not arrive within 1 s; the job does not start" in done.stdout


def test_without_the_gate_the_job_never_starts_and_the_wrapper_gives_up_within_its_bound(disk):
    staged_restore(disk, {"epoch": "9\n"}, ["epoch"])
    done = run_wrapper(disk, WrapperStaging(None, gated=True, timeout=1), command="echo ran")
    assert done.returncode == staging.STAGING_FAILED_STATUS
    assert "ran" not in done.stdout.splitlines()
    assert "gpumarket: the staged data did not arrive within 1 s; the job does not start" in done.stdout


def test_the_manifest_names_the_checkpoint_files_but_hidden_and_tmp_ones(disk):
    command = 'cd "$GPUMARKET_CHECKPOINT_DIR" && echo 1 > epoch && echo x > w.tmp && echo y > .hidden && mkdir d'
    command += " && echo z > d/e"
    done = run_wrapper(disk, WrapperStaging(CKPT), command=command)
    assert done.returncode == 0
    assert (disk / "workspace/ckpt" / staging.MANIFEST_NAME).read_text().split() == ["d/e", "epoch"]


def test_a_path_the_wrapper_cannot_quote_is_refused():
    with pytest.raises(GpuMarketValidationError, match="checkpoint_dir"):
        build_job_onstart("true", base_url=BASE, staged=WrapperStaging("/work space/'x"))


def input_folder(disk: Path, path: str, files: dict[str, str], manifest: list[str] | None) -> None:
    folder = disk / path.lstrip("/")
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    if manifest is not None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / staging.MANIFEST_NAME).write_text("".join(f"{name}\n" for name in manifest))


def test_inputs_whose_manifests_and_files_arrived_start_the_job_without_the_gate(disk):
    input_folder(disk, "/data", {"train.csv": "1\n", "sub/x": "2\n"}, ["sub/x", "train.csv"])
    input_folder(disk, "/more", {"y": "3\n"}, ["y"])
    staged = WrapperStaging(None, gated=True, timeout=5, inputs=("/data", "/more"))
    done = run_wrapper(disk, staged, command='cat "$GPUMARKET_INSTANCE_ROOT/data/sub/x"')
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    arrived = lines.index("gpumarket: input /data arrived (2 files, as its manifest lists)")
    assert arrived < lines.index("gpumarket: input /more arrived (1 files, as its manifest lists)")
    assert lines.index(STARTED_LINE) > arrived and "2" in lines


def test_an_input_whose_manifest_names_a_missing_file_waits_for_the_gate(disk):
    input_folder(disk, "/data", {"train.csv": "1\n"}, ["train.csv", "labels.csv"])
    staged = WrapperStaging(None, gated=True, timeout=1, inputs=("/data",))
    done = run_wrapper(disk, staged, command="echo ran")
    assert done.returncode == staging.STAGING_FAILED_STATUS
    assert "ran" not in done.stdout.splitlines() and "arrived" not in done.stdout
    open_gate(disk)  # the provider saw the copy end: the gate decides
    assert "ran" in run_wrapper(disk, staged, command="echo ran").stdout.splitlines()


def test_one_input_without_a_manifest_keeps_the_job_behind_the_gate(disk):
    input_folder(disk, "/data", {"train.csv": "1\n"}, ["train.csv"])
    input_folder(disk, "/plain", {"y": "3\n"}, None)
    done = run_wrapper(disk, WrapperStaging(None, gated=True, timeout=1, inputs=("/data", "/plain")), "echo ran")
    assert done.returncode == staging.STAGING_FAILED_STATUS and "ran" not in done.stdout.splitlines()
    assert "gpumarket: input /data arrived (1 files, as its manifest lists)" in done.stdout


def test_each_output_directory_gets_a_manifest_of_every_file_after_the_command(disk):
    command = 'o="$GPUMARKET_INSTANCE_ROOT/out"; mkdir -p "$o/d" && echo 1 > "$o/a" && echo 2 > "$o/.meta"'
    command += ' && echo 3 > "$o/d/b"'
    done = run_wrapper(disk, WrapperStaging(None, outputs=("/out", "/never")), command=command)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (disk / "out" / staging.MANIFEST_NAME).read_text().split() == [".meta", "a", "d/b"]
    assert not (disk / "never").exists()


def test_the_durable_data_howto_recipe_writes_a_manifest_the_wrapper_accepts(disk):
    howto = Path(__file__).parents[1] / "docs" / "howto" / "durable-data.md"
    (recipe,) = [line for line in howto.read_text().splitlines() if line.startswith("cd data && find")]
    input_folder(disk, "/data", {"train.csv": "1\n", "sub/x": "2\n", ".meta": "3\n"}, None)
    subprocess.run(["/bin/sh", "-c", recipe], cwd=disk, check=True)
    done = run_wrapper(disk, WrapperStaging(None, gated=True, timeout=1, inputs=("/data",)), "echo ran")
    assert "gpumarket: input /data arrived (3 files, as its manifest lists)" in done.stdout, done.stdout
    assert "ran" in done.stdout.splitlines()
