"""Datasets and assets of a cloud integration's paths (``airflow_gpumarket.assets``), named as OpenLineage names object
stores, and the rental carried in the extra of a task's asset events."""

from __future__ import annotations

from importlib.metadata import version
from types import SimpleNamespace

import pytest

from airflow_gpumarket.assets import EXTRA_KEY, annotate_outlet_events, cloud_asset, cloud_dataset

AIRFLOW_2 = version("apache-airflow").startswith("2.")


@pytest.mark.parametrize(
    ("cloud_type", "path", "namespace", "name"),
    [
        ("s3", "models/mnist/v3", "s3://models", "mnist/v3"),
        ("S3", "/models/mnist/v3/", "s3://models", "mnist/v3"),  # a leading and a trailing slash name the same
        ("gcs", "bucket//a/b", "gs://bucket", "a/b"),
        ("s3", "bucket", "s3://bucket", "/"),  # a bucket's root
        ("backblaze", "ckpt/run-1", "backblaze://ckpt", "run-1"),  # no convention: the type is the scheme
        ("Google Drive", "shared/x", "google-drive://shared", "x"),
    ],
)
def test_a_cloud_path_is_named_as_the_openlineage_conventions_name_object_stores(cloud_type, path, namespace, name):
    dataset = cloud_dataset(cloud_type, path)
    assert (dataset.namespace, dataset.name) == (namespace, name)


def test_a_path_without_a_bucket_is_refused_naming_the_path():
    with pytest.raises(ValueError, match="'/'"):
        cloud_dataset("s3", "/")


def test_the_asset_is_the_datasets_uri_as_airflow_names_it_on_each_version():
    asset = cloud_asset("s3", "models/mnist/v3", extra={"team": "vision"})
    assert asset.uri == "s3://models/mnist/v3"
    assert asset.extra == {"team": "vision"}
    assert type(asset).__name__ == ("Dataset" if AIRFLOW_2 else "Asset")


class Events(dict):
    def __missing__(self, outlet):
        self[outlet] = SimpleNamespace(extra={})
        return self[outlet]


def test_each_outlet_event_carries_the_rental_that_produced_it():
    asset = cloud_asset("s3", "models/mnist/v3")
    events = Events()
    summary = {"instance_id": 7, "offer_id": 3, "gpu_name": "RTX 4090", "dph_total": 0.4, "estimated_cost": 0.02}
    annotate_outlet_events({"task": SimpleNamespace(outlets=[asset]), "outlet_events": events}, summary)
    assert events[asset].extra == {EXTRA_KEY: summary}


def test_outlet_events_that_cannot_be_written_leave_the_task_alone():
    log = SimpleNamespace(messages=[])
    log.warning = lambda *args: log.messages.append(args[0] % args[1:])
    task = SimpleNamespace(outlets=[cloud_asset("s3", "m/x")], log=log)
    annotate_outlet_events({"task": task, "outlet_events": {}}, {"instance_id": 7})  # KeyError inside
    assert log.messages and "Could not add the rental" in log.messages[0]
