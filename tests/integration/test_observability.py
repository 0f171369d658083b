"""The tools a data platform already runs, against the simulator: an asset event per model, OpenLineage through the
OpenLineage provider's own adapter and a file transport, and the metrics through Airflow's StatsD client to a UDP
socket on loopback. The integration ``training-data`` of the simulator's world is of type ``s3``."""

from __future__ import annotations

import json
import os
import socket
from importlib.metadata import version

import pytest

from airflow_gpumarket import assets

from .conftest import alive, task_states
from .test_money_safety import context, healthy_market, job  # noqa: F401 (an autouse fixture)

AIRFLOW_2 = version("apache-airflow").startswith("2.")
INTEGRATION = "training-data"
WRITE_OUTPUT = 'o="$GPUMARKET_INSTANCE_ROOT/workspace/out"; mkdir -p "$o" && echo weights > "$o/model.txt"'


def staged_job(**kwargs):
    return job(
        command=WRITE_OUTPUT,
        cloud_integration=INTEGRATION,
        inputs={"/workspace/data": "datasets/mnist"},
        outputs={"/workspace/out": "models/mnist/v3"},
        checkpoint_dir="/workspace/ckpt",
        checkpoint_uri="checkpoints/mnist",
        **kwargs,
    )


def asset_events(uri: str) -> list[dict]:
    from airflow import settings

    if AIRFLOW_2:
        from airflow.models.dataset import DatasetEvent as Event
        from airflow.models.dataset import DatasetModel as Model

        key = Event.dataset_id
    else:
        from airflow.models.asset import AssetEvent as Event
        from airflow.models.asset import AssetModel as Model

        key = Event.asset_id
    with settings.Session() as session:
        rows = session.query(Event).join(Model, Model.id == key).filter(Model.uri == uri).all()
        return [dict(row.extra or {}) for row in rows]


def test_the_training_dags_asset_event_carries_the_rental_that_produced_the_model(example_dag, sim):
    uri = "s3://models/mnist/latest"
    before = len(asset_events(uri))
    dag = example_dag("example_gpumarket_assets")
    if AIRFLOW_2:  # dag.test() records a dataset event only for a dataset the DAG's sync wrote
        dag.sync_to_db()
    run = dag.test()
    assert run.state == "success", task_states(run)
    (instance,) = sim.state()["instances"]
    events = asset_events(uri)[before:]
    assert len(events) == 1, events
    produced = events[0][assets.EXTRA_KEY]
    assert produced["instance_id"] == instance["id"] and produced["estimated_cost"] >= 0
    assert alive(sim) == []


def test_openlineage_reads_the_integrations_datasets_and_the_rental_of_a_finished_job(sim, tmp_path):
    pytest.importorskip("airflow.providers.openlineage")
    from types import SimpleNamespace

    from airflow.providers.openlineage.extractors.manager import ExtractorManager
    from airflow.providers.openlineage.plugins.adapter import OpenLineageAdapter
    from airflow.utils.state import TaskInstanceState
    from openlineage.client import OpenLineageClient
    from openlineage.client.transport.file import FileConfig, FileTransport

    op = staged_job(interruptible=True)
    op.execute(context())
    ti = SimpleNamespace(task=op, dag_id="d", task_id=op.task_id, map_index=-1, try_number=1)
    lineage = ExtractorManager().extract_metadata(SimpleNamespace(run_id="run-1"), op, TaskInstanceState.SUCCESS, ti)
    sent = tmp_path / "lineage.jsonl"
    client = OpenLineageClient(transport=FileTransport(FileConfig(log_file_path=str(sent), append=True)))
    OpenLineageAdapter(client=client).complete_task(
        run_id="01938d2a-0000-7000-8000-000000000001",
        job_name="d.job",
        end_time="2026-01-01T00:00:00+00:00",
        task=lineage,
        nominal_start_time=None,
        nominal_end_time=None,
        owners=None,
        tags=None,
        job_description=None,
    )
    (event,) = [json.loads(line) for line in sent.read_text().splitlines() if line.strip()]
    names = {kind: [(d["namespace"], d["name"]) for d in event[kind]] for kind in ("inputs", "outputs")}
    assert names == {
        "inputs": [("s3://datasets", "mnist"), ("s3://checkpoints", "mnist")],
        "outputs": [("s3://models", "mnist/v3"), ("s3://checkpoints", "mnist")],
    }
    (instance,) = sim.state()["instances"]
    facet = event["run"]["facets"]["gpumarket"]
    assert facet["instanceId"] == instance["id"] and facet["offerId"] == instance["offer_id"]
    assert facet["interruptible"] is True and facet["preemptions"] == 0 and facet["estimatedCost"] >= 0
    assert alive(sim) == []


@pytest.fixture
def statsd_listener(monkeypatch):
    """A UDP socket on loopback, and Airflow's ``Stats`` sending to it as ``[metrics] statsd_on`` makes it."""
    pytest.importorskip("statsd")
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(0.2)
    for key, value in {"ON": "True", "HOST": "127.0.0.1", "PORT": str(listener.getsockname()[1])}.items():
        monkeypatch.setenv(f"AIRFLOW__METRICS__STATSD_{key}", value)
    if AIRFLOW_2:
        from airflow.metrics import statsd_logger
        from airflow.stats import Stats

        meta = type(Stats)  # the factory is the metaclass's; the client it made, the class's
        factory = meta.factory
        meta.factory, Stats.instance = statsd_logger.get_statsd_logger, None
        yield listener
        meta.factory, Stats.instance = factory, None
    else:
        from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger
        from airflow.sdk.observability import stats
        from airflow.sdk.observability.metrics import stats_utils

        stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
        yield listener
        stats.initialize(factory=NoStatsLogger, export_legacy_names=False)
    listener.close()


def received(listener: socket.socket) -> dict[str, list[str]]:
    """Metric name -> the values received for it (``name:value|type`` lines)."""
    found: dict[str, list[str]] = {}
    while True:
        try:
            packet = listener.recv(65536).decode()
        except TimeoutError:
            return found
        for line in packet.splitlines():
            name, _, value = line.partition(":")
            found.setdefault(name, []).append(value)


def test_the_metrics_of_a_job_reach_a_statsd_listener_as_they_happened(sim, statsd_listener):
    os.environ.pop("AIRFLOW__METRICS__STATSD_PREFIX", None)
    job(command="sleep 0.5; echo ok").execute(context())  # seen running: its boot is timed
    got = received(statsd_listener)
    assert got["airflow.gpumarket.rental.started"] == ["1|c"]
    assert got["airflow.gpumarket.rental.ended.succeeded"] == ["1|c"]
    assert len(got["airflow.gpumarket.rental.boot"]) == 1 and got["airflow.gpumarket.rental.boot"][0].endswith("|ms")
    (reserved,) = got["airflow.gpumarket.budget.reserved_dollars"]
    (settled,) = got["airflow.gpumarket.budget.settled_dollars"]
    assert 0 <= float(settled.split("|")[0]) <= float(reserved.split("|")[0])
    assert alive(sim) == []
