"""The offer choice of one try (operators/chooser.py): what the expected-cost model assumes, and where it learns it.

Host memory and the task's history are reached through one client (``host_memory_client``), replaced here by a
fake that counts its calls; the simulator runs the same paths in tests/integration/test_renting_well.py and
tests/integration/test_task_history.py.
"""

from __future__ import annotations

import logging

import pytest

from airflow_gpumarket.operators import host_memory_client
from airflow_gpumarket.operators.chooser import OfferChooser
from airflow_gpumarket.operators.spec import RentalSpec
from airflow_gpumarket.task_history import Learned

from .renting_fakes import FakeHook, job

LOG = logging.getLogger("tests.chooser")


class Reach:
    """Host memory and the history as the fake client holds them; ``calls``: what was asked, in order."""

    def __init__(self) -> None:
        self.learned = Learned()
        self.calls: list[tuple] = []

    def avoided(self):
        self.calls.append(("avoided",))
        return {}

    def history(self, dag_id, task_id, image=None):
        self.calls.append(("history", dag_id, task_id, image))
        return self.learned


@pytest.fixture
def reach(monkeypatch):
    made = Reach()
    monkeypatch.setattr(host_memory_client, "host_memory_client", lambda hook, conn_id: made)
    return made


def chooser(**kwargs) -> OfferChooser:
    hook = FakeHook({})
    spec = RentalSpec.of(job(hook, offer_choice="expected_cost", **kwargs))
    return OfferChooser(hook, LOG, spec, conn_id="gpumarket_default", task_ids=("dag", "job"))


def test_the_model_takes_the_runtime_and_image_size_the_history_tells_read_once_per_try(reach):
    reach.learned = Learned(1800.0, 2.5)
    choice = chooser(disk=50, transfer_gb={"in": 40})
    choice.start()
    model = choice.cost_model()
    assert (model.expected_runtime, model.image_size_gb, model.disk_gb) == (1800.0, 2.5, 50.0)
    assert (model.transfer_in_gb, model.transfer_out_gb, model.boot_timeout) == (40.0, 0.0, 900.0)
    assert reach.calls == [("avoided",), ("history", "dag", "job", "img")]


def test_given_arguments_win_over_the_history(reach):
    reach.learned = Learned(1800.0, 2.5)
    model = chooser(expected_runtime=600, image_size_gb=9).cost_model()
    assert (model.expected_runtime, model.image_size_gb) == (600.0, 9.0)
    assert reach.calls == []  # nothing to learn: not read


def test_without_history_the_defaults_stand_in(reach, caplog):
    caplog.set_level(logging.INFO, logger=LOG.name)  # an earlier test may leave the root logger at WARNING
    model = chooser(max_runtime=7200).cost_model()
    assert (model.expected_runtime, model.image_size_gb) == (7200.0, 6.0)
    assert "max_runtime (no earlier successful run)" in caplog.text
    assert "a default: no image_size_gb, and no earlier boot of this image" in caplog.text


def test_with_host_memory_off_the_history_is_still_read_and_host_memory_never(reach):
    reach.learned = Learned(None, 1.0)
    choice = chooser(avoid_failed_hosts=False)
    choice.start()
    assert choice.cost_model().image_size_gb == 1.0
    assert reach.calls == [("history", "dag", "job", "img")]


def test_a_history_out_of_reach_warns_once_and_the_defaults_stand_in(monkeypatch, caplog):
    def unreachable(hook, conn_id):
        raise ConnectionError("api-server refused the connection")

    monkeypatch.setattr(host_memory_client, "host_memory_client", unreachable)
    choice = chooser(avoid_failed_hosts=False)
    assert choice.cost_model().image_size_gb == 6.0 and choice.image_size_gb() is None
    assert caplog.text.count("Defaults stand in for this task's history: api-server refused the connection") == 1
