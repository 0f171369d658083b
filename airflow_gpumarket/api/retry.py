"""What is retried and how long to wait.

This holds the published request budgets, the patient operations and the policy read from the connection. Tenacity does
the looping in the hooks.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_gpumarket.exceptions import (
    GpuMarketQuotaExceededError,
    GpuMarketRateLimitError,
    GpuMarketServerError,
    GpuMarketTransportError,
)

#: A wait the server asks for longer than this fails the call at once: a task must not sleep for hours on a
#: quota that resets tomorrow (the live service's daily search quota points its Retry-After hours ahead).
MAX_RETRY_AFTER_SECONDS = 300.0

#: Requests per second the live service allows per key and client address (its published figures; the buckets
#: have no burst and charge a penalty for each refusal): the instance list, a create, a destroy, a change of an
#: instance (label, state: one PUT budget).
LIST_RATE_PER_SECOND = 0.5
CREATE_RATE_PER_SECOND = 1 / 4.5
DESTROY_RATE_PER_SECOND = 1 / 3
CHANGE_RATE_PER_SECOND = 1.0
#: Searches and per-instance reads (an instance, its logs) have no published figure: the provider assumes the
#: simulator's (search 1/s, the others 2/s). A fleet of 220 tasks on one key drew hundreds of 429s there without it.
#: The account's reads (charges, invoices, the account) are assumed to be reads too, each with a bucket of its own.
SEARCH_RATE_PER_SECOND = 1.0
READ_RATE_PER_SECOND = 2.0
#: Operations that keep trying through 429s for ``RATE_LIMIT_PATIENCE_SECONDS`` whatever ``max_retries`` says: the
#: calls a fleet of tasks makes all at once when it starts (search, create), reads its jobs' final output or fails
#: (destroy). Refused with 429, none of them did anything, so waiting is safe; giving up fails a task or, for a
#: destroy, leaves an instance billing.
PATIENT_OPERATIONS = frozenset({"search_offers", "create_instance", "request_instance_logs", "destroy_instance"})


def rate_budget(operation: str) -> tuple[str, float] | None:
    """The (budget, requests/s) that paces ``operation``, or None for an operation not paced.

    The hook books each such call a slot of its budget machine-wide (``pacing``), so the pages of a walk, the shared
    pollers' rounds and a fleet of tasks starting or failing at once stay within it.
    """
    return {
        "list_instances": ("list_instances", LIST_RATE_PER_SECOND),
        "create_instance": ("create_instance", CREATE_RATE_PER_SECOND),
        "destroy_instance": ("destroy_instance", DESTROY_RATE_PER_SECOND),
        "label_instance": ("change_instance", CHANGE_RATE_PER_SECOND),
        "stop_instance": ("change_instance", CHANGE_RATE_PER_SECOND),
        "change_bid": ("change_bid", CHANGE_RATE_PER_SECOND),  # its own path: assumed a bucket of its own
        "search_offers": ("search_offers", SEARCH_RATE_PER_SECOND),
        "get_instance": ("get_instance", READ_RATE_PER_SECOND),
        "request_instance_logs": ("request_instance_logs", READ_RATE_PER_SECOND),
        "charges": ("charges", READ_RATE_PER_SECOND),
        "invoices": ("invoices", READ_RATE_PER_SECOND),
        "account": ("account", READ_RATE_PER_SECOND),
    }.get(operation)


#: Longest backoff after a 429 that named no wait (the live service's buckets refill within seconds).
RATE_LIMIT_BACKOFF_CAP_SECONDS = 16.0
#: How long a ``PATIENT_OPERATIONS`` call keeps trying through 429s.
RATE_LIMIT_PATIENCE_SECONDS = 900.0


@dataclass(frozen=True)
class RetryPolicy:
    """How failed calls are retried. Read from the connection's extras (see ``get_provider_info``)."""

    max_retries: int = 5
    min_wait: float = 1.0
    max_wait: float = 60.0
    #: A Retry-After header is honoured up to this many seconds (a longer one fails the call at once).
    max_retry_after: float = MAX_RETRY_AFTER_SECONDS


def is_retryable(exc: BaseException) -> bool:
    """Whether a failure is worth another try for an idempotent call.

    429, 5xx and transport failures are; a quota that resets hours ahead is not.
    """
    if isinstance(exc, GpuMarketQuotaExceededError):
        return False
    return isinstance(exc, GpuMarketRateLimitError | GpuMarketServerError | GpuMarketTransportError)


def create_surely_not_processed(exc: BaseException) -> bool:
    """True when a failed create certainly made no instance, so it may be re-sent as is.

    429 and 503 are answered before any work; a connection that was never established carried nothing. A timeout,
    a dropped connection, 500, 502 or 504 may come after the instance was made: those are ambiguous.
    """
    if isinstance(exc, GpuMarketRateLimitError):
        return True
    if isinstance(exc, GpuMarketServerError):
        return exc.status_code == 503
    if isinstance(exc, GpuMarketTransportError):
        return not exc.request_sent
    return False


def retry_wait_seconds(exc: BaseException | None, attempt: int, policy: RetryPolicy, jitter: float) -> float:
    """Seconds to wait before try ``attempt + 1``.

    Retry-After when the server sent one, else exponential backoff from ``min_wait`` capped at ``max_wait``, scaled by
    ``jitter`` (0..1) into its upper half.
    """
    cap = policy.max_wait
    if isinstance(exc, GpuMarketRateLimitError):
        if exc.retry_after is not None:
            return min(exc.retry_after, policy.max_retry_after)
        # A plain 429 of the live service comes from a token bucket that refills within seconds; backing off
        # for a minute would only add billed time to a destroy.
        cap = min(cap, RATE_LIMIT_BACKOFF_CAP_SECONDS)
    base = min(cap, policy.min_wait * 2 ** max(0, attempt - 1))
    return base * (0.5 + 0.5 * jitter)
