"""The heterogeneous market (a world file's ``market``): boot from image size and download speed, GPU checks that
fail, flaky hosts, reliability that predicts failures, outbid rates that rise towards the floor."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from gpumarket_simulator.hosts import EXTRA_OFFER_BASE, PRESETS, HostProfile, nvidia_smi_script, parse_profile
from gpumarket_simulator.world import World
from gpumarket_simulator.worldgen import GPU_TYPES, build_world, load_world_file

START = 1_700_000_000.0


def offer(offer_id: int, **fields: Any) -> dict[str, Any]:
    return {"id": offer_id, "gpu_name": "RTX 4090", "dph_total": 1.0, **fields}


def world(market: Any, *offers: dict[str, Any]) -> World:
    return build_world(0, START, {"market": market, "offers": list(offers), "credit": 1e6})


def rent(w: World, offer_id: int, ids: Any, **request: Any) -> Any:
    inst = w.create_instance(
        offer_id, {"image": "pytorch", **request}, w._last_update, new_id=lambda: next(ids), api_key=f"k{offer_id}"
    )
    return inst


def final_status(w: World, inst: Any, after: float) -> str | None:
    w.update(w._last_update + after)
    status = inst.status
    w.destroy(inst, w._last_update)
    return status


def test_the_default_world_has_no_market_profile_and_boots_as_before():
    w = build_world(0, START)
    assert w.profile is None
    assert all(o.gpu_check == "ok" and o.inet_down > 0 for o in w.offers.values())


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_preset_adds_hosts_of_every_kind_to_each_gpu_type(name):
    w = build_world(0, START, {"market": name})
    assert w.profile == PRESETS[name]
    extra = [o for o in w.offers.values() if o.gpu_name == "RTX 4090"]
    assert len(extra) >= PRESETS[name].extra_offers_per_gpu_type
    low, high = PRESETS[name].inet_down_mbps
    assert all(low <= o.inet_down <= high for o in extra)


def test_the_bad_preset_has_more_failing_hosts_than_the_healthy_one():
    def failing(name: str) -> int:
        w = build_world(0, START, {"market": name})
        return sum(o.gpu_check == "fail" or o.reliability < 0.9 for o in w.offers.values())

    assert failing("bad") > failing("typical") > failing("healthy")


def test_boot_time_grows_with_image_size_and_shrinks_with_download_speed():
    profile = {"preset": "typical", "image_sizes_gb": {"big": 20.0, "small": 2.0}}
    w = world(profile, offer(1, inet_down=100.0, reliability=1.0), offer(2, inet_down=1000.0, reliability=1.0))
    ids = itertools.count(1)
    boots = {}
    for offer_id, image in ((1, "big"), (2, "big"), (1, "small")):
        inst = rent(w, offer_id, ids, image=image)
        boots[offer_id, image] = inst.schedule[1][0] - w._last_update
        w.destroy(inst, w._last_update)
    # 20 GB at 100 Mbps * 0.5 efficiency is 3200 s of pull alone
    assert boots[1, "big"] > 3200 > boots[2, "big"]
    assert boots[1, "small"] < boots[1, "big"] / 5


def test_a_host_that_fails_the_gpu_check_boots_to_running_with_a_gpu_fault():
    w = world("typical", offer(1, gpu_check="fail"))
    inst = rent(w, 1, itertools.count(1))
    w.update(START + 10_000)
    assert inst.status == "running" and inst.gpu_fault


def booted(w: World, inst: Any) -> str | None:
    w.update(inst.schedule[1][0] + 1)
    return inst.status


def test_reliability_predicts_how_often_a_rental_fails_to_start():
    w = world("typical", offer(1, reliability=0.99), offer(2, reliability=0.5))
    ids = itertools.count(1)
    failures = {1: 0, 2: 0}
    for _ in range(200):
        for offer_id in failures:
            inst = rent(w, offer_id, ids)
            failures[offer_id] += booted(w, inst) != "running"
            w.destroy(inst, w._last_update)
    assert failures[1] <= 10 and 70 <= failures[2] <= 130  # the flaky one fails again and again


def test_the_loss_rate_reads_reliability_as_uptime_in_outages_of_outage_hours():
    p = parse_profile({"preset": "typical", "outage_hours": 4.0})
    assert p.loss_rate_per_hour(1.0) == 0
    assert p.loss_rate_per_hour(0.8) == pytest.approx(0.2 / (0.8 * 4.0))
    rates = [p.loss_rate_per_hour(r) for r in (0.5, 0.9, 0.99)]
    assert rates == sorted(rates, reverse=True)


def test_a_long_job_is_lost_more_often_than_a_short_one():
    w = world("typical", offer(1, reliability=0.8))  # lost at 0.125 per running hour
    ids = itertools.count(1)
    started = lost_by_10_min = lost_by_3_h = 0
    for _ in range(300):
        inst = rent(w, 1, ids)
        if booted(w, inst) == "running":
            started += 1
            w.update(w._last_update + 600)
            lost_by_10_min += inst.status != "running"
            w.update(w._last_update + 3 * 3600 - 600)
            lost_by_3_h += inst.status != "running"
        w.destroy(inst, w._last_update)
    assert lost_by_10_min <= 0.06 * started and 0.2 * started <= lost_by_3_h <= 0.45 * started


def test_a_job_lost_mid_way_has_billed_the_hours_it_ran():
    w = world({"preset": "typical", "outage_hours": 0.5}, offer(1, reliability=0.5))
    ids = itertools.count(1)
    while True:
        inst = rent(w, 1, ids)
        if booted(w, inst) == "running":
            break
        w.destroy(inst, w._last_update)
    w.update(w._last_update + 100_000)
    assert inst.status in ("exited", "unknown", "offline") and inst.lost_after is not None
    assert inst.compute_seconds == pytest.approx(inst.lost_after, abs=1.5)
    assert inst.compute_cost == pytest.approx(inst.lost_after / 3600, abs=0.01)


def test_a_slow_boot_bills_its_disk_but_no_compute():
    w = world({"preset": "typical", "image_sizes_gb": {"big": 20.0}}, offer(1, inet_down=20.0, reliability=1.0))
    inst = rent(w, 1, itertools.count(1), image="big")
    w.update(START + 3600)  # 20 GB at 20 Mbps x 0.5 takes hours to pull
    assert inst.status in (None, "loading")
    assert inst.compute_seconds == 0 and inst.storage_seconds == pytest.approx(3600)


def test_with_bill_loading_the_image_pull_bills_compute_but_provisioning_does_not():
    market = {"preset": "typical", "image_sizes_gb": {"big": 20.0}, "bill_loading": True}
    w = world(market, offer(1, inet_down=20.0, reliability=1.0))
    inst = rent(w, 1, itertools.count(1), image="big")
    (provisioned, _), *_ = inst.schedule
    w.update(START + 3600)
    assert inst.status == "loading"
    assert inst.compute_seconds == pytest.approx(START + 3600 - provisioned)
    assert inst.compute_cost == pytest.approx(inst.compute_seconds / 3600)


def test_the_cheap_hosts_are_the_unreliable_unverified_slow_ones():
    w = build_world(0, START, {"market": "typical"})
    added = [o for o in w.offers.values() if o.id >= EXTRA_OFFER_BASE]
    base = {name: price for name, _, price, _ in GPU_TYPES}

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    unreliable = [o for o in added if o.gpu_check == "fail" or o.reliability < 0.9]
    healthy = [o for o in added if o not in unreliable]
    price = {id(o): o.dph_total / o.num_gpus / base[o.gpu_name] for o in added}
    assert median([price[id(o)] for o in unreliable]) < median([price[id(o)] for o in healthy])
    assert sum(o.verified for o in unreliable) / len(unreliable) < sum(o.verified for o in healthy) / len(healthy)
    assert median([o.inet_down for o in added if not o.verified]) < median([o.inet_down for o in added if o.verified])


def test_the_outbid_rate_rises_as_the_bid_approaches_the_floor():
    p = HostProfile()
    rates = [p.outbid_rate_per_hour(bid, 1.0, 0.4) for bid in (0.4, 0.6, 0.8, 1.0)]
    assert rates == sorted(rates, reverse=True) and rates[0] == p.outbid_per_hour_at_floor and rates[-1] == 0


def test_a_bid_at_the_floor_is_outbid_and_comes_back_by_itself():
    w = world({"preset": "typical", "outbid_per_hour_at_floor": 50.0}, offer(1, reliability=1.0))
    inst = rent(w, 1, itertools.count(1), price=0.4)
    w.update(START + 3600)
    assert inst.outbids >= 1


def test_an_on_demand_rental_is_never_outbid():
    w = world({"preset": "typical", "outbid_per_hour_at_floor": 50.0}, offer(1, reliability=1.0))
    inst = rent(w, 1, itertools.count(1))
    w.update(START + 36_000)
    assert inst.outbids == 0 and inst.status == "running"


@pytest.mark.parametrize(
    ("market", "field"),
    [
        ("average", "market.preset"),
        ({"flaky_share": 1.5}, "market.flaky_share"),
        ({"inet_down_mbps": [500, 100]}, "market.inet_down_mbps"),
        ({"boot_speed": 2}, "unknown market fields"),
        ({"reliability_flaky": [0.5, 1.5]}, "market.reliability_flaky"),
        ({"price_factor_healthy": [1.4, 0.85]}, "market.price_factor_healthy"),
        ({"verified_share_unreliable": 1.2}, "market.verified_share_unreliable"),
        ({"outage_hours": 0}, "market.outage_hours"),
        ({"bill_loading": "yes"}, "market.bill_loading"),
        ({"lost_mid_job_share": 0.3}, "unknown market fields"),
        (3, "market must be"),
    ],
)
def test_a_bad_market_is_refused_naming_the_field(market, field, tmp_path):
    with pytest.raises(ValueError, match=field):
        parse_profile(market)
    path = tmp_path / "world.json"
    path.write_text(f'{{"market": {__import__("json").dumps(market)}}}')
    with pytest.raises(ValueError, match="invalid world file"):
        load_world_file(path)


def test_a_bad_gpu_check_or_inet_down_is_refused():
    with pytest.raises(ValueError, match="gpu_check"):
        world(None, offer(1, gpu_check="flaky"))
    with pytest.raises(ValueError, match="inet_down"):
        world(None, offer(1, inet_down=0))


def test_a_state_dump_round_trips_the_market_profile():
    w = world({"preset": "bad", "flaky_share": 0.5}, offer(1))
    again = parse_profile(w.state(START)["market"])
    assert again == w.profile


def test_nvidia_smi_lists_the_offers_gpus_or_fails_without_a_driver():
    good = nvidia_smi_script("RTX 4090", 2, works=True)
    assert "GPU 1: NVIDIA RTX 4090" in good and "GPU 2:" not in good
    assert "exit 9" in nvidia_smi_script("RTX 4090", 2, works=False)
