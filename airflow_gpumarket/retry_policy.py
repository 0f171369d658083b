"""The provider's retry policy (Airflow 3.3+, AIP-105).

It retries, after a delay, what another try may get past, and fails at once what it would only repeat.

    from airflow_gpumarket.retry_policy import gpumarket_retry_policy

    GpuMarketRunJobOperator(..., retries=3, retry_policy=gpumarket_retry_policy())

On Airflow before 3.3 ``gpumarket_retry_policy()`` is None, which the renting operators accept and ignore: the
task's standard retries apply.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

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
    GpuMarketBudgetExceeded,
    GpuMarketHostFailed,
    GpuMarketJobFailed,
    GpuMarketNoWorkingOffer,
    GpuMarketPreemptedTooOften,
    GpuMarketServiceGone,
    GpuMarketStagingFailed,
)

#: The delay before a retry the policy asks for, when none is given.
DEFAULT_RETRY_DELAY = timedelta(minutes=5)


def gpumarket_retry_policy(*, retry_delay: timedelta = DEFAULT_RETRY_DELAY, retry_job_failures: bool = False) -> Any:
    """An ``ExceptionRetryPolicy`` for renting tasks, or None before Airflow 3.3.

    - Retried after ``retry_delay``: no working offer (none under ``max_dph``, all taken, hosts that failed, booted
      too slowly or failed the GPU preflight), a host that failed under the running job, preemptions past
      ``max_preemptions``, and the service's 5xx, 429 and lost connections that outlasted the hook's own retries.
    - Failed at once: the job's own failure (its command exited non-zero; ``retry_job_failures=True`` retries it
      too), data that did not move (``GpuMarketStagingFailed``), arguments the API refuses, a key it refuses, and a
      quota that resets far ahead, a rented service gone under a task that used it, and a rental a person did not
      approve (``approval_above``).
    - Anything else: the task's standard retries.

    Retries still count against the task's ``retries``.

    :param retry_delay: how long to wait before a retry the policy asks for.
    :param retry_job_failures: retry a job whose command failed, as for a flaky job.
    """
    try:
        from airflow.sdk import ExceptionRetryPolicy, RetryAction, RetryRule
    except ImportError:
        return None
    job = RetryAction.RETRY if retry_job_failures else RetryAction.FAIL
    return ExceptionRetryPolicy(
        rules=[
            RetryRule(
                exception=[GpuMarketValidationError, GpuMarketAuthError, GpuMarketQuotaExceededError],
                action=RetryAction.FAIL,
                reason="the service refuses this request or key as it is: another try would be refused too",
            ),
            RetryRule(
                exception=GpuMarketApprovalRefused,
                action=RetryAction.FAIL,
                reason="a person refused the rental, or nobody answered: another try would ask again",
            ),
            RetryRule(
                exception=GpuMarketBudgetExceeded,
                action=RetryAction.FAIL,
                reason="the money is not there: a budget, the account's credit or max_cost stops this task, and "
                "another try would be stopped the same way",
            ),
            RetryRule(
                exception=GpuMarketStagingFailed,
                action=RetryAction.FAIL,
                reason="the task's data did not move (a missing input, a required checkpoint, an output after the job "
                "succeeded): another try would rent and run again for the same result",
            ),
            RetryRule(
                exception=GpuMarketServiceGone,
                action=RetryAction.FAIL,
                reason="the rented service this task used is gone: only a new run of its task group rents another",
            ),
            RetryRule(
                exception=GpuMarketJobFailed,
                action=job,
                retry_delay=retry_delay if retry_job_failures else None,
                reason="the job itself failed"
                + ("" if retry_job_failures else ": a new GPU would run it the same way"),
            ),
            RetryRule(
                exception=[
                    GpuMarketNoWorkingOffer,
                    GpuMarketHostFailed,
                    GpuMarketPreemptedTooOften,
                    GpuMarketServerError,
                    GpuMarketRateLimitError,
                    GpuMarketTransportError,
                ],
                action=RetryAction.RETRY,
                retry_delay=retry_delay,
                reason="the market or the service may do better after a while",
            ),
        ]
    )
