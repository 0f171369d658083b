"""Errors raised by this provider.

Every message is written for the person reading the task log: it names what failed, the server's own words
when there are any, and what to do next. No message ever contains an API key (see ``api.redact``).
"""

from __future__ import annotations


class GpuMarketError(Exception):
    """A call to the GPU marketplace failed.

    :param message: sentence a person can act on.
    :param status_code: HTTP status, or None when no response arrived.
    :param error: the ``error`` field of the service's error object, when present.
    :param msg: the ``msg`` field of the service's error object, when present.
    :param operation: the hook method that failed, e.g. ``create_instance``.
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        error: str | None = None,
        msg: str | None = None,
        operation: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.error = error
        self.msg = msg
        self.operation = operation

    def __reduce__(self):  # keep keyword fields when pickled (Airflow ships exceptions between processes)
        return (_rebuild, (type(self), self.message, self.__dict__))


def _rebuild(cls: type[GpuMarketError], message: str, state: dict) -> GpuMarketError:
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    exc.__dict__.update(state)
    return exc


class GpuMarketAuthError(GpuMarketError):
    """The API key is missing, wrong, revoked, or not allowed to do this.

    Raised for 401/403, or any status whose body says ``auth_error``.
    """


class GpuMarketNotFoundError(GpuMarketError):
    """404: the instance (or other object) does not exist, or no longer exists."""


class GpuMarketRateLimitError(GpuMarketError):
    """429: too many requests. ``retry_after`` holds the server's Retry-After in seconds, when sent."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class GpuMarketQuotaExceededError(GpuMarketRateLimitError):
    """429 for a quota that resets far ahead (a daily search quota): not retried; the message says when."""


class GpuMarketCreateRefusedError(GpuMarketError):
    """create_instance answered ``success: false`` yet made a stopped instance.

    A bid below the machine's minimum does this (``new_contract``). The hook destroys that instance before it raises;
    ``destroyed`` (and the message) say whether that worked.
    """

    def __init__(self, message: str, *, new_contract: int, destroyed: bool = False, **kwargs) -> None:
        super().__init__(message, **kwargs)
        self.new_contract = new_contract
        self.destroyed = destroyed


class GpuMarketCopyRefusedError(GpuMarketError):
    """Starting a copy (instance to instance, or with a cloud integration) answered ``success: false``.

    ``msg`` holds the service's reason. Nothing was copied, so the call was not retried.
    """


class GpuMarketServerError(GpuMarketError):
    """5xx: the service failed; the request may be retried when that is safe."""


class GpuMarketTransportError(GpuMarketError):
    """No usable response: connection refused or dropped, or a timeout.

    ``request_sent`` tells whether the request may have reached the server (False only when the connection
    was never established), which decides whether a non-idempotent call may be re-sent. ``detail`` is what
    happened without the advice a task's reader gets (the doctor gives its own).
    """

    def __init__(self, message: str, *, request_sent: bool = True, detail: str | None = None, **kwargs) -> None:
        super().__init__(message, **kwargs)
        self.request_sent = request_sent
        self.detail = detail or message


class GpuMarketOfferUnavailableError(GpuMarketError):
    """The offer was rented by someone else (or withdrawn) between search and create."""


class GpuMarketAmbiguousCreateError(GpuMarketError):
    """Creating an instance failed in a way that leaves open whether the instance exists.

    Raised only when the hook could not settle the question by itself: the request carried no label to look
    for. The message says how to check.
    """


class GpuMarketValidationError(GpuMarketError, ValueError):
    """The arguments break a rule of the API; raised before any request is sent, so nothing is billed."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem
