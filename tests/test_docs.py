"""The docs cannot rot: their code comes from example DAG files that the test suite parses.

- The README's DAG is the whole of ``example_dags/example_gpumarket_quickstart.py``.
- Every Python block of a how-to guide (``docs/howto/``) is a whole example DAG file, written there by
  ``scripts/docs_examples.py`` after its marker, never code written inline; the page reads the same on GitHub.
- Every shown file exists and its block is up to date, and every example DAG is shown somewhere in the docs.
- Every example DAG file parses without import errors.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
EXAMPLES = REPO / "example_dags"
QUICKSTART = EXAMPLES / "example_gpumarket_quickstart.py"
MARKER = re.compile(r"^<!-- (?P<path>[^ ]+): written by scripts/docs_examples\.py -->$")
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


def shown(page: Path) -> list[str]:
    """The example DAG files a page shows, by the markers before their blocks."""
    return [m["path"] for line in page.read_text().splitlines() if (m := MARKER.match(line))]


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
def test_every_python_block_of_a_how_to_guide_is_an_example_dag_shown_whole(page):
    blocks = code_blocks(page.read_text())
    python = [body for lang, body in blocks if lang in ("python", "py", "python3", "pycon")]
    assert bool(python) is (page.name not in WITHOUT_A_DAG), f"{page.name}: a how-to guide shows its example DAG"
    assert all(lang for lang, _ in blocks), f"{page.name}: a code block without a language"
    lines = page.read_text().splitlines()
    for i, line in enumerate(lines):
        opening = FENCE.match(line)
        if opening and opening["lang"] in ("python", "py", "python3", "pycon"):
            assert i and MARKER.match(lines[i - 1]), (
                f"{page.name}, line {i + 1}: a Python block written inline; put it in an example DAG under "
                "example_dags/, name it in a marker line before the block and run python scripts/docs_examples.py"
            )
    assert len(shown(page)) == len(python)


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_every_shown_file_is_an_example_dag_that_exists(page):
    missing = [path for path in shown(page) if not (path.startswith("example_dags/") and (REPO / path).is_file())]
    assert not missing, f"{page.relative_to(DOCS)} shows files that are not example DAGs: {missing}"


def test_every_shown_example_dag_is_the_files_content():
    script = REPO / "scripts" / "docs_examples.py"
    checked = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_example_dag_is_shown_in_the_docs():
    on_pages = {path for page in DOC_PAGES for path in shown(page)}
    examples = {f"example_dags/{f.name}" for f in EXAMPLES.glob("*.py")}
    assert examples - on_pages == set(), "example DAGs that no page of docs/ shows"


def test_every_example_dag_parses():
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 2.11
        from airflow.models.dagbag import DagBag

    bag = DagBag(dag_folder=str(EXAMPLES))
    assert bag.import_errors == {}
    assert {f.stem for f in EXAMPLES.glob("*.py")} <= set(bag.dag_ids)  # each file holds the DAG it is named for
