"""The exception hierarchy: what callers catch, and what survives pickling between Airflow processes."""

from __future__ import annotations

import pickle

import pytest

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import (
    GpuMarketAmbiguousCreateError,
    GpuMarketAuthError,
    GpuMarketError,
    GpuMarketNotFoundError,
    GpuMarketOfferUnavailableError,
    GpuMarketQuotaExceededError,
    GpuMarketRateLimitError,
    GpuMarketServerError,
    GpuMarketTransportError,
    GpuMarketValidationError,
)


def test_validation_error_is_a_value_error_and_a_gpumarket_error():
    exc = GpuMarketValidationError("runtype", "'x' is not one of ssh")

    assert isinstance(exc, ValueError)
    assert isinstance(exc, GpuMarketError)
    assert (exc.field, exc.problem, str(exc)) == ("runtype", "'x' is not one of ssh", "runtype: 'x' is not one of ssh")


@pytest.mark.parametrize(
    "cls",
    [
        GpuMarketAuthError,
        GpuMarketNotFoundError,
        GpuMarketRateLimitError,
        GpuMarketQuotaExceededError,
        GpuMarketServerError,
        GpuMarketTransportError,
        GpuMarketOfferUnavailableError,
        GpuMarketAmbiguousCreateError,
    ],
)
def test_every_error_is_a_gpumarket_error(cls):
    assert issubclass(cls, GpuMarketError)
    assert not issubclass(cls, ValueError)


@pytest.mark.parametrize(
    "exc",
    [
        GpuMarketError("m", status_code=422, error="invalid_args", msg="bad disk", operation="create_volume_listings"),
        GpuMarketAuthError("m", status_code=401, error="auth_error", msg="Invalid key", operation="list_instances"),
        GpuMarketRateLimitError("m", retry_after=7.0, status_code=429, error="e", msg="slow", operation="o"),
        GpuMarketQuotaExceededError("m", retry_after=18000.0, status_code=429, error="search_quota_exceeded"),
        GpuMarketServerError("m", status_code=503, error="e", msg="down", operation="o"),
        GpuMarketTransportError("m", request_sent=False, operation="o"),
        GpuMarketOfferUnavailableError("m", status_code=409, error="conflict", msg="rented", operation="o"),
        GpuMarketAmbiguousCreateError("m", status_code=502, operation="create_instance"),
        GpuMarketValidationError("price", "must be greater than 0"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_exceptions_pickle_round_trip_keeping_their_fields(exc):
    copy = pickle.loads(pickle.dumps(exc))

    assert type(copy) is type(exc)
    assert str(copy) == str(exc)
    assert copy.args == exc.args
    assert vars(copy) == vars(exc)
    assert (copy.status_code, copy.error, copy.msg, copy.operation) == (
        exc.status_code,
        exc.error,
        exc.msg,
        exc.operation,
    )


def test_pickled_fields_are_the_real_values():
    copy = pickle.loads(pickle.dumps(GpuMarketRateLimitError("m", retry_after=7.0, status_code=429, msg="slow")))

    assert (copy.status_code, copy.msg, copy.retry_after) == (429, "slow", 7.0)


def test_raise_for_response_returns_the_body_of_a_success():
    assert api.raise_for_response("op", 200, {"success": True, "x": 1}) == {"success": True, "x": 1}
    assert api.raise_for_response("op", 200, [1, 2]) == [1, 2]


def test_raise_for_response_message_is_cut_for_long_text_bodies():
    with pytest.raises(GpuMarketError) as caught:
        api.raise_for_response("op", 400, "x" * 1000)

    assert "x" * 200 in str(caught.value)
    assert "x" * 201 not in str(caught.value)


def test_redact_replaces_every_secret_of_four_or_more_characters():
    assert api.redact("a sk-123 b sk-123", ["sk-123"]) == "a *** b ***"
    assert api.redact("abc", ["abc"]) == "abc"  # too short to redact without mangling text
    assert api.redact("x", [None, ""]) == "x"


def test_decode_body_json_text_or_none():
    assert api.decode_body(b'{"a": 1}') == {"a": 1}
    assert api.decode_body(b"<html>oops</html>") == "<html>oops</html>"
    assert api.decode_body(b"") is None


@pytest.mark.parametrize(
    ("status", "booting", "never_runs"),
    [
        (None, True, False),
        ("loading", True, False),
        ("running", False, False),
        ("exited", False, True),
        ("unknown", False, True),
        ("offline", False, True),
    ],
)
def test_instance_status_helpers_follow_the_state_table(status, booting, never_runs):
    assert api.is_booting(status) is booting
    assert api.will_never_run(status) is never_runs


def test_find_by_label_returns_the_newest_match_or_none():
    instances = [{"id": 1, "label": "a"}, {"id": 3, "label": "a"}, {"id": 2, "label": "b"}]
    assert api.find_by_label(instances, "a") == {"id": 3, "label": "a"}
    assert api.find_by_label(instances, "c") is None
