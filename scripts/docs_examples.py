"""Write each example DAG into the docs pages that show it, so a page reads whole on GitHub as on the site.

python scripts/docs_examples.py          # rewrite every block that follows an example marker
python scripts/docs_examples.py --check  # exit 1 if a block differs from its file (a test runs this)

A page shows an example DAG as a marker line, then a Python block holding the whole file::

    <!-- example_dags/example_gpumarket_run_job.py: written by scripts/docs_examples.py -->
    ```python
    ...
    ```
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
MARKER = re.compile(r"^<!-- (?P<path>example_dags/[A-Za-z0-9_]+\.py): written by scripts/docs_examples\.py -->$")
FENCE = "```"


def examples(text: str) -> list[str]:
    """The example DAG files a page's markers name, in order."""
    return [m["path"] for line in text.splitlines() if (m := MARKER.match(line))]


def written(text: str, page: str) -> str:
    """``text`` with the block after each marker replaced by its file's content."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        out.append(lines[i])
        marker = MARKER.match(lines[i])
        i += 1
        if not marker:
            continue
        if i >= len(lines) or lines[i] != FENCE + "python":
            raise SystemExit(f"{page}: the marker for {marker['path']} must be followed by a ```python block")
        try:
            end = lines.index(FENCE, i + 1)
        except ValueError:
            raise SystemExit(f"{page}: the block after the marker for {marker['path']} never closes") from None
        source = REPO / marker["path"]
        if not source.is_file():
            raise SystemExit(f"{page}: {marker['path']} does not exist; fix the marker's path")
        out += [FENCE + "python", *source.read_text().splitlines(), FENCE]
        i = end + 1
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def main(argv: list[str]) -> int:
    stale = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        wanted = written(text, str(page.relative_to(REPO)))
        if wanted == text:
            continue
        if "--check" in argv:
            stale.append(str(page.relative_to(REPO)))
        else:
            page.write_text(wanted)
    if stale:
        pages = ", ".join(stale)
        print(f"Example DAGs differ from the docs that show them ({pages}): run python scripts/docs_examples.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
