"""The daily spend report: what the service charged over a window, per DAG and team, and what no task recorded."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow_gpumarket._compat import AirflowFailException
from airflow_gpumarket.exceptions import GpuMarketNotFoundError
from airflow_gpumarket.operators.base import GpuMarketBaseOperator
from airflow_gpumarket.utils import RunTimeModule, duration_seconds, is_templated

if TYPE_CHECKING:
    from airflow_gpumarket import spend_report
    from airflow_gpumarket.operators import budget
else:  # what only a running task needs: not imported when a DAG file is parsed
    spend_report = RunTimeModule("airflow_gpumarket.spend_report")
    budget = RunTimeModule("airflow_gpumarket.operators.budget")

#: How long before the window the ledger is read from: a rental that began earlier and still billed in the window
#: is found by its entry, so it is not taken for a leak. Longer than any rental's ``max_runtime`` should be.
LEDGER_LOOKBACK = timedelta(days=30)


class GpuMarketSpendReportOperator(GpuMarketBaseOperator):
    """Report what the service charged over a window: per DAG, per team, and charges that no task recorded.

    Reads the account's charges (``hook.charges``) and the budget ledger's entries (one per rental a task made),
    logs the report as a table, and returns it (XCom) as plain JSON: ``total``, ``per_dag``, ``per_team``,
    ``leaked`` (instance id, amount, days), ``other`` (charges of no instance, by type), ``start`` and ``end``.
    An instance charge belongs to the DAG whose entry names the instance, and to that DAG's team (its
    ``team:<name>`` tag; ``(no team)`` otherwise). The window is half-open: a charge of its last second belongs to
    the next window, so consecutive daily reports never count one twice.

    :param window_start: when the window starts: a datetime, ISO 8601 text or epoch seconds (templated). Default:
        the run's ``data_interval_start`` (for a daily DAG, the start of the day before), else 24 h ago.
    :param window_end: when it ends, in the same forms (templated). Default: the run's ``data_interval_end``, else
        now.
    :param ledger_lookback: how long before ``window_start`` the ledger is read from (default 30 days), so that a
        rental begun before the window is still found.
    """

    template_fields: Sequence[str] = ("window_start", "window_end")

    def __init__(
        self,
        *,
        window_start: datetime | str | float | None = None,
        window_end: datetime | str | float | None = None,
        ledger_lookback: timedelta | float = LEDGER_LOOKBACK,
        gpumarket_conn_id: str = "gpumarket_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.gpumarket_conn_id = gpumarket_conn_id
        self.window_start = window_start
        self.window_end = window_end
        self.ledger_lookback = duration_seconds("ledger_lookback", ledger_lookback)
        given = [value for value in (window_start, window_end) if value is not None]
        if given and not any(is_templated(value) for value in given):  # bad input costs nothing: refused at parse
            spend_report.window(window_start, window_end, now=time.time())

    def execute(self, context: Any) -> dict[str, Any]:
        start, end = spend_report.window(
            self.window_start,
            self.window_end,
            interval_start=context.get("data_interval_start"),
            interval_end=context.get("data_interval_end"),
            now=time.time(),
        )
        try:
            # Both ends of the service's filter are included: the window's last second is the next window's.
            charges = self.hook.charges(start, max(math.floor(start), math.ceil(end) - 1))
        except GpuMarketNotFoundError as exc:
            raise AirflowFailException(
                "The spend report needs the account's charges, which this service does not serve (a server that "
                f"follows the spec only). Point the connection at the live service. {exc}"
            ) from None
        entries = budget.ledger_client(self.hook).entries(self.gpumarket_conn_id, start - self.ledger_lookback)
        report = spend_report.build(charges, entries, start=start, end=end)
        self.log.info("Spend report (%d ledger entries read):\n%s", len(entries), report.table())
        if report.leaked:
            self.log.warning(
                "%d instance(s) were charged $%s that no task recorded renting: %s. Rented by hand, by another tool, "
                "or leaked: look for them on the GPU rentals page.",
                len(report.leaked),
                spend_report.rounded(report.leaked_total),
                ", ".join(str(leak.instance_id) for leak in report.leaked),
            )
        return report.to_dict()
