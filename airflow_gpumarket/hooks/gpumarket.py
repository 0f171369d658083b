"""Hooks for the GPU marketplace API: ``GpuMarketHook`` (requests) and ``GpuMarketAsyncHook`` (httpx, for triggers).

The two differ only in transport: each is a driver of the flows in ``airflow_gpumarket.hooks.core``, where
requests are built, paced, answered, retried, listed and logs fetched, once for both.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, Unpack

import requests

from airflow_gpumarket import api, types
from airflow_gpumarket._compat import BaseHook, mask_secret
from airflow_gpumarket.exceptions import (
    GpuMarketError,
)
from airflow_gpumarket.hooks import transport
from airflow_gpumarket.hooks.connection import ConnectionSettings
from airflow_gpumarket.hooks.core import _GpuMarketHookBase
from airflow_gpumarket.hooks.flow import Book, Done, FetchLog, Flow, Probe, Request, Response, Sleep, T, resume

if TYPE_CHECKING:
    import httpx


class GpuMarketHook(_GpuMarketHookBase):
    """Talks to the GPU marketplace REST API, one method per endpoint.

    :param gpumarket_conn_id: connection of type ``gpumarket``: host = base URL, password = API key, extras =
        ``timeout``, ``max_retries``, ``retry_min_wait``, ``retry_max_wait``, ``ca_bundle``.

    Reads, stop, destroy and starting or cancelling a copy are retried on 429 (honouring Retry-After), 5xx and
    connection errors (a copy sent twice converges to the same files). Creating an instance is never re-sent
    blindly: see :meth:`create_instance`. Results are plain JSON dicts and lists, except the account's money
    (:meth:`charges`, :meth:`invoices`, :meth:`account`), read into frozen records of ``airflow_gpumarket.api``.
    """

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The connection form's hidden, relabelled and hinted fields, for Airflow 2.11's webserver.

        Airflow 3.2+ reads the same declaration from the provider info, ``get_provider_info.CONNECTION_FORM``.
        """
        from airflow_gpumarket.get_provider_info import CONNECTION_FORM

        return {key.replace("-", "_"): value for key, value in CONNECTION_FORM["ui-field-behaviour"].items()}

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """The connection form's extra fields for Airflow 2.11's webserver.

        Built from the provider info's ``conn-fields``. Flask AppBuilder, which Airflow 3 does not install, is imported
        here only. Both methods are defined on this class itself: Airflow 2.11 does not look for them on a base class.
        """
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
        return transport.requests_session(self.settings)

    # --- the driver of the flows (``hooks.core``) ------------------------------------------------------------
    def run_flow(self, flow: Flow[T]) -> T:
        """Run ``flow`` to its end, blocking: send its requests, sleep its sleeps, fetch its logs."""
        reply: Any = None
        while not isinstance(effect := resume(flow, reply), Done):
            if isinstance(effect, Sleep):
                time.sleep(effect.seconds)
                reply = None
            elif isinstance(effect, Book):
                reply = self._pace(effect.operation)
            elif isinstance(effect, FetchLog):
                reply = transport.fetch_log(self.storage_session, effect.url)
            elif isinstance(effect, Probe):
                from airflow_gpumarket import service_probe

                reply = service_probe.probe(effect)
            else:
                reply = transport.send(self.session, self.settings, effect)
                answer = f"HTTP {reply.status_code}" if isinstance(reply, Response) else reply
                self.log.debug("%s %s -> %s", effect.method, effect.path, answer)
        return effect.value

    def _send(
        self, operation: str, method: str, path: str, body: Any = None, params: Mapping[str, str] | None = None
    ) -> Any:
        """One try, no pacing, no retry (see ``_exchange_flow``)."""
        return self.run_flow(self._exchange_flow(Request(operation, method, path, body, params)))

    def _call(
        self, operation: str, method: str, path: str, body: Any = None, *, params: Mapping[str, str] | None = None
    ) -> Any:
        """A paced call retried after 429, 5xx and transport failures, for idempotent calls (see ``_call_flow``)."""
        return self.run_flow(self._call_flow(operation, method, path, body, params=params))

    def _call_unless_processed(self, operation: str, method: str, path: str, body: Any) -> Any:
        """A call that must not be repeated once the server may have acted on it.

        For creating an endpoint or regenerating backup codes: retried only after failures that surely did nothing.
        """
        return self.run_flow(self._call_flow(operation, method, path, body, retryable=api.create_surely_not_processed))

    # --- offers and instances ---------------------------------------------------------------------------
    def search_offers(
        self,
        filters: Mapping[str, Any] | None = None,
        *,
        offer_type: str = "ondemand",
        limit: int | None = None,
        order: list | None = None,
        extra_filter_fields: Iterable[str] = (),
    ) -> list[types.Offer]:
        """Search offers.

        ``filters``: ``{"gpu_name": {"eq": "RTX 4090"}, "num_gpus": {"gte": 1}}`` (``in`` takes a list;
        :class:`airflow_gpumarket.api.OfferQuery` builds them), each on a field the service filters on
        (``api.OFFER_FILTER_FIELDS``) or named in ``extra_filter_fields``; ``order``: ``[["dph_total", "asc"]]``;
        ``offer_type``: ondemand, on-demand or bid.
        """
        body = api.build_search_body(
            filters, offer_type=offer_type, limit=limit, order=order, extra_fields=extra_filter_fields
        )
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
        return self.run_flow(self.create_instance_flow(offer_id, label, fields))

    def list_instances(self, *, label: str | None = None, ids: Iterable[int] | None = None) -> list[types.Instance]:
        """Every instance of the account, following the pages of ``GET /api/v1/instances/`` to the end.

        Pages are spaced at the live service's list rate; ``label`` and ``ids`` narrow the list down on the server.

        On a server without the v1 list (404/405: one that follows the spec only) it falls back to
        ``GET /api/v0/instances/`` and remembers that for the hook's life.
        """
        return self.run_flow(self.list_instances_flow(label, ids))

    def get_instance(self, instance_id: int) -> types.Instance:
        """The instance object, unwrapped from ``instances``.

        Raises GpuMarketNotFoundError when the service says it does not exist (404, or the live service's
        ``{"instances": null}``); see :meth:`find_instance`.
        """
        return self.run_flow(self.get_instance_flow(instance_id))

    def find_instance(self, instance_id: int) -> types.Instance | None:
        """The instance, or None only when it is surely gone: a read said "not found" and the list agrees.

        A wait in job mode reads "gone" as success, so one answer is not enough to believe it.
        """
        return self.run_flow(self.find_instance_flow(instance_id))

    def label_instance(self, instance_id: int, label: str) -> dict[str, Any]:
        """Change an instance's label.

        Sends ``PUT /api/v0/instances/{id}/ {"label": ...}``, as the live service and its CLI do; not in the spec.
        """
        return self.run_flow(self.label_instance_flow(instance_id, label))

    def stop_instance(self, instance_id: int) -> dict[str, Any]:
        """Stop: compute billing halts, disk charges continue."""
        api.require_positive_int("instance_id", instance_id)
        path = api.PATH_INSTANCE.format(instance_id=instance_id)
        return self._call("stop_instance", "PUT", path, {"state": "stopped"})

    def change_bid(self, instance_id: int, price: float) -> dict[str, Any]:
        """Change the bid ($/h) of an interruptible instance.

        The service answers 400 for an on-demand one ("Can't change price of on-demand contract."), 404 for an instance
        that does not exist.
        """
        return self.run_flow(self.change_bid_flow(instance_id, price))

    def destroy_instance(self, instance_id: int) -> dict[str, Any]:
        """Destroy an instance: all billing stops.

        Idempotent: an instance that is already gone counts as success (the result then carries ``already_gone: True``).
        """
        return self.run_flow(self.destroy_instance_flow(instance_id))

    def request_instance_logs(
        self, instance_id: int, **options: Unpack[types.LogRequestOptions]
    ) -> types.LogsRequestResult:
        """Ask the service to upload the instance's container log; returns ``result_url``.

        With ``daemon_logs``, the host daemon's log instead. Sends ``PUT /api/v0/instances/request_logs/{id}/`` (live
        service; not in the spec); the log appears at ``result_url`` shortly after. The options are
        ``types.LogRequestOptions``'.
        """
        return self.run_flow(self.request_instance_logs_flow(instance_id, **options))

    def get_instance_logs(self, instance_id: int, **options: Unpack[types.LogReadOptions]) -> str:
        """The instance's log text: requested, then fetched from ``result_url`` without the API key.

        See :meth:`request_instance_logs`. It waits for the upload as the official client does (``LOG_FETCH_TRIES``
        tries ``LOG_FETCH_INTERVAL_SECONDS`` apart). The account key, instance keys this process created, keys whose
        sha256 is in ``key_digests`` and ``CONTAINER_API_KEY=`` values are masked. At most ``LOG_MAX_BYTES`` (the end)
        is read. The options are ``types.LogReadOptions``'.
        """
        return self.run_flow(self.get_instance_logs_flow(instance_id, **options))

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
        """Create a serverless endpoint from the spec's endpoint fields (``api.ENDPOINT_FIELDS``).

        ``result`` is the new endpoint's id. Not retried after it may have been processed (5xx, timeouts): creating is
        not idempotent.
        """
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
        """Regenerate the ten two-factor backup codes.

        The codes are masked in logs; never push them to XCom. Not retried once it may have been processed: the old
        codes stop working.
        """
        body = api.build_regen_backup_codes_body(
            tfa_method=tfa_method, code=code, secret=secret, tfa_method_id=tfa_method_id, backup_code=backup_code
        )
        result = self._call_unless_processed("regenerate_backup_codes", "PUT", api.PATH_REGEN_BACKUP_CODES, body)
        for backup in api.expect_list("regenerate_backup_codes", result, "backup_codes"):
            mask_secret(backup)
        return result

    def list_pending_price_increases(self) -> types.PendingPriceIncreases:
        """The whole response: ``pending_price_increases``, ``count`` and ``truncated`` (the list was cut)."""
        return self.run_flow(self.list_pending_price_increases_flow())

    def list_api_keys(self) -> list[dict[str, Any]]:
        result = self._call("list_api_keys", "GET", api.PATH_API_KEYS)
        return api.expect_list("list_api_keys", result, "apikeys")

    def list_cloud_integrations(self) -> list[dict[str, Any]]:
        result = self._call("list_cloud_integrations", "GET", api.PATH_CLOUD_INTEGRATIONS)
        return api.expect_list("list_cloud_integrations", result, None)

    def cloud_integration(self, name_or_id: str | int) -> types.CloudIntegration:
        """The cloud integration (``id``, ``cloud_type``, ``name``) a name or id picks, for :meth:`start_cloud_copy`.

        An int or a string of digits matches the ``id``, anything else the exact ``name``.

        :param name_or_id: the integration's name or id, as the console shows them.
        :raises GpuMarketValidationError: ``cloud_integration`` when none matches (the message lists those there are)
            or several share the name (pass the id).
        """
        api.require_integration_ref(name_or_id)
        integrations = self.list_cloud_integrations()
        return api.resolve_cloud_integration(integrations, name_or_id, secrets=(self.settings.api_key,))

    # --- the account's money (the live service's; not in the spec) --------------------------------------------
    def charges(self, start: float, end: float, *, types: Sequence[str] | None = None) -> list[api.Charge]:
        """Every charge of the days from ``start`` to ``end``, each with its breakdown (``items``).

        Reads every page of ``GET /api/v0/charges/`` (100 a page), sending each page's ``next_token`` back unchanged
        with the same filters, as the official CLI does. Pages are paced and retried as reads are.

        :param start: epoch seconds; the window includes it.
        :param end: epoch seconds, not before ``start``; the window includes it.
        :param types: charge types (``api.CHARGE_TYPES``: instance, volume, serverless); None for all.
        :raises GpuMarketNotFoundError: the service has no charges endpoint (one that follows the spec only).
        :raises GpuMarketError: a record cannot be read (the message names the field), or the service repeats a
            ``next_token``.
        """
        return self.run_flow(self.charges_flow(start, end, types))

    def invoices(self, start: float, end: float, *, services: Sequence[str] | None = None) -> list[api.Invoice]:
        """Every invoice dated from ``start`` to ``end``, read through the pages of ``GET /api/v1/invoices/``.

        :param start: epoch seconds; the window includes it.
        :param end: epoch seconds, not before ``start``; the window includes it.
        :param services: invoice services (``api.INVOICE_SERVICES``); None for all.
        :raises GpuMarketNotFoundError: the service has no invoices endpoint (one that follows the spec only).
        """
        return self.run_flow(self.invoices_flow(start, end, services))

    def account(self) -> api.Account:
        """The account's credit, balance and identity, from ``GET /api/v0/users/current``.

        ``Account.available`` is the credit left, or the balance when the service sends no credit. The API key the
        service sends along is masked in logs and never returned.

        :raises GpuMarketNotFoundError: the service has no such endpoint (one that follows the spec only).
        """
        return self.run_flow(self.account_flow())

    # --- copies: asynchronous on the service; read progress with ``api.copy_progress(instance["status_msg"])`` ----
    def start_instance_copy(self, src_id: int, dst_id: int, src_path: str, dst_path: str) -> types.CopyResult:
        """Start copying ``src_path`` of instance ``src_id`` to ``dst_path`` of instance ``dst_id``.

        Sends ``PUT /api/v0/commands/copy_direct/`` (live service; not in the spec). The copy runs on after the call
        answers, from a stopped instance too; its progress shows only in the destination's ``status_msg``, about
        30 s late. Retried after 429, 5xx and connection errors: a copy sent twice converges to the same files.

        :param src_id: the instance copied from.
        :param dst_id: the instance copied to.
        :param src_path: absolute path on ``src_id`` (no ``..``).
        :param dst_path: absolute path on ``dst_id`` (no ``..``).
        :raises GpuMarketCopyRefusedError: the service answered ``success: false``; ``msg`` holds its reason.
        """
        return self.run_flow(self.start_instance_copy_flow(src_id, dst_id, src_path, dst_path))

    def cancel_instance_copy(self, dst_id: int) -> types.CopyResult:
        """Cancel every instance-to-instance copy into ``dst_id`` (``DELETE /api/v0/commands/copy_direct/``).

        :param dst_id: the destination instance of the copies to cancel.
        """
        return self.run_flow(self.cancel_instance_copy_flow(dst_id))

    def start_cloud_copy(
        self,
        instance_id: int,
        integration_id: int,
        *,
        src: str,
        dst: str,
        transfer: str,
        flags: Sequence[str] = (),
    ) -> types.CopyResult:
        """Start copying between instance ``instance_id`` and the cloud integration ``integration_id``.

        Sends ``POST /api/v0/commands/rclone/`` (live service; not in the spec). The copy runs on after the call
        answers; the instance's ``status_msg`` says ``api.CLOUD_COPY_FINISHED`` when it ended, about 30 s late.
        Retried after 429, 5xx and connection errors, as :meth:`start_instance_copy` is.

        :param instance_id: the instance copied from or to.
        :param integration_id: the cloud integration's id (:meth:`cloud_integration` finds it by name).
        :param src: with ``api.TRANSFER_TO_CLOUD`` an absolute path on the instance, else a path in the integration's
            storage.
        :param dst: the other side: a path in the integration's storage, or an absolute path on the instance.
        :param transfer: ``api.TRANSFER_TO_CLOUD`` or ``api.TRANSFER_FROM_CLOUD``.
        :param flags: extra rclone options, each a ``--`` string (``["--size-only"]``).
        :raises GpuMarketCopyRefusedError: the service answered ``success: false``; ``msg`` holds its reason.
        """
        return self.run_flow(
            self.start_cloud_copy_flow(instance_id, integration_id, src=src, dst=dst, transfer=transfer, flags=flags)
        )

    def cancel_cloud_copy(self, instance_id: int) -> types.CopyResult:
        """Cancel the cloud copies of instance ``instance_id`` (``DELETE /api/v0/commands/rclone/``).

        :param instance_id: the instance whose cloud copies to cancel (sent as ``dst_id``, as the CLI does).
        """
        return self.run_flow(self.cancel_cloud_copy_flow(instance_id))

    # --- Airflow connection test ---------------------------------------------------------------------
    def test_connection(self) -> tuple[bool, str]:
        """Make one cheap authenticated call, not retried, and report it in a sentence.

        The call reads the first page of one instance. Works against the live service (v1 list) and a spec-only server
        (v0 list).
        """
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
        return transport.httpx_client(self.settings)

    async def aclose(self) -> None:
        if "client" in self.__dict__:
            await self.client.aclose()
            del self.__dict__["client"]

    async def run_flow(self, flow: Flow[T]) -> T:
        """Run ``flow`` to its end without blocking the triggerer's loop (the sync hook's driver, awaited)."""
        await self.asettings()  # flows read the settings (the pacer is keyed by the server and key)
        reply: Any = None
        while not isinstance(effect := resume(flow, reply), Done):
            if isinstance(effect, Sleep):
                await asyncio.sleep(effect.seconds)
                reply = None
            elif isinstance(effect, Book):  # the slot file's lock may be held by another process: off the loop
                reply = await asyncio.to_thread(self._pace, effect.operation) if self.paces(effect.operation) else 0.0
            elif isinstance(effect, FetchLog):
                reply = await transport.afetch_log(effect.url)
            elif isinstance(effect, Probe):
                from airflow_gpumarket import service_probe

                reply = await service_probe.aprobe(effect)
            else:
                reply = await transport.asend(self.client, effect)
        return effect.value

    async def _call(
        self, operation: str, method: str, path: str, body: Any = None, *, params: Mapping[str, str] | None = None
    ) -> Any:
        return await self.run_flow(self._call_flow(operation, method, path, body, params=params))

    # The same calls as the sync hook's, through the same flows.
    async def get_instance(self, instance_id: int) -> types.Instance:
        return await self.run_flow(self.get_instance_flow(instance_id))

    async def search_offers(
        self,
        filters: Mapping[str, Any] | None = None,
        *,
        offer_type: str = "ondemand",
        limit: int | None = None,
        extra_filter_fields: Iterable[str] = (),
    ) -> list[types.Offer]:
        """As the sync hook's ``search_offers``, cheapest first."""
        body = api.build_search_body(
            filters, offer_type=offer_type, limit=limit, order=[["dph_total", "asc"]], extra_fields=extra_filter_fields
        )
        result = await self._call("search_offers", "POST", api.PATH_SEARCH_OFFERS, body)
        return api.expect_list("search_offers", result, "offers")

    async def find_instance(self, instance_id: int) -> types.Instance | None:
        return await self.run_flow(self.find_instance_flow(instance_id))

    async def list_instances(
        self, *, label: str | None = None, ids: Iterable[int] | None = None
    ) -> list[types.Instance]:
        return await self.run_flow(self.list_instances_flow(label, ids))

    async def label_instance(self, instance_id: int, label: str) -> dict[str, Any]:
        return await self.run_flow(self.label_instance_flow(instance_id, label))

    async def change_bid(self, instance_id: int, price: float) -> dict[str, Any]:
        return await self.run_flow(self.change_bid_flow(instance_id, price))

    async def destroy_instance(self, instance_id: int) -> dict[str, Any]:
        return await self.run_flow(self.destroy_instance_flow(instance_id))

    async def request_instance_logs(
        self, instance_id: int, **options: Unpack[types.LogRequestOptions]
    ) -> types.LogsRequestResult:
        return await self.run_flow(self.request_instance_logs_flow(instance_id, **options))

    async def get_instance_logs(self, instance_id: int, **options: Unpack[types.LogReadOptions]) -> str:
        return await self.run_flow(self.get_instance_logs_flow(instance_id, **options))

    async def list_pending_price_increases(self) -> types.PendingPriceIncreases:
        return await self.run_flow(self.list_pending_price_increases_flow())
