"""Sensor that notices host-requested price increases before they reach the bill."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import api, price_increases
from airflow_gpumarket._compat import AirflowException, AirflowFailException, BaseSensorOperator, PokeReturnValue
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.utils import DEFAULT_DEFERRABLE, is_templated

if TYPE_CHECKING:
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

ALERT = "alert"


class GpuMarketPendingPriceIncreaseSensor(BaseSensorOperator):
    """Wait until host-requested price increases are pending, optionally only for given contracts.

    By default the sensor succeeds when it finds some and returns them (XCom) for downstream tasks. With
    ``alert=True`` (or ``mode="alert"``) it fails the task instead, so the DAG's failure alerting fires (e-mail,
    Slack callbacks...). Either way the log lists old and new costs side by side, and a warning is logged when the
    server says the list was truncated (more increases exist than it returned).

    :param contract_ids: only these contracts (instance ids) count; None means any.
    :param alert: fail the task when increases are found, so alerting fires.
    :param check_once: look once and succeed (returning an empty list) when nothing is pending, instead of
        waiting: the shape of a scheduled daily check (``soft_fail`` would also hide the alert, so use this).
    :param deferrable: wait in the triggerer (default ``[operators] default_deferrable``).
    :param poke_interval: seconds between checks (default 300).
    """

    template_fields: Sequence[str] = ("contract_ids",)

    def __init__(
        self,
        *,
        contract_ids: list[int] | None = None,
        alert: bool = False,
        check_once: bool = False,
        gpumarket_conn_id: str = "gpumarket_default",
        deferrable: bool | None = None,
        poke_interval: timedelta | float = price_increases.CHECK_INTERVAL_SECONDS,
        mode: str = "poke",
        **kwargs: Any,
    ) -> None:
        if mode == ALERT:  # the sensor's own switch, spelled as the issue asked; Airflow's mode stays "poke"
            alert, mode = True, "poke"
        super().__init__(poke_interval=poke_interval, mode=mode, **kwargs)
        self.contract_ids = contract_ids
        self.alert = alert
        self.check_once = check_once
        self.gpumarket_conn_id = gpumarket_conn_id
        self.deferrable = DEFAULT_DEFERRABLE if deferrable is None else deferrable
        api.require_positive_number("poke_interval", self.poke_interval)
        if contract_ids is not None and not is_templated(contract_ids):
            self._contract_list()

    def _contract_list(self) -> list[int] | None:
        if self.contract_ids is None:
            return None
        if not isinstance(self.contract_ids, list | tuple) or not self.contract_ids:
            raise GpuMarketValidationError(
                "contract_ids", f"must be a non-empty list of contract ids or None, got {self.contract_ids!r}"
            )
        for contract in self.contract_ids:
            api.require_positive_int("contract_ids[]", contract)
        return list(self.contract_ids)

    @cached_property
    def hook(self) -> GpuMarketHook:
        from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

        return GpuMarketHook(self.gpumarket_conn_id)

    def execute(self, context: Any) -> Any:
        if not self.deferrable or self.check_once:
            return super().execute(context)
        from airflow_gpumarket.triggers.price_increases import GpuMarketPendingPriceIncreaseTrigger

        self.defer(
            trigger=GpuMarketPendingPriceIncreaseTrigger(
                gpumarket_conn_id=self.gpumarket_conn_id,
                contract_ids=self._contract_list(),
                poll_interval=float(self.poke_interval),  # type: ignore[arg-type]
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=float(self.timeout)) if self.timeout else None,  # type: ignore[arg-type]
        )

    def poke(self, context: Any) -> Any:
        response = self.hook.list_pending_price_increases()
        pending = price_increases.select(response, self._contract_list())
        if not pending:
            self.log.info("No pending price increase%s", "" if self.contract_ids is None else " for those contracts")
            if response.get("truncated"):
                self._warn_truncated()
            return PokeReturnValue(is_done=True, xcom_value=[]) if self.check_once else False
        return PokeReturnValue(is_done=True, xcom_value=self._report(pending, bool(response.get("truncated"))))

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        if event.get("status") != price_increases.PriceIncreaseEvent.FOUND:
            raise AirflowException(f"Waiting for price increases failed: {event.get('message', event)}")
        return self._report(event["pending"], bool(event.get("truncated")))

    def _warn_truncated(self) -> None:
        self.log.warning(
            "The server truncated the pending price increase list at its list limit: more increases exist than "
            "were returned; review them in the web console"
        )

    def _report(self, pending: list[dict[str, Any]], truncated: bool) -> Any:
        self.log.warning("%d pending price increase(s):", len(pending))
        for item in pending:
            self.log.warning("  %s", price_increases.describe(item))
        if truncated:
            self._warn_truncated()
        if self.alert:
            raise AirflowFailException(
                f"{len(pending)} host-requested price increase(s) pending: "
                + "; ".join(price_increases.describe(i) for i in pending[:5])
                + (" (list truncated by the server)" if truncated else "")
            )
        return pending
