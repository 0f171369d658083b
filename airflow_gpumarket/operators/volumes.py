"""Operator for hosts: create or update disk volume ask listings for their machines."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_gpumarket import api
from airflow_gpumarket._compat import AirflowException
from airflow_gpumarket.exceptions import GpuMarketError
from airflow_gpumarket.operators.base import GpuMarketBaseOperator
from airflow_gpumarket.utils import is_templated

# What to do about each documented error of the volume listing endpoint, keyed by status and message.
_ADVICE = {
    (400, "invalid machine id"): "a machine id is not valid: check the machine/machines argument",
    (400, "no such machine"): "a machine is not registered to this account: list only your own machines "
    "(check the connection's API key belongs to the host account)",
    (402, ""): "the machine is offline: asks can only be created for an online machine; bring it online and retry",
    (422, ""): "the service refused the arguments (invalid disk ask): check hidden_listing and the machine settings",
}


def advice_for(exc: GpuMarketError) -> str:
    text = f"{exc.error or ''} {exc.msg or ''}".lower()
    for (status, words), advice in _ADVICE.items():
        if exc.status_code == status and words in text:
            return advice
    return "see the server's message"


class GpuMarketCreateVolumeListingOperator(GpuMarketBaseOperator):
    """Create or update volume ask listings on one or several machines; returns the listing result.

    The per-machine results (new contracts with their sizes, updated contracts, extended count) are logged and
    returned to XCom. The documented errors (400 invalid or foreign machine, 402 machine offline, 422 invalid
    arguments) fail the task with a message saying what to do.

    :param machine: a single machine id.
    :param machines: several machine ids (overrides ``machine`` when both are given, as the spec says).
    :param hidden_listing: hide the listing from public marketplace search.
    """

    template_fields: Sequence[str] = ("machine", "machines", "hidden_listing")

    def __init__(
        self,
        *,
        machine: int | None = None,
        machines: list[int] | None = None,
        hidden_listing: bool | None = None,
        gpumarket_conn_id: str = "gpumarket_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.gpumarket_conn_id = gpumarket_conn_id
        self.machine = machine
        self.machines = machines
        self.hidden_listing = hidden_listing
        if not any(is_templated(v) for v in (machine, machines, hidden_listing)):
            api.build_volume_listing_body(machine=machine, machines=machines, hidden_listing=hidden_listing)

    def execute(self, context: Any) -> dict[str, Any]:
        try:
            result = self.hook.create_volume_listings(
                machine=self.machine, machines=self.machines, hidden_listing=self.hidden_listing
            )
        except GpuMarketError as exc:
            if exc.status_code in (400, 402, 422):
                raise AirflowException(f"Volume listing failed: {advice_for(exc)}. {exc}") from exc
            raise
        for item in result.get("results") or []:
            new = ", ".join(f"{c.get('id')} ({c.get('size')} GB)" for c in item.get("new_contracts") or []) or "none"
            self.log.info(
                "Machine %s: new contracts %s; updated contracts %s; %s active contract(s) extended",
                item.get("machine_id"),
                new,
                item.get("upd_contracts") or "none",
                item.get("extended", 0),
            )
        return dict(result)
