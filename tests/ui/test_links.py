"""The "GPU rental" extra link (ui/links.py): the address its task recorded when it rented, read back from XCom."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_gpumarket._compat import is_airflow_2
from airflow_gpumarket.ui import records
from airflow_gpumarket.ui.links import GpuRentalLink

TI_KEY = SimpleNamespace(dag_id="train_dag", task_id="train", run_id="run-1", map_index=-1, try_number=1)


@pytest.fixture
def stored(monkeypatch):
    """What XCom holds, by key; ``XCom.get_value`` as the link calls it."""
    from airflow.providers.common.compat import sdk

    values: dict = {}
    asked: list = []

    class XCom:
        @staticmethod
        def get_value(*, key, ti_key):
            asked.append((key, ti_key))
            return values.get(key)

    monkeypatch.setattr(sdk, "XCom", XCom)
    values["asked"] = asked
    return values


@pytest.mark.skipif(is_airflow_2(), reason="Airflow 3 reads the link from XCom; 2.11 has no page to open")
def test_the_link_opens_the_address_its_task_recorded_and_nothing_before_it_rented(stored):
    link = GpuRentalLink()
    assert link.get_link(None, ti_key=TI_KEY) == ""  # nothing rented yet
    stored[records.URL_XCOM_KEY] = "gpumarket/?instance=41#rental-41"
    assert link.get_link(None, ti_key=TI_KEY) == "gpumarket/?instance=41#rental-41"
    stored[records.URL_XCOM_KEY] = {"not": "an address"}
    assert link.get_link(None, ti_key=TI_KEY) == ""
    assert stored["asked"][0] == (records.URL_XCOM_KEY, TI_KEY)


@pytest.mark.skipif(not is_airflow_2(), reason="Airflow 2.11 only")
def test_on_airflow_2_the_link_is_empty_there_being_no_page(stored):
    stored[records.URL_XCOM_KEY] = "gpumarket/?instance=41#rental-41"
    assert GpuRentalLink().get_link(None, ti_key=TI_KEY) == ""
    assert stored["asked"] == []


@pytest.mark.skipif(is_airflow_2(), reason="Airflow 3 reads the link from XCom; 2.11 has no page to open")
def test_the_link_of_a_try_that_rented_nothing_reads_no_xcom(stored):
    """A try refused before renting wrote no address: reading it would log an XCom "not found" error in its log."""
    recorder = records.RentalRecorder({}, None, "gpumarket_default", clock=lambda: 0.0)
    ran = SimpleNamespace(session=SimpleNamespace(recorded=recorder.recorded))  # the operator's RentalSession
    stored[records.URL_XCOM_KEY] = "gpumarket/?instance=41#rental-41"
    assert GpuRentalLink().get_link(ran, ti_key=TI_KEY) == ""
    assert stored["asked"] == []
    recorder.start(
        SimpleNamespace(
            instance_id=41,
            offer_id=3,
            gpu_name="g",
            hourly_price=0.3,
            disk_hourly=0.0,
            bid=None,
            recorded_at=1.0,
            running_at=None,
        )
    )
    ran.session.recorded = recorder.recorded
    assert GpuRentalLink().get_link(ran, ti_key=TI_KEY) == "gpumarket/?instance=41#rental-41"
