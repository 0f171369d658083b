"""What a rental cost (operators/cost.py): the service's charge when it is posted to the rental's end, else the
estimate, each named."""

from __future__ import annotations

from types import SimpleNamespace

from airflow_gpumarket import lifecycle
from airflow_gpumarket.api import Charge
from airflow_gpumarket.operators import cost

START, END = 1_000_000.0, 1_003_600.0  # one hour on the service's clock


def rental() -> lifecycle.Rental:
    return lifecycle.Rental(
        instance_id=7, offer_id=3, dph_total=0.5, gpu_name="g", label=None, created_at=START, running_at=START
    )


def hook(*charges: Charge, fails: bool = False) -> SimpleNamespace:
    def read(start, end, types=None):
        if fails:
            raise OSError("no answer")
        return list(charges)

    return SimpleNamespace(charges=read)


def charge(amount: float, end: float | None, instance_id: int = 7) -> Charge:
    return Charge("instance", f"instance-{instance_id}", instance_id, amount, START, end, "")


def test_rule_a_charge_posted_to_the_rentals_end_is_its_cost():
    held = rental()
    cost.settle(hook(charge(0.3, END - 10), charge(0.2, END), charge(9.0, END, instance_id=8)), held, END)
    assert (held.cost, held.cost_kind, held.ended_at) == (0.5, cost.CHARGED, END)
    assert cost.text(held.cost, held.cost_kind) == "$0.5000, charged by the service"


def test_rule_a_charge_posted_only_up_to_well_before_the_end_is_partial_and_the_estimate_stands():
    held = rental()
    cost.settle(hook(charge(0.1, START + 600)), held, END)
    assert (held.cost, held.cost_kind) == (0.5, cost.ESTIMATED)  # an hour at $0.5/h
    assert cost.text(held.cost, held.cost_kind).endswith("estimated on the service's clock")


def test_rule_no_charges_or_no_answer_leaves_the_estimate_and_never_raises():
    for service in (hook(), hook(fails=True)):
        held = rental()
        cost.settle(service, held, END)
        assert held.cost_kind == cost.ESTIMATED
