"""The hook's reads of the account's money (``GpuMarketHook.charges``, ``invoices`` and ``account``, through
``hooks/core.py``): every page read through ``after_token``, the query as the official CLI sends it, a repeated token
stopping the walk, retries and pacing as for reads, a server without these paths saying so, and the key the user
blob carries kept out of results, logs and errors."""

from __future__ import annotations

import json
import logging
import pickle
import traceback
from urllib.parse import quote_plus

import pytest
from hook_fakes import API_KEY, AUTH_HEADER, methods_and_paths, query, url

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import (
    GpuMarketAuthError,
    GpuMarketError,
    GpuMarketNotFoundError,
    GpuMarketValidationError,
)

CHARGES = url("/api/v0/charges/")
INVOICES = url("/api/v1/invoices/")
USER = url("/api/v0/users/current")
START, END = 1_764_460_800, 1_765_065_600
#: The key the user blob carries: the account's, which may be another than the connection's.
BLOB_KEY = "0123456789abcdef0123456789abcdef-blob-key"
NO_SUCH_PATH = {"error": "not_found", "msg": "No such path: /api/v0/charges/ (paths are exact)"}


def charge(instance_id: int, amount: float = 0.5) -> dict:
    items = [{"type": "gpu", "source": f"instance-{instance_id}", "amount": amount, "start": START, "end": END,
              "description": "GPU", "metadata": {}, "items": []}]  # fmt: skip
    return {"type": "instance", "source": f"instance-{instance_id}", "amount": amount, "start": START, "end": END,
            "description": "RTX 4090", "metadata": {}, "items": items}  # fmt: skip


def page(results: list, next_token: str | None = None, total: int = 5) -> dict:
    return {"json": {"results": results, "count": len(results), "total": total, "next_token": next_token}}


def raw_query(request) -> str:
    return request.url.split("?", 1)[1]


# --- Charges -----------------------------------------------------------------------------------------------------
def test_charges_reads_every_page_through_after_token(requests_mock, hook):
    requests_mock.get(
        CHARGES,
        [page([charge(1), charge(2)], "tok-2"), page([charge(3), charge(4)], "tok-3"), page([charge(5)])],
    )

    charges = hook.charges(START, END)

    assert [c.instance_id for c in charges] == [1, 2, 3, 4, 5]
    assert all(isinstance(c, api.Charge) and c.items[0].type == "gpu" for c in charges)
    assert methods_and_paths(requests_mock) == [("GET", CHARGES)] * 3
    assert [query(r).get("after_token") for r in requests_mock.request_history] == [None, "tok-2", "tok-3"]
    assert all(r.headers["Authorization"] == AUTH_HEADER for r in requests_mock.request_history)


def test_the_token_is_passed_back_unchanged_with_the_same_filters(requests_mock, hook):
    opaque = "eyJ2YWx1ZXMiOiB7ImlkIjogMjUwNzgyMzR9LCAib3NfcGFnZSI6IDB9+/="
    requests_mock.get(CHARGES, [page([charge(1)], opaque), page([charge(2)])])

    hook.charges(START, END, types=["instance", "serverless"])

    first, second = (query(r) for r in requests_mock.request_history)
    assert second == {**first, "after_token": opaque}
    assert json.loads(first["select_filters"])["type"] == {"in": ["instance", "serverless"]}


def test_the_query_args_are_json_encoded_exactly_as_the_official_cli_sends_them(requests_mock, hook):
    """vast.py's ``apiurl``: ``quote_plus`` of a string, or of ``json.dumps`` of any other value (the CLI's display
    option ``format`` aside)."""
    requests_mock.get(CHARGES, [page([], "tok-2"), page([])])

    hook.charges(START, END, types=["volume"])

    cli = {"select_filters": {"day": {"gte": START, "lte": END}, "type": {"in": ["volume"]}},
           "latest_first": False, "limit": 100}  # fmt: skip
    expected = "&".join(f"{x}={quote_plus(y if isinstance(y, str) else json.dumps(y))}" for x, y in cli.items())
    first, second = requests_mock.request_history
    assert raw_query(first) == expected
    assert raw_query(second) == expected + "&after_token=tok-2"


def test_a_repeated_token_stops_with_a_clear_error(requests_mock, hook):
    requests_mock.get(CHARGES, [page([charge(1)], "tok-2"), page([charge(2)], "tok-3"), page([charge(3)], "tok-2")])

    with pytest.raises(GpuMarketError, match="already given") as caught:
        hook.charges(START, END)

    assert requests_mock.call_count == 3
    assert caught.value.operation == "charges"


def test_a_page_is_retried_after_a_5xx_with_the_same_token(requests_mock, hook):
    requests_mock.get(
        CHARGES,
        [page([charge(1)], "tok-2"), {"status_code": 503, "json": {"error": "x", "msg": "busy"}}, page([charge(2)])],
    )

    assert [c.instance_id for c in hook.charges(START, END)] == [1, 2]
    assert [query(r).get("after_token") for r in requests_mock.request_history] == [None, "tok-2", "tok-2"]


def test_pages_take_turns_in_a_read_budget_of_their_own(requests_mock, hook, sleeps):
    from airflow_gpumarket.hooks.core import slot_seconds

    requests_mock.get(CHARGES, [page([], "tok-2"), page([], "tok-3"), page([])])

    hook.charges(START, END)

    assert len(sleeps) == 2
    assert all(1 / api.READ_RATE_PER_SECOND < wait <= slot_seconds("charges") for wait in sleeps)


@pytest.mark.parametrize(
    ("start", "end", "kwargs", "field"),
    [(START, END, {"types": ["gpu"]}, "types"), (END, START, {}, "end"), (-1, END, {}, "start")],
)
def test_bad_arguments_are_refused_before_anything_is_sent(wire, hook, start, end, kwargs, field):
    with pytest.raises(GpuMarketValidationError) as caught:
        hook.charges(start, end, **kwargs)
    assert caught.value.field == field
    assert wire.call_count == 0


def test_a_malformed_charge_names_its_field(requests_mock, hook):
    bad = {**charge(2), "items": [{"type": "gpu", "amount": "n/a"}]}
    requests_mock.get(CHARGES, [page([charge(1)], "tok-2"), page([bad])])

    with pytest.raises(GpuMarketError, match=r"results\[0\]\.items\[0\]\.amount must be a number"):
        hook.charges(START, END)


# --- Invoices ----------------------------------------------------------------------------------------------------
def test_invoices_reads_every_page_and_filters_on_when(requests_mock, hook):
    invoice = {"type": "credit", "source": "stripe", "amount": 25.0, "start": START, "end": START,
               "description": "Stripe payment", "metadata": {"invoice_id": 9001}}  # fmt: skip
    requests_mock.get(INVOICES, [page([invoice], "i-2"), page([{**invoice, "metadata": {"invoice_id": 9002}}])])

    invoices = hook.invoices(START, END, services=["stripe_payments"])

    assert [(i.invoice_id, i.amount) for i in invoices] == [(9001, 25.0), (9002, 25.0)]
    first, second = (query(r) for r in requests_mock.request_history)
    assert json.loads(first["select_filters"]) == {
        "when": {"gte": START, "lte": END},
        "service": {"in": ["stripe_payments"]},
    }
    assert second == {**first, "after_token": "i-2"}


# --- A server without these paths (one that follows the spec only) ---------------------------------------------
@pytest.mark.parametrize(
    ("call", "path"),
    [
        (lambda hook: hook.charges(START, END), "/api/v0/charges/"),
        (lambda hook: hook.invoices(START, END), "/api/v1/invoices/"),
        (lambda hook: hook.account(), "/api/v0/users/current"),
    ],
)
def test_404_says_this_service_has_no_such_endpoint(requests_mock, hook, call, path):
    requests_mock.get(url(path), status_code=404, json=NO_SUCH_PATH)

    with pytest.raises(GpuMarketNotFoundError) as caught:
        call(hook)

    assert f"this service has no GET {path}" in str(caught.value)
    assert caught.value.status_code == 404
    assert requests_mock.call_count == 1


def test_a_404_that_says_the_key_is_bad_stays_an_auth_error(requests_mock, hook):
    requests_mock.get(CHARGES, status_code=404, json={"error": "auth_error", "msg": "Invalid user key"})

    with pytest.raises(GpuMarketAuthError):
        hook.charges(START, END)


# --- The account -------------------------------------------------------------------------------------------------
BLOB = {"id": 4242, "email": "ml@example.org", "username": "ml-team", "credit": 12.5, "balance": 0.0,
        "api_key": BLOB_KEY, "fullname": "ML team", "can_pay": True}  # fmt: skip


def test_account_reads_the_credit_left(requests_mock, hook):
    requests_mock.get(USER, json=BLOB)

    account = hook.account()

    assert account == api.Account(credit=12.5, balance=0.0, user_id=4242, email="ml@example.org", username="ml-team")
    assert account.available == 12.5
    assert methods_and_paths(requests_mock) == [("GET", USER)]


def test_the_api_key_of_the_user_blob_is_masked_and_never_returned_or_logged(requests_mock, hook, masked, caplog):
    requests_mock.get(USER, json=BLOB)

    with caplog.at_level(logging.DEBUG):
        account = hook.account()

    assert BLOB_KEY in masked
    assert BLOB_KEY not in repr(account) and BLOB_KEY not in repr(pickle.dumps(account))
    assert BLOB_KEY not in caplog.text and API_KEY not in caplog.text


def test_the_api_key_never_appears_in_the_error_of_an_odd_user_blob(requests_mock, hook, caplog):
    requests_mock.get(USER, json={**BLOB, "credit": BLOB_KEY})

    with caplog.at_level(logging.DEBUG), pytest.raises(GpuMarketError, match=r"users/current\.credit") as caught:
        hook.account()

    text = "".join(traceback.format_exception(caught.value))
    assert BLOB_KEY not in text and BLOB_KEY not in repr(vars(caught.value)) and BLOB_KEY not in caplog.text
