"""Hooks for the GPU marketplace API: ``GpuMarketHook`` (requests) and ``GpuMarketAsyncHook`` (httpx, for triggers).

The two differ only in transport. Building and validating requests, mapping responses to results or exceptions
and deciding whether to retry are pure functions in ``airflow_gpumarket.api``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import random
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

import requests
import tenacity
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError

from airflow_gpumarket import api, job_logs, pacing, types
from airflow_gpumarket._compat import BaseHook, mask_secret
from airflow_gpumarket.exceptions import (
    GpuMarketAmbiguousCreateError,
    GpuMarketCreateRefusedError,
    GpuMarketError,
    GpuMarketNotFoundError,
    GpuMarketRateLimitError,
    GpuMarketTransportError,
    GpuMarketValidationError,
)

if TYPE_CHECKING:
    import httpx


#: Upper bound on the tries of a patient call, so a clock that does not move cannot make it loop forever.
_PATIENT_MAX_TRIES = 200
#: Seconds an idle pooled connection of the async client is kept. Below the idle timeout of the servers and load
#: balancers in front of them (5 s for uvicorn's default, 60 s and more for common balancers): a connection the
#: server closed while the client reused it shows up as ``RemoteProtocolError`` in trigger logs.
CLIENT_KEEPALIVE_SECONDS = 4.0
#: Paced calls (``api.rate_budget``) are spaced this many times the budget's interval (10 % wider) ...
PACING_MARGIN = 1.1
#: ... plus this many seconds: a request that opens a connection (TCP, TLS: tens to a couple of hundred ms) reaches
#: the server later than the next one on a warm connection, and two processes' slots would meet there (measured:
#: one 429 per extra process at start-up, P1-HA).
PACING_SLACK_SECONDS = 0.1
#: The connect timeout, at most: a server that does not accept a connection within this is down.
CONNECT_TIMEOUT_SECONDS = 10.0
#: Instance keys this process received from create calls, masked in every log text fetched here (bounded).
_INSTANCE_KEYS: deque[str] = deque(maxlen=1000)


def slot_seconds(operation: str, rate_limit_scale: float = 1.0) -> float:
    """Seconds between two calls of ``operation``'s budget on one key from this machine (see ``PACING_MARGIN``),
    for a server whose budgets are ``rate_limit_scale`` times the published ones."""
    budget = api.rate_budget(operation)
    if budget is None:
        raise ValueError(f"{operation} is paced by no budget")
    return PACING_MARGIN / (budget[1] * rate_limit_scale) + PACING_SLACK_SECONDS


#: The pacer of each (server, key, operation) this process uses: one each, whatever the number of hooks.
_PACERS: dict[tuple[str, str, str], pacing.SharedPacer] = {}


@dataclass(frozen=True)
class ConnectionSettings:
    """What a hook needs from an Airflow connection. ``api_key`` is kept out of the repr."""

    base_url: str
    api_key: str = field(repr=False)
    timeout: float = api.REQUEST_TIMEOUT_SECONDS
    retry: api.RetryPolicy = api.RetryPolicy()
    verify: bool | str = True
    #: The server's request budgets as a multiple of the published ones; 0: no pacing (a server without limits).
    rate_limit_scale: float = 1.0


def _is_loopback(hostname: str) -> bool:
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def _extra(extra: Mapping[str, Any], name: str) -> Any:
    value = extra.get(name)
    return None if value == "" else value


def _extra_number(extra: Mapping[str, Any], name: str, default: float, conn_id: str) -> float:
    value = _extra(extra, name)
    if value is None:
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if not math.isfinite(number) or number < 0:
        raise GpuMarketValidationError(
            f"connection {conn_id!r} extra {name!r}", f"must be a number of at least 0, got {value!r}"
        )
    return number


def settings_from_connection(
    conn_id: str, host: str | None, port: int | None, password: str | None, extra: Mapping[str, Any]
) -> ConnectionSettings:
    """Turn a connection's fields into settings, refusing anything that would leak the key or guess a host.

    The host holds the base URL. A host without a scheme gets ``http`` when it is a loopback address (the
    simulator) and ``https`` otherwise; plaintext ``http`` to any other host is refused.
    """
    where = f"connection {conn_id!r}"
    if not host:
        raise GpuMarketValidationError(
            f"{where} host", "is empty; set it to the service's base URL, e.g. https://api.example.com"
        )
    if not password:
        raise GpuMarketValidationError(
            f"{where} password", "is empty; put the API key from the web console in the connection's password"
        )
    if "://" not in host:
        bare = urlsplit(f"//{host}").hostname or ""
        host = f"{'http' if _is_loopback(bare) else 'https'}://{host}"
    parts = urlsplit(host)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise GpuMarketValidationError(
            f"{where} host", f"{host!r} is not a base URL; write it as https://HOST[:PORT][/PREFIX]"
        )
    if parts.scheme == "http" and not _is_loopback(parts.hostname):
        raise GpuMarketValidationError(
            f"{where} host",
            f"{host!r} uses plaintext http to a non-loopback host, which would expose the API key; use https://",
        )
    netloc = parts.netloc
    if port and parts.port is None:
        netloc = f"{netloc}:{port}"
    base_url = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    max_retries = int(_extra_number(extra, "max_retries", api.RetryPolicy.max_retries, conn_id))
    policy = api.RetryPolicy(
        max_retries=max_retries,
        min_wait=_extra_number(extra, "retry_min_wait", api.RetryPolicy.min_wait, conn_id),
        max_wait=_extra_number(extra, "retry_max_wait", api.RetryPolicy.max_wait, conn_id),
    )
    timeout = _extra_number(extra, "timeout", api.REQUEST_TIMEOUT_SECONDS, conn_id) or api.REQUEST_TIMEOUT_SECONDS
    ca_bundle = _extra(extra, "ca_bundle")
    rate_limit_scale = _extra_number(extra, "rate_limit_scale", 1.0, conn_id)
    return ConnectionSettings(base_url, password, timeout, policy, ca_bundle or True, rate_limit_scale)


class _BearerAuth(requests.auth.AuthBase):
    """Bearer auth as an ``auth`` object, so a ~/.netrc entry can never replace it. Its repr hides the key."""

    def __init__(self, api_key: str) -> None:
        self._api_key = api_key

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = f"Bearer {self._api_key}"
        return request

    def __repr__(self) -> str:
        return "_BearerAuth(***)"


class _LogBuffer:
    """The end of an uploaded log as it is read: at most ``LOG_MAX_BYTES``, starting at a whole line."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.cut = False

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > api.paths.LOG_MAX_BYTES:
            del self.data[: len(self.data) - api.paths.LOG_MAX_BYTES]
            self.cut = True

    def text(self) -> str:
        data = self.data[self.data.find(b"\n") + 1 :] if self.cut else self.data
        return data.decode("utf-8", "replace")


class _GpuMarketHookBase(BaseHook):
    """Connection handling, retry policy and logging shared by the sync and async hooks."""

    conn_name_attr = "gpumarket_conn_id"
    default_conn_name = "gpumarket_default"
    conn_type = "gpumarket"
    hook_name = "GPU Market"

    def __init__(self, gpumarket_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gpumarket_conn_id = gpumarket_conn_id
        #: Whether this server has the live service's paged v1 instance list; learnt from the first listing.
        self._list_v1 = True

    def _pace(self, operation: str) -> float:
        """Seconds to wait before the next ``operation`` request, and book its slot (0 for an operation that no
        budget paces: ``api.rate_budget``). The live service keeps a bucket per operation, key and client address,
        without burst, and charges a penalty for each refusal. So every such call of every process of this machine
        on this key (pages of a walk, the shared pollers' rounds, reapers, a fleet of mapped tasks renting, reading
        or failing at once) takes its turn through one ``pacing.SharedPacer`` per budget, spaced a little wider
        than the budget: sent exactly at the rate, clock jitter alone would draw 429s. The connection's
        ``rate_limit_scale`` scales the budgets (0: none)."""
        settings = self.settings
        budget = api.rate_budget(operation)
        if budget is None or not settings.rate_limit_scale:
            return 0.0
        key = (settings.base_url, settings.api_key, budget[0])
        pacer = _PACERS.get(key)
        if pacer is None:
            pacer = _PACERS[key] = pacing.SharedPacer(settings.base_url, settings.api_key, budget[0])
        return pacer.book(slot_seconds(operation, settings.rate_limit_scale))

    def min_list_interval(self) -> float:
        """Seconds between two list calls that the connection's budget allows (0: it paces nothing); the published
        budget's until the connection has been read."""
        settings = self.__dict__.get("settings")
        scale = settings.rate_limit_scale if settings is not None else 1.0
        return 1.0 / (api.retry.LIST_RATE_PER_SECOND * scale) if scale else 0.0

    def _fall_back_from_v1(self, listing: api.InstanceListing, exc: GpuMarketError) -> bool:
        """True, with ``listing`` restarted on the v0 list, when ``exc`` says this server has no v1 list."""
        if not (listing.v1 and api.falls_back_to_v0(exc)):
            return False
        self._list_v1 = False
        self.log.info("This server has no %s (%s); listing through %s", api.PATH_INSTANCES_V1, exc, api.PATH_INSTANCES)
        listing.use_v0()
        return True

    def _settings_from(self, conn: Any) -> ConnectionSettings:
        settings = settings_from_connection(
            self.gpumarket_conn_id, conn.host, conn.port, conn.password, conn.extra_dejson or {}
        )
        mask_secret(settings.api_key)
        return settings

    def _retry_kwargs(self, retry: Any, *, tries_done: int = 0, patient: bool = False) -> dict[str, Any]:
        """tenacity settings for the tries left after ``tries_done`` (attempt numbers count those too).

        ``patient`` calls (``api.PATIENT_OPERATIONS``) keep trying through 429s for
        ``api.retry.RATE_LIMIT_PATIENCE_SECONDS`` whatever ``max_retries`` says: many tasks starting or failing at once
        share one rate budget. Other failures still stop them after ``max_retries``.
        """
        max_attempts = self.settings.retry.max_retries + 1 - tries_done
        patience = api.retry.RATE_LIMIT_PATIENCE_SECONDS

        def stop(state: tenacity.RetryCallState) -> bool:
            exc = state.outcome.exception() if state.outcome else None
            if patient and isinstance(exc, GpuMarketRateLimitError) and api.is_retryable(exc):
                return (state.seconds_since_start or 0.0) >= patience or state.attempt_number >= _PATIENT_MAX_TRIES
            return state.attempt_number >= max_attempts

        def wait(state: tenacity.RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            return api.retry_wait_seconds(exc, state.attempt_number + tries_done, self.settings.retry, random.random())

        def log_retry(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            seconds = state.next_action.sleep if state.next_action else 0
            self.log.warning("Try %d failed (%s); retrying in %.1f s", state.attempt_number + tries_done, exc, seconds)

        return {
            "stop": stop,
            "wait": wait,
            "retry": retry,
            "before_sleep": log_retry,
            "reraise": True,
        }

    def _first_retry_wait(self, exc: GpuMarketError, *, patient: bool = False) -> float | None:
        """After a failed first try: seconds to wait before the second, or None when it must not be retried.

        The first try of a retried call goes out without tenacity (most calls succeed at once, and building the
        retry machinery per call cost about a tenth of a millisecond); tenacity takes over from the second try
        with the same waits, stop rule and log lines as if it had made the first.
        """
        if not api.is_retryable(exc):
            return None
        if self.settings.retry.max_retries == 0 and not (patient and isinstance(exc, GpuMarketRateLimitError)):
            return None
        seconds = api.retry_wait_seconds(exc, 1, self.settings.retry, random.random())
        self.log.warning("Try 1 failed (%s); retrying in %.1f s", exc, seconds)
        return seconds

    @cached_property
    def settings(self) -> ConnectionSettings:
        return self._settings_from(self.get_connection(self.gpumarket_conn_id))

    def _mask_instance_key(self, result: Mapping[str, Any]) -> None:
        key = result.get("instance_api_key")
        if isinstance(key, str) and key:
            mask_secret(key)
            _INSTANCE_KEYS.append(key)

    # --- logs (live service; not in the spec) ---------------------------------------------------------
    @staticmethod
    def _logs_request(
        instance_id: int, tail: int | str | None, filter: str | None, daemon_logs: bool | None
    ) -> tuple[str, dict[str, Any]]:
        api.require_positive_int("instance_id", instance_id)
        body = api.build_request_logs_body(tail=tail, filter=filter, daemon_logs=daemon_logs)
        return api.PATH_REQUEST_LOGS.format(instance_id=instance_id), body

    def _redact_log(self, text: str, key_digests: Iterable[str | None]) -> str:
        """The account key, every instance key this process created, the keys known by digest and every
        ``CONTAINER_API_KEY=`` value, masked."""
        return job_logs.Redactor((self.settings.api_key, *_INSTANCE_KEYS), key_digests)(text)

    @staticmethod
    def _log_not_uploaded(instance_id: int, url: str, last: str) -> GpuMarketError:
        host = urlsplit(url).hostname  # the rest of the URL grants access to the log: not repeated in messages
        waited = api.LOG_FETCH_TRIES * api.LOG_FETCH_INTERVAL_SECONDS
        return GpuMarketError(
            f"get_instance_logs: the log of instance {instance_id} was not at its result URL on {host} after "
            f"{api.LOG_FETCH_TRIES} tries over {waited:.0f} s (last answer: {last}); the service may be slow to "
            "upload it: ask again later",
            operation="get_instance_logs",
        )


class GpuMarketHook(_GpuMarketHookBase):
    """Talks to the GPU marketplace REST API, one method per endpoint.

    :param gpumarket_conn_id: connection of type ``gpumarket``: host = base URL, password = API key, extras =
        ``timeout``, ``max_retries``, ``retry_min_wait``, ``retry_max_wait``, ``ca_bundle``.

    Reads, stop and destroy are retried on 429 (honouring Retry-After), 5xx and connection errors. Creating an
    instance is never re-sent blindly: see :meth:`create_instance`. Results are plain JSON dicts and lists.
    """

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The connection form's hidden, relabelled and hinted fields, for Airflow 2.11's webserver (Airflow 3.2+
        reads the same declaration from the provider info, ``get_provider_info.CONNECTION_FORM``)."""
        from airflow_gpumarket.get_provider_info import CONNECTION_FORM

        return {key.replace("-", "_"): value for key, value in CONNECTION_FORM["ui-field-behaviour"].items()}

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """The connection form's extra fields for Airflow 2.11's webserver, built from the provider info's
        ``conn-fields``. Flask AppBuilder, which Airflow 3 does not install, is imported here only. Both methods
        are defined on this class itself: Airflow 2.11 does not look for them on a base class."""
        from flask_appbuilder.fieldwidgets import BS3TextFieldWidget
        from wtforms import IntegerField, StringField
        from wtforms.validators import NumberRange, Optional

        from airflow_gpumarket.get_provider_info import CONNECTION_FORM

        widgets = {}
        for name, spec in CONNECTION_FORM["conn-fields"].items():
            schema = spec["schema"]
            validators: list[Any] = [Optional()]
            field: Any = StringField  # 2.11's form takes no FloatField: a number is text the hook parses and checks
            if "integer" in schema["type"]:
                field = IntegerField
                validators.append(NumberRange(min=schema.get("minimum")))
            widgets[name] = field(
                spec["label"],
                description=spec.get("description", ""),
                default=schema.get("default"),
                validators=validators,
                widget=BS3TextFieldWidget(),
            )
        return widgets

    @cached_property
    def session(self) -> requests.Session:
        session = requests.Session()
        session.auth = _BearerAuth(self.settings.api_key)
        session.verify = self.settings.verify
        session.headers["Accept"] = "application/json"
        return session

    # --- transport -------------------------------------------------------------------------------------
    def _send(
        self, operation: str, method: str, path: str, body: Any = None, params: Mapping[str, str] | None = None
    ) -> Any:
        """One HTTP exchange, mapped to a result or a ``GpuMarketError``. No retry here."""
        settings = self.settings
        url = settings.base_url + path
        try:
            response = self.session.request(
                method,
                url,
                json=body,
                params=params,
                timeout=(min(CONNECT_TIMEOUT_SECONDS, settings.timeout), settings.timeout),
                # A redirect is not part of the contract (and would turn a PUT into a GET): surface it instead.
                allow_redirects=False,
            )
        except requests.RequestException as exc:
            raise _transport_error(operation, method, path, exc) from None
        self.log.debug("%s %s -> HTTP %s", method, path, response.status_code)
        return api.raise_for_response(
            operation,
            response.status_code,
            api.decode_body(response.content),
            retry_after=response.headers.get("Retry-After"),
            rate_limit_reset=response.headers.get("X-RateLimit-Reset"),
            secrets=(settings.api_key,),
        )

    def _call(
        self,
        operation: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
    ) -> Any:
        """``_send`` with retries: only for idempotent calls (reads, stop, destroy, account listings). Every try, a
        retry's too, first waits for a slot of the operation's budget (a retry sent outside the budget would draw
        the next call's 429); ``api.PATIENT_OPERATIONS`` keep trying through 429s."""
        patient = operation in api.PATIENT_OPERATIONS

        def send() -> Any:
            if (wait := self._pace(operation)) > 0:
                time.sleep(wait)
            return self._send(operation, method, path, body, params)

        try:
            return send()
        except GpuMarketError as exc:
            seconds = self._first_retry_wait(exc, patient=patient)
            if seconds is None:
                raise
        tenacity.nap.sleep(seconds)
        retry = tenacity.retry_if_exception(api.is_retryable)
        for attempt in tenacity.Retrying(**self._retry_kwargs(retry, tries_done=1, patient=patient)):
            with attempt:
                return send()
        raise AssertionError("unreachable: tenacity re-raises the last error")

    def _call_unless_processed(self, operation: str, method: str, path: str, body: Any) -> Any:
        """``_send`` for a call that must not be repeated once the server may have acted on it (creating an
        endpoint, regenerating backup codes): retried only after failures that surely did nothing."""
        retry = tenacity.retry_if_exception(api.create_surely_not_processed)
        for attempt in tenacity.Retrying(**self._retry_kwargs(retry)):
            with attempt:
                return self._send(operation, method, path, body)
        raise AssertionError("unreachable: tenacity re-raises the last error")

    # --- offers and instances ---------------------------------------------------------------------------
    def search_offers(
        self,
        filters: Mapping[str, Any] | None = None,
        *,
        offer_type: str = "ondemand",
        limit: int | None = None,
        order: list | None = None,
    ) -> list[types.Offer]:
        """Search offers. ``filters``: ``{"gpu_name": {"eq": "RTX 4090"}, "num_gpus": {"gte": 1}}``
        (``in`` takes a list; :class:`airflow_gpumarket.api.OfferQuery` builds them); ``order``:
        ``[["dph_total", "asc"]]``; ``offer_type``: ondemand, on-demand or bid."""
        body = api.build_search_body(filters, offer_type=offer_type, limit=limit, order=order)
        result = self._call("search_offers", "POST", api.PATH_SEARCH_OFFERS, body)
        return api.expect_list("search_offers", result, "offers")

    def create_instance(self, offer_id: int, *, label: str | None = None, **fields: Any) -> types.CreateInstanceResult:
        """Rent offer ``offer_id``; returns ``success``, ``new_contract`` (the instance id), ``instance_api_key``.

        ``fields`` are the spec's creation fields (``api.CREATION_FIELDS``: image, template_hash_id, disk, runtype,
        target_state, price, env, onstart, args_str, ...). Every argument is validated before anything is sent.
        Creation is not idempotent on the wire, so a failure is re-sent only when it surely made nothing (429, 503,
        connection never established). Creates are paced machine-wide to the key's budget and keep trying through
        429s (``api.PATIENT_OPERATIONS``), so a fleet of tasks renting at once waits its turn. After an
        ambiguous failure (timeout, dropped connection, 500/502/504) the hook looks for an instance carrying
        ``label`` (again after the request timeout, when the first look finds none) and returns it (with
        ``instance_api_key`` None) instead of renting twice; without a label it raises
        :class:`GpuMarketAmbiguousCreateError`. A result reached after an ambiguous failure carries
        ``ambiguous: True``: a create delayed even longer could still land, so the caller should look for
        duplicates of its label later (the operators do).
        """
        api.require_positive_int("offer_id", offer_id)
        body = api.build_create_instance_body(label=label, **fields)
        path = api.PATH_CREATE_INSTANCE.format(offer_id=offer_id)
        failed_at: float | None = None  # monotonic time of the last ambiguous failure
        retry = tenacity.retry_if_exception(api.is_retryable)
        for attempt in tenacity.Retrying(**self._retry_kwargs(retry, patient=True)):
            with attempt:
                if failed_at is not None and label is not None:
                    found = self._find_after_ambiguous_create(label, failed_at)
                    if found is not None:
                        return {"success": True, "new_contract": found, "instance_api_key": None, "ambiguous": True}
                if (wait := self._pace("create_instance")) > 0:
                    time.sleep(wait)
                try:
                    result = self._send("create_instance", "PUT", path, body)
                except GpuMarketCreateRefusedError as exc:
                    self._destroy_refused_create(exc)
                except GpuMarketError as exc:
                    if not api.is_retryable(exc) or api.create_surely_not_processed(exc):
                        raise
                    if label is None:
                        raise GpuMarketAmbiguousCreateError(
                            f"create_instance on offer {offer_id} failed ambiguously ({exc}); an instance may "
                            "have been created. It was not re-sent, to avoid renting twice: check list_instances() "
                            "and destroy any instance you do not want. Pass a label so the hook can check itself.",
                            status_code=exc.status_code,
                            operation="create_instance",
                        ) from exc
                    self.log.warning(
                        "create_instance on offer %s failed ambiguously (%s); will look for label %r before "
                        "deciding to send it again",
                        offer_id,
                        exc,
                        label,
                    )
                    failed_at = time.monotonic()
                    raise
                self._mask_instance_key(result)
                if failed_at is not None:  # sent again after an ambiguous failure: a late duplicate is possible
                    result = {**result, "ambiguous": True}
                return result
        raise AssertionError("unreachable: tenacity re-raises the last error")

    def _destroy_refused_create(self, refused: GpuMarketCreateRefusedError) -> NoReturn:
        """Destroy the stopped instance that a refused create made (it bills storage until then), then raise."""
        fields = {"status_code": refused.status_code, "error": refused.error, "msg": refused.msg}
        try:
            self.destroy_instance(refused.new_contract)
        except GpuMarketError as exc:
            raise GpuMarketCreateRefusedError(
                f"{refused.message} Destroying it failed ({exc}): destroy instance {refused.new_contract} by hand "
                "(or let the reaper find its label); it bills storage until then.",
                new_contract=refused.new_contract,
                operation="create_instance",
                **fields,
            ) from refused
        raise GpuMarketCreateRefusedError(
            f"{refused.message} It has been destroyed: nothing bills.",
            new_contract=refused.new_contract,
            operation="create_instance",
            **fields,
        ) from None

    def _find_after_ambiguous_create(self, label: str, failed_at: float) -> int | None:
        """The id of the instance an ambiguous create made, if any.

        Looked for at once (a quick job may finish and destroy its instance, which then no longer shows); if it
        is not there, the server gets as long to finish the request as it had to answer it (the request
        timeout), and a second look decides.
        """
        found = api.find_by_label(self.list_instances(label=label), label)
        remaining = failed_at + self.settings.timeout - time.monotonic()
        if found is None and remaining > 0:
            self.log.warning("No instance labelled %r yet; giving the request %.1f s more to land", label, remaining)
            tenacity.nap.sleep(remaining)
            found = api.find_by_label(self.list_instances(label=label), label)
        if found is None:
            return None
        self.log.warning(
            "Found instance %s with label %r after the ambiguous failure: using it, not renting again",
            found["id"],
            label,
        )
        return int(found["id"])

    def list_instances(self, *, label: str | None = None, ids: Iterable[int] | None = None) -> list[types.Instance]:
        """Every instance of the account, following the pages of ``GET /api/v1/instances/`` to the end (spaced
        at the live service's list rate); ``label`` and ``ids`` narrow it down on the server.

        On a server without the v1 list (404/405: one that follows the spec only) it falls back to
        ``GET /api/v0/instances/`` and remembers that for the hook's life.
        """
        listing = api.InstanceListing(label=label, ids=ids, v1=self._list_v1)
        while (request := listing.request()) is not None:
            path, params = request
            try:
                body = self._call("list_instances", "GET", path, params=params)
            except GpuMarketError as exc:
                if self._fall_back_from_v1(listing, exc):
                    continue
                raise
            listing.take(body)
        return listing.instances

    def get_instance(self, instance_id: int) -> types.Instance:
        """The instance object (unwrapped from ``instances``). Raises GpuMarketNotFoundError when the service
        says it does not exist (404, or the live service's ``{"instances": null}``); see :meth:`find_instance`."""
        api.require_positive_int("instance_id", instance_id)
        path = api.PATH_INSTANCE.format(instance_id=instance_id)
        return api.unwrap_instance(self._call("get_instance", "GET", path), instance_id)

    def find_instance(self, instance_id: int) -> types.Instance | None:
        """The instance, or None only when it is surely gone: a read said "not found" and the list agrees.

        A wait in job mode reads "gone" as success, so one answer is not enough to believe it.
        """
        try:
            return self.get_instance(instance_id)
        except GpuMarketNotFoundError as exc:
            listed = self.list_instances(ids=[instance_id])
            if listed:
                self.log.warning("Instance %s was reported missing (%s) but is listed; still there", instance_id, exc)
                return listed[0]
            return None

    def label_instance(self, instance_id: int, label: str) -> dict[str, Any]:
        """Change an instance's label (``PUT /api/v0/instances/{id}/ {"label": ...}``, as the live service and
        its CLI do; not in the spec)."""
        api.require_positive_int("instance_id", instance_id)
        api.require_text("label", label)
        path = api.PATH_INSTANCE.format(instance_id=instance_id)
        return self._call("label_instance", "PUT", path, {"label": label})

    def stop_instance(self, instance_id: int) -> dict[str, Any]:
        """Stop: compute billing halts, disk charges continue."""
        api.require_positive_int("instance_id", instance_id)
        path = api.PATH_INSTANCE.format(instance_id=instance_id)
        return self._call("stop_instance", "PUT", path, {"state": "stopped"})

    def change_bid(self, instance_id: int, price: float) -> dict[str, Any]:
        """Change the bid ($/h) of an interruptible instance. The service answers 400 for an on-demand one ("Can't
        change price of on-demand contract."), 404 for an instance that does not exist."""
        body = api.build_change_bid_body(instance_id, price)
        return self._call("change_bid", "PUT", api.PATH_CHANGE_BID.format(instance_id=instance_id), body)

    def destroy_instance(self, instance_id: int) -> dict[str, Any]:
        """Destroy: all billing stops. Idempotent: an instance that is already gone counts as success
        (the result then carries ``already_gone: True``)."""
        api.require_positive_int("instance_id", instance_id)
        path = api.PATH_INSTANCE.format(instance_id=instance_id)
        try:
            return self._call("destroy_instance", "DELETE", path)
        except GpuMarketNotFoundError:
            return {"success": True, "already_gone": True}

    def request_instance_logs(
        self,
        instance_id: int,
        *,
        tail: int | str | None = None,
        filter: str | None = None,
        daemon_logs: bool | None = None,
        retry: bool = True,
    ) -> types.LogsRequestResult:
        """Ask the service to upload the instance's container log (or, with ``daemon_logs``, the host daemon's):
        ``PUT /api/v0/instances/request_logs/{id}/`` (live service; not in the spec). Returns ``result_url``, where
        the log appears shortly after. ``tail``: the last lines only; ``filter``: a server-side grep. ``retry``
        False sends one try (for periodic reads, whose next round is the retry)."""
        path, body = self._logs_request(instance_id, tail, filter, daemon_logs)
        if not retry:  # one try, in its slot of the budget all the same
            if (wait := self._pace("request_instance_logs")) > 0:
                time.sleep(wait)
            return self._send("request_instance_logs", "PUT", path, body)
        return self._call("request_instance_logs", "PUT", path, body)

    def get_instance_logs(
        self,
        instance_id: int,
        *,
        tail: int | str | None = api.LOG_TAIL_DEFAULT,
        filter: str | None = None,
        daemon_logs: bool | None = None,
        retry: bool = True,
        key_digests: Iterable[str | None] = (),
    ) -> str:
        """The log's text: requested (see :meth:`request_instance_logs`), then fetched from ``result_url``
        without the API key, waiting for the upload as the official client does (``LOG_FETCH_TRIES`` tries
        ``LOG_FETCH_INTERVAL_SECONDS`` apart). The account key, instance keys this process created, keys whose
        sha256 is in ``key_digests`` and ``CONTAINER_API_KEY=`` values are masked. At most ``LOG_MAX_BYTES``
        (the end) is read."""
        answer = self.request_instance_logs(instance_id, tail=tail, filter=filter, daemon_logs=daemon_logs, retry=retry)
        url = api.log_result_url("get_instance_logs", answer)
        last = "nothing"
        for _ in range(api.LOG_FETCH_TRIES):
            tenacity.nap.sleep(api.LOG_FETCH_INTERVAL_SECONDS)  # the upload is never there at once
            try:
                with self.storage_session.get(url, timeout=api.LOG_FETCH_TIMEOUT_SECONDS, stream=True) as response:
                    if response.status_code == 200:
                        buffer = _LogBuffer()
                        for chunk in response.iter_content(65536):
                            buffer.add(chunk)
                        return self._redact_log(buffer.text(), key_digests)
                    last = f"HTTP {response.status_code}"
            except requests.RequestException as exc:
                last = type(exc).__name__
        raise self._log_not_uploaded(instance_id, url, last)

    @cached_property
    def storage_session(self) -> requests.Session:
        """For log uploads: no API key (the storage host must never see it), default certificate checks."""
        return requests.Session()

    # --- host, serverless and account -------------------------------------------------------------------
    def create_volume_listings(
        self, *, machine: int | None = None, machines: list[int] | None = None, hidden_listing: bool | None = None
    ) -> types.VolumeListingResult:
        body = api.build_volume_listing_body(machine=machine, machines=machines, hidden_listing=hidden_listing)
        return self._call("create_volume_listings", "POST", api.PATH_VOLUMES, body)

    def create_endpoint(self, **fields: Any) -> types.EndpointResult:
        """Create a serverless endpoint from the spec's endpoint fields (``api.ENDPOINT_FIELDS``); ``result`` is the
        new endpoint's id. Not retried after it may have been processed (5xx, timeouts): creating is not
        idempotent."""
        body = api.build_endpoint_body(**fields)
        return self._call_unless_processed("create_endpoint", "POST", api.PATH_ENDPOINTS, body)

    def delete_deployments(self, name: str, tag: str | None = None) -> types.DeleteDeploymentsResult:
        """Soft-delete every deployment called ``name`` (and ``tag``), cascading to endpoints and workers."""
        body = api.build_delete_deployments_body(name, tag)
        return self._call("delete_deployments", "DELETE", api.PATH_DEPLOYMENTS, body)

    def regenerate_backup_codes(
        self,
        *,
        tfa_method: str | None = None,
        code: str | None = None,
        secret: str | None = None,
        tfa_method_id: int | None = None,
        backup_code: str | None = None,
    ) -> types.BackupCodesResult:
        """Regenerate the ten two-factor backup codes. The codes are masked in logs; never push them to XCom.
        Not retried once it may have been processed: the old codes stop working."""
        body = api.build_regen_backup_codes_body(
            tfa_method=tfa_method, code=code, secret=secret, tfa_method_id=tfa_method_id, backup_code=backup_code
        )
        result = self._call_unless_processed("regenerate_backup_codes", "PUT", api.PATH_REGEN_BACKUP_CODES, body)
        for backup in api.expect_list("regenerate_backup_codes", result, "backup_codes"):
            mask_secret(backup)
        return result

    def list_pending_price_increases(self) -> types.PendingPriceIncreases:
        """The whole response: ``pending_price_increases``, ``count`` and ``truncated`` (the list was cut)."""
        return self._call("list_pending_price_increases", "GET", api.PATH_PENDING_PRICE_INCREASES)

    def list_api_keys(self) -> list[dict[str, Any]]:
        result = self._call("list_api_keys", "GET", api.PATH_API_KEYS)
        return api.expect_list("list_api_keys", result, "apikeys")

    def list_cloud_integrations(self) -> list[dict[str, Any]]:
        result = self._call("list_cloud_integrations", "GET", api.PATH_CLOUD_INTEGRATIONS)
        return api.expect_list("list_cloud_integrations", result, None)

    # --- Airflow connection test ---------------------------------------------------------------------
    def test_connection(self) -> tuple[bool, str]:
        """One cheap authenticated call (the first page of one instance), not retried, reported in a sentence.
        Works against the live service (v1 list) and a spec-only server (v0 list)."""
        listing = api.InstanceListing(v1=self._list_v1, page_limit=1)
        try:
            while True:
                path, params = listing.request() or (api.PATH_INSTANCES, None)
                try:
                    result = self._send("test_connection", "GET", path, params=params)
                    break
                except GpuMarketError as exc:
                    if not self._fall_back_from_v1(listing, exc):
                        raise
        except GpuMarketError as exc:  # messages are built without the key (see api.raise_for_response)
            return False, str(exc)
        count = api.listing_total(result)
        return True, f"Connected to {self.settings.base_url}: the API key works ({count} instance(s) visible)."


def _transport_error(operation: str, method: str, path: str, exc: BaseException) -> GpuMarketTransportError:
    """Wrap a requests/httpx failure; ``request_sent`` is False only when no connection was ever made."""
    never_connected = _never_connected(exc)
    kind = type(exc).__name__
    return GpuMarketTransportError(
        f"{operation}: {method} {path} got no response ({kind}); "
        + ("the connection could not be opened." if never_connected else "the request may have reached the server."),
        request_sent=not never_connected,
        operation=operation,
    )


def _never_connected(exc: BaseException) -> bool:
    if isinstance(exc, requests.ConnectTimeout):
        return True
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, NewConnectionError | ConnectTimeoutError | ConnectionRefusedError):
            return True
        reason = getattr(seen, "reason", None)
        if isinstance(reason, BaseException) and reason is not seen:
            seen = reason
            continue
        args = getattr(seen, "args", ())
        nested = args[0] if args and isinstance(args[0], BaseException) else None
        seen = nested or seen.__cause__ or seen.__context__
    type_name = type(exc).__name__
    return type_name in ("ConnectError", "ConnectTimeout")  # httpx names


class GpuMarketAsyncHook(_GpuMarketHookBase):
    """The async twin used by triggers (httpx). Same connection, same retry rules, same results."""

    async def asettings(self) -> ConnectionSettings:
        if "settings" not in self.__dict__:
            getter = getattr(BaseHook, "aget_connection", None)
            if getter is not None:
                conn = await getter(self.gpumarket_conn_id)
            else:  # Airflow 2.x
                from asgiref.sync import sync_to_async

                conn = await sync_to_async(BaseHook.get_connection)(self.gpumarket_conn_id)
            self.__dict__["settings"] = self._settings_from(conn)
        return self.settings

    @cached_property
    def client(self) -> httpx.AsyncClient:
        import httpx

        settings = self.settings
        return httpx.AsyncClient(
            base_url=settings.base_url,
            headers={"Authorization": f"Bearer {settings.api_key}", "Accept": "application/json"},
            timeout=httpx.Timeout(settings.timeout, connect=min(CONNECT_TIMEOUT_SECONDS, settings.timeout)),
            limits=httpx.Limits(keepalive_expiry=CLIENT_KEEPALIVE_SECONDS),
            verify=settings.verify,
            trust_env=False,
        )

    async def aclose(self) -> None:
        if "client" in self.__dict__:
            await self.client.aclose()
            del self.__dict__["client"]

    async def _send(
        self, operation: str, method: str, path: str, body: Any = None, params: Mapping[str, str] | None = None
    ) -> Any:
        import httpx

        settings = await self.asettings()
        try:
            response = await self.client.request(method, path, json=body, params=params)
        except httpx.HTTPError as exc:
            raise _transport_error(operation, method, path, exc) from None
        return api.raise_for_response(
            operation,
            response.status_code,
            api.decode_body(response.content),
            retry_after=response.headers.get("Retry-After"),
            rate_limit_reset=response.headers.get("X-RateLimit-Reset"),
            secrets=(settings.api_key,),
        )

    async def _call(
        self,
        operation: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
    ) -> Any:
        """Same rules as the sync hook's ``_call``: a plain first try, tenacity after a retryable failure."""
        await self.asettings()
        patient = operation in api.PATIENT_OPERATIONS

        async def send() -> Any:
            if (wait := self._pace(operation)) > 0:
                await asyncio.sleep(wait)
            return await self._send(operation, method, path, body, params)

        try:
            return await send()
        except GpuMarketError as exc:
            seconds = self._first_retry_wait(exc, patient=patient)
            if seconds is None:
                raise
        await asyncio.sleep(seconds)
        retry = tenacity.retry_if_exception(api.is_retryable)
        async for attempt in tenacity.AsyncRetrying(**self._retry_kwargs(retry, tries_done=1, patient=patient)):
            with attempt:
                return await send()
        raise AssertionError("unreachable: tenacity re-raises the last error")

    async def get_instance(self, instance_id: int) -> types.Instance:
        api.require_positive_int("instance_id", instance_id)
        path = api.PATH_INSTANCE.format(instance_id=instance_id)
        return api.unwrap_instance(await self._call("get_instance", "GET", path), instance_id)

    async def find_instance(self, instance_id: int) -> types.Instance | None:
        """The instance, or None only when a read and the list agree that it is gone (see the sync hook)."""
        try:
            return await self.get_instance(instance_id)
        except GpuMarketNotFoundError as exc:
            listed = await self.list_instances(ids=[instance_id])
            if listed:
                self.log.warning("Instance %s was reported missing (%s) but is listed; still there", instance_id, exc)
                return listed[0]
            return None

    async def list_instances(
        self, *, label: str | None = None, ids: Iterable[int] | None = None
    ) -> list[types.Instance]:
        """The async twin of :meth:`GpuMarketHook.list_instances`."""
        await self.asettings()  # the pacer is keyed by the connection's server and key
        listing = api.InstanceListing(label=label, ids=ids, v1=self._list_v1)
        while (request := listing.request()) is not None:
            path, params = request
            try:
                body = await self._call("list_instances", "GET", path, params=params)
            except GpuMarketError as exc:
                if self._fall_back_from_v1(listing, exc):
                    continue
                raise
            listing.take(body)
        return listing.instances

    async def label_instance(self, instance_id: int, label: str) -> dict[str, Any]:
        """The async twin of :meth:`GpuMarketHook.label_instance`."""
        api.require_positive_int("instance_id", instance_id)
        api.require_text("label", label)
        path = api.PATH_INSTANCE.format(instance_id=instance_id)
        return await self._call("label_instance", "PUT", path, {"label": label})

    async def change_bid(self, instance_id: int, price: float) -> dict[str, Any]:
        """The async twin of :meth:`GpuMarketHook.change_bid`."""
        body = api.build_change_bid_body(instance_id, price)
        return await self._call("change_bid", "PUT", api.PATH_CHANGE_BID.format(instance_id=instance_id), body)

    async def destroy_instance(self, instance_id: int) -> dict[str, Any]:
        api.require_positive_int("instance_id", instance_id)
        path = api.PATH_INSTANCE.format(instance_id=instance_id)
        try:
            return await self._call("destroy_instance", "DELETE", path)
        except GpuMarketNotFoundError:
            return {"success": True, "already_gone": True}

    async def request_instance_logs(
        self,
        instance_id: int,
        *,
        tail: int | str | None = None,
        filter: str | None = None,
        daemon_logs: bool | None = None,
        retry: bool = True,
    ) -> types.LogsRequestResult:
        """The async twin of :meth:`GpuMarketHook.request_instance_logs`."""
        path, body = self._logs_request(instance_id, tail, filter, daemon_logs)
        if not retry:  # one try, in its slot of the budget all the same
            await self.asettings()
            if (wait := self._pace("request_instance_logs")) > 0:
                await asyncio.sleep(wait)
            return await self._send("request_instance_logs", "PUT", path, body)
        return await self._call("request_instance_logs", "PUT", path, body)

    async def get_instance_logs(
        self,
        instance_id: int,
        *,
        tail: int | str | None = api.LOG_TAIL_DEFAULT,
        filter: str | None = None,
        daemon_logs: bool | None = None,
        retry: bool = True,
        key_digests: Iterable[str | None] = (),
    ) -> str:
        """The async twin of :meth:`GpuMarketHook.get_instance_logs`."""
        import httpx

        answer = await self.request_instance_logs(
            instance_id, tail=tail, filter=filter, daemon_logs=daemon_logs, retry=retry
        )
        url = api.log_result_url("get_instance_logs", answer)
        last = "nothing"
        async with httpx.AsyncClient(timeout=api.LOG_FETCH_TIMEOUT_SECONDS, follow_redirects=True) as storage:
            for _ in range(api.LOG_FETCH_TRIES):
                await asyncio.sleep(api.LOG_FETCH_INTERVAL_SECONDS)
                try:
                    async with storage.stream("GET", url) as response:
                        if response.status_code == 200:
                            buffer = _LogBuffer()
                            async for chunk in response.aiter_bytes():
                                buffer.add(chunk)
                            return self._redact_log(buffer.text(), key_digests)
                        last = f"HTTP {response.status_code}"
                except httpx.HTTPError as exc:
                    last = type(exc).__name__
        raise self._log_not_uploaded(instance_id, url, last)

    async def list_pending_price_increases(self) -> types.PendingPriceIncreases:
        return await self._call("list_pending_price_increases", "GET", api.PATH_PENDING_PRICE_INCREASES)
