"""The pending price increase list read as pure functions (price_increases.py), for the sensor and its trigger."""

from __future__ import annotations

from airflow_gpumarket import price_increases

INCREASE = {
    "pending_price_increase_id": 5,
    "contract_id": 42,
    "host_id": 9,
    "old_gpu_costpersec": 0.0002,
    "new_gpu_costpersec": 0.0003,
    "old_disk_ram_costpersec": 0.00002,
    "new_disk_ram_costpersec": 0.00002,
}


def test_select_keeps_the_given_contracts_only_and_skips_what_is_not_an_increase():
    response = {"pending_price_increases": [INCREASE, {**INCREASE, "contract_id": 7}, "not an increase"]}
    assert price_increases.select(response, None) == [INCREASE, {**INCREASE, "contract_id": 7}]
    assert price_increases.select(response, ["42"]) == [INCREASE]
    assert price_increases.select({"pending_price_increases": None}, None) == []


def test_describe_puts_old_and_new_costs_side_by_side_with_the_change():
    line = price_increases.describe(INCREASE)
    assert line.startswith("contract 42 (host 9, increase 5): ")
    assert "GPU 0.0002 -> 0.0003 (+50%)" in line and "disk+RAM 2e-05 -> 2e-05 (+0%)" in line
    assert "(" not in price_increases.describe({**INCREASE, "old_gpu_costpersec": None}).split("GPU")[1].split(";")[0]
