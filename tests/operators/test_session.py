"""RentalSession (operators/session.py): one try's rentals, driven through its public methods with a fake hook.

A rental starts by ``rent`` (a retry's first takes back what an earlier try left; else reserve, create, record,
hold) or ``resume``, and ends by ``end`` (as its outcome says) or ``fail_over``; ``failed`` destroys what the session
holds.
"""

from __future__ import annotations

import logging
import time

import pytest

from airflow_gpumarket import lifecycle
from airflow_gpumarket._compat import AirflowException
from airflow_gpumarket.operators.failures import GpuMarketNoWorkingOffer
from airflow_gpumarket.operators.result import summary
from airflow_gpumarket.operators.session import Outcome, RentalSession
from airflow_gpumarket.operators.spec import RentalSpec
from airflow_gpumarket.outcome import EventKind, WaitOutcome

from .renting_fakes import FakeHook, ctx, job

LOG = logging.getLogger("tests.session")


def session_of(hook: FakeHook, try_number: int = 1, **kwargs) -> RentalSession:
    op = job(hook, **kwargs)
    return RentalSession(hook, LOG, RentalSpec.of(op), ctx(try_number), task=op)


def rented(hook: FakeHook, **kwargs) -> tuple[RentalSession, lifecycle.Rental]:
    session = session_of(hook, **kwargs)
    return session, session.rent()


def test_rent_creates_on_the_first_offer_with_the_tasks_label_and_holds_it():
    hook = FakeHook({1: ["running"], 2: ["running"]})
    session, rental = rented(hook)
    assert (rental.instance_id, rental.offer_id, rental.attempts.tried) == (1001, 1, [1])
    assert session.recorded and not session_of(hook).recorded  # the GPU rental link reads an address only then
    key, lease = lifecycle.parse_label(hook.instances[1001]["label"])
    assert key == session.key and lease > time.time()
    session.failed(RuntimeError("boom"))
    assert hook.alive() == []  # held: a failure destroys it


def test_rent_fails_naming_why_once_no_offer_is_left():
    hook = FakeHook({1: ["running"]})
    session = session_of(hook)
    session.attempts = lifecycle.Attempts(tried=[1], reasons=["instance 1001 never ran"])
    with pytest.raises(GpuMarketNoWorkingOffer, match="instance 1001 never ran; no further matching offer"):
        session.rent()
    assert hook.instances == {}


def test_rule_a_search_that_matches_no_offer_says_so_echoing_the_filter_and_the_command_that_shows_matches():
    hook = FakeHook({})  # the search answers no offer
    op = job(hook)
    op.offer_filters = {"gpu_name": {"eq": "A100"}}
    with pytest.raises(GpuMarketNoWorkingOffer) as caught:
        RentalSession(hook, LOG, RentalSpec.of(op), ctx(1), task=op).rent()
    said = str(caught.value)
    assert 'the search matched no offer (offer_filters {"gpu_name": {"eq": "A100"}}, ondemand)' in said
    assert """`airflow gpumarket offers --filters '{"gpu_name": {"eq": "A100"}}'`""" in said
    assert hook.instances == {}


@pytest.mark.parametrize("choice", ["price", "expected_cost"])
def test_rule_offers_that_match_but_are_priced_out_are_not_said_to_match_nothing(choice):
    hook = FakeHook({1: ["running"], 2: ["running"]})
    op = job(hook, max_dph=0.001, offer_choice=choice)  # both offers match, and cost more than that
    with pytest.raises(GpuMarketNoWorkingOffer) as caught:
        RentalSession(hook, LOG, RentalSpec.of(op), ctx(1), task=op).rent()
    assert "matched no offer" not in str(caught.value) and "no further matching offer" in str(caught.value)


def test_rule_offers_the_search_returned_against_a_gpu_name_filter_are_named_among_the_gpus_it_saw():
    hook = FakeHook({1: ["running"], 2: ["running"]})  # a search that ignored the filter: two RTX 4090 offers
    op = job(hook)
    op.offer_filters = {"gpu_name": {"in": ["A100", "H100"]}}
    with pytest.raises(GpuMarketNoWorkingOffer, match=r"matched no offer \(.*\); the GPUs it saw are 'RTX 4090'\."):
        RentalSession(hook, LOG, RentalSpec.of(op), ctx(1), task=op).rent()


def test_a_rental_that_never_ran_is_destroyed_and_why_is_kept_for_the_end():
    hook = FakeHook({1: ["offline"]})
    session, rental = rented(hook)
    session.fail_over(rental, WaitOutcome(EventKind.NEVER_RUNS, actual_status="offline"), None)
    assert hook.destroyed == [1001] and "which never becomes running" in rental.attempts.reasons[-1]


def test_rule_a_failover_after_the_task_was_killed_rents_nothing_more():
    hook = FakeHook({1: ["offline"], 2: ["running"]})
    session, rental = rented(hook)
    session.kill()  # SIGTERM's handler ran during the wait, which then saw the instance gone
    session.fail_over(rental, WaitOutcome(EventKind.NEVER_RUNS, actual_status="offline"), None)
    with pytest.raises(AirflowException, match="killed: nothing more is rented"):
        session.rent()
    assert list(hook.instances) == [1001] and hook.alive() == []


@pytest.mark.parametrize(
    ("outcome", "destroyed", "alive"),
    [
        (Outcome.SUCCEEDED, [1001], []),
        (Outcome.FAILED, [1001], []),
        (Outcome.NOT_STARTED, [1001], []),
        (Outcome.HANDED_OVER, [], [1001]),
        (Outcome.GONE, [], [1001]),  # the fake still lists it; the session only forgets it
    ],
)
def test_end_destroys_or_hands_over_as_the_outcome_says_and_nothing_is_held_after(outcome, destroyed, alive):
    hook = FakeHook({1: ["running"]})
    session, rental = rented(hook)
    session.end(rental, outcome, metric=None)
    session.kill()  # on_kill after the end: nothing of this try's is left to destroy
    assert hook.destroyed == destroyed and hook.alive() == alive


def test_an_end_with_nothing_saved_neither_saves_nor_waits_for_a_kept_checkpoint_source():
    """execution_timeout ends the rental at once: a save, or the wait for a kept source's save, would outlast it."""
    from types import SimpleNamespace

    hook = FakeHook({1: ["running"]})
    session, rental = rented(hook)
    staged: list[str] = []
    session._stager = SimpleNamespace(  # a stager that records what it is asked, nothing more
        drop_source=lambda *args: staged.append("drop_source"),
        save=lambda *args: staged.append("save"),
        stage_out=lambda *args: staged.append("stage_out") or {},
    )
    session.end(rental, Outcome.DESTROYED, metric=None)
    assert hook.destroyed == [1001] and staged == []
    session.end(rental, Outcome.FAILED, metric=None)
    assert staged == ["drop_source", "save"]  # a failed job's end saves its checkpoint first


def test_a_retry_adopts_what_an_earlier_try_left_counted_from_its_own_start():
    hook = FakeHook({1: ["running"]})
    session = session_of(hook, try_number=2)
    started = time.time() - 480
    made = hook.create_instance(1, label=lifecycle.make_label(session.key, time.time() + 600))
    hook.instances[made["new_contract"]].update(actual_status="running", start_date=started, dph_total=0.5)
    rental = session.rent()
    assert (rental.instance_id, rental.created_at) == (1001, started) and len(hook.instances) == 1
    assert summary(rental, "running", hook.service_now)["elapsed_seconds"] == pytest.approx(480, abs=5)
    first = FakeHook({1: ["running"]})
    first.create_instance(1, label=lifecycle.make_label(session.key, time.time() + 600))
    assert session_of(first).rent().instance_id == 1002  # a first try adopts nothing: it rents


def test_resume_takes_the_rental_back_from_the_event_and_destroys_it_when_the_event_is_not_its_own():
    hook = FakeHook({1: ["running"]})
    _, rental = rented(hook)
    event = {"status": "job_failed", "instance_id": 1001, "label": "renewed", "bid": 0.3, "resume": rental.to_resume()}
    session = session_of(hook)
    back, _ = session.resume(event)
    assert (back.instance_id, back.label) == (1001, "renewed")
    other = session_of(hook)
    with pytest.raises(AirflowException, match="Unexpected trigger event") as raised:
        other.resume({**event, "instance_id": 1002})
    other.failed(raised.value)
    assert hook.destroyed == [1002]  # the instance the event named: whatever else is wrong, it is destroyed


def test_the_label_key_is_the_task_instances_for_every_try():
    hook = FakeHook({1: ["running"]})
    op = job(hook)
    assert session_of(hook).key == session_of(hook, try_number=3).key == lifecycle.task_key(op, ctx())


def test_rule_the_cost_so_far_of_a_rental_not_seen_running_is_its_disk_and_never_goes_down(caplog):
    from types import SimpleNamespace

    from airflow_gpumarket.operators.session import log_progress

    rental = lifecycle.Rental(7, 1, 3.6, "GPU", "label", created_at=1000.0, disk_hourly=0.36)
    watch = SimpleNamespace(shown="'loading'")
    log = logging.getLogger("progress")
    with caplog.at_level(logging.INFO, logger="progress"):
        log_progress(log, rental, watch, 1000.0 + 600)  # ten minutes loading: disk only
        rental.running_at = 1600.0
        log_progress(log, rental, watch, 1600.0 + 60)  # then a minute running: disk and compute
    loading, running = (r.getMessage() for r in caplog.records)
    assert "cost so far about $0.0600" in loading and "cost so far about $0.1260" in running
