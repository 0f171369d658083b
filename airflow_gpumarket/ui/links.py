"""The "GPU rental" link of every renting task instance: its latest rental's row on the GPU rentals page.

The renting task writes the row's address to its XCom when it rents (``records.URL_XCOM_KEY``); the link reads it
back, so it works after the task ended, on the worker (Airflow 3 evaluates links when a task finishes) and in 2.11's
webserver alike. The address is relative to the Airflow UI's base URL (no leading slash), so it works behind a
reverse proxy.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.common.compat.sdk import BaseOperatorLink

from airflow_gpumarket._compat import is_airflow_2


class GpuRentalLink(BaseOperatorLink):
    """Opens the task instance's latest rental on the GPU rentals page (Airflow 3).

    Empty before it rented, and on Airflow 2.11, which has no page.
    """

    name = "GPU rental"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        if is_airflow_2():  # no page to open there (the rental is still recorded in the task's XComs)
            return ""
        session = getattr(operator, "session", None)  # set on the operator that ran this try, in its worker
        if session is not None and not session.recorded:
            return ""  # this try rented nothing (a budget refusal, say): no address to read, no "not found" logged
        # Imported here: every DAG file with a renting operator imports this module when it is parsed.
        from airflow.providers.common.compat.sdk import XCom

        from airflow_gpumarket.ui.records import URL_XCOM_KEY

        url = XCom.get_value(key=URL_XCOM_KEY, ti_key=ti_key)
        return url if isinstance(url, str) else ""
