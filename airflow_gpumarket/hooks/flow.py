"""What a flow is: a generator that yields what it needs from the outside and gets the answer back.

It yields a ``Request`` (the driver sends it and returns a ``Response``, or throws a ``GpuMarketTransportError``
in), a ``Book`` (the driver books a slot of the request budget and returns the seconds to wait), a ``Sleep`` (the
driver sleeps, blocking or awaiting), a ``FetchLog`` (the driver reads an uploaded log without the API key, and
returns a ``FetchedLog``) or a ``Probe`` (the driver asks a rented server whether it is ready, and returns
``(ready, what it saw)``). The flows are in ``hooks.core``; their drivers in
``hooks.gpumarket``.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from airflow_gpumarket.exceptions import GpuMarketTransportError

T = TypeVar("T")


@dataclass(frozen=True)
class Request:
    """One exchange with the API: the driver sends it with the account's key and answers a ``Response``."""

    operation: str
    method: str
    path: str
    body: Any = None
    params: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Response:
    status_code: int
    content: bytes
    headers: Mapping[str, str]


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Book:
    """Book a slot of ``operation``'s request budget; the driver answers the seconds to wait for it.

    Booking may touch a file shared by the machine's processes, so the async driver books in a thread.
    """

    operation: str


@dataclass(frozen=True)
class FetchLog:
    """Read an uploaded log from its result URL, without the API key (the storage host must never see it)."""

    url: str


@dataclass(frozen=True)
class FetchedLog:
    """The log's end (at most ``LOG_MAX_BYTES``, from a whole line), or why it was not there yet."""

    text: str | None = None
    failure: str = "nothing"


@dataclass(frozen=True)
class Probe:
    """Ask a rented service's server at ``url`` whether it is ready, over TLS trusting ``certificate`` (DER, base64)
    alone: ``GET path`` with the rental's ``credential`` must answer ``status``; with ``path`` None, a handshake."""

    url: str
    path: str | None
    status: int
    credential: str = field(repr=False)
    certificate: str = field(repr=False)


#: What a flow yields; what it gets back is the ``Response``, ``FetchedLog`` or a probe's answer (None after a
#: ``Sleep``).
Flow = Generator[Request | Book | Sleep | FetchLog | Probe, Any, T]


@dataclass(frozen=True)
class Done:
    """A flow's end, with what it returned."""

    value: Any


def resume(flow: Flow[Any], reply: Any) -> Request | Book | Sleep | FetchLog | Probe | Done:
    """The flow's next need after giving it ``reply``; ``Done`` once it returned.

    A ``GpuMarketTransportError`` reply is thrown in, at the request that failed. The flow's own exceptions go to the
    driver's caller.
    """
    try:
        return flow.throw(reply) if isinstance(reply, GpuMarketTransportError) else flow.send(reply)
    except StopIteration as done:
        return Done(done.value)
