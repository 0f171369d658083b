"""DAGs and operators against the embedded simulator, with onstart scripts really run.

One simulator serves the whole run (reset before each test); its clock runs 600x, so a 1-5 minute boot takes
0.1-0.5 s, and the operators poll every 0.05 s. Every test ends by checking the ledger: nothing left alive.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from importlib.metadata import version

import pytest

POLL = 0.05
AIRFLOW_2 = version("apache-airflow").startswith("2.")  # the top-level conftest has the same flag


@pytest.fixture(scope="session")
def job_sim_server():
    from gpumarket_simulator import MarketSimulator

    with MarketSimulator(speed=600, seed=11, execute_onstart=True) as sim:
        yield sim


@pytest.fixture
def sim(job_sim_server, monkeypatch) -> Iterator:
    job_sim_server.reset()
    for name, value in job_sim_server.connection_env().items():
        # Retries wait milliseconds here, not seconds: fault storms stay fast and no test sleeps for timing.
        # The simulator's clock (and so its rate buckets) runs 600x: its connection's rate_limit_scale says so.
        conn = json.loads(value)
        conn["extra"] |= {"retry_min_wait": 0.01, "retry_max_wait": 0.05, "max_retries": 6, "timeout": 2}
        monkeypatch.setenv(name, json.dumps(conn))
    monkeypatch.setenv("GPUMARKET_POLL_INTERVAL", str(POLL))
    _empty_the_budget_ledger()
    yield job_sim_server
    job_sim_server.clear_faults()


def _empty_the_budget_ledger() -> None:
    """Each test starts with no reservations: one a test left open must not hold another test's credit."""
    from airflow import settings

    from airflow_gpumarket import ledger

    ledger.ensure_tables(settings.engine)
    with settings.engine.begin() as conn:
        conn.execute(ledger.RESERVATIONS.delete())


def alive(sim) -> list[dict]:
    return sim.alive_instances()


def rented_offers(sim) -> list[int]:
    return [i["offer_id"] for i in sim.state()["instances"]]


def offers_rented_twice_at_once(sim) -> list[int]:
    """Offers that had two instances alive at the same moment (an offer is back on the market once its
    instance is destroyed, so renting it again later is fine)."""
    spans: dict[int, list[tuple[float, float]]] = {}
    for i in sim.state()["instances"]:
        spans.setdefault(i["offer_id"], []).append((i["created_at"], i["destroyed_at"] or float("inf")))
    twice = []
    for offer_id, lives in spans.items():
        lives.sort()
        if any(later[0] < earlier[1] for earlier, later in zip(lives, lives[1:], strict=False)):
            twice.append(offer_id)
    return twice


@pytest.fixture
def example_dag(airflow_db, sim):
    """Load an example DAG file fresh (after the simulator's connection and poll interval are set)."""
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 2.11
        from airflow.models.dagbag import DagBag

    def load(dag_id: str):
        bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
        assert not bag.import_errors, bag.import_errors
        return bag.get_dag(dag_id)

    return load


def first_event(instance_id: int, rental: dict) -> dict:
    """The first event of a job's trigger that holds only what travels in its kwargs (``rental``)."""
    import asyncio

    from airflow_gpumarket.triggers.instances import GpuMarketInstanceStatusTrigger

    trigger = GpuMarketInstanceStatusTrigger(
        instance_id=instance_id,
        watch={"wait_for": "job"},
        rental=rental,
        poll_interval=POLL,
        log_interval=POLL,
        shared_poller=False,
    )

    async def run() -> dict:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(run())


def task_states(dag_run) -> dict[str, str]:
    return {f"{ti.task_id}[{ti.map_index}]": str(ti.state) for ti in dag_run.get_task_instances()}


def _stored_texts() -> list[str]:
    """Every XCom value and rendered template field Airflow stored during the run."""
    from airflow.models.renderedtifields import RenderedTaskInstanceFields

    try:
        from airflow.models.xcom import XComModel
    except ImportError:  # Airflow 2.11
        from airflow.models.xcom import BaseXCom as XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        xcoms = [str(v) for v in session.scalars(select(XComModel.value))]
        rendered = [str(v) for v in session.scalars(select(RenderedTaskInstanceFields.rendered_fields))]
    return xcoms + rendered


@pytest.fixture(autouse=True)
def no_secret_leaks(request, capsys, caplog, job_sim_server):
    """R3: after each test, the account key, every instance key and every backup code are looked for in
    everything a person or a downstream task could see: task logs (stdout/stderr and log records), XCom values
    and rendered template fields. Goal: none found."""
    yield
    if "sim" not in request.fixturenames:
        return
    sim = job_sim_server  # the per-test fixture is torn down by now; its server is not (and not yet reset)
    world = sim._market.world  # the in-process simulator knows every key it handed out
    secrets = {sim.api_key}
    secrets |= {inst.api_key for inst in world.instances.values()}
    secrets |= {v for inst in world.instances.values() for k, v in inst.config["env"].items() if k.endswith("_TOKEN")}
    secrets |= set(sim.state()["tfa"]["backup_codes"])
    captured = capsys.readouterr()
    texts = [captured.out, captured.err, caplog.text]
    if "airflow_db" in request.fixturenames:
        texts += _stored_texts()
    leaked = leaks(texts, secrets, account_key=sim.api_key)
    assert not leaked, f"secrets visible in logs, XCom or rendered fields: {leaked}"


def leaks(texts: list[str], secrets: set[str], *, account_key: str) -> list[str]:
    """Which kinds of secret appear in any of the texts."""
    found = {
        "account key" if secret == account_key else "instance key or backup code"
        for secret in secrets
        if secret and any(secret in text for text in texts)
    }
    return sorted(found)


def handed_over_run(example_dag, *, run_still_running: bool):
    """A run whose CreateInstance task handed its instance over; the run ended (or is set back to running)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    run = example_dag("gpm_ui_handover").test()
    assert run.state == "success", task_states(run)
    if run_still_running:
        with create_session() as session:
            session.query(DagRun).filter_by(dag_id=run.dag_id, run_id=run.run_id).update({"state": "running"})
    return run
