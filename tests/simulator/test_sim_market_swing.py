"""The market over the day (market_swing.py): offers come and go by the hour, prices follow demand, seeded."""

from __future__ import annotations

import pytest

HOUR = 3600.0


def listed_ids(api) -> set[int]:
    return {o["id"] for o in api.search({"limit": 1000})}


def prices(sim) -> dict[int, float]:
    return {o["id"]: o["dph_total"] for o in sim.state()["offers"]}


def hours_listed(sim, api, hours: int) -> list[set[int]]:
    """The offers search shows at each of the next ``hours`` hours."""
    seen = []
    for _ in range(hours):
        seen.append(listed_ids(api))
        sim.advance(HOUR)
    return seen


def test_rule_offers_come_and_go_by_the_hour_the_same_way_for_the_same_seed(sim, api):
    everything = set(sim.set_market_swing({"preset": "typical"})["offers"])
    first = hours_listed(sim, api, 24)
    sim.reset()
    sim.set_market_swing({"preset": "typical"})
    assert hours_listed(sim, api, 24) == first  # seeded: the same market again
    share = sum(len(hour) for hour in first) / (24 * len(everything))
    assert 0.3 < share < 0.5, share  # half listed, fewer at busy hours
    come_and_go = [o for o in everything if 0 < sum(o in hour for hour in first) < 24]
    assert len(come_and_go) > len(everything) / 2  # most offers appear and disappear over the day


def test_rule_prices_follow_the_days_demand_within_the_amplitude(sim):
    base = prices(sim)
    sim.set_market_swing({"preset": "tight", "peak_hour": 14})
    by_hour = {}
    start = sim.now() - sim.now() % 86400  # midnight UTC, on the simulator's clock
    for hour in (2, 14):
        sim.advance(start + hour * HOUR + 86400 - sim.now())
        by_hour[hour] = prices(sim)
    some = next(iter(base))
    assert by_hour[14][some] == pytest.approx(base[some] * 1.4, abs=1e-3)  # the peak
    assert by_hour[2][some] == pytest.approx(base[some] * 0.6, abs=1e-3)  # twelve hours from it


def test_rule_a_rented_offer_keeps_its_price_and_a_null_swing_gives_the_others_theirs_back(sim, api):
    base = prices(sim)
    named = sorted(listed_ids(api))[:20]  # listed before the swing: the null swing lists them again
    sim.set_market_swing({"preset": "tight", "listed": 1.0, "offers": named})  # most listed at any hour
    assert [o for o in base if o not in named and prices(sim)[o] != base[o]] == []  # only the named offers swing
    offer = min((o for o in api.search({"limit": 1000}) if o["id"] in named), key=lambda o: o["dph_total"])
    instance_id = api.create(offer["id"], {"image": "ubuntu:22.04"})["new_contract"]
    sim.advance(6 * HOUR)
    assert prices(sim)[offer["id"]] == offer["dph_total"]  # the contract's price does not move
    assert any(prices(sim)[o] != base[o] for o in named)  # the others swing on
    deleted = api.delete(f"/api/v0/instances/{instance_id}/")
    assert deleted.status_code == 200, deleted.text
    sim.set_market_swing(None)
    assert prices(sim) == base and offer["id"] in listed_ids(api)


@pytest.mark.parametrize(
    ("swing", "named"),
    [
        ({"preset": "wild"}, "swing.preset"),
        ({"listed": 2}, "swing.listed"),
        ({"amplitude": True}, "swing.amplitude"),
        ({"slot": 0}, "swing.slot"),
        ({"offers": [-1]}, "swing.offers"),
        ({"speed": 1}, "swing must be"),
        ("typical", "swing must be"),
    ],
)
def test_a_bad_swing_is_refused_naming_the_field(sim, api, swing, named):
    answer = api.put("/_sim/market-swing", {"swing": swing})
    assert answer.status_code == 400 and named in answer.text
