"""OpenLineage of a renting task (``airflow_gpumarket.lineage``): its datasets from the cloud integration, the
``gpumarket`` run facet, and nothing loaded without the OpenLineage provider."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from airflow_gpumarket import lineage

TASK = SimpleNamespace(
    inputs={"/workspace/data": "datasets/mnist"},
    outputs={"/workspace/out": "models/mnist/v3"},
    checkpoint_uri="checkpoints/train",
    cloud_integration="training-data",
)
RECORD = {"instance_id": 7, "offer_id": 3, "gpu_name": "RTX 4090", "hourly_price": 0.4, "interruptible": True}


def uris(datasets) -> list[str]:
    return [d.uri for d in datasets]


def test_inputs_and_checkpoint_uri_are_read_outputs_and_checkpoint_uri_written():
    read, written = lineage.datasets(TASK, "s3")
    assert uris(read) == ["s3://datasets/mnist", "s3://checkpoints/train"]
    assert uris(written) == ["s3://models/mnist/v3", "s3://checkpoints/train"]


def test_a_task_without_an_integration_has_no_datasets():
    assert lineage.datasets(SimpleNamespace(inputs=None, outputs=None, checkpoint_uri=None), None) == ([], [])


def test_the_run_facet_tells_the_rental_its_preemptions_and_its_cost():
    rental = SimpleNamespace(attempts=SimpleNamespace(preemptions=2))
    facts = lineage.rental_facts({**RECORD, "cost": 0.031}, rental)
    assert facts == {
        "instanceId": 7,
        "offerId": 3,
        "gpuName": "RTX 4090",
        "dphTotal": 0.4,
        "interruptible": True,
        "preemptions": 2,
        "estimatedCost": 0.031,
    }


def test_the_facets_name_the_datasets_from_the_type_the_stager_resolved():
    pytest.importorskip("airflow.providers.openlineage")
    found = lineage.facets_on_complete(TASK, ({**RECORD, "cost": 0.031}, None), "gcs")
    written = [(d.namespace, d.name) for d in found.outputs]
    assert written == [("gs://models", "mnist/v3"), ("gs://checkpoints", "train")]
    facet = found.run_facets[lineage.RUN_FACET_KEY]
    assert (facet.instanceId, facet.estimatedCost, facet.preemptions) == (7, 0.031, None)


#: The OpenLineage packages, hidden from imports and from the installed distributions (Airflow reads providers there).
HIDDEN = """
import importlib, importlib.abc, sys
def _without(distributions):
    return lambda **kw: (d for d in distributions(**kw) if "openlineage" not in (d.metadata["Name"] or "").lower())
for _name in ("importlib.metadata", "importlib_metadata"):
    try:
        _md = importlib.import_module(_name)
    except ImportError:
        continue
    _md.distributions = _without(_md.distributions)
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "openlineage" or name.startswith(("openlineage.", "airflow.providers.openlineage")):
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Hide())
"""


def test_without_the_openlineage_provider_a_dag_parses_and_its_facets_are_never_asked_for():
    code = HIDDEN + textwrap.dedent(
        """
        from datetime import datetime
        from airflow.providers.common.compat.sdk import DAG
        from airflow_gpumarket.assets import cloud_asset
        from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator
        with DAG("d", start_date=datetime(2026, 1, 1), schedule=None):
            op = GpuMarketRunJobOperator(task_id="j", command="true", image="i", offer_filters={},
                                         outlets=[cloud_asset("s3", "models/x")])
        loaded = sorted(m for m in sys.modules if "openlineage" in m or m.startswith("airflow_gpumarket.lineage"))
        try:
            op.get_openlineage_facets_on_complete(None)
        except ImportError:
            print("loaded:", loaded, "facets: need the provider")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "loaded: [] facets: need the provider" in done.stdout, done.stdout + done.stderr
