"""``python -m airflow_gpumarket``: the ``airflow gpumarket`` commands, for an Airflow CLI without them (before 3.2)."""

from __future__ import annotations

import sys

from airflow_gpumarket.commands.definition import build_parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
