"""Count the file switches a reader makes following a deferrable RunJob to ``defer()``.

The service is mocked (requests-mock: one offer, one create); every call into the provider's own code is recorded,
and a hop is a call or return that lands in another file than the one before it. Printed for the trace from
construction and from ``execute``: the hops among all of the provider's files, and among
``airflow_gpumarket/operators/`` files.

    python bench/trace_hops.py
"""

from __future__ import annotations

import argparse
import importlib
import json
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


def trace(module: str) -> tuple[list[str], int]:
    """The provider's files, in the order a deferrable RunJob's code runs through them; where ``execute`` starts."""
    os.environ["AIRFLOW_CONN_GPUMARKET_DEFAULT"] = json.dumps(
        {"conn_type": "gpumarket", "host": BASE, "password": "trace-key-0123456789"}
    )
    from airflow_gpumarket._compat import TaskDeferred

    operator_class = importlib.import_module(module).GpuMarketRunJobOperator

    files: list[str] = []
    executed = 0

    def profile(frame, event, arg):  # noqa: ARG001 - the profiler's signature
        now = frame if event == "call" else frame.f_back if event == "return" else None
        if now is not None and now.f_code.co_filename.startswith(str(PACKAGE)):
            files.append(os.path.relpath(now.f_code.co_filename, PACKAGE.parent))

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
    return files, executed


def _runs(files: list[str]) -> list[str]:
    return [name for i, name in enumerate(files) if i == 0 or files[i - 1] != name]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default="airflow_gpumarket.operators.run_job", help="where the operator lives")
    files, executed = trace(parser.parse_args().module)
    for start, part in (("construction", files), ("execute", files[executed:])):
        path = _runs(part)
        operators = _runs([name for name in path if name.startswith("airflow_gpumarket/operators/")])
        print(
            f"from {start} to defer(): {len(path) - 1} hops among {len(set(path))} provider files; "
            f"{len(operators) - 1} hops among {len(set(operators))} operator files"
        )
        print(
            "  operator files:", ", ".join(sorted({n.removeprefix("airflow_gpumarket/operators/") for n in operators}))
        )


if __name__ == "__main__":
    main()
