"""The data a renting task reads and writes in a cloud integration, named once for OpenLineage and Airflow assets.

A path in a cloud integration (``inputs``, ``outputs``, ``checkpoint_uri``) starts with its bucket:
``my-bucket/models/v3``. The integration's ``cloud_type`` picks the scheme, as the OpenLineage naming conventions
name object stores: ``s3://my-bucket`` (namespace) and ``models/v3`` (name) for S3, ``gs://`` for Google Cloud
Storage. The conventions name no other store the service copies to; those keep their type as the scheme
(``backblaze://my-bucket``, ``gdrive://folder``). The asset URI is the namespace and the name joined, so a
lineage backend and Airflow's asset scheduling see the same dataset.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: ``cloud_type`` -> the scheme the OpenLineage naming conventions give the store.
CONVENTION_SCHEMES = {"s3": "s3", "gcs": "gs", "gs": "gs", "google_cloud_storage": "gs"}
#: The key of an asset event's ``extra`` that holds the rental that produced it.
EXTRA_KEY = "gpumarket"
_NOT_SCHEME = re.compile(r"[^a-z0-9+.-]+")


@dataclass(frozen=True)
class CloudDataset:
    """A path in a cloud integration as OpenLineage names it: ``namespace`` (the store) and ``name`` (the path)."""

    namespace: str
    name: str

    @property
    def uri(self) -> str:
        return f"{self.namespace}/{self.name}"


def scheme_of(cloud_type: str) -> str:
    """The URI scheme of an integration's ``cloud_type``: the convention's, else the type itself made URI-safe."""
    kind = str(cloud_type).strip().lower()
    if kind in CONVENTION_SCHEMES:
        return CONVENTION_SCHEMES[kind]
    scheme = _NOT_SCHEME.sub("-", kind).strip("-")
    return scheme if scheme[:1].isalpha() else f"cloud-{scheme or 'unknown'}"


def cloud_dataset(cloud_type: str, path: str) -> CloudDataset:
    """The dataset ``path`` names in an integration of ``cloud_type``: its first part is the bucket.

    ``/`` names a bucket's root; a trailing ``/`` and repeated ones are dropped, so a folder has one name.
    """
    parts = [part for part in posixpath.normpath("/" + str(path)).split("/") if part]
    if not parts:
        raise ValueError(f"the cloud path {path!r} names no bucket; give 'bucket/path'")
    bucket, key = parts[0], "/".join(parts[1:])
    return CloudDataset(f"{scheme_of(cloud_type)}://{bucket}", key or "/")


def cloud_asset(cloud_type: str, path: str, *, extra: Mapping[str, Any] | None = None) -> Any:
    """The Airflow asset of ``path`` in an integration of ``cloud_type``: for ``outlets`` and ``schedule``.

    An ``airflow.sdk.Asset`` on Airflow 3 and an ``airflow.datasets.Dataset`` (the same thing's Airflow 2 name) on
    2.11; its URI is the OpenLineage dataset's (``cloud_dataset``). The path is not templated: a DAG scheduled on the
    asset names it when it is parsed.

    :param cloud_type: the integration's type as ``vastai show connections`` lists it (``s3``, ``gcs``, ...).
    :param path: the path in the integration, as the task's ``outputs`` or ``checkpoint_uri`` gives it.
    :param extra: the asset's own ``extra``.
    """
    from airflow_gpumarket._compat import Asset

    return Asset(uri=cloud_dataset(cloud_type, path).uri, extra=dict(extra or {}))


def rental_extra(summary: Mapping[str, Any]) -> dict[str, Any]:
    """What an asset event says of the rental that produced it, from the task's summary of the rental."""
    keys = ("instance_id", "offer_id", "gpu_name", "dph_total", "estimated_cost", "elapsed_seconds", "preemptions")
    return {key: summary[key] for key in keys if summary.get(key) is not None}


def annotate_outlet_events(context: Any, summary: Mapping[str, Any]) -> None:
    """Put the rental into the ``extra`` of each asset event this task's outlets emit (``EXTRA_KEY``). Never raises."""
    try:
        task = context.get("task") if isinstance(context, Mapping) else None
        events = context.get("outlet_events") if isinstance(context, Mapping) else None
        outlets = [o for o in getattr(task, "outlets", None) or () if hasattr(o, "uri")]
        if events is None or not outlets:
            return
        extra = rental_extra(summary)
        for outlet in outlets:
            events[outlet].extra[EXTRA_KEY] = extra
    except Exception as exc:  # noqa: BLE001 - the asset event is still emitted, only without the rental
        log = getattr(context.get("task"), "log", None) if isinstance(context, Mapping) else None
        if log is not None:
            log.warning("Could not add the rental to the asset events' extra: %s", exc)
