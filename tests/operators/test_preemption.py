"""Preemptions (operators/preemption.py): what each preemption of a bid instance leads to, through ``after``."""

from __future__ import annotations

import logging

import pytest

from airflow_gpumarket import lifecycle
from airflow_gpumarket.operators.failures import GpuMarketPreemptedTooOften

from .renting_fakes import FakeHook, PreemptionsOfASession

LOG = logging.getLogger("tests.preemption")
PREEMPTED = {"status": "job_failed", "actual_status": "stopped", "exit_status": None, "log_read": True}


def preempted_rental(hook: FakeHook, preemptions: int = 0) -> lifecycle.Rental:
    made = hook.create_instance(1, label="afgm-0123456789ab-1")["new_contract"]
    attempts = lifecycle.Attempts(tried=[1], preemptions=preemptions)
    return lifecycle.Rental(made, 1, 0.5, "x", "afgm-0123456789ab-1", 0.0, bid=0.21, machine_id=9, attempts=attempts)


def preemptions(hook: FakeHook, **kwargs) -> PreemptionsOfASession:
    return PreemptionsOfASession(hook, LOG, **kwargs)


def test_rule_a_preemption_destroys_the_instance_and_never_rents_its_machine_again():
    hook = FakeHook({1: ["stopped"]})
    rental = preempted_rental(hook)
    assert preemptions(hook).after(rental, PREEMPTED) is None
    assert hook.destroyed == [1001] and rental.attempts.preemptions == 1
    assert rental.attempts.lost_machines == [9] and rental.attempts.round_start == 1  # a new round of offers


def test_rule_one_preemption_more_than_max_preemptions_fails_the_task_with_the_instance_destroyed():
    hook = FakeHook({1: ["stopped"]})
    rental = preempted_rental(hook, preemptions=2)
    with pytest.raises(GpuMarketPreemptedTooOften, match="preempted 3 times, more than max_preemptions=2"):
        preemptions(hook, max_preemptions=2).after(rental, PREEMPTED)
    assert hook.destroyed == [1001]


def test_rule_fallback_on_demand_rents_on_demand_after_max_preemptions():
    hook = FakeHook({1: ["stopped"]})
    rental = preempted_rental(hook, preemptions=2)
    assert preemptions(hook, max_preemptions=2, fallback_on_demand=True).after(rental, PREEMPTED) is None
    assert rental.attempts.on_demand and hook.destroyed == [1001]


def test_rule_on_preemption_wait_leaves_the_stopped_instance_to_win_its_machine_back():
    hook = FakeHook({1: ["stopped"]})
    rental = preempted_rental(hook)
    watch = preemptions(hook, on_preemption="wait", max_outbid_wait=600).after(rental, PREEMPTED)
    assert watch is not None and watch.wait_for == lifecycle.WAIT_JOB and hook.destroyed == []
    assert watch.outbid_wait_until is not None and watch.boot_deadline > watch.outbid_wait_until
