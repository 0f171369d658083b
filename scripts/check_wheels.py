"""`make test-wheel`: check that each built wheel holds only its own package, as installed in a clean venv.

Run by the clean venv's Python, outside the checkout, with the two wheel files as arguments.
"""

from __future__ import annotations

import re
import sys
import zipfile
from importlib.metadata import requires
from pathlib import Path

PROVIDER = "airflow-provider-gpumarket"
#: The simulator's server: installing the provider alone must not pull it in.
SERVER_REQUIREMENTS = ("fastapi", "uvicorn")
#: Each wheel's own top-level package and dist-info folder.
PACKAGES = {"airflow_provider_gpumarket": "airflow_gpumarket", "gpumarket_simulator": "gpumarket_simulator"}
#: Top-level modules a wheel holds beside its package: the provider's, for Airflow's example DAG discovery.
MODULES = {"airflow_provider_gpumarket": ("airflow_provider_gpumarket.py",), "gpumarket_simulator": ()}


def problems(wheel: Path) -> list[str]:
    """What in ``wheel`` lies outside its own package and dist-info (and, in the provider's, any simulator)."""
    dist = wheel.name.split("-")[0]
    package = PACKAGES[dist]
    names = zipfile.ZipFile(wheel).namelist()
    found = [
        f"{wheel.name}: {name} is not part of {package}"
        for name in names
        if not name.startswith((f"{package}/", f"{dist}-")) and name not in MODULES[dist]
    ]
    if package == "airflow_gpumarket":
        found += [f"{wheel.name}: {name} is simulator code" for name in names if "simulator" in name]
    return found


def main(wheels: list[str]) -> int:
    found = [problem for wheel in wheels for problem in problems(Path(wheel))]
    found += [f"no {dist} wheel given" for dist in set(PACKAGES) - {Path(w).name.split("-")[0] for w in wheels}]
    names = {re.split(r"[ ;<>=!~\[]", r, maxsplit=1)[0].lower() for r in requires(PROVIDER) or []}
    found += [f"{PROVIDER} requires {name}" for name in SERVER_REQUIREMENTS if name in names]
    for problem in found:
        print(problem, file=sys.stderr)
    if not found:
        print(f"wheels hold their own packages only; {PROVIDER} requires neither FastAPI nor uvicorn")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
