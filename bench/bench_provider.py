"""P2-P5, P10 and P11: API calls per lifecycle, GPU seconds billed after the job, DAG parse time, hook overhead,
what an interruptible job costs against on-demand, and how soon a restored checkpoint reaches the job.

Every figure is measured against the embedded simulator, side by side with its baseline in one run, and printed
as ``NAME: value (goal: ...)``; timings are medians of repeated runs.

    python bench/bench_provider.py [--quick]

``--quick`` is a smoke run (about 25 s, P11 30 s more): the same code paths with tiny sizes (one run of each, a
faster clock in P2, a 1 s poke in P3, 100 calls in P5) and the same lines; it fails on an error, never on a missed
goal.

Stdout carries the figure lines only. Airflow 3 prints every operator's and hook's log line on stdout, so those
lines, the in-process simulators' and P5's ``gpumarket-sim`` go to ``bench_provider.log`` in ``$AIRFLOW_HOME``
(a temporary folder without it); stderr keeps what went wrong. An exception ends the run with a non-zero status.

Profiles, each chosen on purpose: P2, P3 and P5 run the simulator's ``live`` profile (the service as it answers
today, which the provider is built for) with its per-endpoint buckets off. None of them measures pacing (P1 does):
P2 counts the calls of one lifecycle, which a refused call and its retry would inflate; P3 reads billed seconds
from the simulator's ledger; P5 compares client overhead, and the buckets would refuse most of its 1000 reads.
P4 starts no simulator.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TextIO

import requests

from gpumarket_simulator import MarketSimulator

#: The account's credit in dollars: enough that the simulator's $0 stop never cuts a measurement short.
BENCH_CREDIT = 1e9
#: MarketSimulator arguments of P2 and P3: the live profile with its buckets off (see the module docstring).
SIM_PROFILE = {"profile": "live", "rate_limits": False, "credit": BENCH_CREDIT}
#: The same for P5's ``gpumarket-sim`` process.
SIM_PROFILE_ARGS = ["--profile", "live", "--no-rate-limits", "--credit", str(BENCH_CREDIT)]


def route_logs_to(path: Path) -> TextIO:
    """Send Airflow's log output (structlog, and the standard library's loggers through it) to ``path``."""
    stream = path.open("w", encoding="utf-8")
    try:
        from airflow.sdk.log import configure_logging
    except ImportError:  # Airflow 2: the standard library's logging only
        import logging

        logging.basicConfig(stream=stream, level=logging.INFO, force=True)
    else:
        configure_logging(output=stream, colored_console_log=False)
    return stream


def run_child(args: list[str], env: dict[str, str] | None = None, python: str = sys.executable) -> dict | list:
    """Run a Python child; the JSON document on the last line of its stdout. Fails loudly, stderr included."""
    out = subprocess.run([python, *args], capture_output=True, text=True, env=env)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        tail = "\n".join(out.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"child {args[:2]} failed (exit status {out.returncode}):\n{tail}")
    return json.loads(lines[-1])


def instance_record(sim: MarketSimulator, instance_id: int) -> dict:
    """The simulator's admin view of one instance: timestamps and the billing ledger (simulated seconds)."""
    return next(i for i in sim.state()["instances"] if i["id"] == instance_id)


def context(run_id: str) -> dict:
    return {"run_id": run_id, "ti": SimpleNamespace(try_number=1, map_index=-1)}


def connect(sim: MarketSimulator) -> None:
    conn = json.loads(sim.connection_env()["AIRFLOW_CONN_GPUMARKET_DEFAULT"])
    conn["extra"] = {**conn.get("extra", {}), "retry_min_wait": 0.05, "retry_max_wait": 0.5}  # + rate_limit_scale
    os.environ["AIRFLOW_CONN_GPUMARKET_DEFAULT"] = json.dumps(conn)


# --- P2 ----------------------------------------------------------------------------------------------------
def p2_calls_per_lifecycle(runs: int, speed: float = 60.0, job_seconds: float = 3.0) -> None:
    """Requests made with the account key by one GpuMarketRunJobOperator, vs the minimum any client needs:
    1 search + 1 create + ceil(boot / interval) + ceil(job / interval) polls + 1 read of the final log + 1 destroy
    + 1 read of the instance's charge (what the task says the rental cost: no other answer carries it).

    The job runs from the instance's first ``running`` to the wrapper's stop: the ledger's compute seconds. The
    log read is the one that gives the exit status (the job's output and its status line come from the log)."""
    from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

    interval = 1.0
    # The simulator's buckets are off here (SIM_PROFILE), so its connection says rate_limit_scale=0: no call waits
    # for a budget's slot, and the poll interval alone sets how often the wait reads.
    for deferrable in (False, True):
        ratios, calls = [], []
        for run in range(runs):
            with MarketSimulator(speed=speed, seed=run, execute_onstart=True, **SIM_PROFILE) as sim:
                connect(sim)
                op = GpuMarketRunJobOperator(
                    task_id="p2",
                    offer_filters={"reliability": {"gte": 0.99}},
                    image="bench",
                    command=f"sleep {job_seconds:g}",
                    poll_interval=interval,
                    deferrable=deferrable,
                )
                ctx = context(f"p2-{run}")
                made = _run_deferred(op, ctx) if deferrable else op.execute(ctx)
                instance = instance_record(sim, made["instance_id"])
                if instance["actual_status"] != "stopped" or not instance["destroyed"]:
                    raise RuntimeError(f"P2: the job did not end by the wrapper's stop then a destroy: {instance}")
                account_calls = [r for r in sim.requests() if r["key"] == "account"]
                boot = (instance["first_running_at"] - instance["created_at"]) / speed
                job = instance["compute_seconds"] / speed
                minimum = 5 + math.ceil(boot / interval) + math.ceil(job / interval)
                calls.append(len(account_calls))
                ratios.append(len(account_calls) / minimum)
        mode = "deferrable" if deferrable else "sync"
        print(
            f"P2 API calls per RunJob lifecycle ({mode}): median {statistics.median(calls):g} calls, "
            f"{statistics.median(ratios):.2f}x the minimum (goal: <= 1.1x)"
        )


def _run_deferred(op, ctx: dict) -> dict:
    """execute() until it defers, run the trigger in an event loop (as the triggerer would), then resume."""
    import asyncio

    from airflow_gpumarket._compat import TaskDeferred

    try:
        return op.execute(ctx)
    except TaskDeferred as deferral:
        deferred = deferral
    trigger = deferred.trigger

    async def first_event():
        async for event in trigger.run():
            return event.payload

    event = asyncio.run(first_event())
    return getattr(op, deferred.method_name)(ctx, event=event, **(deferred.kwargs or {}))


# --- P3 ----------------------------------------------------------------------------------------------------
def _job(seconds: float) -> str:
    return f"sleep {seconds:g}; python3 -c 'import time; print(\"JOB_END\", repr(time.time()))'"


def _job_end(output: str) -> float:
    return float(next(line.split()[1] for line in output.splitlines() if line.startswith("JOB_END")))


def _slow_clock_once_running(sim: MarketSimulator, offsets: dict) -> threading.Thread:
    """Boot at 600x, then run the job at 1x so billed seconds are real seconds; remember sim - real offset."""

    def watch() -> None:
        while True:
            running = [i for i in sim.state()["instances"] if i["first_running_at"] is not None]
            if running:
                sim.set_speed(1.0)
                offsets["sim_minus_real"] = sim.now() - time.time()
                return
            time.sleep(0.005)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _billing_after_job(instance: dict, job_end: float) -> tuple[float, float]:
    """(compute-billed seconds after ``job_end``, storage-only seconds after compute billing ended), from the
    simulator's ledger. The instance runs once, from ``first_running_at`` until its stop or destroy, so compute
    billing ends at ``first_running_at + compute_seconds``; storage bills from creation to the destroy, so what it
    billed beyond the boot and the compute seconds is the stretch from the stop to the destroy."""
    compute_end = instance["first_running_at"] + instance["compute_seconds"]
    boot = instance["first_running_at"] - instance["created_at"]
    storage_only_after = instance["storage_seconds"] - boot - instance["compute_seconds"]
    if abs(storage_only_after) < 1e-6:  # destroyed while running: zero, up to the float sums' rounding
        storage_only_after = 0.0
    return compute_end - job_end, storage_only_after


def p3_billed_after_last_command(runs: int, pattern_interval: float, job_seconds: float = 2.0) -> None:
    """Billed seconds after the job's last command, from the simulator's ledger: compute (GPU) seconds until
    compute billing ended (the wrapper's stop, or the destroy), and storage-only seconds from that stop to the
    destroy, for the completion protocol and for a sensor (poke ``pattern_interval``) + teardown task."""
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
    from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
    from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

    compute: dict[str, list[float]] = {"protocol": [], "pattern": []}
    storage: dict[str, list[float]] = {"protocol": [], "pattern": []}
    job = _job(job_seconds)
    for run in range(runs):
        for kind in ("protocol", "pattern"):
            with MarketSimulator(speed=600, seed=run, execute_onstart=True, **SIM_PROFILE) as sim:
                connect(sim)
                offsets: dict = {}
                watcher = _slow_clock_once_running(sim, offsets)
                filters = {"reliability": {"gte": 0.99}}
                if kind == "protocol":  # the wrapper stops the instance; the operator reads the log, then destroys
                    made = GpuMarketRunJobOperator(
                        task_id="p3", offer_filters=filters, image="bench", command=job, poll_interval=1.0
                    ).execute(context(f"p3-{run}"))
                else:  # the job marks completion; a sensor pokes for it; a teardown task destroys
                    marker = Path(tempfile.mkdtemp()) / "done"
                    made = GpuMarketCreateInstanceOperator(
                        task_id="p3",
                        offer_filters=filters,
                        image="bench",
                        onstart=f"{job}; touch {marker}",
                        poll_interval=0.05,
                    ).execute(context(f"p3-{run}"))
                    while not marker.exists():
                        time.sleep(pattern_interval)
                    GpuMarketHook().destroy_instance(made["instance_id"])
                watcher.join(timeout=30)
                instance = instance_record(sim, made["instance_id"])
                expected_end = "stopped" if kind == "protocol" else "running"
                if instance["actual_status"] != expected_end or not instance["destroyed"]:
                    raise RuntimeError(f"P3 {kind}: expected {expected_end!r} then destroyed, got {instance}")
                result = sim.onstart_result(made["instance_id"]) or {}
                job_end_sim = _job_end(result.get("output", "")) + offsets["sim_minus_real"]
                after_job, storage_only = _billing_after_job(instance, job_end_sim)
                compute[kind].append(after_job)
                storage[kind].append(storage_only)
    mine, theirs = statistics.median(compute["protocol"]), statistics.median(compute["pattern"])
    print(
        f"P3 GPU-billed seconds after the job's last command: completion protocol {mine:.3f} s (until its stop), "
        f"sensor (poke {pattern_interval:g} s) + teardown pattern {theirs:.2f} s (until the destroy), "
        f"{theirs / max(mine, 1e-3):.0f}x less (goal: <= 1 s and >= 10x less)"
    )
    print(
        f"P3 storage-only seconds from the stop to the destroy (disk, no goal): completion protocol "
        f"{statistics.median(storage['protocol']):.2f} s (the final log read), sensor + teardown pattern "
        f"{statistics.median(storage['pattern']):.2f} s (never stopped)"
    )


# --- P4 ----------------------------------------------------------------------------------------------------
#: The same 20-task DAG written with each operator: (module imported, DAG source).
P4_DAGS = {
    "BashOperator": (
        "airflow.providers.standard.operators.bash",
        """
        from datetime import datetime
        from airflow.sdk import DAG
        from airflow.providers.standard.operators.bash import BashOperator
        with DAG("p4", start_date=datetime(2026, 1, 1), schedule=None):
            for i in range(20):
                BashOperator(task_id=f"job_{i}", bash_command=f"python train.py --shard {i}", env={"SHARD": str(i)})
        """,
    ),
    "KubernetesPodOperator": (
        "airflow.providers.cncf.kubernetes.operators.pod",
        """
        from datetime import datetime
        from airflow.sdk import DAG
        from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
        with DAG("p4", start_date=datetime(2026, 1, 1), schedule=None):
            for i in range(20):
                KubernetesPodOperator(task_id=f"job_{i}", name=f"job-{i}", image="img",
                                      cmds=["python", "train.py", "--shard", str(i)], env_vars={"SHARD": str(i)})
        """,
    ),
    "GpuMarketRunJobOperator": (
        "airflow_gpumarket.operators.run_job",
        """
        from datetime import datetime
        from airflow.sdk import DAG
        from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator
        with DAG("p4", start_date=datetime(2026, 1, 1), schedule=None):
            for i in range(20):
                GpuMarketRunJobOperator(task_id=f"job_{i}", offer_filters={"num_gpus": {"gte": 1}}, image="img",
                                        command=f"python train.py --shard {i}", env={"SHARD": str(i)})
        """,
    ),
}
#: One child per operator and round: the first parse (the operator's module imported, then the file parsed, as
#: the DAG processor does with [dag_processor] parsing_pre_import_modules), then the warm parses that follow.
PARSE_ONE = """
import importlib, json, statistics, sys, time
import airflow.sdk, airflow.dag_processing.dagbag as d
module, folder, warm_runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
t = time.perf_counter()
importlib.import_module(module)
imported = time.perf_counter() - t
def parse():
    t = time.perf_counter()
    bag = d.DagBag(dag_folder=folder)
    elapsed = time.perf_counter() - t
    assert not bag.import_errors and len(bag.dags["p4"].tasks) == 20, bag.import_errors
    return elapsed
first = imported + parse()
warm = statistics.median(parse() for _ in range(warm_runs))
print(json.dumps({"first": first, "warm": warm}))
"""
IMPORTS = """
import json, sys
import airflow.sdk
before = set(sys.modules)
import airflow_gpumarket.operators.run_job, airflow_gpumarket.operators.create_instance
import airflow_gpumarket.sensors.instances
print(json.dumps(sorted(m for m in set(sys.modules) - before if not m.startswith("airflow."))))
"""


def p4_parse_time(runs: int, warm_runs: int, peers_python: str | None) -> None:
    """Side by side in one sitting: the provider's operator, BashOperator and KubernetesPodOperator. The peer
    provider is installed only in the benchmark's own environment (``make bench``: ``--peers-python``), never as a
    dependency; without it (``--quick``) the peer's column is skipped."""
    python = peers_python or sys.executable
    kinds = [k for k in P4_DAGS if peers_python or k != "KubernetesPodOperator"]
    folder = Path(tempfile.mkdtemp(prefix="gpm-p4-"))
    for kind in kinds:
        (folder / kind).mkdir()
        (folder / kind / "dag.py").write_text(textwrap.dedent(P4_DAGS[kind][1]))
    env = {**os.environ, "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    # Airflow's own modules were byte-compiled by pip; compile ours too, as a wheel install does (an editable
    # install under PYTHONDONTWRITEBYTECODE would otherwise recompile them from source at every import).
    import airflow_gpumarket

    subprocess.run([python, "-m", "compileall", "-q", str(Path(airflow_gpumarket.__file__).parent)], check=True)
    first: dict[str, list[float]] = {k: [] for k in kinds}
    warm: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(runs):
        for kind in kinds:  # alternate, so machine noise hits every one alike
            module = P4_DAGS[kind][0]
            result = run_child(["-c", PARSE_ONE, module, str(folder / kind), str(warm_runs)], env=env, python=python)
            assert isinstance(result, dict)
            first[kind].append(result["first"])
            warm[kind].append(result["warm"])
    bash = "BashOperator"
    for name, values, goal in (
        ("warm DAG parse, 20 operators", warm, "<= KubernetesPodOperator's"),
        ("first parse, operator import included", first, "<= 2x BashOperator's"),
    ):
        med = {k: statistics.median(v) for k, v in values.items()}
        cells = ", ".join(f"{k} {med[k] * 1000:.1f} ms ({med[k] / med[bash]:.2f}x)" for k in kinds)
        print(f"P4 {name}: {cells} (goal: {goal}; medians of {runs})")
    if not peers_python:
        print("P4 KubernetesPodOperator: not measured without --peers-python (make bench installs the peer)")
    modules = run_child(["-c", IMPORTS], env=env, python=python)
    ours = [m for m in modules if m.startswith("airflow_gpumarket")]
    others = sorted({m.split(".")[0] for m in modules if not m.startswith("airflow_gpumarket")})
    print(f"P4 imported at parse time: {', '.join(ours)}; others: {', '.join(others) or 'none'}")


# --- P5 ----------------------------------------------------------------------------------------------------
def p5_hook_overhead(calls: int, runs: int, sim_log: TextIO) -> None:
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    cmd = [sys.executable, "-m", "gpumarket_simulator.cli", "--port", "0", "--speed", "60"]
    process = subprocess.Popen([*cmd, *SIM_PROFILE_ARGS], stdout=subprocess.PIPE, stderr=sim_log, text=True)
    try:
        line = process.stdout.readline() if process.stdout else ""
        url = next(word for word in line.split() if word.startswith("http://"))
        key = line.split("gpumarket://:", 1)[1].split("@", 1)[0]
        # The connection the simulator prints: its rate_limit_scale is 0 with the buckets off, so nothing is paced
        # (P5 compares client overhead; pacing is P1's).
        os.environ["AIRFLOW_CONN_GPUMARKET_DEFAULT"] = line.split("AIRFLOW_CONN_GPUMARKET_DEFAULT=", 1)[1].split()[0]
        raw = requests.Session()
        raw.headers["Authorization"] = f"Bearer {key}"
        found = raw.post(f"{url}/api/v0/bundles/", json={"limit": 1})
        found.raise_for_status()
        created = raw.put(f"{url}/api/v0/asks/{found.json()['offers'][0]['id']}/", json={"image": "bench"})
        created.raise_for_status()
        instance_id = created.json()["new_contract"]
        hook = GpuMarketHook()
        hook.get_instance(instance_id)  # connection read, session built
        hook_times, raw_times = [], []
        for run in range(runs):  # alternate which goes first, so neither always gets the warmer server
            order = [("raw", raw_times), ("hook", hook_times)]
            for name, times in order if run % 2 == 0 else order[::-1]:
                t = time.perf_counter()
                for _ in range(calls):
                    if name == "raw":
                        response = raw.get(f"{url}/api/v0/instances/{instance_id}/")
                        response.raise_for_status()  # as the hook checks every answer
                        response.json()
                    else:
                        hook.get_instance(instance_id)
                times.append(time.perf_counter() - t)
        # Every read must have been answered 200: a refused one retried by the hook would be pacing, not overhead.
        log = raw.get(f"{url}/_sim/requests").json()["requests"]
        refused = sum(1 for r in log if r["op"] == "get_instance" and r["status"] != 200)
        if refused:
            raise RuntimeError(f"P5: {refused} get_instance requests were not answered 200")
        ours, base = statistics.median(hook_times), statistics.median(raw_times)
        print(
            f"P5 hook overhead, {calls} get_instance calls: hook {ours:.2f} s, raw requests.Session {base:.2f} s, "
            f"{ours / base:.2f}x (goal: <= 1.15x)"
        )
    finally:
        process.terminate()
        process.wait(timeout=10)


# --- P10 ---------------------------------------------------------------------------------------------------
#: P10's job: ``steps`` steps of 10 simulated minutes, a checkpoint after each in ``checkpoint_dir`` on the
#: instance's own disk, which the service copies to the next rental after a preemption.
P10_JOB = (
    'c="$GPUMARKET_CHECKPOINT_DIR"; n=$(cat "$c/step" 2>/dev/null || echo 0); '
    'echo "run attempt=$GPUMARKET_ATTEMPT from step $n at $(date +%s.%N)"; '
    'while [ "$n" -lt {steps} ]; do sleep {step_seconds:g} || exit 143; '
    'n=$((n+1)); echo "$n" > "$c/step.tmp" && mv "$c/step.tmp" "$c/step"; done; '
    "echo done"
)
P10_CHECKPOINT_DIR = "/workspace/ckpt"
P10_STEP_SIMULATED_SECONDS = 600.0
#: One kind of GPU (three machines on the seeded market), so that both runs pay for the same hardware.
P10_FILTERS = {"gpu_name": {"eq": "RTX 4090"}, "num_gpus": {"eq": 1}}


@contextlib.contextmanager
def _p10_job(*, seed: int, steps: int, step_seconds: float, **options: Any) -> Iterator[tuple[Any, Any]]:
    """(simulator, operator) for P10's job on the seeded market, its hosts all healthy (hosts that fail would blur
    what bidding costs), checkpointing into ``checkpoint_dir`` on isolated disks; ``options`` go to the operator."""
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
    from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

    speed = P10_STEP_SIMULATED_SECONDS / step_seconds
    with MarketSimulator(speed=speed, seed=seed, execute_onstart=True, **SIM_PROFILE) as sim:
        connect(sim)
        for offer in GpuMarketHook().search_offers(P10_FILTERS, limit=50):
            sim.set_offer_fate(offer["id"], "running")
        yield (
            sim,
            GpuMarketRunJobOperator(
                task_id="p10",
                offer_filters=P10_FILTERS,
                image="bench",
                checkpoint_dir=P10_CHECKPOINT_DIR,
                command=P10_JOB.format(steps=steps, step_seconds=step_seconds),
                poll_interval=0.05,
                **options,
            ),
        )


def _p10_run(*, interruptible: bool, steps: int, step_seconds: float, outbid_after: float) -> dict:
    """One 2-hour-like job on the simulator's market; with ``interruptible``, each of its first two rentals is
    outbid ``outbid_after`` real seconds into its job. Cost and wall time come from the simulator's ledger."""
    speed = P10_STEP_SIMULATED_SECONDS / step_seconds
    with _p10_job(
        seed=10,
        steps=steps,
        step_seconds=step_seconds,
        max_runtime=steps * P10_STEP_SIMULATED_SECONDS * 2,
        interruptible=interruptible,
    ) as (sim, op):
        done = threading.Event()
        outbid: list[int] = []
        outbid_at: dict[int, float] = {}

        def market() -> None:
            started: dict[int, float] = {}
            while not done.wait(0.02) and len(outbid) < 2:
                for instance in sim.alive_instances():
                    output = (sim.onstart_result(instance["id"]) or {}).get("output", "")
                    if instance["id"] in outbid or "run attempt=" not in output:
                        continue
                    started.setdefault(instance["id"], time.monotonic())
                    # Not before the wrapper's manifest names the checkpoint: a restore brings what it names.
                    if time.monotonic() - started[instance["id"]] >= outbid_after and _checkpoint_named(
                        sim, instance["id"]
                    ):
                        try:
                            sim.outbid(instance["id"])
                        except ValueError:  # the job ended first: this rental is not outbid
                            continue
                        outbid.append(instance["id"])
                        outbid_at[instance["id"]] = time.time()

        thread = threading.Thread(target=market, daemon=True)
        if interruptible:
            thread.start()
        try:
            result = op.execute(context("p10-interruptible" if interruptible else "p10-on-demand"))
        finally:
            done.set()
            if thread.is_alive():
                thread.join(timeout=10)
        instances = sorted(sim.state()["instances"], key=lambda i: i["created_at"])
        if result["job_status"] != "succeeded" or sim.alive_instances() or len(outbid) != (2 if interruptible else 0):
            raise RuntimeError(f"P10: the job did not finish across {len(outbid)} outbids: {result} {instances}")
        # Work lost per preemption, in simulated seconds: how long the job ran past its last checkpoint (each run
        # prints the step it starts from and when, by the host's clock).
        runs = []
        for i in instances:
            output = (sim.onstart_result(i["id"]) or {}).get("output", "")
            for line in output.splitlines():
                if " from step " in line:
                    step, started = line.split(" from step ")[1].split(" at ")
                    runs.append((i["id"], int(step), float(started)))
        lost = [
            ((outbid_at[run_id] - started) - (next_step - step) * step_seconds) * speed
            for (run_id, step, started), (_, next_step, _) in zip(runs, runs[1:], strict=False)
        ]
        return {
            "cost": sum(i["cost"] for i in instances),
            "wall": max(i["destroyed_at"] for i in instances) - instances[0]["created_at"],
            "lost": lost,
            "rentals": len(instances),
            "restores": _p10_restores(sim, instances),
        }


def _checkpoint_named(sim: Any, instance_id: int) -> bool:
    try:
        manifest = sim.read_disk_file(instance_id, f"{P10_CHECKPOINT_DIR}/.gpumarket-manifest")
    except Exception:  # noqa: BLE001 - not written yet
        return False
    return "step" in manifest.decode().split()


def _p10_restores(sim: Any, instances: list[dict]) -> list[tuple[float, float]]:
    """(wall, cost) of each failover's restore: the copy's simulated seconds from its request to its end, and the
    bandwidth it moved plus the kept source's storage from the next rental's creation to the source's destroy."""
    by_id = {i["id"]: i for i in instances}
    offers = {o["id"]: o for o in sim.state()["offers"]}
    restores = []
    for copy in sim.copies():
        if copy["kind"] != "copy_direct" or copy.get("ended_at") is None:
            continue
        source, target = by_id[copy["src_instance_id"]], by_id[copy["dst_instance_id"]]
        kept = max(0.0, source["destroyed_at"] - target["created_at"])
        storage = source["storage_cost"] * kept / source["storage_seconds"] if source["storage_seconds"] else 0.0
        moved = copy["bytes_done"] / 1e9
        up, down = offers.get(source["offer_id"], {}), offers.get(target["offer_id"], {})
        bandwidth = moved * (up.get("inet_up_cost") or 0) + moved * (down.get("inet_down_cost") or 0)
        restores.append((copy["ended_at"] - copy["requested_at"], storage + bandwidth))
    return restores


def p10_interruptible(*, steps: int, step_seconds: float, outbid_after: float) -> None:
    """P10: the same checkpointing job on demand and interruptible (outbid twice), cost and wall time."""
    on_demand = _p10_run(interruptible=False, steps=steps, step_seconds=step_seconds, outbid_after=outbid_after)
    bid = _p10_run(interruptible=True, steps=steps, step_seconds=step_seconds, outbid_after=outbid_after)
    hours = steps * P10_STEP_SIMULATED_SECONDS / 3600
    print(
        f"P10 interruptible vs on-demand ({hours:g} h job, checkpoint every 10 min in checkpoint_dir on isolated "
        f"disks, outbid twice): cost ${bid['cost']:.4f} vs ${on_demand['cost']:.4f} "
        f"({1 - bid['cost'] / on_demand['cost']:.0%} cheaper; goal: >= 40 %), wall {bid['wall'] / 60:.0f} vs "
        f"{on_demand['wall'] / 60:.0f} min, {bid['rentals']} rentals, work lost per preemption "
        f"{', '.join(f'{x / 60:.1f}' for x in bid['lost'])} min (goal: <= 10 min each), restore per failover "
        + (", ".join(f"{wall:.0f} s ${cost:.5f}" for wall, cost in bid["restores"]) or "none")
    )


#: P10's bid strategies: the competing bids of every machine drift (a log-normal step every ``interval`` simulated
#: seconds); the same job runs under each strategy on the same worlds, whose drift draws from the world's seed.
P10_DRIFT = {"interval": 600.0, "volatility": 0.15}
P10_STRATEGIES = ("min", "hold")


def _p10_drift_run(strategy: str, *, seed: int, steps: int, step_seconds: float) -> dict:
    """The 2-hour checkpointing job as one interruptible task under drifting competing bids, with ``strategy``.
    Preemptions, rentals, bid changes, cost (the ledger's) and wall time (simulated) of one run."""
    with _p10_job(
        seed=seed,
        steps=steps,
        step_seconds=step_seconds,
        log_interval=0.5,
        max_runtime=steps * P10_STEP_SIMULATED_SECONDS * 3,
        interruptible=True,
        bid_strategy=strategy,
        max_preemptions=50,  # counted, not limited: each strategy runs the job to its end when it can
        max_outbid_wait=2.0,
    ) as (sim, op):
        sim.set_bid_drift(P10_DRIFT["interval"], P10_DRIFT["volatility"])
        try:
            result = op.execute(context(f"p10-{strategy}-{seed}"))
        except Exception as exc:  # a strategy that runs out of machines is a result too
            result = {"job_status": f"failed: {type(exc).__name__}", "preemptions": None}
        instances = sorted(sim.state()["instances"], key=lambda i: i["created_at"])
        if sim.alive_instances():
            raise RuntimeError(f"P10 {strategy}: instances left alive: {sim.alive_instances()}")
        return {
            "ok": result["job_status"] == "succeeded",
            "preemptions": sum(i["outbids"] for i in instances),
            "rentals": len(instances),
            "bid_changes": sum(r["op"] == "change_bid" for r in sim.requests()),
            "cost": sum(i["cost"] for i in instances),
            "wall": max(i["destroyed_at"] for i in instances) - instances[0]["created_at"],
        }


def p10_bid_strategies(*, seeds: int, steps: int, step_seconds: float) -> None:
    """P10 under drifting prices: the bid strategies side by side, medians over ``seeds`` worlds."""
    runs = {
        s: [_p10_drift_run(s, seed=10 + k, steps=steps, step_seconds=step_seconds) for k in range(seeds)]
        for s in P10_STRATEGIES
    }
    hours = steps * P10_STEP_SIMULATED_SECONDS / 3600
    cells = []
    for strategy, results in runs.items():
        done = [r for r in results if r["ok"]]
        med = (
            {
                k: statistics.median(r[k] for r in done)
                for k in ("preemptions", "rentals", "bid_changes", "cost", "wall")
            }
            if done
            else {}
        )
        cells.append(
            f"{strategy}: {len(done)}/{len(results)} finished"
            + (
                f", {med['preemptions']:g} preemptions, {med['rentals']:g} rentals, "
                f"{med['bid_changes']:g} bid changes, ${med['cost']:.4f}, wall {med['wall'] / 60:.0f} min"
                if med
                else ""
            )
        )
    print(
        f"P10 bid strategies under drift ({hours:g} h job, competing bids step every {P10_DRIFT['interval']:g} s "
        f"by volatility {P10_DRIFT['volatility']:g}; medians of {seeds} worlds): " + "; ".join(cells)
    )
    for strategy, results in runs.items():
        print(
            f"P10 {strategy} per world: "
            + ", ".join(
                f"{'ok' if r['ok'] else 'FAILED'} {r['preemptions']} preemptions/{r['rentals']} rentals/"
                f"${r['cost']:.4f}/{r['wall'] / 60:.0f} min"
                for r in results
            )
        )


# --- P11 ---------------------------------------------------------------------------------------------------
#: P11's checkpoint: one file, small (0.2 s at the simulator's 50 MB/s), named by the wrapper's manifest.
P11_CHECKPOINT_BYTES = 10_000_000
P11_CHECKPOINT_DIR = "/workspace/ckpt"
P11_URI = "ckpt/p11"
#: P11's input: one file of the checkpoint's size, copied to this directory before the job starts.
P11_INPUT_URI = "data/p11"
P11_INPUT_DIR = "/workspace/data"
#: The job prints when it started (the host's clock); a first run writes the checkpoint and waits to be outbid.
P11_JOB = (
    "python3 -c 'import time; print(\"P11_START\", repr(time.time()))'; "
    'c="$GPUMARKET_CHECKPOINT_DIR"; if [ ! -f "$c/weights" ]; then '
    f'head -c {P11_CHECKPOINT_BYTES} /dev/zero > "$c/weights.tmp" && mv "$c/weights.tmp" "$c/weights"; sleep 600; fi; '
    "echo done"
)
#: With inputs, the job says when it started and how many bytes of its input it found.
P11_INPUT_JOB = (
    "python3 -c 'import time; print(\"P11_START\", repr(time.time()))'; "
    f'echo "input bytes $(wc -c < "${{GPUMARKET_INSTANCE_ROOT:-}}{P11_INPUT_DIR}/weights")"'
)
#: Boots (and what follows the job's start) run this fast; the clock is at 1x from a rental running to its job's
#: start, so P11 is measured in real seconds.
P11_BOOT_SPEED = 60.0
#: The task's poll_interval: it sees the rental run (and starts its copy) at most this long after.
P11_POLL = 1.0


def _p11_clock(sim: MarketSimulator, offsets: dict[int, float], stop: threading.Event) -> threading.Thread:
    """Boot at ``P11_BOOT_SPEED``, stage at 1x: the clock slows as soon as a rental is running (its offset sim - real
    then is kept by instance id), and speeds up again once its job started (or it was outbid)."""

    def watch() -> None:
        started: set[int] = set()
        while not stop.wait(0.002):
            for instance in sim.state()["instances"]:
                iid = instance["id"]
                if iid not in offsets and instance["first_running_at"] is not None:
                    sim.set_speed(1.0)
                    offsets[iid] = sim.now() - time.time()
                elif iid in offsets and iid not in started and "P11_START" in _output(sim, iid):
                    started.add(iid)
                    sim.set_speed(P11_BOOT_SPEED)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _output(sim: MarketSimulator, instance_id: int) -> str:
    return (sim.onstart_result(instance_id) or {}).get("output", "")


def _p11_started(sim: MarketSimulator, instance: dict, offsets: dict[int, float]) -> float:
    """Service seconds from the rental's first running to its job's start (with its data: the job needs it)."""
    output = _output(sim, instance["id"])
    started = float(next(line.split()[1] for line in output.splitlines() if line.startswith("P11_START")))
    return started + offsets[instance["id"]] - instance["first_running_at"]


def _p11_run(kind: str, seed: int) -> tuple[float, float]:
    """(rental running -> job started, the copy's own transfer time), service seconds, for one rental of ``kind``:
    ``cloud`` restores from ``checkpoint_uri``, ``copy_direct`` from a preempted instance, ``inputs`` copies one input
    without a manifest (``inputs-first``: the integration's first use, whose cloud holds no gate yet), and
    ``inputs-manifest`` one with its manifest, as an earlier task's outputs leave it."""
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
    from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

    with MarketSimulator(speed=P11_BOOT_SPEED, seed=seed, execute_onstart=True, **SIM_PROFILE) as sim:
        connect(sim)
        for offer in GpuMarketHook().search_offers(P10_FILTERS, limit=50):
            sim.set_offer_fate(offer["id"], "running")
        inputs = kind.startswith("inputs")
        restore = {"checkpoint_dir": P11_CHECKPOINT_DIR, "command": P11_JOB}
        options: dict[str, Any] = {**restore, "interruptible": True}  # copy_direct: from the preempted instance
        if kind == "cloud":
            sim.put_bucket_file(1, f"{P11_URI}/weights", b"\0" * P11_CHECKPOINT_BYTES)
            sim.put_bucket_file(1, f"{P11_URI}/.gpumarket-manifest", b"weights\n")
            options = {**restore, "checkpoint_uri": P11_URI, "cloud_integration": "training-data"}
        if inputs:
            sim.put_bucket_file(1, f"{P11_INPUT_URI}/weights", b"\0" * P11_CHECKPOINT_BYTES)
            if kind == "inputs-manifest":
                sim.put_bucket_file(1, f"{P11_INPUT_URI}/.gpumarket-manifest", b"weights\n")
            options = {
                "inputs": {P11_INPUT_DIR: P11_INPUT_URI},
                "cloud_integration": "training-data",
                "command": P11_INPUT_JOB,
            }
        if kind == "inputs":  # as after any earlier run with this integration: the cloud holds the gate
            sim.put_bucket_file(1, ".gpumarket/gate/gate", b"gpumarket\n")
        op = GpuMarketRunJobOperator(
            task_id="p11",
            offer_filters=P10_FILTERS,
            image="bench",
            poll_interval=P11_POLL,
            log_interval=P11_POLL,
            max_runtime=3600,
            **options,
        )
        stop, offsets = threading.Event(), {}
        clock = _p11_clock(sim, offsets, stop)

        def outbid_once_checkpointed() -> None:
            while not stop.wait(0.01):
                for instance in sim.alive_instances():
                    if instance["actual_status"] == "running" and _manifest_names(sim, instance["id"], "weights"):
                        sim.set_speed(P11_BOOT_SPEED)
                        sim.outbid(instance["id"])
                        return

        market = threading.Thread(target=outbid_once_checkpointed, daemon=True)
        if kind == "copy_direct":
            market.start()
        try:
            result = op.execute(context(f"p11-{kind}-{seed}"))
        finally:
            stop.set()
            clock.join(timeout=5)
            if market.is_alive():
                market.join(timeout=5)
        instances = sorted(sim.state()["instances"], key=lambda i: i["id"])
        if result["job_status"] != "succeeded" or sim.alive_instances():
            raise RuntimeError(f"P11 {kind}: the job did not end well: {result} {instances}")
        restored = instances[-1]
        output = _output(sim, restored["id"])
        if inputs:
            if f"input bytes {P11_CHECKPOINT_BYTES}" not in output:
                raise RuntimeError(f"P11 inputs: the input did not arrive whole: {output}")
        elif "gpumarket: restored the checkpoint" not in output:
            raise RuntimeError(f"P11 {kind}: the job started without its checkpoint: {output}")
        source = P11_INPUT_URI if inputs else "ckpt"
        (restore,) = [c for c in sim.copies() if c["dst_instance_id"] == restored["id"] and source in c["src"]]
        if kind == "inputs-manifest" and any(".gpumarket/gate" in c["src"] + c["dst"] for c in sim.copies()):
            raise RuntimeError("P11 inputs-manifest: the input brought its manifest, yet the gate was copied")
        rate = sim.set_copy_settings()["bytes_per_second"]
        return _p11_started(sim, restored, offsets), restore["bytes_total"] / rate


def _manifest_names(sim: Any, instance_id: int, name: str) -> bool:
    try:
        manifest = sim.read_disk_file(instance_id, f"{P11_CHECKPOINT_DIR}/.gpumarket-manifest")
    except Exception:  # noqa: BLE001 - not written yet
        return False
    return name in manifest.decode().split()


def p11_staging_latency(runs: int) -> None:
    """P11: rental running -> job started with its data: a restore by ``copy_direct``, from the cloud, and inputs."""
    cells = []
    for kind in ("copy_direct", "cloud", "inputs-manifest", "inputs", "inputs-first"):
        measured = [_p11_run(kind, seed=20 + run) for run in range(runs if kind != "inputs-first" else 1)]
        latency = statistics.median(m[0] for m in measured)
        transfer = statistics.median(m[1] for m in measured)
        cells.append(
            f"{kind} {latency:.1f} s (runs {', '.join(f'{m[0]:.1f}' for m in measured)}; transfer {transfer:.1f} s; "
            f"{'under' if latency < 10 + transfer else 'OVER'} 10 s + transfer)"
        )
    print(
        f"P11 rental running -> job started with its checkpoint or input ({P11_CHECKPOINT_BYTES / 1e6:g} MB, "
        f"poll_interval {P11_POLL:g} s, medians of {runs}): "
        + "; ".join(cells)
        + " (goal: < 10 s + the copy's transfer time)"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny sizes, the same lines")
    parser.add_argument("--peers-python", help="P4: an interpreter that also has the peer providers installed")
    parser.add_argument(
        "--only", help="run only these figures, comma-separated (p2, p3, p4, p5, p10, p10-strategies, p11)"
    )
    args = parser.parse_args()
    home = os.environ.get("AIRFLOW_HOME") or tempfile.mkdtemp(prefix="gpm-bench-")
    log_path = Path(home) / "bench_provider.log"
    # Left open to the end of the process: a logger may still write while the interpreter shuts down.
    log_stream = route_logs_to(log_path)
    quick = {
        "p2": lambda: p2_calls_per_lifecycle(runs=1, speed=600.0, job_seconds=1.0),
        "p3": lambda: p3_billed_after_last_command(runs=1, pattern_interval=1.0, job_seconds=1.0),
        "p4": lambda: p4_parse_time(runs=1, warm_runs=1, peers_python=args.peers_python),
        "p5": lambda: p5_hook_overhead(calls=100, runs=1, sim_log=log_stream),
        "p10": lambda: p10_interruptible(steps=6, step_seconds=0.5, outbid_after=0.6),
        "p10-strategies": lambda: p10_bid_strategies(seeds=1, steps=2, step_seconds=0.5),
        "p11": lambda: p11_staging_latency(runs=1),
    }
    full = {
        "p2": lambda: p2_calls_per_lifecycle(runs=5),
        "p3": lambda: p3_billed_after_last_command(runs=3, pattern_interval=10.0),
        "p4": lambda: p4_parse_time(runs=15, warm_runs=5, peers_python=args.peers_python),
        "p5": lambda: p5_hook_overhead(calls=1000, runs=5, sim_log=log_stream),
        "p10": lambda: p10_interruptible(steps=12, step_seconds=1.0, outbid_after=5.5),
        "p10-strategies": lambda: p10_bid_strategies(seeds=5, steps=12, step_seconds=1.0),
        "p11": lambda: p11_staging_latency(runs=3),
    }
    figures = quick if args.quick else full
    only = [name.strip().lower() for name in args.only.split(",")] if args.only else list(figures)
    unknown = [name for name in only if name not in figures]
    if unknown:
        parser.error(f"--only: unknown figure(s) {unknown}; choose from {', '.join(figures)}")
    try:
        for name in only:
            figures[name]()
    finally:
        log_stream.flush()
        print(f"bench_provider: the log lines of Airflow and the simulators are in {log_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
