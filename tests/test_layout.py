"""Limits that keep one role per file: modules a reader can hold, Airflow-facing classes of one role each."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Lines a module of either package may have; past this it holds more than one role.
MAX_MODULE_LINES = 550
#: Methods an operator, sensor or trigger class may define (the hooks, the API's faces, are exempt).
MAX_CLASS_METHODS = 25
PACKAGES = ("airflow_gpumarket", "simulator/gpumarket_simulator")
#: The Airflow faces whose classes the method limit covers.
FACES = ("airflow_gpumarket/operators", "airflow_gpumarket/sensors", "airflow_gpumarket/triggers")


def tracked_modules(*folders: str) -> list[str]:
    """The Python modules git tracks under ``folders`` (an untracked build copy is not the project's)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--", *(f"{folder}/*.py" for folder in folders)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return []
    return sorted(listed)


@pytest.mark.parametrize("module", tracked_modules(*PACKAGES))
def test_no_module_of_either_package_is_longer_than_550_lines(module):
    lines = len((ROOT / module).read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{module} has {lines} lines: split it by role (at most {MAX_MODULE_LINES})"


def methods_per_class(module: str) -> dict[str, int]:
    tree = ast.parse((ROOT / module).read_text(encoding="utf-8"))
    return {
        node.name: sum(isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) for item in node.body)
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }


@pytest.mark.parametrize("module", tracked_modules(*FACES))
def test_no_operator_sensor_or_trigger_class_defines_more_than_25_methods(module):
    too_many = {name: n for name, n in methods_per_class(module).items() if n > MAX_CLASS_METHODS}
    assert not too_many, f"{module}: give a part of these classes its own object: {too_many}"


def test_the_limits_see_the_modules_they_check():
    """A pattern that matched nothing would let every check above pass."""
    modules = tracked_modules(*PACKAGES)
    if not modules:
        pytest.skip("not a git checkout: git ls-files lists nothing")
    assert "simulator/gpumarket_simulator/world.py" in modules
    assert "airflow_gpumarket/operators/renting.py" in tracked_modules(*FACES)
