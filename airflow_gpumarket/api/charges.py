"""The account's money as the service tells it: charges, invoices and the credit left (queries, pages, records).

None of it is in the spec: the paths, query arguments and answers are the live service's, as its official CLI
(``vastai show invoices-v1``, ``vastai show user``) sends and reads them. Records are read tolerantly: a field that
is missing takes its default (None, "" or empty), but a value of the wrong kind is an error naming the field, and a
charge or invoice without an ``amount`` is an error too (money is never assumed to be zero).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, NoReturn, TypeVar

from airflow_gpumarket.api.paths import (
    BILLING_PAGE_LIMIT,
    BODY_EXCERPT_CHARS,
    CHARGE_TYPES,
    INVOICE_SERVICES,
    SECONDS_PER_DAY,
)
from airflow_gpumarket.api.responses import expect_list
from airflow_gpumarket.api.validation import require_choice, require_non_negative_number, require_positive_int
from airflow_gpumarket.exceptions import (
    GpuMarketAuthError,
    GpuMarketError,
    GpuMarketNotFoundError,
    GpuMarketValidationError,
)

R = TypeVar("R")

#: A walk through more pages than this fails instead of going on: 100,000 records in one window means a server
#: that keeps handing out tokens.
MAX_BILLING_PAGES = 1000
#: A charge's ``source`` for an instance: ``instance-<id>``.
_INSTANCE_SOURCE = r"instance-(\d+)"


@dataclass(frozen=True)
class Charge:
    """One charge of the account, with its breakdown (``items``: gpu, storage, bandwidth, ... of the same shape).

    ``amount`` is in dollars; ``start`` and ``end`` are epoch seconds; ``instance_id`` is read from a ``source`` of
    ``instance-<id>`` (None for any other source).
    """

    type: str
    source: str | None
    instance_id: int | None
    amount: float
    start: float | None
    end: float | None
    description: str
    items: tuple[Charge, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Invoice:
    """One invoice of the account (a payment, a transfer, a prepayment, ...), as the service records it.

    ``amount`` is in dollars with the service's sign (the official CLI flips it for display); ``invoice_id`` comes
    from ``metadata``.
    """

    type: str
    source: str | None
    amount: float
    start: float | None
    end: float | None
    description: str
    invoice_id: int | str | None
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Account:
    """The account's money and who it is. The API key the service sends along is never kept."""

    credit: float | None
    balance: float | None
    user_id: int | None
    email: str | None
    username: str | None

    @property
    def available(self) -> float | None:
        """The money left to spend: ``credit`` (the prepaid credit left) when the service sends it, else ``balance``.

        Credit is what rentals draw from on the live service; ``balance`` is the only figure a service without
        ``credit`` gives, so it stands in rather than leaving the caller with nothing. None when neither is sent.
        """
        return self.credit if self.credit is not None else self.balance


# --- Queries ------------------------------------------------------------------------------------------------------
def encode_query(args: Mapping[str, Any]) -> dict[str, str]:
    """Query arguments as the official CLI sends them: a string as it is, any other value JSON-encoded."""
    return {name: value if isinstance(value, str) else json.dumps(value) for name, value in args.items()}


def page_limit(limit: int) -> int:
    """A page size the service accepts: ``limit``, clamped to ``BILLING_PAGE_LIMIT``."""
    require_positive_int("limit", limit)
    return min(limit, BILLING_PAGE_LIMIT)


def _window(start: float, end: float) -> dict[str, int]:
    """``gte``/``lte`` in whole epoch seconds, widened to include both ends (the CLI sends integers)."""
    require_non_negative_number("start", start)
    require_non_negative_number("end", end)
    if end < start:
        raise GpuMarketValidationError("end", f"must not be before start ({start!r}), got {end!r}")
    return {"gte": math.floor(start), "lte": math.ceil(end)}


def _one_of(name: str, values: Iterable[str] | None, choices: tuple[str, ...]) -> dict[str, list[str]] | None:
    """An ``in`` filter of the distinct ``values`` (each one of ``choices``), or None for no filter."""
    if values is None:
        return None
    if isinstance(values, str):
        raise GpuMarketValidationError(name, f"must be a list of names, not the string {values!r}")
    wanted = list(dict.fromkeys(values))
    if not wanted:
        raise GpuMarketValidationError(name, "must name at least one value, or be None for all of them")
    for value in wanted:
        require_choice(name, value, choices)
    return {"in": wanted}


def build_charges_query(
    start: float,
    end: float,
    *,
    types: Iterable[str] | None = None,
    limit: int = BILLING_PAGE_LIMIT,
    latest_first: bool = False,
) -> dict[str, str]:
    """``GET charges/``: the charges of the days from ``start`` to ``end`` (epoch seconds), of ``types`` if given.

    :param types: charge types (``CHARGE_TYPES``: instance, volume, serverless); None for all.
    :param limit: charges per page, clamped to ``BILLING_PAGE_LIMIT``.
    """
    require_non_negative_number("start", start)
    filters: dict[str, Any] = {"day": _window(start - start % SECONDS_PER_DAY, end)}  # a charge's day is its midnight
    if (by_type := _one_of("types", types, CHARGE_TYPES)) is not None:
        filters["type"] = by_type
    return encode_query({"select_filters": filters, "latest_first": latest_first, "limit": page_limit(limit)})


def build_invoices_query(
    start: float,
    end: float,
    *,
    services: Iterable[str] | None = None,
    limit: int = BILLING_PAGE_LIMIT,
    latest_first: bool = False,
) -> dict[str, str]:
    """``GET invoices/``: the invoices dated from ``start`` to ``end`` (epoch seconds), of ``services`` if given.

    :param services: invoice services (``INVOICE_SERVICES``: stripe_payments, transfer, ...); None for all.
    :param limit: invoices per page, clamped to ``BILLING_PAGE_LIMIT``.
    """
    filters: dict[str, Any] = {"when": _window(start, end)}
    if (by_service := _one_of("services", services, INVOICE_SERVICES)) is not None:
        filters["service"] = by_service
    return encode_query({"select_filters": filters, "latest_first": latest_first, "limit": page_limit(limit)})


# --- Records ------------------------------------------------------------------------------------------------------
class _Fields:
    """Reads one record's fields; a value of the wrong kind raises an error naming the field."""

    def __init__(self, operation: str, where: str, raw: Any, *, quote: bool = True) -> None:
        self.operation = operation
        self.where = where
        self.raw = raw
        self.quote = quote  # False for records that may hold secrets (the user blob carries the API key)
        if not isinstance(raw, Mapping):
            self.fail(None, f"must be a JSON object, got {type(raw).__name__}")

    def fail(self, name: str | None, problem: str) -> NoReturn:
        at = f"{self.where}.{name}" if name else self.where
        got = f" Got: {str(self.raw)[:BODY_EXCERPT_CHARS]!r}" if self.quote and isinstance(self.raw, Mapping) else ""
        raise GpuMarketError(
            f"{self.operation}: the service answered HTTP 200 with a malformed record: {at} {problem}.{got}",
            status_code=200,
            operation=self.operation,
        )

    def _bad(self, name: str, kind: str, value: Any) -> NoReturn:
        shown = repr(value)[:40] if self.quote else type(value).__name__
        self.fail(name, f"must be {kind}, got {shown}")

    def number(self, name: str) -> float | None:
        value = self.raw.get(name)
        return None if value is None else self._number(name, value)

    def amount(self) -> float:
        """The ``amount``, which must be there: money is never assumed to be zero."""
        value = self.raw.get("amount")
        if value is None:
            self.fail("amount", "is missing")
        return self._number("amount", value)

    def _number(self, name: str, value: Any) -> float:
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            try:
                number = float(value)
            except ValueError:
                number = math.nan
            if math.isfinite(number):
                return number
        self._bad(name, "a number", value)

    def text(self, name: str) -> str | None:
        value = self.raw.get(name)
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        self._bad(name, "a string", value)

    def identifier(self, name: str, within: Mapping[str, Any] | None = None, prefix: str = "") -> int | str | None:
        value = (self.raw if within is None else within).get(name)
        if value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        self._bad(prefix + name, "an integer or a string", value)

    def mapping(self, name: str) -> dict[str, Any]:
        value = self.raw.get(name)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self._bad(name, "a JSON object", value)
        return dict(value)

    def records(self, name: str) -> list[Any]:
        value = self.raw.get(name)
        if value is None:
            return []
        if not isinstance(value, list):
            self._bad(name, "a list", value)
        return value


def instance_id_of(source: str | None) -> int | None:
    """The instance id of a charge's ``source`` (``instance-<id>``), else None."""
    found = re.fullmatch(_INSTANCE_SOURCE, source or "")
    return int(found.group(1)) if found else None


def parse_charge(raw: Any, where: str = "charge", operation: str = "charges") -> Charge:
    """One charge (and its ``items``, recursively) read from the service's record."""
    fields = _Fields(operation, where, raw)
    source = fields.text("source")
    items = tuple(
        parse_charge(item, f"{where}.items[{i}]", operation) for i, item in enumerate(fields.records("items"))
    )
    return Charge(
        type=fields.text("type") or "",
        source=source,
        instance_id=instance_id_of(source),
        amount=fields.amount(),
        start=fields.number("start"),
        end=fields.number("end"),
        description=fields.text("description") or "",
        items=items,
        metadata=fields.mapping("metadata"),
    )


def parse_invoice(raw: Any, where: str = "invoice", operation: str = "invoices") -> Invoice:
    """One invoice read from the service's record; ``invoice_id`` from its ``metadata``."""
    fields = _Fields(operation, where, raw)
    metadata = fields.mapping("metadata")
    return Invoice(
        type=fields.text("type") or "",
        source=fields.text("source"),
        amount=fields.amount(),
        start=fields.number("start"),
        end=fields.number("end"),
        description=fields.text("description") or "",
        invoice_id=fields.identifier("invoice_id", metadata, "metadata."),
        metadata=metadata,
    )


def parse_account(body: Any, operation: str = "account") -> Account:
    """The account from ``GET users/current``. Its ``api_key`` is dropped, and no message quotes the blob."""
    fields = _Fields(operation, "users/current", body, quote=False)
    user_id = fields.identifier("id")
    if isinstance(user_id, str):
        user_id = int(user_id) if user_id.isdigit() else None
    return Account(
        credit=fields.number("credit"),
        balance=fields.number("balance"),
        user_id=user_id,
        email=fields.text("email"),
        username=fields.text("username"),
    )


def next_token(body: Any) -> str | None:
    """A page's ``next_token`` as it is sent back (JSON-encoded when not a string, as the CLI does); None at the end."""
    token = body.get("next_token") if isinstance(body, Mapping) else None
    if token is None or token == "":
        return None
    return token if isinstance(token, str) else json.dumps(token)


def parse_page(operation: str, body: Any, record: Callable[[Any, str, str], R]) -> tuple[list[R], str | None]:
    """One page: its ``results``, each read by ``record``, and its ``next_token`` (None on the last page)."""
    results = expect_list(operation, body, "results")
    return [record(raw, f"results[{i}]", operation) for i, raw in enumerate(results)], next_token(body)


def parse_charges_page(body: Any, operation: str = "charges") -> tuple[list[Charge], str | None]:
    return parse_page(operation, body, parse_charge)


def parse_invoices_page(body: Any, operation: str = "invoices") -> tuple[list[Invoice], str | None]:
    return parse_page(operation, body, parse_invoice)


class BillingPages(Generic[R]):
    """One walk through a paged list of charges or invoices (no transport).

    :meth:`request` gives the next ``(path, query)`` or None when the walk is over, :meth:`take` reads the answer,
    :attr:`results` holds the records. Every page is asked for with the first page's filters and the token the
    previous page answered, unchanged (the service serves the next page only for the same filters). A token that
    comes back a second time, or more than ``max_pages`` pages, fails the walk instead of looping.
    """

    def __init__(
        self,
        operation: str,
        path: str,
        query: Mapping[str, str],
        record: Callable[[Any, str, str], R],
        *,
        max_pages: int = MAX_BILLING_PAGES,
    ) -> None:
        self.operation = operation
        self.path = path
        self.query = dict(query)
        self.record = record
        self.max_pages = max_pages
        self.results: list[R] = []
        self.pages = 0
        self._token: str | None = None
        self._seen: set[str] = set()
        self._done = False

    def request(self) -> tuple[str, dict[str, str]] | None:
        if self._done:
            return None
        query = dict(self.query)
        if self._token is not None:
            query["after_token"] = self._token
        return self.path, query

    def take(self, body: Any) -> None:
        records, token = parse_page(self.operation, body, self.record)
        self.results.extend(records)
        self.pages += 1
        if token is None:
            self._done = True
            return
        if token in self._seen or self.pages >= self.max_pages:
            why = "answered a next_token it had already given" if token in self._seen else "kept answering more pages"
            raise GpuMarketError(
                f"{self.operation}: the service {why} ({self.pages} pages read, next_token {token[:40]!r}); stopped "
                "so as not to loop forever. Try again later, or ask for a shorter window.",
                status_code=200,
                operation=self.operation,
            )
        self._seen.add(token)
        self._token = token


def missing_endpoint(operation: str, path: str, exc: GpuMarketError) -> GpuMarketNotFoundError | None:
    """The error for a server without ``path`` (404 or 405, not a bad key), or None when ``exc`` says otherwise.

    These paths are the live service's: a server that follows the spec only does not have them.
    """
    if exc.status_code not in (404, 405) or isinstance(exc, GpuMarketAuthError):
        return None
    words = ": ".join(str(p) for p in (exc.error, exc.msg) if p)
    said = f" Server said: {words}" if words else ""
    return GpuMarketNotFoundError(
        f"{operation}: this service has no GET {path} (HTTP {exc.status_code}). The path is the live service's, "
        f"not the spec's; check the connection's host if it should reach the live service.{said}",
        status_code=exc.status_code,
        error=exc.error,
        msg=exc.msg,
        operation=operation,
    )
