"""GpuMarketReapOrphansOperator (operators/reaper.py) with a fake hook: only this provider's rentals whose lease
ran out are destroyed."""

from __future__ import annotations

import time
from types import SimpleNamespace

from bad_input import refused_at_parse_time
from fake_flows import FlowsOverMethods

from airflow_gpumarket import lifecycle
from airflow_gpumarket.operators.reaper import GpuMarketReapOrphansOperator
from airflow_gpumarket.ui import records

KEY = "0123456789ab"
CASES = [
    # (operator, arguments, the argument the message must name)
    (GpuMarketReapOrphansOperator, {"grace": -1}, "grace"),
]


class Instances(FlowsOverMethods):
    """A service listing ``instances``; destroys are recorded."""

    def __init__(self, *instances: dict) -> None:
        self.instances = list(instances)
        self.destroyed: list[int] = []

    def list_instances(self, *, label=None, ids=None):
        return [i for i in self.instances if i["id"] not in self.destroyed]

    def destroy_instance(self, instance_id):
        self.destroyed.append(instance_id)
        return {"success": True}


def leased(instance_id: int, lease_until: float, dph_total: float = 0.5) -> dict:
    label = lifecycle.make_label(KEY, lease_until)
    return {"id": instance_id, "label": label, "actual_status": "running", "dph_total": dph_total}


def reaper(hook: Instances, **kwargs) -> GpuMarketReapOrphansOperator:
    op = GpuMarketReapOrphansOperator(task_id="reap", **kwargs)
    op.__dict__["hook"] = hook  # the cached_property, replaced
    return op


def test_only_this_providers_instances_whose_lease_ran_out_are_destroyed():
    now = time.time()
    hook = Instances(
        leased(1, now - 600, dph_total=0.5),
        leased(2, now + 600),  # still leased: its task holds it
        {"id": 3, "label": "my-notebook", "dph_total": 2.0},  # made by hand: never touched
        {"id": 4, "label": None, "dph_total": 2.0},
        leased(5, now - 60, dph_total=0.25),
    )
    pushed = {}
    ti = SimpleNamespace(xcom_push=lambda key, value: pushed.update({key: value}))
    result = reaper(hook).execute({"ti": ti})
    assert hook.destroyed == [1, 5]
    assert result == {"destroyed": [1, 5], "report_only": False, "dollars_per_hour_saved": 0.75}
    assert {records.end_key(1), records.end_key(5)} == set(pushed) and pushed[records.end_key(1)]["ended_by"] == "reap"


def test_report_only_destroys_nothing_and_says_what_it_would_destroy(task_log):
    hook = Instances(leased(1, time.time() - 600))
    result = reaper(hook, report_only=True).execute({})
    assert hook.destroyed == [] and result["destroyed"] == [1] and result["report_only"] is True
    assert "Would destroy instance 1" in task_log()


def test_grace_spares_an_instance_whose_lease_ran_out_only_just():
    now = time.time()
    hook = Instances(leased(1, now - 60), leased(2, now - 3600))
    assert reaper(hook, grace=600).execute({})["destroyed"] == [2]


# --- Bad input, refused when the DAG is parsed -------------------------------------------------------------


test_bad_input_is_refused_at_parse_time_naming_the_argument = refused_at_parse_time(CASES)


def test_rule_a_reaped_instance_is_settled_from_its_start_at_what_the_service_charged(monkeypatch):
    from airflow_gpumarket.operators import budget

    settled = []
    monkeypatch.setattr(
        budget, "settle_ended", lambda hook, conn, instance_id, log, cost=None, started=None: settled.append(started)
    )
    hook = Instances({**leased(1, time.time() - 600), "start_date": 1_700_000_000.0})
    reaper(hook).execute({"ti": SimpleNamespace(xcom_push=lambda **kwargs: None)})
    assert settled == [1_700_000_000.0]  # the charges from its start are read, not an estimate over its life
