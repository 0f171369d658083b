"""The wrapper's preflight: the promised GPUs are visible and the user's check passes, else a host failure.

The wrapper is run for real with sh; ``nvidia-smi`` and ``curl`` are stand-ins on PATH.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.job_logs import PreflightFailure, exit_status, preflight_failure
from airflow_gpumarket.job_script import (
    PREFLIGHT_FAILED_STATUS,
    STARTED_LINE,
    build_job_onstart,
    certainly_fits,
)
from airflow_gpumarket.staging import STAGING_FAILED_STATUS

BASE = "http://127.0.0.1:9999"
TWO_GPUS = "GPU 0: NVIDIA RTX 4090 (UUID: GPU-0)\nGPU 1: NVIDIA RTX 4090 (UUID: GPU-1)"
NO_DRIVER = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."


def run(tmp_path: Path, script: str, nvidia_smi: str | None) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for needed in ("sh", "cat", "rm", "printf", "sleep", "echo", "grep", "head", "tail", "tr", "cut"):
        (bin_dir / needed).symlink_to(shutil.which(needed) or f"/bin/{needed}")
    (bin_dir / "curl").write_text("#!/bin/sh\nexit 0\n")
    if nvidia_smi is not None:
        (bin_dir / "nvidia-smi").write_text(nvidia_smi)
    for tool in bin_dir.iterdir():
        if not tool.is_symlink():
            tool.chmod(0o755)
    env = {"PATH": str(bin_dir), "CONTAINER_ID": "7", "CONTAINER_API_KEY": "k", "TMPDIR": str(tmp_path)}
    return subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=30)


def smi(listing: str, status: int = 0) -> str:
    return f"#!/bin/sh\ncat <<'LISTING'\n{listing}\nLISTING\nexit {status}\n"


def test_the_job_runs_when_the_promised_gpus_are_visible(tmp_path):
    proc = run(tmp_path, build_job_onstart("echo JOB", base_url=BASE, gpu_count=2), smi(TWO_GPUS))
    assert proc.returncode == 0 and "JOB" in proc.stdout
    assert preflight_failure(proc.stdout.splitlines(), 0) is None


@pytest.mark.parametrize(
    ("listing", "status", "seen"),
    [
        (TWO_GPUS.split("\n")[0], 0, "expected 2 GPUs, nvidia-smi -L listed 1: GPU 0: NVIDIA RTX 4090"),
        (NO_DRIVER, 9, "expected 2 GPUs, nvidia-smi -L listed 0: NVIDIA-SMI has failed"),
    ],
)
def test_fewer_gpus_than_promised_fail_the_preflight_without_running_the_job(tmp_path, listing, status, seen):
    proc = run(tmp_path, build_job_onstart("echo JOB", base_url=BASE, gpu_count=2), smi(listing, status))
    lines = proc.stdout.splitlines()
    assert proc.returncode == PREFLIGHT_FAILED_STATUS and "JOB" not in lines and STARTED_LINE not in lines
    failure = preflight_failure(lines, exit_status(lines))
    assert failure is not None and failure.check == "gpus" and failure.seen.startswith(seen)


def test_a_host_without_nvidia_smi_fails_the_gpu_preflight(tmp_path):
    proc = run(tmp_path, build_job_onstart("echo JOB", base_url=BASE, gpu_count=1), None)
    failure = preflight_failure(proc.stdout.splitlines())
    assert proc.returncode == PREFLIGHT_FAILED_STATUS and failure and "listed 0" in failure.seen


def test_a_failing_preflight_command_is_a_host_failure_with_its_last_line(tmp_path):
    check = 'echo checking; echo "it\'s CUDA 11, not 12"; exit 3'
    proc = run(tmp_path, build_job_onstart("echo JOB", base_url=BASE, preflight=check), None)
    failure = preflight_failure(proc.stdout.splitlines(), PREFLIGHT_FAILED_STATUS)
    assert proc.returncode == PREFLIGHT_FAILED_STATUS
    assert failure == PreflightFailure("command", "exit status 3: it's CUDA 11, not 12")


def test_the_preflight_command_runs_after_the_gpu_check_passed(tmp_path):
    script = build_job_onstart("echo JOB", base_url=BASE, gpu_count=2, preflight="nvidia-smi -L | grep -q 'GPU 1'")
    proc = run(tmp_path, script, smi(TWO_GPUS))
    assert proc.returncode == 0 and "JOB" in proc.stdout


def test_the_marker_is_one_line_however_much_the_check_printed(tmp_path):
    check = "i=0; while [ $i -lt 500 ]; do printf 'x'; i=$((i+1)); done; echo; exit 1"
    proc = run(tmp_path, build_job_onstart("true", base_url=BASE, preflight=check), None)
    marker = [line for line in proc.stdout.splitlines() if "preflight failed" in line]
    assert len(marker) == 1 and len(marker[0]) < 300


def test_a_job_that_exits_with_the_preflight_status_is_the_jobs_own_failure():
    lines = [
        STARTED_LINE,
        "gpumarket: preflight failed (gpus): faked by the job",
        "gpumarket: job exited with status 69",
    ]
    assert preflight_failure(lines, 69) is None


def test_another_exit_status_is_never_a_preflight_failure():
    assert preflight_failure(["gpumarket: preflight failed (gpus): expected 2"], 1) is None


def test_the_preflight_status_differs_from_staging_and_from_success():
    assert PREFLIGHT_FAILED_STATUS not in (0, STAGING_FAILED_STATUS)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"preflight": ["nvidia-smi"]}, "preflight"),
        ({"preflight": "  "}, "preflight"),
        ({"gpu_count": -1}, "gpu_count"),
        ({"gpu_count": True}, "gpu_count"),
    ],
)
def test_a_bad_preflight_is_refused_naming_the_field(kwargs, field):
    with pytest.raises(GpuMarketValidationError) as caught:
        build_job_onstart("true", base_url=BASE, **kwargs)
    assert caught.value.field == field


def test_certainly_fits_counts_the_preflight():
    check = "python -c 'import torch; assert torch.cuda.is_available()'"
    command = "x" * 1500
    assert certainly_fits(command, gpu_count=8, preflight=check)
    script = build_job_onstart(command, base_url="https://" + "h" * 192, gpu_count=8, preflight=check)
    assert len(script) <= api.ONSTART_MAX_CHARS and "packed by" not in script
    long_check = "y" * 2000
    assert not certainly_fits(command, gpu_count=8, preflight=long_check)
    assert certainly_fits(command) and not certainly_fits("x" * 4000)
