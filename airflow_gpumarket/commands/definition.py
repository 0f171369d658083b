"""The commands' names, help and options, written once for both entry points.

``get_gpumarket_cli_commands`` hands them to Airflow 3.2+'s CLI (the provider info's ``cli`` entry); ``build_parser``
makes the ``python -m airflow_gpumarket`` parser of the fallback (Airflow 2.11, 3.0, 3.1). Airflow imports this module
every time its CLI starts, so it imports only the standard library (and, in ``get_gpumarket_cli_commands``, Airflow's
CLI classes).
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass, field
from typing import Any

#: The group's name under ``airflow``.
GROUP = "gpumarket"
GROUP_HELP = "GPU Market: check a connection, list rentals and orphans, read spend"
#: The connection the commands use when ``--conn-id`` is not given (``GpuMarketHook.default_conn_name``).
DEFAULT_CONN_ID = "gpumarket_default"


@dataclass(frozen=True)
class Option:
    """One option: its flags and the keyword arguments of ``argparse``'s ``add_argument``."""

    flags: tuple[str, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Command:
    """One command: ``func`` (``module:function``, imported when the command runs) takes the parsed arguments."""

    name: str
    help: str
    func: str
    options: tuple[Option, ...] = ()


CONN_ID = Option(
    ("--conn-id",),
    {"default": DEFAULT_CONN_ID, "help": f"the gpumarket connection to use (default {DEFAULT_CONN_ID})"},
)
CONN_IDS = Option(
    ("--conn-id",),
    {
        "default": None,
        "help": "the gpumarket connection to read (default: those of the GPU rentals page, [gpumarket] "
        "ui_connections, else every connection of type gpumarket)",
    },
)

COMMANDS: tuple[Command, ...] = (
    Command(
        "doctor",
        "Check a connection end to end: URL and TLS, the key, credit, integrations, clock, rate limits, versions",
        "airflow_gpumarket.commands.doctor:doctor",
        (CONN_ID,),
    ),
    Command(
        "rentals",
        "List this deployment's live rentals with their DAG, run, task and cost so far",
        "airflow_gpumarket.commands.rentals:rentals",
        (CONN_IDS,),
    ),
    Command(
        "orphans",
        "List the instances no running task owns (by label and record); destroy them with --destroy",
        "airflow_gpumarket.commands.rentals:orphans",
        (
            CONN_IDS,
            Option(("--destroy",), {"action": "store_true", "help": "destroy them, after a confirmation"}),
            Option(("-y", "--yes"), {"action": "store_true", "help": "do not ask for the confirmation (scripts)"}),
        ),
    ),
    Command(
        "hosts",
        "List the machines renting tasks avoid after they failed (host memory); forget them with --clear",
        "airflow_gpumarket.commands.hosts:hosts",
        (
            CONN_ID,
            Option(("--clear",), {"type": int, "metavar": "MACHINE_ID", "help": "forget this machine"}),
            Option(("--clear-all",), {"action": "store_true", "help": "forget every machine of this account"}),
        ),
    ),
    Command(
        "budgets",
        "Each DAG's budgets (the gpumarket_budgets Variable) with what is spent, reserved and left in this window",
        "airflow_gpumarket.commands.budgets:budgets_command",
        (CONN_IDS,),
    ),
    Command(
        "offers",
        "The offers a filter (or a DAG's renting task) would rent: price, worst case, whether the budget allows it",
        "airflow_gpumarket.commands.offers:offers",
        (
            CONN_ID,
            Option(
                ("--filters",),
                {"metavar": "JSON", "help": 'offer_filters as JSON, e.g. \'{"gpu_name": {"eq": "RTX 4090"}}\''},
            ),
            Option(("--dag",), {"metavar": "DAG_ID", "help": "take the arguments of a renting task of this DAG"}),
            Option(("--task",), {"metavar": "TASK_ID", "help": "the renting task (with --dag)"}),
            Option(
                ("--max-runtime",),
                {"type": float, "metavar": "MINUTES", "help": "the job's time limit, for the worst case (no --task)"},
            ),
            Option(("--limit",), {"type": int, "default": 10, "help": "offers shown at most (default 10)"}),
        ),
    ),
    Command(
        "spend",
        "What the service charged today (--day, the default) or this month (--month), per DAG and team",
        "airflow_gpumarket.commands.spend:spend",
        (
            CONN_ID,
            # Flags, not one option with choices: Airflow's ``Arg`` takes no ``const``.
            Option(("--day",), {"action": "store_true", "help": "today, from 00:00 UTC (the default)"}),
            Option(("--month",), {"action": "store_true", "help": "this month, from its first day 00:00 UTC"}),
        ),
    ),
)


def run(func: str, args: argparse.Namespace) -> Any:
    """Import the command's function and run it with the parsed arguments."""
    module, _, name = func.partition(":")
    return getattr(importlib.import_module(module), name)(args)


def _runner(command: Command) -> Any:
    def runner(args: argparse.Namespace) -> Any:
        return run(command.func, args)

    runner.__name__ = command.name
    return runner


def get_gpumarket_cli_commands() -> list[Any]:
    """The ``airflow gpumarket`` group, for Airflow 3.2+'s CLI (the provider info's ``cli`` entry)."""
    from airflow.cli.cli_config import ActionCommand, Arg, GroupCommand

    subcommands = []
    for command in COMMANDS:
        args = [Arg(option.flags, **option.kwargs) for option in command.options]
        subcommands.append(ActionCommand(name=command.name, help=command.help, func=_runner(command), args=args))
    return [GroupCommand(name=GROUP, help=GROUP_HELP, subcommands=subcommands)]


def build_parser(prog: str = "python -m airflow_gpumarket") -> argparse.ArgumentParser:
    """The same commands as one ``argparse`` parser (the fallback where Airflow's CLI does not list them)."""
    parser = argparse.ArgumentParser(prog=prog, description=GROUP_HELP)
    subparsers = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
    for command in COMMANDS:
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help)
        for option in command.options:
            sub.add_argument(*option.flags, **option.kwargs)
        sub.set_defaults(func=_runner(command))
    return parser
