"""R1 chaos, services: rented servers for a task group, under the run's faults, each group ended one way or another.

Each lifecycle rents a ``GpuMarketServiceOperator`` (the example DAG's TLS server; now and then one that never
answers, or one that exits at once), sends it requests through ``connect_service`` as the group's tasks would, then
ends as a group can:

- the teardown task destroys it (after the group's tasks succeeded or failed: teardown runs either way);
- the setup task is killed (``on_kill``, as when a user marks it failed or its worker dies) at a random moment: a
  kill before the hand-over must destroy what it rented; after it, the teardown still runs;
- nothing runs the teardown (a DAG run that never reaches it): the lease ends the server and the instance destroys
  itself.

Counted as chaos.py counts jobs: how each ended (a clear reason or unclear), and what of its rentals is alive after.
"""

from __future__ import annotations

import random
import runpy
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

#: The instance's own seconds a leased service lives; the harness waits this long plus the kill grace for its end.
SHORT_LEASE = 4.0
#: What the instance's ``timeout`` gives a server between its TERM and a KILL, and the destroy's callback after.
LEASE_GRACE = 45.0
#: A server that never answers is given up after this long on the service's clock (600x: 3 s real).
READY_TIMEOUT = 1800.0
#: Requests each group sends through the provider's client.
REQUESTS = 3


def server() -> str:
    """The example DAG's server: a few lines of Python over TLS, with the rental's credential."""
    example = Path(__file__).resolve().parent.parent / "example_dags" / "example_gpumarket_service.py"
    return runpy.run_path(str(example))["SERVER"]


def service_lifecycle(i: int, seed: int, sim: Any, gpus: list[str], classify: Any, serving: str) -> dict:
    """One group: rent, use, end; how it ended and what of it is alive after (chaos.py's shape of a result)."""
    from airflow_gpumarket import lifecycle as lc
    from airflow_gpumarket.operators.service import GpuMarketServiceOperator

    rng = random.Random(f"chaos-service-{seed}-{i}")
    command = rng.choices([serving, "sleep 600", "echo no model here; exit 3"], [0.8, 0.1, 0.1])[0]
    ending = rng.choices(["teardown", "killed", "lease"], [0.6, 0.2, 0.2])[0]
    run_id, task_id = f"chaos-service-{seed}-{i}", f"chaos_service_{i}"
    op = GpuMarketServiceOperator(
        task_id=task_id,
        offer_filters={"gpu_name": {"eq": rng.choice(gpus)}},
        image="chaos",
        command=command,
        ready_path="/",
        ready_timeout=READY_TIMEOUT,
        lease=SHORT_LEASE if ending == "lease" else 3600,
        poll_interval=0.05,
        max_offer_attempts=3,
        deferrable=False,
    )
    ctx = {"run_id": run_id, "ti": SimpleNamespace(try_number=1, map_index=-1)}
    key = lc.rental_key(op.dag_id or "", run_id, task_id, -1)
    shown = "server" if command == serving else command
    result = {"key": key, "command": f"service: {shown}, {ending}", "run_id": run_id, "task_id": task_id}
    timer = threading.Timer(rng.uniform(0.05, 1.5), op.on_kill) if ending == "killed" else None
    outcome, message, detail, handed = "succeeded", "", "", None
    try:
        if timer is not None:
            timer.start()
        handed = op.execute(ctx)
        outcome = _use(handed, task_id, run_id)
    except BaseException as exc:  # noqa: BLE001 - every ending is classified
        outcome, message = _classify(exc, classify), str(exc)
        detail = "".join(traceback.format_exception(exc)) if outcome.startswith("UNCLEAR") else ""
    finally:
        if timer is not None:
            timer.cancel()
    try:
        _end(handed, ending, sim, key, ctx)
    except BaseException as exc:  # noqa: BLE001 - a teardown that fails is an ending too
        outcome, message = _classify(exc, classify), str(exc)
        detail = "".join(traceback.format_exception(exc)) if outcome.startswith("UNCLEAR") else ""
    alive = [inst for inst in sim.alive() if (lc.parse_label(inst.get("label")) or ("",))[0] == key]
    return result | {"outcome": outcome, "message": message, "detail": detail, "alive_at_finish": alive}


def _use(handed: dict, task_id: str, run_id: str) -> str:
    """The group's tasks: requests through ``connect_service``; their ending (a host that failed: a clear one)."""
    from airflow_gpumarket.service_client import connect_service

    pulls = {task_id: handed}
    context = {"run_id": run_id, "ti": SimpleNamespace(xcom_pull=lambda task_ids: pulls.get(task_ids))}
    service = connect_service(task_id, context=context)
    with service.client(timeout=5) as client:
        for n in range(REQUESTS):
            answer = client.post("/embed", json=["x" * (n + 1)]).raise_for_status().json()
            if answer != {"lengths": [n + 1]}:
                return f"UNCLEAR: the server answered {answer!r}"
    return "succeeded"


def _end(handed: dict | None, ending: str, sim: Any, key: str, ctx: dict) -> None:
    """The group's end: the teardown task (when the setup handed a service over), or the lease."""
    from airflow_gpumarket import lifecycle as lc
    from airflow_gpumarket.operators.teardown import GpuMarketDestroyInstanceOperator

    if handed is None:
        return  # the setup task failed: Airflow skips a teardown whose setup failed
    if ending != "lease":
        GpuMarketDestroyInstanceOperator(task_id="stop", instance_id=handed).execute(ctx)
        return
    deadline = time.monotonic() + SHORT_LEASE + LEASE_GRACE
    while time.monotonic() < deadline:
        if not [i for i in sim.alive() if (lc.parse_label(i.get("label")) or ("",))[0] == key]:
            return
        time.sleep(0.2)  # the lease runs on the instance's own clock, in real seconds


def _classify(exc: BaseException, classify: Any) -> str:
    import httpx

    from airflow_gpumarket.operators.failures import GpuMarketServiceGone

    if isinstance(exc, GpuMarketServiceGone):
        return "a request found the service's host gone"
    if "exited before" in str(exc):
        return "the server exited before it answered"
    if isinstance(exc, httpx.HTTPError):
        return f"UNCLEAR: a request failed untyped ({type(exc).__name__})"
    return classify(exc)


def service_phase(
    sim: Any, seed: int, count: int, workers: int, *, faults: list[dict], gpus: list[str], classify: Any
) -> list[dict]:
    """``count`` service groups, ``workers`` at a time, under ``faults`` (the run's fault rules): their endings."""
    serving = server()
    sim.send("PUT", "/_sim/faults", {"rules": faults}).raise_for_status()
    try:
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(lambda i: service_lifecycle(i, seed, sim, gpus, classify, serving), range(count)))
    finally:
        sim.send("DELETE", "/_sim/faults")
