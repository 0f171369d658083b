"""The account's money as pure rules (api/charges.py): the charges and invoices queries as the official CLI sends them,
the walk through their pages, the records read from them (each malformed field named), and the account's credit
without its API key."""

from __future__ import annotations

import dataclasses
import json
import pickle
import traceback
from urllib.parse import quote_plus

import pytest
import requests

from airflow_gpumarket import api
from airflow_gpumarket.api import Account, Charge, Invoice
from airflow_gpumarket.exceptions import (
    GpuMarketAuthError,
    GpuMarketError,
    GpuMarketNotFoundError,
    GpuMarketServerError,
    GpuMarketValidationError,
)

START, END = 1_764_460_800, 1_765_065_600  # 2025-11-30 .. 2025-12-07, as the CLI's dates turn into
USER_KEY = "d41d8cd98f00b204e9800998ecf8427e-account-key"


def cli_query(params: dict) -> str:
    """The query string the official CLI's ``apiurl`` builds (vast.py): each value quote_plus'ed, a non-string after
    ``json.dumps``."""
    return "&".join(f"{x}={quote_plus(y if isinstance(y, str) else json.dumps(y))}" for x, y in params.items())


def on_the_wire(path: str, params: dict[str, str]) -> str:
    """The query string requests sends for ``params`` (what the sync hook hands it)."""
    return requests.Request("GET", "https://api.example.com" + path, params=params).prepare().url.split("?", 1)[1]


def rejected(call, field: str) -> GpuMarketValidationError:
    with pytest.raises(GpuMarketValidationError) as caught:
        call()
    assert caught.value.field == field
    return caught.value


def malformed(call, *words: str) -> GpuMarketError:
    with pytest.raises(GpuMarketError) as caught:
        call()
    assert caught.value.status_code == 200
    for word in words:
        assert word in str(caught.value)
    return caught.value


CHARGE = {
    "type": "instance",
    "source": "instance-31337",
    "amount": 1.875,
    "start": START,
    "end": START + 3600,
    "description": "RTX 4090 x1",
    "metadata": {"machine_id": 42},
    "items": [
        {"type": "gpu", "source": "instance-31337", "amount": 1.5, "start": START, "end": START + 3600,
         "description": "GPU", "metadata": {}, "items": []},
        {"type": "storage", "source": None, "amount": 0.25, "start": START, "end": START + 3600,
         "description": "16 GB disk", "metadata": {}, "items": []},
        {"type": "bandwidth", "source": None, "amount": 0.125, "start": START, "end": START + 3600,
         "description": "egress", "metadata": {}, "items": []},
    ],
}  # fmt: skip


# --- Paths -------------------------------------------------------------------------------------------------------
def test_billing_paths_are_the_live_services_with_their_trailing_slashes():
    assert api.PATH_CHARGES == "/api/v0/charges/"
    assert api.PATH_INVOICES_V1 == "/api/v1/invoices/"
    assert api.PATH_CURRENT_USER == "/api/v0/users/current"
    assert api.CHARGE_TYPES == ("instance", "volume", "serverless")
    assert api.BILLING_PAGE_LIMIT == 100


# --- Queries -----------------------------------------------------------------------------------------------------
def test_charges_query_args_are_json_encoded_exactly_as_the_official_cli_sends_them():
    """The CLI also sends ``format`` (how it prints the table); the provider leaves that display option out."""
    query = api.build_charges_query(START, END, types=["instance", "volume"])

    assert query == {
        "select_filters": '{"day": {"gte": 1764460800, "lte": 1765065600}, "type": {"in": ["instance", "volume"]}}',
        "latest_first": "false",
        "limit": "100",
    }
    cli = {
        "select_filters": {"day": {"gte": START, "lte": END}, "type": {"in": ["instance", "volume"]}},
        "latest_first": False,
        "limit": 100,
    }
    assert on_the_wire(api.PATH_CHARGES, query) == cli_query(cli)


def test_invoices_query_filters_on_when_and_service_as_the_official_cli_does():
    query = api.build_invoices_query(START, END, services=["stripe_payments", "transfer"])

    cli = {
        "select_filters": {"when": {"gte": START, "lte": END}, "service": {"in": ["stripe_payments", "transfer"]}},
        "latest_first": False,
        "limit": 100,
    }
    assert on_the_wire(api.PATH_INVOICES_V1, query) == cli_query(cli)


def test_without_types_or_services_no_filter_but_the_window_is_sent():
    assert json.loads(api.build_charges_query(START, END)["select_filters"]) == {"day": {"gte": START, "lte": END}}
    assert json.loads(api.build_invoices_query(START, END)["select_filters"]) == {"when": {"gte": START, "lte": END}}


def test_latest_first_is_sent_as_json_true():
    assert api.build_charges_query(START, END, latest_first=True)["latest_first"] == "true"


@pytest.mark.parametrize(("limit", "sent"), [(1, "1"), (20, "20"), (100, "100"), (101, "100"), (5000, "100")])
def test_limit_is_clamped_to_the_services_maximum_of_100(limit, sent):
    assert api.build_charges_query(START, END, limit=limit)["limit"] == sent
    assert api.build_invoices_query(START, END, limit=limit)["limit"] == sent


@pytest.mark.parametrize("limit", [0, -5, 2.5, True, "100"])
def test_a_limit_that_is_not_a_positive_integer_is_refused(limit):
    rejected(lambda: api.build_charges_query(START, END, limit=limit), "limit")


def test_the_window_is_sent_in_whole_seconds_widened_to_include_both_ends():
    filters = json.loads(api.build_charges_query(START + 0.75, END + 0.25)["select_filters"])
    assert filters["day"] == {"gte": START, "lte": END + 1}


@pytest.mark.parametrize(
    ("start", "end", "field"),
    [(-1, END, "start"), (float("nan"), END, "start"), (True, END, "start"), ("2025-11-30", END, "start"),
     (START, None, "end"), (END, START, "end")],
)  # fmt: skip
def test_a_window_that_is_not_two_epoch_times_in_order_is_refused(start, end, field):
    rejected(lambda: api.build_charges_query(start, end), field)
    rejected(lambda: api.build_invoices_query(start, end), field)


def test_charge_types_must_be_the_services_and_a_list():
    assert "gpu" in str(rejected(lambda: api.build_charges_query(START, END, types=["gpu"]), "types"))
    rejected(lambda: api.build_charges_query(START, END, types="instance"), "types")
    rejected(lambda: api.build_charges_query(START, END, types=[]), "types")
    rejected(lambda: api.build_invoices_query(START, END, services=["stripe"]), "services")


def test_a_type_given_twice_is_sent_once():
    filters = json.loads(api.build_charges_query(START, END, types=["volume", "volume"])["select_filters"])
    assert filters["type"] == {"in": ["volume"]}


# --- Records -----------------------------------------------------------------------------------------------------
def test_a_charge_is_read_with_its_breakdown_of_the_same_shape():
    charge = api.parse_charge(CHARGE)

    assert charge.type == "instance"
    assert charge.amount == 1.875
    assert (charge.start, charge.end) == (START, START + 3600)
    assert charge.metadata == {"machine_id": 42}
    assert [(i.type, i.amount) for i in charge.items] == [("gpu", 1.5), ("storage", 0.25), ("bandwidth", 0.125)]
    assert all(isinstance(i, Charge) and i.items == () for i in charge.items)


@pytest.mark.parametrize(
    ("source", "instance_id"),
    [("instance-31337", 31337), ("volume-88", None), ("serverless-3", None), ("instance-", None),
     ("instance-12x", None), ("my-instance-12", None), (None, None)],
)  # fmt: skip
def test_the_instance_id_is_read_from_a_source_of_instance_dash_id_only(source, instance_id):
    assert api.parse_charge({**CHARGE, "source": source}).instance_id == instance_id
    assert api.instance_id_of(source) == instance_id


def test_an_items_instance_id_is_read_from_its_own_source():
    charge = api.parse_charge(CHARGE)
    assert [i.instance_id for i in charge.items] == [31337, None, None]


def test_missing_fields_take_their_defaults_and_numbers_may_come_as_strings():
    charge = api.parse_charge({"amount": "0.42"})
    assert charge == Charge(
        type="", source=None, instance_id=None, amount=0.42, start=None, end=None, description="", items=(), metadata={}
    )
    assert api.parse_charge({**CHARGE, "items": None, "metadata": None, "start": "1764460800"}).start == START


def test_a_charge_without_an_amount_is_an_error_naming_the_field():
    malformed(lambda: api.parse_charges_page({"results": [CHARGE, {"type": "instance"}]}), "results[1].amount")


@pytest.mark.parametrize(
    ("record", "field"),
    [({**CHARGE, "amount": "lots"}, "results[0].amount"),
     ({**CHARGE, "amount": True}, "results[0].amount"),
     ({**CHARGE, "amount": float("inf")}, "results[0].amount"),
     ({**CHARGE, "start": [1]}, "results[0].start"),
     ({**CHARGE, "metadata": ["x"]}, "results[0].metadata"),
     ({**CHARGE, "items": {"gpu": 1}}, "results[0].items"),
     ({**CHARGE, "description": {"x": 1}}, "results[0].description"),
     ({**CHARGE, "items": [{**CHARGE["items"][0], "amount": None}]}, "results[0].items[0].amount"),
     ({**CHARGE, "items": ["gpu"]}, "results[0].items[0]"),
     ("a charge", "results[0]")],
)  # fmt: skip
def test_a_malformed_field_is_an_error_naming_it(record, field):
    exc = malformed(lambda: api.parse_charges_page({"results": [record]}), f"{field} ", "charges")
    assert exc.operation == "charges"


def test_an_invoice_carries_its_invoice_id_from_the_metadata():
    record = {"type": "credit", "source": "stripe", "amount": 25.0, "start": START, "end": START,
              "description": "Stripe payment", "metadata": {"invoice_id": 9001}}  # fmt: skip

    invoice = api.parse_invoice(record)

    assert invoice == Invoice(
        type="credit",
        source="stripe",
        amount=25.0,
        start=START,
        end=START,
        description="Stripe payment",
        invoice_id=9001,
        metadata={"invoice_id": 9001},
    )
    assert api.parse_invoice({"amount": 1}).invoice_id is None
    malformed(lambda: api.parse_invoices_page({"results": [{"amount": 1, "metadata": {"invoice_id": [1]}}]}),
              "results[0].metadata.invoice_id")  # fmt: skip


def test_records_are_frozen_and_hashable_and_turn_into_plain_dicts():
    charge = api.parse_charge(CHARGE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        charge.amount = 0  # type: ignore[misc]
    assert hash(charge) == hash(api.parse_charge(CHARGE))
    assert dataclasses.asdict(charge)["items"][0]["type"] == "gpu"
    assert pickle.loads(pickle.dumps(charge)) == charge


# --- Pages -------------------------------------------------------------------------------------------------------
def test_a_page_parser_returns_the_records_and_the_next_token():
    records, token = api.parse_charges_page({"results": [CHARGE], "count": 1, "total": 3, "next_token": "tok-2"})
    assert [r.instance_id for r in records] == [31337]
    assert token == "tok-2"


@pytest.mark.parametrize("token", [None, "", "absent"])
def test_a_page_without_a_next_token_is_the_last(token):
    body = {"results": []} if token == "absent" else {"results": [], "next_token": token}
    assert api.parse_charges_page(body) == ([], None)


def test_a_page_without_results_is_an_error_not_an_empty_list():
    malformed(lambda: api.parse_invoices_page({"invoices": []}), "invoices", "'results'")


def walk_of(*pages: dict) -> tuple[api.BillingPages, list[dict[str, str]]]:
    query = api.build_charges_query(START, END, types=["instance"])
    walk = api.BillingPages("charges", api.PATH_CHARGES, query, api.parse_charge)
    sent = []
    for body in pages:
        request = walk.request()
        assert request is not None and request[0] == api.PATH_CHARGES
        sent.append(request[1])
        walk.take(body)
    return walk, sent


def test_paging_reads_three_pages_through_after_token():
    walk, sent = walk_of(
        {"results": [CHARGE], "next_token": "tok-2"},
        {"results": [CHARGE, CHARGE], "next_token": "tok-3"},
        {"results": [{**CHARGE, "source": "instance-7"}], "next_token": None},
    )

    assert walk.request() is None
    assert [c.instance_id for c in walk.results] == [31337, 31337, 31337, 7]
    assert walk.pages == 3
    assert [q.get("after_token") for q in sent] == [None, "tok-2", "tok-3"]


def test_the_token_is_passed_back_unchanged_with_the_same_filters():
    opaque = "eyJ2YWx1ZXMiOiB7ImlkIjogMjUwNzgyMzR9LCAib3NfcGFnZSI6IDB9+/="
    _, sent = walk_of({"results": [], "next_token": opaque}, {"results": []})

    first, second = sent
    assert second == {**first, "after_token": opaque}


def test_a_token_that_is_not_a_string_is_sent_back_json_encoded_as_the_cli_would():
    _, sent = walk_of({"results": [], "next_token": 12}, {"results": []})
    assert sent[1]["after_token"] == "12"


def test_a_repeated_token_stops_the_walk_with_a_clear_error():
    exc = malformed(
        lambda: walk_of(
            {"results": [CHARGE], "next_token": "tok-2"},
            {"results": [CHARGE], "next_token": "tok-3"},
            {"results": [CHARGE], "next_token": "tok-2"},
        ),
        "already given",
        "3 pages",
        "'tok-2'",
    )
    assert exc.operation == "charges"


def test_a_walk_stops_after_max_pages():
    walk = api.BillingPages("invoices", api.PATH_INVOICES_V1, {}, api.parse_invoice, max_pages=2)
    walk.take({"results": [], "next_token": "a"})
    with pytest.raises(GpuMarketError, match="kept answering more pages"):
        walk.take({"results": [], "next_token": "b"})


# --- A server without these paths ----------------------------------------------------------------------------------
def test_404_or_405_means_the_server_has_no_such_endpoint():
    exc = GpuMarketNotFoundError("charges: not found", status_code=404, error="not_found", msg="No such path")

    missing = api.missing_endpoint("charges", api.PATH_CHARGES, exc)

    assert isinstance(missing, GpuMarketNotFoundError)
    assert missing.status_code == 404 and missing.operation == "charges"
    assert "has no GET /api/v0/charges/" in str(missing) and "not the spec's" in str(missing)
    assert "No such path" in str(missing)
    assert api.missing_endpoint("account", api.PATH_CURRENT_USER, GpuMarketError("x", status_code=405)) is not None


def test_a_bad_key_or_another_failure_is_not_read_as_a_missing_endpoint():
    assert api.missing_endpoint("charges", "/p", GpuMarketAuthError("bad key", status_code=404)) is None
    assert api.missing_endpoint("charges", "/p", GpuMarketServerError("down", status_code=503)) is None
    assert api.missing_endpoint("charges", "/p", GpuMarketError("bad", status_code=400)) is None


# --- The account -------------------------------------------------------------------------------------------------
USER = {"id": 4242, "email": "ml@example.org", "username": "ml-team", "credit": 12.5, "balance": -3.0,
        "api_key": USER_KEY, "ssh_key": "ssh-ed25519 AAAA", "can_pay": True}  # fmt: skip


def test_the_account_keeps_credit_balance_and_who_it_is():
    assert api.parse_account(USER) == Account(
        credit=12.5, balance=-3.0, user_id=4242, email="ml@example.org", username="ml-team"
    )


@pytest.mark.parametrize(
    ("credit", "balance", "available"), [(12.5, -3.0, 12.5), (0.0, 40.0, 0.0), (None, 40.0, 40.0), (None, None, None)]
)
def test_available_is_the_credit_when_present_else_the_balance(credit, balance, available):
    account = api.parse_account({k: v for k, v in {"credit": credit, "balance": balance}.items() if v is not None})
    assert account.available == available


def test_an_account_with_odd_fields_is_read_where_it_can_be():
    account = api.parse_account({"id": "77", "credit": "5.5"})
    assert (account.user_id, account.credit, account.balance, account.email) == (77, 5.5, None, None)


def test_the_api_key_never_appears_in_the_accounts_repr_fields_or_pickle():
    account = api.parse_account(USER)

    assert USER_KEY not in repr(account)
    assert USER_KEY not in str(dataclasses.asdict(account))
    assert USER_KEY not in repr(pickle.dumps(account))
    assert not hasattr(account, "api_key")


@pytest.mark.parametrize("odd", [{"credit": USER_KEY}, {"balance": [USER_KEY]}, {"email": {"k": USER_KEY}}])
def test_the_api_key_never_appears_in_an_accounts_error(odd):
    exc = malformed(lambda: api.parse_account({**USER, **odd}), f"users/current.{next(iter(odd))} ", "account")
    assert USER_KEY not in "".join(traceback.format_exception(exc))
    assert USER_KEY not in repr(vars(exc))


def test_an_account_answer_that_is_not_an_object_is_an_error_that_quotes_nothing():
    exc = malformed(lambda: api.parse_account(f"api_key={USER_KEY}"), "must be a JSON object, got str")
    assert USER_KEY not in str(exc)


def test_rule_a_charges_window_starts_at_its_first_days_midnight_so_that_days_charge_is_included():
    mid_day = START + 13 * 3600 + 0.5  # a charge's day is its UTC midnight
    assert json.loads(api.build_charges_query(mid_day, END)["select_filters"]) == {"day": {"gte": START, "lte": END}}
