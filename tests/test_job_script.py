"""The completion protocol: the wrapper keeps the command's exit status and ends billing itself.

The wrapper is run for real with sh; curl/python3/wget are stand-ins on PATH that record how they were called.
"""

from __future__ import annotations

import base64
import gzip
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.job_script import build_job_onstart

BASE = "http://127.0.0.1:9999"


def _fake_tool(bin_dir: Path, name: str, log: Path, exit_code: int = 0) -> None:
    tool = bin_dir / name
    tool.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\nexit {exit_code}\n')
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)


def _run(script: str, tmp_path: Path, tools: dict[str, int], extra_env: dict | None = None):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls.log"
    for name, code in tools.items():
        _fake_tool(bin_dir, name, log, code)
    for needed in ("sh", "cat", "rm", "printf", "sleep", "echo"):  # the rest of a slim image
        found = shutil.which(needed)
        if found and not (bin_dir / needed).exists():
            (bin_dir / needed).symlink_to(found)
    env = {"PATH": str(bin_dir), "CONTAINER_ID": "77", "CONTAINER_API_KEY": "ik-secret", "TMPDIR": str(tmp_path)}
    env.update(extra_env or {})
    path = tmp_path / "onstart.sh"
    path.write_text(script)
    proc = subprocess.run(["/bin/sh", str(path)], env=env, capture_output=True, text=True, timeout=30)
    return proc, (log.read_text() if log.exists() else "")


def test_exit_zero_destroys_the_instance_itself(tmp_path):
    proc, calls = _run(build_job_onstart("echo hello", base_url=BASE), tmp_path, {"curl": 0})
    assert proc.returncode == 0
    assert "hello" in proc.stdout
    assert "-X DELETE" in calls and f"{BASE}/api/v0/instances/77/" in calls
    assert "Bearer ik-secret" in calls


def test_non_zero_exit_stops_the_instance_and_keeps_the_exit_status(tmp_path):
    proc, calls = _run(build_job_onstart("exit 3", base_url=BASE), tmp_path, {"curl": 0})
    assert proc.returncode == 3
    assert "-X PUT" in calls and '{"state":"stopped"}' in calls


def test_python3_is_used_when_curl_is_missing(tmp_path):
    proc, calls = _run(build_job_onstart("true", base_url=BASE), tmp_path, {"python3": 0})
    assert proc.returncode == 0
    assert calls.startswith("python3 -c") and "DELETE" in calls


def test_wget_is_used_when_curl_and_python3_are_missing(tmp_path):
    proc, calls = _run(build_job_onstart("false", base_url=BASE), tmp_path, {"wget": 0})
    assert proc.returncode == 1
    assert "--method=PUT" in calls and '--body-data={"state":"stopped"}' in calls


def test_the_account_key_is_never_in_the_script():
    script = build_job_onstart("echo $SECRET", base_url=BASE)
    assert "CONTAINER_API_KEY" in script and "Bearer $CONTAINER_API_KEY" in script
    assert not re.search(r"Bearer [A-Za-z0-9]", script)


def test_command_containing_the_heredoc_delimiter_style_text_is_kept_verbatim(tmp_path):
    command = "cat <<'EOF'\nGPUMARKET_JOB_x $HOME `date`\nEOF"
    proc, _ = _run(build_job_onstart(command, base_url=BASE), tmp_path, {"curl": 0})
    assert "GPUMARKET_JOB_x $HOME `date`" in proc.stdout


def test_rule_env_visibility_appends_env_to_the_system_environment_file(tmp_path):
    env_file = tmp_path / "environment"
    script = build_job_onstart("true", base_url=BASE, export_env=["EPOCHS"])
    proc, _ = _run(script, tmp_path, {"curl": 0}, {"EPOCHS": "5", "GPUMARKET_ENV_FILE": str(env_file)})
    assert proc.returncode == 0
    assert env_file.read_text() == "EPOCHS=5\n"


def test_rule_onstart_limit_long_commands_are_packed_and_still_run(tmp_path):
    command = "\n".join(f"echo line {i} of a long job script" for i in range(300))
    script = build_job_onstart(command, base_url=BASE)
    assert len(command) > api.ONSTART_MAX_CHARS >= len(script)
    payload = re.search(r"echo '([A-Za-z0-9+/=]+)'", script).group(1)
    assert "echo line 299 of a long job script" in gzip.decompress(base64.b64decode(payload)).decode()
    for needed in ("base64", "gunzip"):
        if not shutil.which(needed):
            pytest.skip(f"{needed} is not installed here")  # the packed form needs them on the instance
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for needed in ("base64", "gunzip", "gzip"):
        (bin_dir / needed).symlink_to(shutil.which(needed))
    proc, calls = _run(script, tmp_path, {"curl": 0})
    assert proc.returncode == 0, proc.stderr
    assert "line 299" in proc.stdout and "DELETE" in calls
    # Unpacked into $TMPDIR under a name of its own (two jobs on one simulator host never share one), then removed.
    assert '"${TMPDIR:-/tmp}/.gpumarket_onstart.$$.sh"' in script
    assert not list(tmp_path.glob(".gpumarket_onstart*"))


def test_rule_onstart_limit_fails_clearly_when_even_packing_does_not_fit():
    incompressible = base64.b64encode(os.urandom(6000)).decode()
    with pytest.raises(GpuMarketValidationError, match=r"^command: .*4048"):
        build_job_onstart(f"echo {incompressible}", base_url=BASE)


@pytest.mark.parametrize("command", ["", "   ", None])
def test_empty_command_is_refused(command):
    with pytest.raises(GpuMarketValidationError, match="^command"):
        build_job_onstart(command, base_url=BASE)


def test_invalid_env_name_to_export_is_refused():
    with pytest.raises(GpuMarketValidationError, match="^env"):
        build_job_onstart("true", base_url=BASE, export_env=["NOT-VALID"])


def test_stdout_and_stderr_reach_the_wrappers_output_with_the_status_line_last_before_billing(tmp_path):
    proc, _ = _run(build_job_onstart("echo out; echo err >&2; exit 3", base_url=BASE), tmp_path, {"curl": 0})
    lines = proc.stdout.splitlines()
    assert lines == ["gpumarket: job started", "out", "err", "gpumarket: job exited with status 3"]
    assert proc.stderr == ""


def test_the_wrapper_removes_the_script_it_wrote(tmp_path):
    proc, _ = _run(build_job_onstart('ls "$TMPDIR"', base_url=BASE), tmp_path, {"curl": 0})
    assert re.search(r"gpumarket-job-\d+\.sh", proc.stdout)  # there while the command ran
    assert not list(tmp_path.glob("gpumarket-job-*"))


def test_the_script_is_removed_when_the_wrapper_is_terminated(tmp_path):
    script = tmp_path / "onstart.sh"
    script.write_text(build_job_onstart("echo started; sleep 30", base_url=BASE))
    env = {"PATH": os.environ["PATH"], "CONTAINER_ID": "77", "CONTAINER_API_KEY": "k", "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(["/bin/sh", str(script)], env=env, stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline() == b"gpumarket: job started\n"
    # The job's own first line: its process exists, so the signal reaches it too (a job forked just after the
    # signal would run on, and the wrapper, which runs its trap only once the job ends, with it).
    assert proc.stdout.readline() == b"started\n"
    assert list(tmp_path.glob("gpumarket-job-*"))
    os.killpg(proc.pid, 15)  # as a stop or destroy of the container ends its processes
    proc.wait(timeout=10)
    assert not list(tmp_path.glob("gpumarket-job-*"))


@pytest.mark.parametrize("stop_on_success", [False, True])
def test_a_command_that_certainly_fits_fits_unpacked_behind_a_long_base_url_and_one_more_character_may_not(
    stop_on_success,
):
    from airflow_gpumarket import api
    from airflow_gpumarket.job_script import certainly_fits

    room = next(n for n in range(4096, 0, -1) if certainly_fits("x" * n, stop_on_success=stop_on_success))
    script = build_job_onstart("x" * room, base_url="https://" + "h" * 192, stop_on_success=stop_on_success)
    assert len(script) == api.ONSTART_MAX_CHARS and "x" * room in script  # unpacked, at the limit
    assert not certainly_fits("x" * (room + 1), stop_on_success=stop_on_success)
