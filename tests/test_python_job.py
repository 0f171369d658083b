"""A Python function as a job: the command really run with sh and python3, and its result read back."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest

from airflow_gpumarket import python_job
from airflow_gpumarket.exceptions import GpuMarketValidationError

KEY = "0123456789ab"
pytestmark = pytest.mark.skipif(shutil.which("python3") is None, reason="the job runs with python3")


def run(source: str, name: str, *args, tmp_path, **kwargs) -> subprocess.CompletedProcess:
    command = python_job.build_command(source=source, name=name, key=KEY, args=args, kwargs=kwargs)
    env = {"PATH": "/usr/bin:/bin:" + shutil.which("python3").rsplit("/", 1)[0], "TMPDIR": str(tmp_path)}
    return subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True, timeout=60)


def test_the_return_value_comes_back_through_the_marker_line(tmp_path):
    source = "def f(a, b, *, scale):\n    print('working')\n    return {'sum': (a + b) * scale, 'tags': ['x']}\n"
    proc = run(source, "f", 1, 2, tmp_path=tmp_path, scale=10)
    assert proc.returncode == 0, proc.stderr
    assert python_job.read_result(proc.stdout, KEY) == (True, {"sum": 30, "tags": ["x"]})
    assert proc.stdout.startswith("working\n")
    assert list(tmp_path.iterdir()) == []  # payload and source files removed


def test_output_that_looks_like_the_marker_cannot_pass_for_the_result(tmp_path):
    fake = python_job.marker(KEY) + " eyJmb3JnZWQiOiB0cnVlfQ=="  # {"forged": true}, printed before returning
    other = python_job.marker("ffffffffffff") + " e30="  # another task's key
    source = f"def f():\n    print({fake!r})\n    print({other!r})\n    return 7\n"
    proc = run(source, "f", tmp_path=tmp_path)
    assert python_job.read_result(proc.stdout, KEY) == (True, 7)


def test_an_exception_prints_the_traceback_with_the_functions_lines_and_exits_1(tmp_path):
    proc = run("def f(a, b):\n    return a / b\n", "f", 1, 0, tmp_path=tmp_path)
    assert proc.returncode == 1
    assert "ZeroDivisionError" in proc.stderr and "return a / b" in proc.stderr
    assert python_job.read_result(proc.stdout, KEY) == (False, None)


@pytest.mark.parametrize(
    ("body", "said"),
    [("return object()", "not JSON"), ("return 'x' * 70000", "object storage")],
)
def test_a_return_value_that_cannot_be_sent_back_fails_clearly(tmp_path, body, said):
    proc = run(f"def f():\n    {body}\n", "f", tmp_path=tmp_path)
    assert proc.returncode == python_job.RESULT_UNSENDABLE_STATUS and said in proc.stderr


def test_sys_exit_without_a_value_is_a_failure_and_a_nonzero_exit_keeps_its_status(tmp_path):
    assert run("def f():\n    import sys; sys.exit(0)\n", "f", tmp_path=tmp_path).returncode == 1
    assert run("def f():\n    import sys; sys.exit(4)\n", "f", tmp_path=tmp_path).returncode == 4


def test_arguments_that_are_not_json_are_refused_naming_them():
    with pytest.raises(GpuMarketValidationError, match="argument 'when'.*object storage"):
        python_job.build_command(source="def f(when): pass\n", name="f", key=KEY, kwargs={"when": object()})
    with pytest.raises(GpuMarketValidationError, match="op_args: positional argument 2"):
        python_job.build_command(source="def f(a, b): pass\n", name="f", key=KEY, args=[1, float("nan")])


@pytest.mark.parametrize("requirement", ["numpy==2.1.0", "torch>=2", "scikit-learn[extra]~=1.5"])
def test_requirements_are_installed_first_with_pip(requirement):
    command = python_job.build_command(source="def f(): pass\n", name="f", key=KEY, requirements=[requirement])
    quoted = shlex.quote(requirement)
    assert f"python3 -m pip install --quiet --disable-pip-version-check {quoted} || exit $?" in command


@pytest.mark.parametrize("requirement", ["numpy; rm -rf /", "$(curl evil)", "", 3])
def test_a_requirement_that_is_not_one_is_refused(requirement):
    with pytest.raises(GpuMarketValidationError, match="requirements"):
        python_job.validate_requirement(requirement)


def test_a_result_line_that_does_not_decode_is_no_result():
    assert python_job.read_result(python_job.marker(KEY) + " not-base64!\n", KEY) == (False, None)
    assert python_job.read_result("nothing here\n", KEY) == (False, None)


def test_a_thread_the_function_left_running_cannot_print_after_the_result(tmp_path):
    fake = python_job.marker(KEY) + " eyJmb3JnZWQiOiB0cnVlfQ=="
    source = (
        "def f():\n    import threading, time\n"
        f"    threading.Thread(target=lambda: (time.sleep(0.5), print({fake!r}, flush=True))).start()\n"
        "    return 'real'\n"
    )
    proc = run(source, "f", tmp_path=tmp_path)
    assert proc.returncode == 0 and python_job.read_result(proc.stdout, KEY) == (True, "real")
