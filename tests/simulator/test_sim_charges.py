"""Charges, invoices and the current user's credit as the live service lists them (live profile; not in the spec).

The world starts at 06:00 UTC on 2026-01-01 and the clock is frozen (only ``advance`` moves it), so the UTC days a
test bills on are known in advance.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest

from gpumarket_simulator import MarketSimulator

from .helpers import Api, ledger

DAY = 86_400
DAY0 = 1_767_225_600  # 2026-01-01 00:00 UTC
START = DAY0 + 6 * 3600
CHARGES = "/api/v0/charges/"
INVOICES = "/api/v1/invoices/"
ITEM_FIELDS = {"type", "source", "amount", "start", "end", "description", "metadata", "items"}


@pytest.fixture(scope="module")
def money_server() -> Iterator[MarketSimulator]:
    with MarketSimulator(speed=0, seed=0, rate_limits=False, world={"start_time": START}) as sim:
        yield sim


@pytest.fixture
def money(money_server: MarketSimulator) -> MarketSimulator:
    money_server.reset()
    return money_server


@pytest.fixture
def live(money: MarketSimulator) -> Api:
    return Api(money, money.api_key)


def encoded(params: dict[str, Any]) -> dict[str, str]:
    """Query values as the official CLI sends them: strings as they are, anything else JSON."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in params.items()}


def listing(api: Api, path: str, **params: Any) -> dict[str, Any]:
    response = api.get(path, params=encoded(params))
    assert response.status_code == 200, response.text
    return response.json()


def rent(api: Api, n: int, **body: Any) -> list[int]:
    offers = api.search({"order": [["dph_total", "asc"]]})
    return [api.create(o["id"], {"image": "img", **body})["new_contract"] for o in offers[:n]]


def walk(api: Api, path: str, **params: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every page of a listing, following next_token: (all results, the pages' answers)."""
    results, pages, token = [], [], params.pop("after_token", None)
    while True:
        page = listing(api, path, **params, **({"after_token": token} if token else {}))
        pages.append(page)
        results += page["results"]
        token = page["next_token"]
        if token is None:
            return results, pages


def assert_item_shape(item: dict[str, Any]) -> None:
    assert set(item) >= ITEM_FIELDS, item
    assert isinstance(item["metadata"], dict) and isinstance(item["items"], list)
    for child in item["items"]:
        assert_item_shape(child)


# --- charges --------------------------------------------------------------------------------------------------
def test_charges_are_one_per_instance_per_utc_day(live, money):
    ids = rent(live, 2)
    money.advance(DAY0 + 2 * DAY + 3600 - START)
    results = listing(live, CHARGES)["results"]
    assert sorted((c["day"], c["source"]) for c in results) == sorted(
        (DAY0 + d * DAY, f"instance-{i}") for d in range(3) for i in ids
    )
    for charge in results:
        assert charge["type"] == "instance"
        assert charge["day"] <= charge["start"] <= charge["end"] <= charge["day"] + DAY
    first_day = [c for c in results if c["day"] == DAY0]
    assert {c["start"] for c in first_day} == {START}  # billed from creation, not from midnight


def test_charge_items_break_it_into_gpu_storage_and_bandwidth_summing_to_the_amount(live, money):
    rent(live, 1)
    money.advance(DAY)
    charges = listing(live, CHARGES)["results"]
    assert charges, "a day of one rental lists its charge"
    for charge in charges:
        assert_item_shape(charge)
        assert [i["type"] for i in charge["items"]] == ["gpu", "storage", "bandwidth"]
        gpu, storage, bandwidth = (i["amount"] for i in charge["items"])
        assert gpu + storage + bandwidth == charge["amount"]
        assert gpu > 0 and storage > 0 and bandwidth == 0


def test_charge_amounts_are_the_ledger_to_the_last_bit(live, money):
    ids = rent(live, 3, disk=40)
    money.advance(DAY / 2)
    live.put(f"/api/v0/instances/{ids[0]}/", {"state": "stopped"})
    live.delete(f"/api/v0/instances/{ids[1]}/")
    money.advance(2 * DAY)
    by_key = {(c["source"], c["day"]): c for c in listing(live, CHARGES, limit=100)["results"]}
    for instance_id in ids:
        record = ledger(money, instance_id)
        days = record["ledger_days"]
        assert len(days) == (1 if instance_id == ids[1] else 3)  # destroyed on its first day
        for day in days:
            charge = by_key[(f"instance-{instance_id}", day["day"])]
            gpu, storage, bandwidth = charge["items"]
            assert (gpu["amount"], storage["amount"], bandwidth["amount"]) == (
                day["compute_cost"],
                day["storage_cost"],
                day["bandwidth_cost"],
            )
            assert charge["amount"] == day["cost"]
            assert gpu["metadata"]["seconds"] == day["compute_seconds"]
        # The totals are the sums of the days: the charges add up to the ledger's figures.
        mine = sorted((c for c in by_key.values() if c["source"] == f"instance-{instance_id}"), key=lambda c: c["day"])
        assert sum(c["items"][0]["amount"] for c in mine) == record["compute_cost"]
        assert sum(c["items"][1]["amount"] for c in mine) == record["storage_cost"]
        assert sum(c["amount"] for c in mine) == pytest.approx(record["cost"], abs=1e-9)


def test_bandwidth_is_charged_on_the_day_the_bytes_moved(live, money):
    src, dst = rent(live, 2)
    money.advance(301)
    money.put_disk_file(src, "data/blob.bin", b"x" * 2_000_000)
    body = {"client_id": "me", "src_id": src, "dst_id": dst, "src_path": "/data/", "dst_path": "/in/"}
    assert live.put("/api/v0/commands/copy_direct/", body).status_code == 200
    money.advance(60)
    charges = {c["source"]: c for c in listing(live, CHARGES)["results"]}
    sent, received = charges[f"instance-{src}"]["items"][2], charges[f"instance-{dst}"]["items"][2]
    assert sent["metadata"] == {"upload_bytes": 2_000_000, "download_bytes": 0}
    assert received["metadata"] == {"upload_bytes": 0, "download_bytes": 2_000_000}
    assert sent["amount"] == ledger(money, src)["bandwidth_cost"] > 0
    assert received["amount"] == ledger(money, dst)["bandwidth_cost"] > 0


def test_a_destroyed_instances_charges_stay_listed(live, money):
    (instance_id,) = rent(live, 1)
    money.advance(DAY)
    live.delete(f"/api/v0/instances/{instance_id}/")
    before = listing(live, CHARGES)["results"]
    money.advance(3 * DAY)
    assert listing(live, CHARGES)["results"] == before
    assert {c["source"] for c in before} == {f"instance-{instance_id}"} and len(before) == 2


def test_the_day_filter_selects_charges_by_the_start_of_their_day(live, money):
    rent(live, 1)
    money.advance(4 * DAY)
    second_and_third = listing(live, CHARGES, select_filters={"day": {"gte": DAY0 + DAY, "lte": DAY0 + 2 * DAY}})
    assert [c["day"] for c in second_and_third["results"]] == [DAY0 + DAY, DAY0 + 2 * DAY]
    # As the official CLI asks: a window that starts in the middle of a day leaves that day out.
    window = listing(live, CHARGES, select_filters={"day": {"gte": DAY0 + DAY + 1, "lte": DAY0 + 3 * DAY - 1}})
    assert [c["day"] for c in window["results"]] == [DAY0 + 2 * DAY]


def test_the_type_filter_selects_instance_volume_or_serverless_charges(live, money):
    rent(live, 1)
    money.advance(DAY)
    every = listing(live, CHARGES)
    assert listing(live, CHARGES, select_filters={"type": {"in": ["instance"]}}) == every
    assert listing(live, CHARGES, select_filters={"type": {"in": ["volume", "serverless"]}})["results"] == []


def test_charges_are_listed_oldest_first_or_latest_first(live, money):
    rent(live, 2)
    money.advance(2 * DAY)
    oldest = listing(live, CHARGES)["results"]
    keys = [(c["day"], c["metadata"]["instance_id"]) for c in oldest]
    assert keys == sorted(keys)
    assert listing(live, CHARGES, latest_first=True)["results"] == oldest[::-1]


def test_charges_page_with_after_token_across_250_charges(live, money):
    ids = rent(live, 10)
    money.advance(DAY0 + 24 * DAY + 1 - START)  # each instance billed on 25 UTC days
    for instance_id in ids:
        live.delete(f"/api/v0/instances/{instance_id}/")
    results, pages = walk(live, CHARGES, limit=100)
    assert [p["count"] for p in pages] == [100, 100, 50]
    assert {p["total"] for p in pages} == {250}
    keys = [(c["day"], c["metadata"]["instance_id"]) for c in results]
    assert keys == sorted(set(keys)) and len(keys) == 250
    newest_first, _ = walk(live, CHARGES, limit=33, latest_first=True)
    assert newest_first == results[::-1]


def test_a_walk_neither_skips_nor_repeats_while_charges_grow(live, money):
    rent(live, 2)
    money.advance(2 * DAY)
    first = listing(live, CHARGES, limit=3)
    rent(live, 1)  # a new instance: its charges come after every charge already listed
    money.advance(DAY)
    rest, _ = walk(live, CHARGES, limit=3, after_token=first["next_token"])
    seen = [(c["day"], c["source"]) for c in first["results"] + rest]
    assert len(seen) == len(set(seen)) == listing(live, CHARGES, limit=100)["total"]


def test_limit_over_100_is_read_as_100(live, money):
    rent(live, 5)
    money.advance(DAY0 + 24 * DAY + 1 - START)
    page = listing(live, CHARGES, limit=500)
    assert page["count"] == 100 and page["total"] == 125 and page["next_token"]
    assert listing(live, CHARGES)["count"] == 20  # the default, as the official CLI's


def test_an_after_token_sent_with_other_filters_is_400(live, money):
    rent(live, 3)
    money.advance(2 * DAY)
    same = {"limit": 2, "select_filters": {"type": {"in": ["instance"]}}}
    token = listing(live, CHARGES, **same)["next_token"]
    assert listing(live, CHARGES, **same, after_token=token)["count"] == 2
    for other in ({"select_filters": {}}, {"latest_first": True}, {"select_filters": {"day": {"gte": DAY0}}}):
        response = live.get(CHARGES, params=encoded({**same, "after_token": token, **other}))
        assert response.status_code == 400, response.text
        assert "after_token" in response.json()["msg"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"select_filters": "{not json"}, "select_filters"),
        ({"select_filters": "NaN"}, "select_filters"),
        ({"select_filters": []}, "select_filters"),
        ({"select_filters": {"day": 1767225600}}, "select_filters"),
        ({"select_filters": {"day": {}}}, "select_filters"),
        ({"select_filters": {"day": {"between": [1, 2]}}}, "select_filters"),
        ({"select_filters": {"day": {"gte": "yesterday"}}}, "select_filters"),
        ({"select_filters": {"day": {"gte": True}}}, "select_filters"),
        ({"select_filters": {"label": {"eq": "x"}}}, "select_filters"),
        ({"select_filters": {"type": {"in": "instance"}}}, "select_filters"),
        ({"select_filters": {"type": {"in": ["gpu"]}}}, "select_filters"),
        ({"select_filters": {"type": {"eq": 3}}}, "select_filters"),
        ({"limit": 0}, "limit"),
        ({"limit": -5}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": 2.5}, "limit"),
        ({"latest_first": "maybe"}, "latest_first"),
        ({"after_token": "not-a-token"}, "after_token"),
        ({"after_token": base64.urlsafe_b64encode(b'{"k": "x"}').decode()}, "after_token"),
        ({"after_token": base64.urlsafe_b64encode(b"[1, 2]").decode()}, "after_token"),
    ],
)
def test_bad_charge_queries_are_400_naming_the_field(live, money, params, field):
    response = live.get(CHARGES, params=encoded(params))
    assert response.status_code == 400, response.text
    assert response.json()["error"] and field in response.json()["msg"]
    assert money.state()["internal_errors"] == 0


def test_bad_invoice_queries_are_400_naming_the_field(live, money):
    for params, field in (
        ({"select_filters": {"day": {"gte": 1}}}, "select_filters"),
        ({"select_filters": {"service": {"in": "stripe"}}}, "select_filters"),
        ({"limit": 0}, "limit"),
        ({"after_token": "%%%"}, "after_token"),
    ):
        response = live.get(INVOICES, params=encoded(params))
        assert response.status_code == 400 and field in response.json()["msg"], response.text
    assert money.state()["internal_errors"] == 0


def test_charges_need_the_account_key(live, money):
    (instance_id,) = rent(live, 1)
    instance_key = next(i for i in money.state()["instances"] if i["id"] == instance_id)["instance_api_key"]
    assert live.get(CHARGES, key=None).status_code == 401
    assert live.get(CHARGES, key="wrong").status_code == 404  # the live service's answer to a bad key
    assert live.get(CHARGES, key=instance_key).status_code == 403


# --- invoices --------------------------------------------------------------------------------------------------
def test_invoices_list_the_starting_credit_and_every_admin_top_up(live, money):
    money.advance(3600)
    money.top_up(25)
    money.advance(3600)
    money.set_credit(10)
    results = listing(live, INVOICES)["results"]
    for item in results:
        assert_item_shape(item)
        assert item["type"] == "credit" and item["end"] == item["start"] and item["items"] == []
    assert [i["metadata"]["invoice_id"] for i in results] == [1, 2, 3]
    assert [i["start"] for i in results] == [START, START + 3600, START + 7200]
    assert [i["source"] for i in results] == ["signup", "admin", "admin"]
    # Money put in is negative, as the live service signs it (the official CLI negates a credit to show it).
    assert results[0]["amount"] == -100.0 and results[1]["amount"] == -25.0
    assert results[2]["amount"] == pytest.approx(125.0 - 10.0)
    assert money.account()["credit"] == pytest.approx(10.0)


def test_invoices_filter_on_when_and_service(live, money):
    money.advance(DAY)
    money.top_up(5)
    later = listing(live, INVOICES, select_filters={"when": {"gte": DAY0 + DAY, "lte": DAY0 + 2 * DAY}})
    assert [i["amount"] for i in later["results"]] == [-5.0]
    signup = listing(live, INVOICES, select_filters={"service": {"in": ["signup_credit"]}})
    assert [i["amount"] for i in signup["results"]] == [-100.0]
    # The official CLI's invoice types name payment services the simulator never uses.
    assert listing(live, INVOICES, select_filters={"service": {"in": ["stripe_payments"]}})["total"] == 0


def test_invoices_page_with_after_token(live, money):
    for k in range(6):
        money.advance(60)
        money.top_up(k + 1)
    results, pages = walk(live, INVOICES, limit=3)
    assert [p["count"] for p in pages] == [3, 3, 1] and {p["total"] for p in pages} == {7}
    assert [i["metadata"]["invoice_id"] for i in results] == list(range(1, 8))
    newest, _ = walk(live, INVOICES, limit=4, latest_first=True)
    assert newest == results[::-1]


# --- the current user ------------------------------------------------------------------------------------------
def test_current_user_credit_and_balance_are_the_credit_left_after_everything_billed(live, money):
    ids = rent(live, 2)
    money.advance(5 * 3600)
    user = live.get("/api/v0/users/current").json()
    billed = sum(ledger(money, i)["cost"] for i in ids)
    assert user["credit"] == pytest.approx(100.0 - billed, abs=1e-9)
    assert user["balance"] == user["credit"] == money.account()["credit"]
    assert user["api_key"] == money.api_key  # the live service sends it; the official CLI drops it before printing
    assert {"id", "username", "email", "can_pay"} <= set(user)


# --- the spec profile ------------------------------------------------------------------------------------------
def test_spec_profile_has_no_charges_invoices_or_current_user(api, sim):
    api.create()
    sim.advance(DAY)
    for path in (CHARGES, INVOICES, "/api/v0/users/current"):
        response = api.get(path)
        assert response.status_code == 404 and response.json()["error"] == "not_found", path
    assert sim.account()["spent"] > 0  # the ledger runs all the same


def test_with_a_charges_delay_a_day_is_listed_only_once_it_has_ended(money, live):
    rent(live, 1)
    money.advance(600)
    window = {"select_filters": {"day": {"gte": DAY0, "lte": DAY0 + 3 * DAY}}}
    assert listing(live, CHARGES, **window)["total"] == 1  # as they accrue, by default
    assert money.set_charges_delay(0)["charges_delay"] == 0
    assert listing(live, CHARGES, **window)["total"] == 0
    money.advance(DAY - (START + 600 - DAY0))  # past midnight: the first day is posted, the second is not
    (posted,) = listing(live, CHARGES, **window)["results"]
    assert posted["end"] == DAY0 + DAY


def test_a_bad_charges_delay_is_a_400_naming_it(live):
    answer = live.post("/_sim/account", json={"charges_delay": -5})
    assert answer.status_code == 400 and "charges_delay" in answer.text
