"""What the sync and async hooks share, written once: settings, pacing, retry decisions and API calls.

Every call of the API that both hooks make is written as a *flow* (``hooks.flow``). Building requests, pacing,
mapping answers, retrying, walking the instance list and fetching logs happen in the flow; ``GpuMarketHook``
(requests) and ``GpuMarketAsyncHook`` (httpx) differ only in their drivers.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from email.utils import parsedate_to_datetime
from functools import cached_property
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlsplit

import tenacity

from airflow_gpumarket import api, job_logs, metrics, pacing, types
from airflow_gpumarket._compat import BaseHook, mask_secret
from airflow_gpumarket.exceptions import (
    GpuMarketAmbiguousCreateError,
    GpuMarketCreateRefusedError,
    GpuMarketError,
    GpuMarketNotFoundError,
    GpuMarketRateLimitError,
)
from airflow_gpumarket.hooks.connection import ConnectionSettings, settings_from_connection
from airflow_gpumarket.hooks.flow import Book, FetchLog, Flow, Request, Sleep

R = TypeVar("R")


#: Upper bound on the tries of a patient call, so a clock that does not move cannot make it loop forever.
_PATIENT_MAX_TRIES = 200
#: Paced calls (``api.rate_budget``) are spaced this many times the budget's interval (10 % wider) ...
PACING_MARGIN = 1.1
#: ... plus this many seconds: a request that opens a connection (TCP, TLS) reaches the server later than the next
#: one on a warm connection, and two processes' slots would meet there.
PACING_SLACK_SECONDS = 0.1
#: Instance keys this process received from create calls, masked in every log text fetched here (bounded).
_INSTANCE_KEYS: deque[str] = deque(maxlen=1000)


def slot_seconds(operation: str, rate_limit_scale: float = 1.0) -> float:
    """Seconds between two calls of ``operation``'s budget on one key from this machine.

    See ``PACING_MARGIN``; the budgets are ``rate_limit_scale`` times the published ones.
    """
    budget = api.rate_budget(operation)
    if budget is None:
        raise ValueError(f"{operation} is paced by no budget")
    return PACING_MARGIN / (budget[1] * rate_limit_scale) + PACING_SLACK_SECONDS


#: The pacer of each (server, key, operation) this process uses: one each, whatever the number of hooks.
_PACERS: dict[tuple[str, str, str], pacing.SharedPacer] = {}


class _GpuMarketHookBase(BaseHook):
    """Everything the sync and async hooks share.

    That is the connection, pacing, retry decisions, and each call of the API as a flow (see the module's docstring). A
    hook adds only a driver that moves the bytes.
    """

    conn_name_attr = "gpumarket_conn_id"
    default_conn_name = "gpumarket_default"
    conn_type = "gpumarket"
    hook_name = "GPU Market"

    def __init__(self, gpumarket_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gpumarket_conn_id = gpumarket_conn_id
        #: Whether this server has the live service's paged v1 instance list; learnt from the first listing.
        self._list_v1 = True
        #: The service's clock minus this host's, in seconds, from the Date header of its latest answer (0 until an
        #: answer has one). Durations of the service's timestamps (an instance's ``start_date``) are counted
        #: against the service's time: the simulator's clock runs ahead, and a host's clock can be off.
        self.service_clock_offset = 0.0

    def _pace(self, operation: str) -> float:
        """Seconds to wait before the next ``operation`` request, and book its slot.

        0 for an operation that no budget paces (``api.rate_budget``). The live service keeps a bucket per operation,
        key and client address, without burst, and charges a penalty for each refusal. So every such call of every
        process of this machine on this key (pages of a walk, the shared pollers' rounds, reapers, a fleet of mapped
        tasks renting, reading or failing at once) takes its turn through one ``pacing.SharedPacer`` per budget, spaced
        a little wider than the budget: sent exactly at the rate, clock jitter alone would draw 429s. The connection's
        ``rate_limit_scale`` scales the budgets (0: none).
        """
        budget = api.rate_budget(operation)
        if budget is None or not self.paces(operation):
            return 0.0
        settings = self.settings
        key = (settings.base_url, settings.api_key, budget[0])
        pacer = _PACERS.get(key)
        if pacer is None:
            pacer = _PACERS[key] = pacing.SharedPacer(settings.base_url, settings.api_key, budget[0])
        return pacer.book(slot_seconds(operation, settings.rate_limit_scale))

    def paces(self, operation: str) -> bool:
        """Whether ``operation``'s requests take a slot of a budget (``_pace``), with this connection."""
        return api.rate_budget(operation) is not None and bool(self.settings.rate_limit_scale)

    def min_list_interval(self) -> float:
        """Seconds between two list calls that the connection's budget allows (0: it paces nothing).

        The published budget's until the connection has been read.
        """
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

    def _retry_kwargs(self, retry: Any, *, patient: bool = False) -> dict[str, Any]:
        """The one retry policy, as tenacity settings.

        ``patient`` calls (``api.PATIENT_OPERATIONS``) keep trying through 429s for
        ``api.retry.RATE_LIMIT_PATIENCE_SECONDS`` whatever ``max_retries`` says: many tasks starting or failing at once
        share one rate budget. Other failures still stop them after ``max_retries``.
        """
        max_attempts = self.settings.retry.max_retries + 1
        patience = api.retry.RATE_LIMIT_PATIENCE_SECONDS

        def stop(state: tenacity.RetryCallState) -> bool:
            exc = state.outcome.exception() if state.outcome else None
            if patient and isinstance(exc, GpuMarketRateLimitError) and api.is_retryable(exc):
                return (state.seconds_since_start or 0.0) >= patience or state.attempt_number >= _PATIENT_MAX_TRIES
            return state.attempt_number >= max_attempts

        def wait(state: tenacity.RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            return api.retry_wait_seconds(exc, state.attempt_number, self.settings.retry, random.random())

        said: list[str] = []  # the failure the last retry's line quoted whole

        def log_retry(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            seconds = state.next_action.sleep if state.next_action else 0
            if said and said[-1] == str(exc):
                self.log.info("Try %d failed the same way; retrying in %.1f s", state.attempt_number, seconds)
                return
            said.append(str(exc))
            self.log.warning("Try %d failed (%s); retrying in %.1f s", state.attempt_number, exc, seconds)

        return {
            "stop": stop,
            "wait": wait,
            "retry": retry,
            "before_sleep": log_retry,
            "reraise": True,
        }

    @cached_property
    def settings(self) -> ConnectionSettings:
        return self._settings_from(self.get_connection(self.gpumarket_conn_id))

    def _mask_instance_key(self, result: Mapping[str, Any]) -> None:
        key = result.get("instance_api_key")
        if isinstance(key, str) and key:
            mask_secret(key)
            _INSTANCE_KEYS.append(key)

    def _redact_log(self, text: str, key_digests: Iterable[str | None]) -> str:
        """Mask the account key, instance keys and ``CONTAINER_API_KEY=`` values in a log.

        Masked are the account key, every instance key this process created, the keys known by digest and every
        ``CONTAINER_API_KEY=`` value.
        """
        return job_logs.Redactor((self.settings.api_key, *_INSTANCE_KEYS), key_digests)(text)

    # --- flows: what each call sends, waits for and makes of the answers, written once ---------------------
    def _exchange_flow(self, request: Request) -> Flow[Any]:
        """One try: the request, its answer mapped to a result or a ``GpuMarketError``. No pacing, no retry."""
        response = yield request
        self._note_service_clock(response.headers.get("Date"))
        metrics.answered(request.operation, response.status_code)
        return api.raise_for_response(
            request.operation,
            response.status_code,
            api.decode_body(response.content),
            retry_after=response.headers.get("Retry-After"),
            rate_limit_reset=response.headers.get("X-RateLimit-Reset"),
            secrets=(self.settings.api_key,),
        )

    def service_now(self) -> float:
        """The service's time now: this host's plus the offset learnt from the Date header of its latest answer."""
        return time.time() + self.service_clock_offset

    def _note_service_clock(self, date: str | None) -> None:
        if not date:
            return
        with contextlib.suppress(TypeError, ValueError, IndexError):  # not an HTTP date: keep what was known
            self.service_clock_offset = parsedate_to_datetime(date).timestamp() - time.time()

    def _paced_flow(self, request: Request) -> Flow[Any]:
        """One try in a slot of the operation's budget (a retry sent outside it would draw the next call's 429)."""
        if (wait := (yield Book(request.operation))) > 0:
            yield Sleep(wait)
        return (yield from self._exchange_flow(request))

    def _call_flow(
        self,
        operation: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        retryable: Callable[[BaseException], bool] = api.is_retryable,
        before_retry: Callable[[], Flow[Any]] | None = None,
    ) -> Flow[Any]:
        """A paced call, retried after the failures ``retryable`` accepts.

        By default those are 429, 5xx and transport failures, for idempotent calls. ``before_retry`` runs before each
        re-send and may end the call with what it returns (not None). ``api.PATIENT_OPERATIONS`` keep trying through
        429s.
        """
        request = Request(operation, method, path, body, params)
        patient = operation in api.PATIENT_OPERATIONS
        waits: list[float] = []  # tenacity decides each wait; the flow sleeps it (see Sleep)
        retrying = tenacity.Retrying(
            sleep=waits.append, **self._retry_kwargs(tenacity.retry_if_exception(retryable), patient=patient)
        )
        for attempt in retrying:
            if waits:
                yield Sleep(waits.pop())
                if before_retry is not None and (found := (yield from before_retry())) is not None:
                    return found
            try:  # the answer is awaited outside tenacity's block: only the try's own error goes into it
                outcome: Any = yield from self._paced_flow(request)
            except GpuMarketError as exc:
                outcome = exc
            with attempt:
                if isinstance(outcome, GpuMarketError):
                    raise outcome
                return outcome
        raise AssertionError("unreachable: tenacity re-raises the last error")

    def list_instances_flow(self, label: str | None, ids: Iterable[int] | None) -> Flow[list[types.Instance]]:
        listing = api.InstanceListing(label=label, ids=ids, v1=self._list_v1)
        while (request := listing.request()) is not None:
            path, params = request
            try:
                body = yield from self._call_flow("list_instances", "GET", path, params=params)
            except GpuMarketError as exc:
                if self._fall_back_from_v1(listing, exc):
                    continue
                raise
            listing.take(body)
        return listing.instances

    def get_instance_flow(self, instance_id: int) -> Flow[types.Instance]:
        api.require_positive_int("instance_id", instance_id)
        path = api.PATH_INSTANCE.format(instance_id=instance_id)
        return api.unwrap_instance((yield from self._call_flow("get_instance", "GET", path)), instance_id)

    def find_instance_flow(self, instance_id: int) -> Flow[types.Instance | None]:
        try:
            return (yield from self.get_instance_flow(instance_id))
        except GpuMarketNotFoundError as exc:
            listed = yield from self.list_instances_flow(None, [instance_id])
            if listed:
                self.log.warning("Instance %s was reported missing (%s) but is listed; still there", instance_id, exc)
                return listed[0]
            return None

    def label_instance_flow(self, instance_id: int, label: str) -> Flow[dict[str, Any]]:
        api.require_positive_int("instance_id", instance_id)
        api.require_text("label", label)
        path = api.PATH_INSTANCE.format(instance_id=instance_id)
        return (yield from self._call_flow("label_instance", "PUT", path, {"label": label}))

    def create_instance_flow(
        self, offer_id: int, label: str | None, fields: Mapping[str, Any]
    ) -> Flow[types.CreateInstanceResult]:
        """Rent ``offer_id`` (see ``GpuMarketHook.create_instance``).

        Re-sent only after failures that surely made nothing, or when a look for ``label`` found no instance that an
        ambiguous failure may have made.
        """
        api.require_positive_int("offer_id", offer_id)
        body = api.build_create_instance_body(label=label, **fields)
        path = api.PATH_CREATE_INSTANCE.format(offer_id=offer_id)
        failed_at: list[float] = []  # monotonic time of the last ambiguous failure

        def retryable(exc: BaseException) -> bool:
            if not api.is_retryable(exc) or api.create_surely_not_processed(exc):
                return api.is_retryable(exc)
            if label is None:
                return False  # raised as GpuMarketAmbiguousCreateError below
            self.log.warning(
                "create_instance on offer %s failed ambiguously (%s); will look for label %r before sending it again",
                offer_id,
                exc,
                label,
            )
            failed_at[:] = [time.monotonic()]
            return True

        def before_retry() -> Flow[Any]:
            if not failed_at or label is None:
                return None
            found = yield from self._find_after_ambiguous_create_flow(label, failed_at[0])
            return None if found is None else {"success": True, "new_contract": found, "instance_api_key": None}

        try:
            result = yield from self._call_flow(
                "create_instance", "PUT", path, body, retryable=retryable, before_retry=before_retry
            )
        except GpuMarketCreateRefusedError as exc:
            return (yield from self._destroy_refused_create_flow(exc))
        except GpuMarketError as exc:
            if label is None and api.is_retryable(exc) and not api.create_surely_not_processed(exc):
                raise GpuMarketAmbiguousCreateError(
                    f"create_instance on offer {offer_id} failed ambiguously ({exc}); an instance may have been "
                    "created, so it was not re-sent. Check list_instances(), or pass a label so the hook can check.",
                    status_code=exc.status_code,
                    operation="create_instance",
                ) from exc
            raise
        self._mask_instance_key(result)
        if failed_at:  # sent again after an ambiguous failure: a late duplicate is possible
            result = {**result, "ambiguous": True}
        return result

    def _destroy_refused_create_flow(self, refused: GpuMarketCreateRefusedError) -> Flow[NoReturn]:
        """Destroy the stopped instance that a refused create made (it bills storage until then), then raise."""
        fields: dict[str, Any] = {"status_code": refused.status_code, "error": refused.error, "msg": refused.msg}
        try:
            yield from self.destroy_instance_flow(refused.new_contract)
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
            destroyed=True,
            operation="create_instance",
            **fields,
        ) from None

    def _find_after_ambiguous_create_flow(self, label: str, failed_at: float) -> Flow[int | None]:
        """The id of the instance an ambiguous create made, if any.

        Looked for at once, then (when not there) once more after the server had as long to finish the request as it had
        to answer it.
        """
        found = api.find_by_label((yield from self.list_instances_flow(label, None)), label)
        remaining = failed_at + self.settings.timeout - time.monotonic()
        if found is None and remaining > 0:
            self.log.warning("No instance labelled %r yet; giving the request %.1f s more to land", label, remaining)
            yield Sleep(remaining)
            found = api.find_by_label((yield from self.list_instances_flow(label, None)), label)
        if found is None:
            return None
        self.log.warning(
            "Found instance %s with label %r after the ambiguous failure: using it, not renting again",
            found["id"],
            label,
        )
        return int(found["id"])

    def renew_lease_flow(self, instance_id: int, watch: Any, now: float, log: Any) -> Flow[str | None]:
        """Keep the label's lease ``keepalive`` ahead while a task watches (a ``lifecycle.Watch``).

        Returns the label written, or None when no renewal was due or the write failed. A failure is logged to ``log``
        and costs nothing: the next observation tries again, well before the lease runs out. See ``lifecycle``.
        """
        renewed = watch.lease_renewal(now)
        if renewed is None:
            return None
        try:
            yield from self.label_instance_flow(instance_id, renewed)
        except GpuMarketError as exc:
            log.warning("Could not renew the lease of instance %s (%s); trying again", instance_id, exc)
            return None
        watch.label = renewed
        return renewed

    def change_bid_flow(self, instance_id: int, price: float) -> Flow[dict[str, Any]]:
        body = api.build_change_bid_body(instance_id, price)
        path = api.PATH_CHANGE_BID.format(instance_id=instance_id)
        return (yield from self._call_flow("change_bid", "PUT", path, body))

    def destroy_instance_flow(self, instance_id: int) -> Flow[dict[str, Any]]:
        api.require_positive_int("instance_id", instance_id)
        path = api.PATH_INSTANCE.format(instance_id=instance_id)
        try:
            return (yield from self._call_flow("destroy_instance", "DELETE", path))
        except GpuMarketNotFoundError:
            return {"success": True, "already_gone": True}

    def request_instance_logs_flow(
        self,
        instance_id: int,
        *,
        tail: int | str | None = None,
        filter: str | None = None,
        daemon_logs: bool | None = None,
        retry: bool = True,
    ) -> Flow[types.LogsRequestResult]:
        api.require_positive_int("instance_id", instance_id)
        body = api.build_request_logs_body(tail=tail, filter=filter, daemon_logs=daemon_logs)
        path = api.PATH_REQUEST_LOGS.format(instance_id=instance_id)
        if not retry:  # one try, in its slot of the budget all the same
            return (yield from self._paced_flow(Request("request_instance_logs", "PUT", path, body)))
        return (yield from self._call_flow("request_instance_logs", "PUT", path, body))

    def get_instance_logs_flow(
        self,
        instance_id: int,
        *,
        tail: int | str | None = api.LOG_TAIL_DEFAULT,
        filter: str | None = None,
        daemon_logs: bool | None = None,
        retry: bool = True,
        key_digests: Iterable[str | None] = (),
    ) -> Flow[str]:
        answer = yield from self.request_instance_logs_flow(
            instance_id, tail=tail, filter=filter, daemon_logs=daemon_logs, retry=retry
        )
        url = api.log_result_url("get_instance_logs", answer)
        last = "nothing"
        for _ in range(api.LOG_FETCH_TRIES):
            yield Sleep(api.LOG_FETCH_INTERVAL_SECONDS)  # the upload is never there at once
            fetched = yield FetchLog(url)
            if fetched.text is not None:
                return self._redact_log(fetched.text, key_digests)
            last = fetched.failure
        host = urlsplit(url).hostname  # the rest of the URL grants access to the log: not repeated in messages
        waited = api.LOG_FETCH_TRIES * api.LOG_FETCH_INTERVAL_SECONDS
        raise GpuMarketError(
            f"get_instance_logs: the log of instance {instance_id} was not at its result URL on {host} after "
            f"{api.LOG_FETCH_TRIES} tries over {waited:.0f} s (last answer: {last}); the service may be slow to "
            "upload it: ask again later",
            operation="get_instance_logs",
        )

    def list_pending_price_increases_flow(self) -> Flow[types.PendingPriceIncreases]:
        return (yield from self._call_flow("list_pending_price_increases", "GET", api.PATH_PENDING_PRICE_INCREASES))

    # --- copies: started from the worker; their progress is read from the instance (``api.copy_progress``) --------
    def start_instance_copy_flow(
        self, src_id: int, dst_id: int, src_path: str, dst_path: str
    ) -> Flow[types.CopyResult]:
        """Start a copy between two instances (see ``GpuMarketHook.start_instance_copy``).

        Retried as reads are: a copy is not idempotent on the wire, but one sent twice converges to the same files.
        """
        body = api.build_instance_copy_body(src_id, dst_id, src_path, dst_path)
        answer = yield from self._call_flow(
            "start_instance_copy", "PUT", api.PATH_COPY_DIRECT, body, retryable=api.is_retryable
        )
        return api.copy_answer("start_instance_copy", answer)

    def cancel_instance_copy_flow(self, dst_id: int) -> Flow[types.CopyResult]:
        body = api.build_cancel_copy_body(dst_id, "dst_id")
        answer = yield from self._call_flow("cancel_instance_copy", "DELETE", api.PATH_COPY_DIRECT, body)
        return api.copy_answer("cancel_instance_copy", answer)

    def start_cloud_copy_flow(
        self,
        instance_id: int,
        integration_id: int,
        *,
        src: str,
        dst: str,
        transfer: str,
        flags: Sequence[str] = (),
    ) -> Flow[types.CopyResult]:
        """Start a copy between an instance and a cloud integration (see ``GpuMarketHook.start_cloud_copy``).

        Retried as reads are, for the reason ``start_instance_copy_flow`` gives.
        """
        body = api.build_cloud_copy_body(instance_id, integration_id, src=src, dst=dst, transfer=transfer, flags=flags)
        answer = yield from self._call_flow(
            "start_cloud_copy", "POST", api.PATH_RCLONE, body, retryable=api.is_retryable
        )
        return api.copy_answer("start_cloud_copy", answer)

    def cancel_cloud_copy_flow(self, instance_id: int) -> Flow[types.CopyResult]:
        body = api.build_cancel_copy_body(instance_id, "instance_id")
        answer = yield from self._call_flow("cancel_cloud_copy", "DELETE", api.PATH_RCLONE, body)
        return api.copy_answer("cancel_cloud_copy", answer)

    # --- the account's money: charges, invoices, credit (the live service's; not in the spec) -------------------
    def charges_flow(self, start: float, end: float, types: Sequence[str] | None = None) -> Flow[list[api.Charge]]:
        """Every charge from ``start`` to ``end`` (see ``GpuMarketHook.charges``)."""
        query = api.build_charges_query(start, end, types=types)
        walk = api.BillingPages("charges", api.PATH_CHARGES, query, api.parse_charge)
        return (yield from self._billing_pages_flow(walk))

    def invoices_flow(self, start: float, end: float, services: Sequence[str] | None = None) -> Flow[list[api.Invoice]]:
        """Every invoice from ``start`` to ``end`` (see ``GpuMarketHook.invoices``)."""
        query = api.build_invoices_query(start, end, services=services)
        walk = api.BillingPages("invoices", api.PATH_INVOICES_V1, query, api.parse_invoice)
        return (yield from self._billing_pages_flow(walk))

    def _billing_pages_flow(self, walk: api.BillingPages[R]) -> Flow[list[R]]:
        """Each page of ``walk`` in turn, paced and retried as reads are; a server without the path says so."""
        while (request := walk.request()) is not None:
            path, params = request
            try:
                body = yield from self._call_flow(walk.operation, "GET", path, params=params)
            except GpuMarketError as exc:
                missing = api.missing_endpoint(walk.operation, path, exc) if walk.pages == 0 else None
                if missing is None:
                    raise
                raise missing from exc
            walk.take(body)
        return walk.results

    def account_flow(self) -> Flow[api.Account]:
        """The account's credit, balance and identity (see ``GpuMarketHook.account``); its key is masked, not kept."""
        try:
            body = yield from self._call_flow("account", "GET", api.PATH_CURRENT_USER)
        except GpuMarketError as exc:
            if (missing := api.missing_endpoint("account", api.PATH_CURRENT_USER, exc)) is None:
                raise
            raise missing from exc
        key = body.get("api_key") if isinstance(body, dict) else None
        if isinstance(key, str) and key:
            mask_secret(key)  # the blob's key may be another than the connection's
        return api.parse_account(body)
