"""Write the docs' table of creation fields from ``api.CREATION_FIELDS``, the one place that names them.

python scripts/readme_fields.py          # rewrite the table in docs/reference/creation-fields.md
python scripts/readme_fields.py --check  # exit 1 if the table is out of date (a test runs this)
"""

from __future__ import annotations

import sys
from pathlib import Path

from airflow_gpumarket import api
from airflow_gpumarket.creation import CREATION_DEFAULTS

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "creation-fields.md"
START, END = "<!-- creation fields: written by scripts/readme_fields.py -->", "<!-- end of creation fields -->"


def table() -> str:
    rows = ["| Field | What it is | Default |", "|---|---|---|"]
    for field in api.CREATION_FIELDS:
        default = f"`{CREATION_DEFAULTS[field.name]!r}`" if field.name in CREATION_DEFAULTS else "not sent"
        rows.append(f"| `{field.name}` | {field.doc} | {default} |")
    return "\n".join(rows)


def with_table(text: str) -> str:
    head, found, rest = text.partition(START)
    _, found_end, tail = rest.partition(END)
    if not (found and found_end):
        raise SystemExit(f"{PAGE.name} lacks the markers {START} ... {END}")
    return f"{head}{START}\n{table()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    text = PAGE.read_text()
    wanted = with_table(text)
    if "--check" in argv:
        if wanted != text:
            print(f"{PAGE.name}'s table of creation fields is out of date: run python scripts/readme_fields.py")
            return 1
        return 0
    PAGE.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
