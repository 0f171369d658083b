"""P4 for two trees of the provider in one sitting: an older checkout against this one, alternating.

    git worktree add /tmp/before <rev>
    .venv/bin/python bench/p4_side_by_side.py --before /tmp/before --rounds 3

Each round runs ``bench_provider.p4_parse_time`` once with the older tree first on ``PYTHONPATH`` and once with
this one, from a folder outside both (a child's working directory would otherwise come first on its path).
``--before-module`` names where the older tree keeps ``GpuMarketRunJobOperator``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ROUND = """
import sys
sys.path.insert(0, {bench!r})
import bench_provider as b
module, dag = b.P4_DAGS["GpuMarketRunJobOperator"]
if {module!r} != module:
    b.P4_DAGS["GpuMarketRunJobOperator"] = ({module!r}, dag.replace(module, {module!r}))
    b.IMPORTS = "\\n".join(
        "import " + {module!r} if line.startswith("import airflow_gpumarket.operators") else line
        for line in b.IMPORTS.splitlines()
    )
b.p4_parse_time(runs={runs}, warm_runs=5, peers_python={peers!r})
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="an older checkout of this repository")
    parser.add_argument("--before-module", default="airflow_gpumarket.operators.instances")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5, help="p4_parse_time's runs per round and tree")
    parser.add_argument("--peers-python", default=str(ROOT / ".airflow/bench/peers/bin/python"))
    args = parser.parse_args()
    trees = (("before", Path(args.before).resolve(), args.before_module), ("now", ROOT, None))
    for round_number in range(1, args.rounds + 1):
        for name, tree, module in trees:
            code = ROUND.format(
                bench=str(HERE),
                module=module or "airflow_gpumarket.operators.run_job",
                runs=args.runs,
                peers=args.peers_python,
            )
            env = {"AIRFLOW_HOME": str(ROOT / ".airflow/bench"), **os.environ, "PYTHONPATH": str(tree)}
            print(f"== {name}, round {round_number}", flush=True)
            subprocess.run([sys.executable, "-c", code], env=env, cwd="/", check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
