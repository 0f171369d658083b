"""OpenLineage for the renting operators and ``@task.gpumarket``, read by the OpenLineage provider when it is installed.

The provider calls the operator's ``get_openlineage_facets_on_complete`` after the task ends (and on a failure, as
none of its own is defined); the operator hands the work to ``facets_on_complete``. Inputs are ``inputs`` and
``checkpoint_uri``, outputs ``outputs`` and ``checkpoint_uri``, each named from the cloud integration's type and
bucket (``airflow_gpumarket.assets``); the ``gpumarket`` run facet tells the rental. Nothing here is imported
while a DAG file is parsed, and the OpenLineage packages only when the provider asks for facets.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_gpumarket.assets import CloudDataset, cloud_dataset

#: The run facet's key in an OpenLineage run event.
RUN_FACET_KEY = "gpumarket"


def datasets(task: Any, cloud_type: str | None) -> tuple[list[CloudDataset], list[CloudDataset]]:
    """The task's (inputs, outputs) in its cloud integration; none when the integration's type is unknown."""
    if not cloud_type:
        return [], []
    checkpoint = [task.checkpoint_uri] if isinstance(getattr(task, "checkpoint_uri", None), str) else []
    read = [*_paths(getattr(task, "inputs", None)), *checkpoint]
    written = [*_paths(getattr(task, "outputs", None)), *checkpoint]
    return _named(cloud_type, read), _named(cloud_type, written)


def _paths(mapping: Any) -> list[str]:
    return [v for v in mapping.values() if isinstance(v, str)] if isinstance(mapping, Mapping) else []


def _named(cloud_type: str, paths: Iterable[str]) -> list[CloudDataset]:
    named: dict[str, CloudDataset] = {}
    for path in paths:
        dataset = cloud_dataset(cloud_type, path)
        named.setdefault(dataset.uri, dataset)
    return list(named.values())


def rental_facts(record: Mapping[str, Any] | None, rental: Any) -> dict[str, Any]:
    """The run facet's fields: the try's latest rental as its record (``ui.records``) and its ``Rental`` tell."""
    if not record:
        return {}
    attempts = getattr(rental, "attempts", None)
    facts = {
        "instanceId": record.get("instance_id"),
        "offerId": record.get("offer_id"),
        "gpuName": record.get("gpu_name"),
        "dphTotal": record.get("hourly_price"),
        "interruptible": record.get("interruptible"),
        "preemptions": getattr(attempts, "preemptions", None),
        "estimatedCost": record.get("cost"),
    }
    return {key: value for key, value in facts.items() if value is not None}


def _cloud_type(task: Any, known: str | None) -> str | None:
    """The integration's type: as the task's stager resolved it (``known``), else read from the service once."""
    if known:
        return str(known)
    name = getattr(task, "cloud_integration", None)
    if name is None:
        return None
    return str(task.hook.cloud_integration(name).get("cloud_type") or "") or None


def facets_on_complete(task: Any, latest: Any, cloud_type: str | None) -> Any:
    """The ``OperatorLineage`` of a renting task's try: its datasets and the ``gpumarket`` run facet.

    ``latest``: the try's latest rental as (its record, its ``Rental``), else None; ``cloud_type``: the integration's
    type as the try resolved it, else None (``RentalSession.lineage_facts``).
    """
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import InputDataset, OutputDataset

    inputs, outputs = datasets(task, _cloud_type(task, cloud_type))
    record, rental = latest or (None, None)
    facts = rental_facts(record, rental)
    return OperatorLineage(
        inputs=[InputDataset(namespace=d.namespace, name=d.name) for d in inputs],
        outputs=[OutputDataset(namespace=d.namespace, name=d.name) for d in outputs],
        run_facets={RUN_FACET_KEY: run_facet_class()(**facts)} if facts else {},
    )


@functools.cache
def run_facet_class() -> type:
    """The ``gpumarket`` run facet, an OpenLineage ``RunFacet`` (defined once the OpenLineage client is imported)."""
    import attr
    from openlineage.client.facet_v2 import RunFacet

    @attr.define
    class GpuMarketRunFacet(RunFacet):
        """The rental a task's try ran on: offer, GPU, price, instance, preemptions and estimated cost."""

        instanceId: int | None = None  # noqa: N815 - OpenLineage facets' fields are camelCase
        offerId: int | None = None  # noqa: N815
        gpuName: str | None = None  # noqa: N815
        dphTotal: float | None = None  # noqa: N815
        interruptible: bool | None = None
        preemptions: int | None = None
        estimatedCost: float | None = None  # noqa: N815

    return GpuMarketRunFacet
