"""The exception hierarchy: what callers catch, and what survives pickling between Airflow processes."""

from __future__ import annotations

import pickle

import pytest

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
