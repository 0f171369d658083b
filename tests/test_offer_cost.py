"""Expected-cost offer choice: offers ranked by what finishing is expected to cost, from what search returns."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from airflow_gpumarket import offer_cost
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.job_script import validate_preflight
from airflow_gpumarket.offer_cost import CostModel, rank_offers

HOUR = 3600.0


def offer(offer_id: int, dph: float, reliability: float = 0.99, inet_down: float | None = 1000.0, **more):
    fields = {
        "id": offer_id,
        "machine_id": offer_id + 100,
        "gpu_name": "RTX 4090",
        "num_gpus": 1,
        "dph_total": dph,
        "reliability": reliability,
        "storage_cost": 0.1,
        "inet_up_cost": 0.01,
        "inet_down_cost": 0.01,
        **more,
    }
    if inet_down is not None:
        fields["inet_down"] = inet_down
    return fields


@pytest.mark.parametrize(
    ("offers", "model", "winner", "because"),
    [
        # equal hosts: the cheaper per hour wins
        ([offer(1, 0.40), offer(2, 0.35)], CostModel(HOUR), 2, "also the cheapest expected"),
        # where boot is billed, a 20 GB image on a 20 Mbps host boots for hours: the faster host wins a one-hour job
        (
            [offer(1, 0.40, inet_down=1000), offer(2, 0.35, inet_down=20)],
            CostModel(HOUR, image_size_gb=20, boot_billed=True),
            1,
            "boot",
        ),
        # a flaky host fails half its starts and loses most four-hour jobs it starts
        ([offer(1, 0.40, 0.99), offer(2, 0.38, 0.5)], CostModel(4 * HOUR), 1, "fails 93.2%"),
        # ... but a somewhat less reliable host can be cheap enough to make up for what its failures waste
        ([offer(1, 0.40, 0.99), offer(2, 0.30, 0.9)], CostModel(4 * HOUR), 2, "also"),
        # a long job makes the lower price matter more than the boot
        ([offer(1, 0.40, inet_down=1000), offer(2, 0.30, inet_down=200)], CostModel(24 * HOUR), 2, "also"),
        # data moved in at a dear bandwidth price
        (
            [offer(1, 0.40), offer(2, 0.38, inet_down_cost=0.05)],
            CostModel(HOUR, transfer_in_gb=100),
            1,
            "transfer",
        ),
    ],
)
def test_the_offer_expected_to_cost_least_wins(offers, model, winner, because):
    ranked = rank_offers(offers, model)
    assert ranked[0].offer_id == winner
    assert because in offer_cost.why_chosen(ranked)


def test_the_parts_add_up_to_the_expected_cost():
    model = CostModel(HOUR, image_size_gb=5, disk_gb=30, transfer_in_gb=2, transfer_out_gb=1)
    (cost,) = rank_offers([offer(1, 0.36, 0.9, inet_down=400)], model)
    boot = 40 + 5 * 8000 / (400 * 0.5) + 5 * 10
    disk_rate = 0.1 * 30 / (30 * 86400)
    assert cost.boot_seconds == pytest.approx(boot)
    assert cost.compute == pytest.approx(0.36)  # the live service bills no compute while it boots
    assert cost.disk == pytest.approx(disk_rate * (boot + HOUR))
    assert cost.transfer == pytest.approx(2 * 0.01 + 1 * 0.01)
    rate = 0.1 / (0.9 * 2 * HOUR)  # reliability read as uptime, in outages of two hours
    lost = 1 - math.exp(-rate * HOUR)
    ran = 1 / rate - HOUR / math.expm1(rate * HOUR)
    p = 0.1 + 0.9 * lost
    assert cost.failure_probability == pytest.approx(p)
    assert cost.failure == pytest.approx(disk_rate * boot + 0.9 * lost * (0.36 / HOUR + disk_rate) * ran / p)
    assert cost.expected == pytest.approx(cost.attempt + cost.failure * p / (1 - p))
    assert f"+ {p / (1 - p):.2f} failed attempts expected (risk {p:.1%} each) x ${cost.failure:.4f}" in cost.explain()


@pytest.mark.parametrize("reliability", [0.5, 0.8, 0.99])
def test_the_expected_cost_is_renting_hosts_like_this_one_until_one_finishes(reliability):
    runtime, dph = 3 * HOUR, 0.30
    (cost,) = rank_offers([offer(1, dph, reliability, storage_cost=0.0)], CostModel(runtime))
    rate = (1 - reliability) / (reliability * 2 * HOUR)
    assert cost.expected == pytest.approx(dph / HOUR * math.expm1(rate * runtime) / rate)


def test_the_longer_the_job_the_more_a_flaky_hosts_losses_cost():
    flaky, steady = offer(1, 0.30, 0.8), offer(2, 0.33, 0.99)
    assert rank_offers([flaky, steady], CostModel(HOUR / 6))[0].offer_id == 1
    assert rank_offers([flaky, steady], CostModel(3 * HOUR))[0].offer_id == 2


def test_without_boot_billing_a_slow_host_costs_only_its_disk_while_it_boots():
    fast, slow = offer(1, 0.40, 1.0, inet_down=2000), offer(2, 0.39, 1.0, inet_down=50)
    assert rank_offers([fast, slow], CostModel(HOUR, image_size_gb=10, boot_billed=True))[0].offer_id == 1
    (cost, _) = rank_offers([fast, slow], CostModel(HOUR, image_size_gb=10))
    assert cost.offer_id == 2 and cost.compute == pytest.approx(0.39)


def test_an_offer_expected_to_boot_past_boot_timeout_is_tried_only_after_those_that_boot_in_time():
    # 6 GB: 3.3 min at 1000 Mbps, 17.7 min at 100 Mbps, 33.7 min at 50 Mbps; boot_timeout 15 min
    slow, slower, fast = offer(1, 0.10, inet_down=100), offer(2, 0.09, inet_down=50), offer(3, 0.40)
    model = CostModel(HOUR, boot_timeout=900)
    ranked = rank_offers([slow, slower, fast], model)
    assert [c.offer_id for c in ranked] == [3, 2, 1]  # the late ones in price order
    assert "past boot_timeout (15.0 min); tried only after every offer expected to boot in time" in ranked[1].explain()
    lines = offer_cost.choice_log(ranked)
    assert "its boot is expected to take 33.7 min at 50 Mbps, past boot_timeout (15.0 min)" in lines[-1]
    assert "expected $inf" not in lines[-1]
    assert [c.offer_id for c in rank_offers([slow, slower, fast], CostModel(HOUR))] == [2, 1, 3]  # no limit given
    lines = offer_cost.choice_log(rank_offers([slow, slower], model))
    assert lines[-1] == "Every offer's boot is expected to outlast boot_timeout: trying them cheapest first."


class Memory:
    def __init__(self, reason: str, failures: int = 1) -> None:
        self.reason, self.failures = reason, failures


def test_a_machine_that_failed_its_gpu_preflight_is_never_chosen():
    ranked = rank_offers([offer(1, 0.10), offer(2, 0.40)], CostModel(HOUR), {101: Memory("preflight")})
    assert ranked[0].offer_id == 2 and math.isinf(ranked[1].expected)
    assert "skipped, its machine is in host memory (preflight)" in ranked[1].explain()
    assert math.isinf(rank_offers([offer(1, 0.10)], CostModel(HOUR), {101})[0].expected)


@pytest.mark.parametrize("reason", ["boot_timeout", "exited", "unknown", "offline", "lost"])
def test_a_machine_in_host_memory_is_skipped_whatever_its_reason(reason):
    ranked = rank_offers([offer(1, 0.10), offer(2, 0.60)], CostModel(HOUR), {101: Memory(reason, 1)})
    assert ranked[0].offer_id == 2 and math.isinf(ranked[1].expected)
    assert f"skipped, its machine is in host memory ({reason})" in ranked[1].explain()


def test_an_offer_without_a_download_speed_is_taken_as_a_slow_host():
    with_speed, without = rank_offers([offer(1, 0.4, inet_down=100), offer(2, 0.4, inet_down=None)], CostModel(HOUR))
    assert with_speed.boot_seconds == without.boot_seconds


def test_ties_keep_the_search_order():
    assert [c.offer_id for c in rank_offers([offer(3, 0.4), offer(1, 0.4)], CostModel(HOUR))] == [3, 1]


def test_the_task_log_shows_the_top_offers_and_why_the_chosen_one_won():
    offers = [offer(i, 0.30 + i / 100, inet_down=20 if i == 0 else 1000) for i in range(8)]
    lines = offer_cost.choice_log(rank_offers(offers, CostModel(HOUR, image_size_gb=10, boot_billed=True)))
    assert len(lines) == offer_cost.TOP_SHOWN + 1
    assert lines[0].startswith("1. offer 1 ") and "expected $" in lines[0]
    assert lines[-1].startswith("Chose offer 1 ") and "offer 0" in lines[-1] and "20 Mbps" in lines[-1]


def test_with_every_machine_avoided_the_log_says_so():
    assert offer_cost.choice_log(rank_offers([offer(1, 0.1)], CostModel(HOUR), {101})) == [
        "No offer can be chosen: every matching machine is in host memory."
    ]


def test_the_ranking_reads_only_fields_a_search_returns():
    search_fields = {"id", "machine_id", "gpu_name", "num_gpus", "dph_total", "reliability", "storage_cost",
                     "inet_up_cost", "inet_down_cost", "inet_down"}  # fmt: skip

    class Recording(dict):
        read: set[str] = set()

        def get(self, key, default=None):
            self.read.add(key)
            return super().get(key, default)

        def __getitem__(self, key):
            self.read.add(key)
            return super().__getitem__(key)

    ranked = rank_offers([Recording(offer(1, 0.3)), Recording(offer(2, 0.4, 0.5))], CostModel(HOUR))
    offer_cost.choice_log(ranked)
    assert Recording.read <= search_fields


# --- the operator's arguments ---------------------------------------------------------------------------------
NOW = dt.datetime(2026, 11, 28, 12, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("check", "value", "field"),
    [
        (offer_cost.check_offer_choice, "cheapest", "offer_choice"),
        (offer_cost.check_offer_choice, None, "offer_choice"),
        (offer_cost.check_expected_runtime, 0, "expected_runtime"),
        (offer_cost.check_expected_runtime, dt.timedelta(seconds=-1), "expected_runtime"),
        (offer_cost.check_expected_runtime, "1h", "expected_runtime"),
        (offer_cost.check_image_size_gb, -2, "image_size_gb"),
        (offer_cost.check_image_size_gb, True, "image_size_gb"),
        (offer_cost.check_transfer_gb, -1, "transfer_gb"),
        (offer_cost.check_transfer_gb, {"in": 5, "up": 1}, "transfer_gb"),
        (offer_cost.check_transfer_gb, {"out": float("inf")}, "transfer_gb"),
        (lambda v: validate_preflight(0, v), ["nvidia-smi"], "preflight"),
        (lambda v: validate_preflight(0, v), "", "preflight"),
        (offer_cost.check_deadline, dt.datetime(2027, 1, 1), "deadline"),
        (offer_cost.check_deadline, dt.timedelta(0), "deadline"),
        (offer_cost.check_deadline, "06:00", "deadline"),
        (offer_cost.check_deadline, "2027-01-01T06:00:00", "deadline"),  # rendered without its timezone
        (offer_cost.check_deadline, 6.0, "deadline"),
    ],
)
def test_bad_arguments_are_refused_naming_the_field(check, value, field):
    with pytest.raises(GpuMarketValidationError) as caught:
        check(value)
    assert caught.value.field == field


def test_good_arguments_pass_in_their_normal_form():
    assert offer_cost.check_offer_choice("expected_cost") == "expected_cost"
    assert offer_cost.check_expected_runtime(dt.timedelta(hours=2)) == 7200.0
    assert offer_cost.check_expected_runtime(None) is None
    assert offer_cost.check_image_size_gb(7) == 7.0
    assert offer_cost.check_transfer_gb(20) == (20.0, 0.0)
    assert offer_cost.check_transfer_gb({"out": 3}) == (0.0, 3.0)
    assert offer_cost.check_transfer_gb(None) is None
    assert validate_preflight(0, "python -c 'import torch'") is None  # accepted as given
    later = NOW + dt.timedelta(hours=6)
    assert offer_cost.check_deadline(later) == later
    assert offer_cost.check_deadline(dt.timedelta(hours=6)) == dt.timedelta(hours=6)


def test_rule_a_deadline_is_a_time_a_duration_a_template_or_a_callable_of_the_context():
    rendered = "2026-12-02 06:00:00+00:00"  # what "{{ data_interval_end + macros.timedelta(hours=6) }}" renders to
    assert offer_cost.check_deadline(rendered) == dt.datetime(2026, 12, 2, 6, tzinfo=dt.UTC)
    assert offer_cost.check_deadline("{{ data_interval_end }}", parse_time=True) is None  # waits for the task
    assert offer_cost.check_deadline(lambda context, jinja_env: NOW, parse_time=True) is None
    past = NOW - dt.timedelta(days=1)  # a fixed time: tomorrow's parse of the DAG file must not fail
    assert offer_cost.check_deadline(past, parse_time=True) == past


def test_rule_a_deadline_rendered_without_a_timezone_is_refused_quoting_what_it_rendered_to():
    with pytest.raises(GpuMarketValidationError, match=r"'2027-01-01T06:00:00' has no timezone: end it with one"):
        offer_cost.check_deadline("2027-01-01T06:00:00")
