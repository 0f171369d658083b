"""The offer watcher (triggers/offers.py) against the simulator's market over the day (its swing).

The simulator's swing is seeded and stateless, so the truth a watcher must agree with is computed here from the
swing itself at the moments of the watcher's own searches (the simulator's request log): an appearance starts at a
search that finds a matching offer listed after one that found none.
"""

from __future__ import annotations

import asyncio

import pytest

from .conftest import AIRFLOW_2, alive

pytestmark = pytest.mark.skipif(AIRFLOW_2, reason="AssetWatcher triggers are Airflow 3's")

GPU = "H100 SXM"
#: Real seconds between a watcher's searches: 30 s on the simulator's 600x clock, 20 searches per 10-minute slot.
POLL = 0.05


def watcher(**kwargs):
    from airflow_gpumarket.triggers.offers import GpuMarketOfferTrigger

    kwargs.setdefault("offer_filters", {"gpu_name": {"eq": GPU}})
    return GpuMarketOfferTrigger(poll_interval=POLL, **kwargs)


def swing_of(sim, view: dict):
    """The simulator's swing, rebuilt from what it said was in force."""
    from gpumarket_simulator.market_swing import Swing

    origin = {o["id"]: (o["dph_total"], True) for o in sim.state()["offers"] if o["id"] in view["offers"]}
    return Swing(view["seed"], view["listed"], view["amplitude"], view["slot"], view["peak_hour"], origin)


def run_for(seconds: float, *triggers) -> list[list[dict]]:
    """Each trigger's events over ``seconds`` of its run, the triggers in one event loop as in a triggerer."""

    async def collect(trigger, events: list) -> None:
        async for event in trigger.run():
            events.append(event.payload)

    async def main() -> list[list[dict]]:
        found: list[list[dict]] = [[] for _ in triggers]
        tasks = [asyncio.ensure_future(collect(t, events)) for t, events in zip(triggers, found, strict=True)]
        await asyncio.sleep(seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return found

    return asyncio.run(main())


def searches(sim, since: float) -> list[float]:
    return [r["t"] for r in sim.requests() if r["op"] == "search_offers" and r["t"] >= since]


def test_rule_a_watcher_fires_once_per_appearance_of_a_matching_offer(sim):
    ids = [o["id"] for o in sim.state()["offers"] if o["gpu_name"] == GPU]
    # Each offer listed in 11 % of the slots whatever the hour: about one slot in two has one of the six.
    view = sim.set_market_swing({"listed": 0.11, "amplitude": 0.0, "slot": 300, "offers": ids})
    truth = swing_of(sim, view)
    start = sim.now()
    (events,) = run_for(12, watcher())
    # The truth is the swing in the slots the watcher searched: a loaded machine may pause it past a whole slot.
    slots = sorted({int(t // truth.slot) for t in searches(sim, start)})
    present = [any(truth.is_listed(i, slot * truth.slot) for i in ids) for slot in slots]
    starts = [slot for slot, now, before in zip(slots, present, [False, *present], strict=False) if now and not before]
    assert starts, "the swing gave this test no appearance to tell anything"
    assert len(events) == len(starts), (events, starts)
    fired = [int(e["seen_at"] // truth.slot) for e in events]  # the Date header's clock: a boundary may blur
    assert all(abs(slot - start) <= 1 for slot, start in zip(fired, starts, strict=True)), (fired, starts)
    assert all(e["offer_id"] in ids and e["gpu_name"] == GPU for e in events)


def test_rule_a_watcher_never_fires_while_nothing_matches(sim):
    (events,) = run_for(2, watcher(max_dph=0.01))  # no offer is that cheap
    assert events == [] and len(searches(sim, 0)) >= 5


def test_rule_watchers_of_one_key_and_search_make_one_search_per_interval(sim):
    start = sim.now()
    found = run_for(1.5, *[watcher() for _ in range(10)])
    made = len(searches(sim, start))
    assert all(len(events) == 1 for events in found)  # each watcher saw the appearance that was there
    assert made <= 1.5 / POLL + 2, made  # one per interval, not ten


def test_rule_watchers_sharing_the_triggerers_stream_each_fire_from_its_one_search(sim):
    from airflow_gpumarket.triggers.offers import GpuMarketOfferTrigger

    cheap, any_price = watcher(max_dph=0.01), watcher()
    assert cheap.shared_stream_key() == any_price.shared_stream_key()  # the caps are checked on the shared answer

    async def main() -> tuple[list, list]:
        shared = GpuMarketOfferTrigger.open_shared_stream(cheap.serialize()[1])
        answers = [await anext(shared) for _ in range(3)]
        await shared.aclose()

        async def replay():
            for answer in answers:
                yield answer

        return (
            [e async for e in cheap.filter_shared_stream(replay())],
            [e async for e in any_price.filter_shared_stream(replay())],
        )

    none, one = asyncio.run(main())
    assert none == [] and len(one) == 1 and one[0].payload["gpu_name"] == GPU


class StateStore:
    """Airflow 3.3's asset state store, as a watcher's trigger sees it (one watched asset)."""

    def __init__(self) -> None:
        self.values: dict = {}

    async def aget(self, key, default=None):
        return self.values.get(key, default)

    async def aset(self, key, value):
        self.values[key] = value


def test_rule_a_watcher_restarted_in_the_middle_of_an_appearance_does_not_fire_for_it_again(sim):
    store = StateStore()
    first = watcher()
    first.asset_state_store = store
    (events,) = run_for(0.5, first)
    assert len(events) == 1 and list(store.values.values()) == [True]
    again = watcher()  # the triggerer restarted: a new trigger from the same row, the same asset's store
    again.asset_state_store = store
    (events,) = run_for(0.5, again)
    assert events == []  # the offers are still there: the same appearance
    sim.set_market_swing({"preset": "typical", "listed": 0.0})  # every offer goes
    gone = watcher()
    gone.asset_state_store = store
    (events,) = run_for(0.5, gone)
    assert events == [] and list(store.values.values()) == [False]
    sim.set_market_swing(None)  # they come back
    (events,) = run_for(0.5, gone)
    assert len(events) == 1


def test_rule_the_task_a_watcher_schedules_rents_the_events_offer_or_the_next_when_it_was_taken(sim):
    from .test_money_safety import context, job

    for offer in sim.state()["offers"]:
        sim.set_offer_fate(offer["id"], "running")
    (events,) = run_for(0.3, watcher())
    (event,) = events
    first = job(offer_filters={"gpu_name": {"eq": GPU}}).execute(context(run_id="market-1"))
    assert first["job_status"] == "succeeded" and rented(sim) == [event["offer_id"]]
    sim.vanish_offer(event["offer_id"])  # someone else rented it before the next run's task searched
    job(offer_filters={"gpu_name": {"eq": GPU}}).execute(context(run_id="market-2"))
    taken_meanwhile = rented(sim)[-1]
    assert taken_meanwhile != event["offer_id"] and taken_meanwhile in {
        o["id"] for o in sim.state()["offers"] if o["gpu_name"] == GPU
    }
    assert alive(sim) == []


def rented(sim) -> list[int]:
    return [i["offer_id"] for i in sorted(sim.state()["instances"], key=lambda i: i["id"])]


def test_rule_the_example_runs_when_the_watcher_fires_and_by_06_00_in_any_case(airflow_db):
    from pathlib import Path

    from airflow.dag_processing.dagbag import DagBag

    example = Path(__file__).parents[2] / "example_dags" / "example_gpumarket_market_schedule.py"
    dag = DagBag(dag_folder=str(example)).dags["example_gpumarket_market_schedule"]
    timetable = dag.timetable
    assert type(timetable).__name__ == "AssetOrTimeSchedule" and timetable.timetable.summary == "0 6 * * *"
    (watcher,) = timetable.asset_condition.watchers
    assert watcher.trigger["classpath"] == "airflow_gpumarket.triggers.offers.GpuMarketOfferTrigger"
    assert watcher.trigger["kwargs"]["offer_filters"] == dag.get_task("train").offer_filters


def test_rule_a_bad_watch_is_refused_when_the_dag_is_parsed():
    from airflow_gpumarket.exceptions import GpuMarketValidationError

    with pytest.raises(GpuMarketValidationError, match="gpu_nmae.*did you mean 'gpu_name'"):
        watcher(offer_filters={"gpu_nmae": {"eq": GPU}})
    with pytest.raises(GpuMarketValidationError, match="max_dph"):
        watcher(max_dph=-1)
