"""The one exception the simulator's server code raises to answer a request with an error object."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An HTTP error answered with the spec's error object ``{"error": ..., "msg": ...}``.

    ``extra`` adds fields to the body (the 402 of volume listings also carries ``success: false``);
    ``headers`` adds response headers (Retry-After).
    """

    def __init__(
        self,
        status: int,
        error: str,
        msg: str,
        *,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(f"{status} {error}: {msg}")
        self.status = status
        self.error = error
        self.msg = msg
        self.extra = extra or {}
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {**self.extra, "error": self.error, "msg": self.msg}


def bad_request(msg: str, error: str = "invalid_args") -> ApiError:
    return ApiError(400, error, msg)
