"""Count what a reader follows from a deferrable RunJob to ``defer()``: file switches, files and functions.

The service is mocked (requests-mock: one offer, one create); every call into the provider's own code is recorded,
and a hop is a call or return that lands in another file than the one before it. A module's first import runs its
body, which is no hop a reader follows: those hops are counted apart ("import hops"), and what runs inside an import
is left out of the path. Printed for the trace from construction and from ``execute``: the hops among all of the
provider's files and among ``airflow_gpumarket/operators/`` files, and the distinct functions run (``--functions``
lists those of ``execute``, in the order first run). Run it on another tree (``PYTHONPATH=<tree>``) for its figures
before a change.

    python bench/trace_hops.py [--functions]
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import requests_mock

BASE = "https://api.example.com"
PACKAGE = Path(__import__("airflow_gpumarket").__file__).parent


def _mock_service(mocker: requests_mock.Mocker) -> None:
    from airflow_gpumarket import api

    offer = {"id": 7, "dph_total": 0.5, "gpu_name": "RTX 4090", "num_gpus": 1, "machine_id": 70}
    mocker.post(BASE + api.PATH_SEARCH_OFFERS, json={"offers": [offer]})
    mocker.put(BASE + api.PATH_CREATE_INSTANCE.format(offer_id=7), json={"success": True, "new_contract": 1001})
    mocker.get(BASE + api.PATH_CURRENT_USER, json={"id": 1, "credit": 100.0})  # the budget's credit check


def trace(module: str) -> tuple[list[str], list[str], int]:
    """The provider's files and functions, in the order a deferrable RunJob's code runs through them; where
    ``execute`` starts (an index of both lists). A module body's entries are named ``<module>``, and what runs
    inside it is left out."""
    os.environ["AIRFLOW_CONN_GPUMARKET_DEFAULT"] = json.dumps(
        {"conn_type": "gpumarket", "host": BASE, "password": "trace-key-0123456789"}
    )
    from airflow_gpumarket._compat import TaskDeferred

    logging.disable(logging.CRITICAL)  # the task's log lines (and the ledger's fallback) are not the trace's output

    operator_class = importlib.import_module(module).GpuMarketRunJobOperator

    files: list[str] = []
    functions: list[str] = []
    executed = 0
    importing: list[object] = []  # the module bodies running now, outermost first

    def profile(frame, event, arg):  # noqa: ARG001 - the profiler's signature
        if frame.f_code.co_name == "<module>" and event in ("call", "return"):
            if event == "call":
                importing.append(frame)
                if len(importing) == 1 and frame.f_code.co_filename.startswith(str(PACKAGE)):
                    name = os.path.relpath(frame.f_code.co_filename, PACKAGE.parent)
                    files.append(name)
                    functions.append(f"{name}:<module>")
            elif importing and importing[-1] is frame:
                importing.pop()
            return
        if importing:
            return
        now = frame if event == "call" else frame.f_back if event == "return" else None
        if now is not None and now.f_code.co_filename.startswith(str(PACKAGE)):
            name = os.path.relpath(now.f_code.co_filename, PACKAGE.parent)
            files.append(name)
            functions.append(f"{name}:{getattr(now.f_code, 'co_qualname', now.f_code.co_name)}")

    context = {"run_id": "run-1", "ti": SimpleNamespace(try_number=1, map_index=-1, start_date=datetime.now(UTC))}
    with requests_mock.Mocker() as mocker:
        _mock_service(mocker)
        sys.setprofile(profile)
        try:
            operator = operator_class(
                task_id="job",
                command="python train.py",
                offer_filters={"num_gpus": {"gte": 1}},
                image="img",
                deferrable=True,
            )
            executed = len(files)
            operator.execute(context)
        except TaskDeferred:
            pass
        finally:
            sys.setprofile(None)
    return files, functions, executed


def _runs(files: list[str]) -> list[str]:
    return [name for i, name in enumerate(files) if i == 0 or files[i - 1] != name]


def _hops(files: list[str], functions: list[str]) -> tuple[int, int]:
    """The switches among ``files`` without the imports, and those the imports add."""
    called = [file for file, function in zip(files, functions, strict=True) if not function.endswith(":<module>")]
    return len(_runs(called)) - 1, (len(_runs(files)) - 1) - (len(_runs(called)) - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default="airflow_gpumarket.operators.run_job", help="where the operator lives")
    parser.add_argument("--functions", action="store_true", help="list the functions run from execute")
    args = parser.parse_args()
    files, functions, executed = trace(args.module)
    for start, part, called in (
        ("construction", files, functions),
        ("execute", files[executed:], functions[executed:]),
    ):
        hops, import_hops = _hops(part, called)
        inside = [(f, c) for f, c in zip(part, called, strict=True) if f.startswith("airflow_gpumarket/operators/")]
        operator_hops, operator_import_hops = _hops([f for f, _ in inside], [c for _, c in inside])
        print(
            f"from {start} to defer(): {hops} hops among {len(set(part))} provider files (+{import_hops} import "
            f"hops); {operator_hops} hops among {len({f for f, _ in inside})} operator files (+{operator_import_hops} "
            f"import hops); {len(set(called))} functions"
        )
        read = {}
        for name in dict.fromkeys(called):
            if name.startswith("airflow_gpumarket/operators/") and not name.endswith(">"):
                file = name.split(":")[0].removeprefix("airflow_gpumarket/operators/")
                read[file] = read.get(file, 0) + 1
        print("  functions read per operator file:", ", ".join(f"{file} {n}" for file, n in sorted(read.items())))
    if args.functions:
        print("functions run from execute, in the order first run:")
        for name in dict.fromkeys(functions[executed:]):
            print("  " + name)


if __name__ == "__main__":
    main()
