"""The DAGs that the system tests (tests/system, make system) run on a real Airflow deployment.

One DAG per scenario, `system_<scenario>`, each with one GpuMarketRunJobOperator task `job` that rents only the
offers whose `gpu_name` is `sys-<scenario>` (scenario.py writes two such offers per scenario into the simulator's
world), so the scenarios never compete for an offer and each one's instances are easy to find.

The lost-worker scenarios also carry a probe callback that only records where Airflow ran it and whether the
connection resolved there (a JSON file under $AIRFLOW_HOME/system-probes); it never touches an instance. It is
appended to whatever callbacks the operator sets itself, so a provider callback still runs.
"""

from __future__ import annotations

import ast
import json
import os
import time
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_gpumarket.assets import cloud_asset
from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator
from airflow_gpumarket.operators.service import GpuMarketServiceOperator
from airflow_gpumarket.operators.teardown import GpuMarketDestroyInstanceOperator
from airflow_gpumarket.triggers.offers import GpuMarketOfferTrigger

#: A line nobody can know before the job runs (test_exit3 looks for it in the task log), then exit 3.
COMPUTED_THEN_EXIT_3 = 'echo "computed $(od -An -N6 -tx1 /dev/urandom | tr -d " \\n")"; echo boom >&2; exit 3'
#: Numbered lines over about 20 s, read every 3 s while the job runs (the task log must show each once).
TICKS = "for i in 1 2 3 4 5 6 7 8; do echo tick $i; sleep 2.5; done"
#: A 3-second job that succeeds: no periodic read happens while it runs (default log_interval), so its three lines
#: reach the task log only through the final read of the stopped instance.
SHORT = 'echo "first $(od -An -N6 -tx1 /dev/urandom | tr -d " \\n")"; echo second; sleep 3; echo third'
#: Finishes on its third run (after two preemptions); runs until killed on the others.
THIRD_RUN_FINISHES = (
    'echo "run attempt=$GPUMARKET_ATTEMPT"; [ "$GPUMARKET_ATTEMPT" -ge 3 ] || sleep 600; '
    'echo "finished on attempt $GPUMARKET_ATTEMPT"'
)
#: Eight epochs of 2 s, a checkpoint (written whole, then renamed) after each, resumed from the last one; at the end
#: a result under /workspace/out, which the task copies to the cloud integration before the destroy.
EPOCHS_WITH_OUTPUT = (
    'c="$GPUMARKET_CHECKPOINT_DIR"; e=$(cat "$c/epoch" 2>/dev/null || echo 0); '
    'echo "run attempt=$GPUMARKET_ATTEMPT resumes at epoch $e from [$GPUMARKET_RESUMED_FROM]"; '
    'while [ "$e" -lt 8 ]; do sleep 2 || exit 143; e=$((e+1)); '
    'echo "$e" > "$c/epoch.tmp" && mv "$c/epoch.tmp" "$c/epoch"; echo "epoch $e done"; done; '
    'o="$GPUMARKET_INSTANCE_ROOT/workspace/out"; mkdir -p "$o" && echo "8 epochs" > "$o/result"'
)
#: Numbered lines over about 30 s: long enough for a triggerer to die mid-job and the other to take over.
TICKS_30S = "for i in $(seq 1 12); do echo tick $i; sleep 2.5; done"
#: Numbered lines over about 50 s: a triggerer frozen past the health threshold, then resumed, while they print.
TICKS_50S = "for i in $(seq 1 20); do echo tick $i; sleep 2.5; done"
#: The model the asset_downstream scenario trains, in the simulator's integration `training-data` (type s3).
MODEL_PATH = "system/asset_downstream/model"
MODEL = cloud_asset("s3", MODEL_PATH)
WRITE_MODEL = 'o="$GPUMARKET_INSTANCE_ROOT/workspace/out"; mkdir -p "$o" && echo weights > "$o/model.txt"; sleep 3'

# name: (deferrable, command, extra operator arguments); scenario.GOALS has the same names.
SCENARIOS: dict[str, tuple[bool, str, dict]] = {
    "deferred_happy": (True, TICKS, {"log_interval": 3}),
    "short_job_deferred": (True, SHORT, {}),
    "mark_failed_deferred": (True, "sleep 600", {}),
    "mark_failed_running": (False, "sleep 600", {}),
    # The job outlasts the heartbeat timeout plus the retry's start, so the retry finds it still running.
    "kill9_retry": (False, "sleep 100", {"retries": 1, "retry_delay": timedelta(seconds=2)}),
    "lost_worker": (False, "sleep 100000", {"retries": 0}),
    "triggerer_restart": (True, "sleep 40", {}),
    "exit3": (False, COMPUTED_THEN_EXIT_3, {}),
    "exit3_deferred": (True, COMPUTED_THEN_EXIT_3, {}),
    "execution_timeout_deferred": (True, "sleep 600", {"execution_timeout": timedelta(seconds=25)}),
    "execution_timeout_sync": (False, "sleep 600", {"execution_timeout": timedelta(seconds=25)}),
    "interruptible": (True, THIRD_RUN_FINISHES, {"interruptible": True}),
    "triggerer_ha": (True, TICKS_30S, {"log_interval": 3}),
    "triggerer_handover": (True, TICKS_50S, {"log_interval": 3}),
    "scheduler_kill": (False, "sleep 30", {}),
    "worker_kill": (False, "sleep 100000", {"retries": 0}),
    "postgres_restart": (True, "sleep 40", {}),  # with a second, sync task: see below
    "asset_downstream": (
        True,
        WRITE_MODEL,
        {"cloud_integration": "training-data", "outputs": {"/workspace/out": MODEL_PATH}, "outlets": [MODEL]},
    ),
    # Its cheapest offer never runs (scenario.py): one failover, then success, seen running (its boot timed).
    "statsd": (False, "sleep 5; echo trained", {}),
    # Its cheapest offer's GPUs fail the preflight (scenario.py): a failover, then success.
    # boot_timeout counts wall seconds and the ranking expects boots in the simulator's (20x): 10 wall minutes
    "rent_well": (
        True,
        "echo trained",
        {"offer_choice": "expected_cost", "expected_runtime": timedelta(minutes=5), "boot_timeout": 600},
    ),
    "durable": (
        True,
        EPOCHS_WITH_OUTPUT,
        {
            "interruptible": True,
            "checkpoint_dir": "/workspace/ckpt",
            "checkpoint_uri": "system/durable/{{ run_id | replace(':', '_') }}/ckpt",
            "cloud_integration": "training-data",
            "outputs": {"/workspace/out": "system/durable/{{ run_id | replace(':', '_') }}/out"},
            "log_interval": 3,
        },
    ),
}
# Scenario -> the callback attribute that a heartbeat timeout fires for it (retries left: on_retry_callback).
PROBED = {"kill9_retry": "on_retry_callback", "lost_worker": "on_failure_callback"}


def probe_for(callback: str):
    """A callback that records which process runs it and whether `gpumarket_default` resolves there (host only)."""

    def probe(context) -> None:
        from airflow.sdk import BaseHook

        ti = context["ti"]
        record: dict = {"callback": callback, "dag_id": ti.dag_id, "pid": os.getpid(), "ppid": os.getppid()}
        try:
            for key, pid in (("process", "self"), ("parent", str(os.getppid()))):
                with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                    record[key] = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
            record["connection_host"] = BaseHook.get_connection("gpumarket_default").host
        except Exception as exc:  # the probe reports, it never breaks the callback chain
            record["connection_error"] = f"{type(exc).__name__}: {exc}"
        folder = Path(os.environ.get("AIRFLOW_HOME", ".")) / "system-probes"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{ti.dag_id}.try{ti.try_number}.{os.getpid()}.{time.time_ns()}.json").write_text(json.dumps(record))

    return probe


def scenario_dag(name: str, **kwargs) -> DAG:
    """The DAG of scenario ``name``, ``system_<name>``: one run at a time, triggered by the test."""
    return DAG(
        dag_id=f"system_{name}",
        start_date=datetime(2026, 1, 1),
        schedule=None,
        catchup=False,
        max_active_runs=1,
        tags=["gpumarket-system"],
        **kwargs,
    )


def rental_arguments(name: str) -> dict:
    """What every scenario's renting task is given: only the scenario's own offers, quick polls and bounds."""
    return dict(
        offer_filters={"gpu_name": {"eq": f"sys-{name}"}},
        image="system-test",
        poll_interval=1,
        boot_timeout=timedelta(minutes=2),
        max_runtime=timedelta(minutes=15),
    )


for _name, (_deferrable, _command, _extra) in SCENARIOS.items():
    with scenario_dag(_name):
        _common = dict(rental_arguments(_name), command=_command)
        _job = GpuMarketRunJobOperator(task_id="job", deferrable=_deferrable, **{**_common, **_extra})
        if _name == "postgres_restart":  # the same job in a worker, beside the deferred one
            GpuMarketRunJobOperator(task_id="job_sync", deferrable=False, **_common)
        if _name in PROBED:
            _attribute = PROBED[_name]
            _existing = getattr(_job, _attribute) or []
            setattr(
                _job, _attribute, [*(_existing if isinstance(_existing, list) else [_existing]), probe_for(_attribute)]
            )


# A mapped @task.gpumarket whose worker is lost: the DAG processor runs the failure callback with the mapped task
# itself (never unmapped), so the callback must find the rental from the partial() arguments and the map index.
with scenario_dag("lost_worker_mapped"):

    @task.gpumarket(**rental_arguments("lost_worker_mapped"), deferrable=False, retries=0)
    def job(seconds: int) -> int:
        import time

        time.sleep(seconds)
        return seconds

    job.expand(seconds=[100_000])


# Fifty jobs of $0.10 worst case each (max_cost plus one poll at $0.50/h) under a $1 daily budget (the deployment's
# gpumarket_budgets Variable): reservations on two workers through the api-server's ledger admit ten at once. A job
# bills its boot and 12 s (240 s on the simulator's clock), well under max_cost.
with scenario_dag("budget", max_active_tasks=64):
    GpuMarketRunJobOperator.partial(
        task_id="job",
        **rental_arguments("budget"),
        deferrable=True,
        max_cost=0.0997,
        max_offer_attempts=30,  # ten renters at once race for the same cheapest offers: the losers try the next
        retries=0,
    ).expand(command=["sleep 12"] * 50)


# Ten deferred jobs that end on their own (long enough for all 13 to defer first), beside three that run until they
# are marked failed while a log read of theirs is slow (test_cancel_mid_step; the counts are
# scenario.CANCEL_MID_STEP_*). The ten read no log (the job wrapper destroys their instances): the simulator's slow
# log answers hold up only the three.
with scenario_dag("cancel_mid_step", max_active_tasks=32):
    GpuMarketRunJobOperator.partial(
        task_id="job",
        **rental_arguments("cancel_mid_step"),
        deferrable=True,
        retries=0,
        max_offer_attempts=16,  # thirteen renters at once race for the same cheapest offers: the losers try the next
    ).expand_kwargs(
        [{"command": "echo ends; sleep 90", "log_interval": 0}] * 10
        + [{"command": "echo marked; sleep 600", "log_interval": 3}] * 3
    )


# An instance handed over to its run and never torn down: the run ends with it alive, an orphan for
# `airflow gpumarket orphans --destroy` (test_orphan).
with scenario_dag("orphan"):
    _arguments = rental_arguments("orphan")
    _arguments.pop("max_runtime")
    GpuMarketCreateInstanceOperator(task_id="job", **_arguments)


# A GPU as a service for a task group (test_service): the example DAG's server, used by two mapped tasks for a while
# each; the Celery worker running one of them is killed, its retry reaches the service from another worker, and the
# teardown destroys the instance.
_EXAMPLE = Path(__file__).resolve().parents[3] / "example_dags" / "example_gpumarket_service.py"
SERVICE_SERVER = next(
    ast.literal_eval(node.value)
    for node in ast.parse(_EXAMPLE.read_text()).body
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "SERVER"
)
#: Seconds each task of the group holds the service between its two requests: the worker is killed meanwhile.
SERVICE_USE_SECONDS = 45

with scenario_dag("service"):
    _arguments = rental_arguments("service")
    _arguments.pop("max_runtime")
    _serve = GpuMarketServiceOperator(
        task_id="serve", command=SERVICE_SERVER, lease=timedelta(minutes=20), deferrable=True, **_arguments
    )

    @task(retries=1, retry_delay=timedelta(seconds=1))
    def use(shard: list[str]) -> int:
        from airflow_gpumarket.service_client import connect_service

        with connect_service("serve").client() as client:
            first = client.post("/embed", json=shard).raise_for_status().json()["lengths"]
            time.sleep(SERVICE_USE_SECONDS)
            again = client.post("/embed", json=shard).raise_for_status().json()["lengths"]
        assert first == again
        return sum(again)

    _stop = GpuMarketDestroyInstanceOperator(task_id="stop", instance_id=_serve.output)
    _serve >> use.expand(shard=[["a", "bb"], ["ccc"]]) >> _stop.as_teardown(setups=_serve)


# Scheduled by an offer watcher on the market_watch scenario's offers: a run each time they appear.
MARKET_WATCH_POLL = 2.0
_offers_appear = Asset(
    "gpumarket-system-market-watch",
    watchers=[
        AssetWatcher(
            name="system_market_watch",
            trigger=GpuMarketOfferTrigger(
                offer_filters={"gpu_name": {"eq": "sys-market_watch"}}, poll_interval=MARKET_WATCH_POLL
            ),
        )
    ],
)
with DAG(
    dag_id="system_market_watch",
    start_date=datetime(2026, 1, 1),
    schedule=_offers_appear,
    catchup=False,
    max_active_runs=1,
    tags=["gpumarket-system"],
):
    GpuMarketRunJobOperator(task_id="job", deferrable=True, command=SHORT, **rental_arguments("market_watch"))


# Scheduled on the asset_downstream scenario's model: runs after each successful training, and returns what the
# asset event said of the rental that produced the model.
with DAG(
    dag_id="system_asset_downstream_evaluate",
    start_date=datetime(2026, 1, 1),
    schedule=[MODEL],
    catchup=False,
    tags=["gpumarket-system"],
):

    @task
    def evaluate(**context) -> list:
        events = context["triggering_asset_events"]
        return [event.extra.get("gpumarket", {}) for queued in events.values() for event in queued]

    evaluate()
