"""gpumarket_retry_policy: what a renting task's failure leads to (Airflow 3.3+'s retry policies, AIP-105)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_gpumarket._compat import has_retry_policies
from airflow_gpumarket.exceptions import (
    GpuMarketAuthError,
    GpuMarketQuotaExceededError,
    GpuMarketRateLimitError,
    GpuMarketServerError,
    GpuMarketTransportError,
    GpuMarketValidationError,
)
from airflow_gpumarket.operators.failures import (
    GpuMarketApprovalRefused,
    GpuMarketJobFailed,
    GpuMarketNoWorkingOffer,
    GpuMarketPreemptedTooOften,
    GpuMarketServiceGone,
)
from airflow_gpumarket.retry_policy import gpumarket_retry_policy

needs_3_3 = pytest.mark.skipif(not has_retry_policies(), reason="retry policies are Airflow 3.3+'s")

FAILS = [
    GpuMarketJobFailed("the job failed: exit status 3", exit_status=3),
    GpuMarketValidationError("image", "is empty"),
    GpuMarketAuthError("401: the key is refused", status_code=401),
    GpuMarketQuotaExceededError("429: the daily search quota is used up", status_code=429),
    GpuMarketServiceGone("The service on instance 7 cannot answer: it is gone."),
    GpuMarketApprovalRefused("The rental was not approved: ana answered ['Do not rent']; nothing was rented."),
]
RETRIES = [
    GpuMarketNoWorkingOffer("Could not get a working instance after trying 3 offer(s)"),
    GpuMarketPreemptedTooOften("The job was preempted 4 times, more than max_preemptions=3"),
    GpuMarketServerError("503 after retries", status_code=503),
    GpuMarketRateLimitError("429 after retries", status_code=429),
    GpuMarketTransportError("connection dropped"),
]


@needs_3_3
@pytest.mark.parametrize("exc", FAILS, ids=lambda e: type(e).__name__)
def test_rule_what_another_try_would_only_repeat_fails_at_once(exc):
    from airflow.sdk import RetryAction

    decision = gpumarket_retry_policy().evaluate(exc, try_number=1, max_tries=4)
    assert decision.action is RetryAction.FAIL and decision.reason


@needs_3_3
@pytest.mark.parametrize("exc", RETRIES, ids=lambda e: type(e).__name__)
def test_rule_what_the_market_may_get_past_is_retried_after_the_delay(exc):
    from airflow.sdk import RetryAction

    decision = gpumarket_retry_policy(retry_delay=timedelta(minutes=7)).evaluate(exc, try_number=1, max_tries=4)
    assert decision.action is RetryAction.RETRY and decision.retry_delay == timedelta(minutes=7)


@needs_3_3
def test_a_job_failure_is_retried_only_when_asked_and_anything_else_takes_the_standard_retries():
    from airflow.sdk import RetryAction

    flaky = gpumarket_retry_policy(retry_job_failures=True, retry_delay=timedelta(seconds=30))
    decision = flaky.evaluate(FAILS[0], try_number=1, max_tries=4)
    assert decision.action is RetryAction.RETRY and decision.retry_delay == timedelta(seconds=30)
    assert gpumarket_retry_policy().evaluate(KeyError("x"), try_number=1, max_tries=4).action is RetryAction.DEFAULT


@needs_3_3
def test_the_policy_survives_dag_serialization():
    from airflow.sdk.definitions.retry_policy import ExceptionRetryPolicy

    policy = gpumarket_retry_policy()
    again = ExceptionRetryPolicy.deserialize(policy.serialize())
    assert [rule.serialize() for rule in again.rules] == [rule.serialize() for rule in policy.rules]


@pytest.mark.skipif(has_retry_policies(), reason="before Airflow 3.3 only")
def test_before_airflow_3_3_there_is_no_policy_and_the_operators_accept_none():
    from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

    assert gpumarket_retry_policy() is None
    op = GpuMarketRunJobOperator(
        task_id="job", offer_filters={}, image="img", command="true", retry_policy=gpumarket_retry_policy()
    )
    assert not hasattr(op, "retry_policy") or op.retry_policy is None
