"""``python -m airflow_gpumarket``: the ``airflow gpumarket`` commands where Airflow's CLI does not list them (2.11)."""

from __future__ import annotations

import sys

from airflow_gpumarket.commands.definition import build_parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
