"""The docs cannot rot: their code comes from example DAG files that the test suite parses.

- The README's DAG is the whole of ``example_dags/example_gpumarket_quickstart.py``.
- Every Python block of a how-to guide (``docs/howto/``) is a ``pymdownx.snippets`` include of an example DAG
  file, never code written inline; ``make docs`` renders the file in its place.
- Every included file exists, and every example DAG is shown somewhere in the docs.
- Every example DAG file parses without import errors.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
EXAMPLES = REPO / "example_dags"
QUICKSTART = EXAMPLES / "example_gpumarket_quickstart.py"
INCLUDE = re.compile(r'^--8<-- "(?P<path>[^"]+)"$')
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[^`\s]*)")


def code_blocks(text: str) -> list[tuple[str, list[str]]]:
    """The fenced code blocks of a Markdown text, as (language, lines without the indent of the fence)."""
    blocks: list[tuple[str, list[str]]] = []
    lines = iter(text.splitlines())
    for line in lines:
        opening = FENCE.match(line)
        if not opening:
            continue
        indent, body = len(opening["indent"]), []
        for inner in lines:
            if inner.strip() == "```":
                break
            body.append(inner[indent:])
        else:
            raise AssertionError(f"a code block that never closes: {line!r}")
        blocks.append((opening["lang"], body))
    return blocks


def includes(page: Path) -> list[str]:
    return [m["path"] for _, body in code_blocks(page.read_text()) for line in body if (m := INCLUDE.match(line))]


HOWTO_PAGES = sorted((DOCS / "howto").glob("*.md"))
#: How-to guides with no DAG of their own, and why.
WITHOUT_A_DAG = {"gpu-rentals-page.md": "the page is used in Airflow's UI; any renting task's DAG shows it"}
DOC_PAGES = sorted(DOCS.rglob("*.md"))


def test_the_readmes_dag_is_the_quickstart_example_dag():
    python = [body for lang, body in code_blocks((REPO / "README.md").read_text()) if lang in ("python", "py")]
    assert len(python) == 1, "the README shows one Python block: the quickstart DAG"
    assert "\n".join(python[0]) + "\n" == QUICKSTART.read_text(), (
        f"the README's DAG differs from {QUICKSTART.relative_to(REPO)}: copy the file into the README"
    )


def test_the_readme_shows_the_two_commands_that_set_everything_up():
    shell = "\n".join("\n".join(body) for lang, body in code_blocks((REPO / "README.md").read_text()) if lang == "bash")
    assert re.search(r"^make demo\b", shell, re.M) and re.search(r"^make test\b", shell, re.M)


def test_there_are_how_to_guides():
    assert len(HOWTO_PAGES) >= 7


@pytest.mark.parametrize("page", HOWTO_PAGES, ids=lambda p: p.name)
def test_every_python_block_of_a_how_to_guide_includes_an_example_dag(page):
    blocks = code_blocks(page.read_text())
    python = [body for lang, body in blocks if lang in ("python", "py", "python3", "pycon")]
    assert bool(python) is (page.name not in WITHOUT_A_DAG), (
        f'{page.name}: a how-to guide shows its DAG: include an example DAG (--8<-- "example_dags/...")'
    )
    for lang, body in blocks:
        assert lang, f"{page.name}: a code block without a language (Python must be an include)"
        if lang not in ("python", "py", "python3", "pycon"):
            continue
        lines = [line for line in body if line.strip()]
        assert lines and all(INCLUDE.match(line) for line in lines), (
            f"{page.name}: a Python block written inline; put it in an example DAG under example_dags/ and "
            f'include it with --8<-- "example_dags/<file>.py"'
        )
        for line in lines:
            path = INCLUDE.match(line)["path"]  # type: ignore[index]
            assert path.startswith("example_dags/") and path.endswith(".py"), f"{page.name}: {path}"


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_every_included_file_exists(page):
    missing = [path for path in includes(page) if not (REPO / path).is_file()]
    assert not missing, f"{page.relative_to(DOCS)} includes files that do not exist: {missing}"


def test_every_example_dag_is_shown_in_the_docs():
    shown = {path for page in DOC_PAGES for path in includes(page)}
    examples = {f"example_dags/{f.name}" for f in EXAMPLES.glob("*.py")}
    assert examples - shown == set(), "example DAGs that no page of docs/ includes"


def test_every_example_dag_parses():
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 2.11
        from airflow.models.dagbag import DagBag

    bag = DagBag(dag_folder=str(EXAMPLES))
    assert bag.import_errors == {}
    assert {f.stem for f in EXAMPLES.glob("*.py")} <= set(bag.dag_ids)  # each file holds the DAG it is named for
