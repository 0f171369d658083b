"""Limits that keep one role per file: modules a reader can hold, Airflow-facing classes of one role each."""

from __future__ import annotations

import ast
import re
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
    """The Python modules under ``folders``, read from the tree (a clean clone, an unpacked sdist, a CI checkout)."""
    return sorted(
        path.relative_to(ROOT).as_posix()
        for folder in folders
        for path in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in path.parts
    )


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
    assert "simulator/gpumarket_simulator/world.py" in modules
    assert "airflow_gpumarket/operators/renting.py" in tracked_modules(*FACES)


LAYOUT = ROOT / "docs" / "contributing" / "layout.md"


@pytest.mark.parametrize("module", tracked_modules("airflow_gpumarket"))
def test_every_module_of_the_provider_is_listed_with_its_role_in_the_layout_page(module):
    """The layout page names each module, by its path or by its name under its folder's entry."""
    text = LAYOUT.read_text(encoding="utf-8")
    path = module.removeprefix("airflow_gpumarket/")
    folder, _, name = path.rpartition("/")
    listed = re.search(rf"^ *{re.escape(path)}\s", text, re.MULTILINE) is not None
    grouped = bool(folder) and re.search(rf"^  {re.escape(folder)}/\s[^\n]*(\n    .*)*?\b{re.escape(name)}", text, re.M)
    assert listed or grouped or name == "__init__.py" and folder, f"docs/contributing/layout.md does not list {path}"


def test_every_module_the_layout_page_lists_exists():
    text = LAYOUT.read_text(encoding="utf-8")
    block = text.split("```text", 1)[1].split("```", 1)[0]
    named = re.findall(r"^  ([a-z_]+(?:/[a-z_]+)*\.py)\s", block, re.MULTILINE)
    assert named, "no module found in the layout page's tree"
    missing = [path for path in named if not (ROOT / "airflow_gpumarket" / path).exists()]
    assert not missing, f"the layout page lists modules that do not exist: {missing}"
