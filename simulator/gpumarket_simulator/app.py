"""The service's REST routes under /api/v0, and the assembly of the whole ASGI application.

Handlers are plain ``Request -> JSONResponse`` functions (no pydantic, no dependency injection): the
simulator must serve well over a thousand requests a second on a small machine.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from gpumarket_simulator import charges, instance_rules, listing, logs, rules
from gpumarket_simulator.admin import AdminRoutes
from gpumarket_simulator.copy_routes import CopyRoutes
from gpumarket_simulator.errors import ApiError
from gpumarket_simulator.instances import bid_loses
from gpumarket_simulator.market import Market
from gpumarket_simulator.paths import (
    PATH_API_KEYS,
    PATH_CHANGE_BID,
    PATH_CHARGES,
    PATH_CLOUD_INTEGRATIONS,
    PATH_COPY_DIRECT,
    PATH_CREATE_INSTANCE,
    PATH_CURRENT_USER,
    PATH_DEPLOYMENTS,
    PATH_ENDPOINTS,
    PATH_GPU_NAMES,
    PATH_INSTANCE,
    PATH_INSTANCE_FILTERS,
    PATH_INSTANCES,
    PATH_INSTANCES_V1,
    PATH_INVOICES,
    PATH_PENDING_PRICE_INCREASES,
    PATH_RCLONE,
    PATH_REGEN_BACKUP_CODES,
    PATH_REQUEST_LOGS,
    PATH_SEARCH_OFFERS,
    PATH_VOLUMES,
)
from gpumarket_simulator.wire import AUTH_SCOPE_KEY, WireLayer

log = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[Any]]
MISSING_KEY = "Send the API key as 'Authorization: Bearer <key>'"
Endpoint = Callable[[Request], Awaitable[Response]]


def build_app(market: Market) -> WireLayer:
    # Exact paths only: a missing trailing slash is a client bug the simulator should surface, not redirect.
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False)
    app.add_exception_handler(StarletteHTTPException, _routing_error)  # type: ignore[arg-type]
    for path, methods, endpoint in ApiRoutes(market).routes() + AdminRoutes(market).routes():
        app.add_route(path, endpoint, methods=methods, include_in_schema=False)
    return WireLayer(app, market)


async def _routing_error(request: Request, exc: StarletteHTTPException) -> Response:
    if exc.status_code == 404:
        msg = f"No such path: {request.url.path} (paths are exact; mind the trailing slash)"
        return JSONResponse({"error": "not_found", "msg": msg}, status_code=404)
    if exc.status_code == 405:
        msg = f"{request.method} is not allowed on {request.url.path}"
        return JSONResponse({"error": "method_not_allowed", "msg": msg}, status_code=405, headers=exc.headers)
    return JSONResponse({"error": "http_error", "msg": str(exc.detail)}, status_code=exc.status_code)


def _path_int(request: Request, name: str, error: str, what: str) -> int:
    raw = request.path_params[name]
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(404, error, f"{what} {raw!r} does not exist (ids are integers)") from None
    if value <= 0:
        raise ApiError(404, error, f"{what} {raw!r} does not exist")
    return value


class ApiRoutes:
    def __init__(self, market: Market) -> None:
        self.market = market

    @property
    def live(self) -> bool:
        return self.market.profile == "live"

    def routes(self) -> list[tuple[str, list[str], Endpoint]]:
        w = self._endpoint
        copies = CopyRoutes(self.market)
        live_only = [
            (PATH_INSTANCES_V1, ["GET"], w(self.list_instances_v1)),
            (PATH_CURRENT_USER, ["GET"], w(self.current_user)),
            (PATH_CHARGES, ["GET"], w(self.list_charges)),
            (PATH_INVOICES, ["GET"], w(self.list_invoices)),
            (PATH_GPU_NAMES, ["GET"], w(self.gpu_names, public=True)),
            (PATH_INSTANCE_FILTERS, ["GET"], w(self.instance_filters)),
        ]
        return (live_only if self.live else []) + [
            (PATH_SEARCH_OFFERS, ["POST"], w(self.search_offers)),
            (PATH_CREATE_INSTANCE, ["PUT", "POST"], w(self.create_instance)),
            (PATH_INSTANCES, ["GET"], w(self.list_instances)),
            (PATH_PENDING_PRICE_INCREASES, ["GET"], w(self.list_pending_price_increases)),
            (PATH_INSTANCE, ["GET"], w(self.get_instance)),
            (PATH_INSTANCE, ["PUT"], w(self.change_state, instance_key_ok=True)),
            (PATH_INSTANCE, ["DELETE"], w(self.destroy_instance, instance_key_ok=True)),
            (PATH_REQUEST_LOGS, ["PUT"], w(self.request_logs)),
            (PATH_CHANGE_BID, ["PUT"], w(self.change_bid)),
            (PATH_VOLUMES, ["POST"], w(self.create_volume_listings)),
            (PATH_ENDPOINTS, ["POST"], w(self.create_endpoint)),
            (PATH_REGEN_BACKUP_CODES, ["PUT"], w(self.regenerate_backup_codes)),
            (PATH_DEPLOYMENTS, ["DELETE"], w(self.delete_deployments)),
            (PATH_API_KEYS, ["GET"], w(self.list_api_keys)),
            (PATH_CLOUD_INTEGRATIONS, ["GET"], w(self.list_cloud_integrations)),
            (PATH_COPY_DIRECT, ["PUT"], w(copies.copy_direct)),
            (PATH_COPY_DIRECT, ["DELETE"], w(copies.cancel_copy_direct)),
            (PATH_RCLONE, ["POST"], w(copies.cloud_copy)),
            (PATH_RCLONE, ["DELETE"], w(copies.cancel_cloud_copy)),
        ]

    def _endpoint(self, handler: Handler, *, instance_key_ok: bool = False, public: bool = False) -> Endpoint:
        market = self.market
        live = self.live

        async def endpoint(request: Request) -> Response:
            try:
                kind, own_instance, _ = request.scope[AUTH_SCOPE_KEY]
                if public:
                    return JSONResponse(await handler(request))
                if kind == "none":
                    raise ApiError(401, "auth_error" if live else "unauthorized", MISSING_KEY)
                if kind == "invalid":
                    if live:  # as the live service has been seen answering a wrong or revoked key
                        raise ApiError(404, "auth_error", "Invalid user key")
                    raise ApiError(403, "invalid_api_key", "The API key is not valid")
                if kind == "instance" and not (
                    instance_key_ok
                    and _path_int(request, "instance_id", "no_such_instance", "Instance") == own_instance
                ):
                    raise ApiError(
                        403,
                        "forbidden",
                        "An instance API key may only start, stop or destroy its own instance",
                    )
                return JSONResponse(await handler(request))
            except ApiError as exc:
                return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers or None)
            except ClientDisconnect:
                # The client gave up mid-request (a timeout, a killed task): ordinary, and nobody to answer.
                log.info("gpumarket-sim: client left during %s %s", request.method, request.url.path)
                return Response(status_code=499)
            except Exception:
                # Only a bug in the simulator gets here; bad input is always answered with a 4xx above.
                log.exception("gpumarket-sim: unexpected error on %s %s", request.method, request.url.path)
                market.note_internal_error()
                return JSONResponse(
                    {"error": "internal_error", "msg": "The simulator failed; see its log"}, status_code=500
                )

        return endpoint

    # --- offers and instances ----------------------------------------------------------------------------
    async def search_offers(self, request: Request) -> Any:
        query = rules.validate_search(rules.parse_json(await request.body(), required=False), lenient=self.live)
        with self.market.transaction() as (world, _):
            return {"offers": world.search(query)}

    async def create_instance(self, request: Request) -> Any:
        offer_id = _path_int(request, "offer_id", "no_such_ask", "Offer")
        fields = instance_rules.validate_create(rules.parse_json(await request.body()))
        market = self.market
        with market.transaction() as (world, now):
            try:
                inst = world.create_instance(
                    offer_id, fields, now, new_id=market.next_instance_id, api_key=market.new_instance_key()
                )
            except ApiError as exc:
                if self.live and exc.error in ("offer_unavailable", "no_such_ask"):
                    raise _live_offer_gone(offer_id, exc, fields.get("cancel_unavail", False)) from None
                raise
            if bid_loses(inst):
                return {
                    "success": False,
                    "new_contract": inst.id,
                    "instance_api_key": inst.api_key,
                    "msg": f"Your bid of ${inst.config['price']}/h is below the machine's minimum bid of "
                    f"${inst.offer.min_bid}/h: the instance was created stopped.",
                }
            return {"success": True, "new_contract": inst.id, "instance_api_key": inst.api_key}

    async def list_instances(self, request: Request) -> Any:
        if self.live:
            raise ApiError(
                410,
                "deprecated_endpoint",
                f"{PATH_INSTANCES} is deprecated. Use {PATH_INSTANCES_V1} instead.",
                extra={"success": False},
            )
        with self.market.transaction() as (world, _):
            instances = [i.api_view() for i in sorted(world.live.values(), key=lambda i: i.id)]
        return {"instances_found": len(instances), "instances": instances}

    async def list_instances_v1(self, request: Request) -> Any:
        with self.market.transaction() as (world, _):
            rows = [i.api_view() for i in world.live.values()]
        return listing.list_page(rows, request.query_params)

    async def get_instance(self, request: Request) -> Any:
        instance_id = _path_int(request, "instance_id", "no_such_instance", "Instance")
        with self.market.transaction() as (world, _):
            inst = world.live.get(instance_id)
            if inst is None and self.live:  # the live service answers an unknown or destroyed id this way
                return {"instances": None}
            return {"instances": world.live_instance(instance_id).api_view()}

    async def change_state(self, request: Request) -> Any:
        instance_id = _path_int(request, "instance_id", "no_such_instance", "Instance")
        body = rules.parse_json(await request.body())
        if self.live:
            state, label = instance_rules.validate_instance_change(body)
        else:
            state, label = instance_rules.validate_state_change(body), None
        with self.market.transaction() as (world, now):
            inst = world.live_instance(instance_id)
            if state is not None:  # first: a start refused for want of credit changes nothing
                world.set_state(inst, state, now)
            if label is not None:
                inst.config["label"] = label
        return {"success": True}

    async def destroy_instance(self, request: Request) -> Any:
        instance_id = _path_int(request, "instance_id", "no_such_instance", "Instance")
        with self.market.transaction() as (world, now):
            world.destroy(world.live_instance(instance_id), now)
        return {"success": True}

    async def request_logs(self, request: Request) -> Any:
        """Snapshot the container's (or the host daemon's) log and "upload" it; the live service's answer shape."""
        instance_id = _path_int(request, "instance_id", "invalid_id", "Instance")
        tail, log_filter, daemon = instance_rules.validate_logs_request(
            rules.parse_json(await request.body(), required=False)
        )
        market = self.market
        with market.transaction() as (world, now):
            inst = world.live.get(instance_id)
            if inst is None:
                raise ApiError(404, "invalid_id", f"Instance {instance_id} does not exist or was destroyed")
            if daemon:
                text = logs.daemon_log(inst, now)
            else:
                ran = market.runner.result(instance_id)
                text = logs.boot_log(inst) if ran is None else ran["output"]
            token = market.log_uploads.put(logs.select(text, tail, log_filter), now)
        return {
            "success": True,
            "result_url": f"{str(request.base_url).rstrip('/')}{logs.UPLOAD_PREFIX}{token}",
            "msg": "The log will be at result_url shortly.",
        }

    async def change_bid(self, request: Request) -> Any:
        """A new bid for an interruptible instance: the live service's errors for an unknown or on-demand one."""
        instance_id = _path_int(request, "instance_id", "no_such_instance", "Instance")
        price = instance_rules.validate_change_bid(rules.parse_json(await request.body()))
        with self.market.transaction() as (world, now):
            inst = world.live.get(instance_id)
            if inst is None:
                raise ApiError(404, "no_such_instance", f"Instance {instance_id} does not exist or was destroyed")
            if inst.config.get("price") is None:
                raise ApiError(400, "invalid_args", "Can't change price of on-demand contract.")
            world.change_bid(inst, price, now)
        return {"success": True}

    # --- host, serverless, account --------------------------------------------------------------------------
    async def create_volume_listings(self, request: Request) -> Any:
        body = rules.parse_json(await request.body())
        machine_ids, hidden = rules.validate_volume_listing(body)
        with self.market.transaction() as (world, _):
            return world.volume_listings.create(machine_ids, hidden, body)

    async def create_endpoint(self, request: Request) -> Any:
        fields = rules.validate_endpoint(rules.parse_json(await request.body()))
        with self.market.transaction() as (world, now):
            return {"success": True, "result": world.serverless.create_endpoint(fields, now)}

    async def delete_deployments(self, request: Request) -> Any:
        name, tag = rules.validate_delete_deployments(rules.parse_json(await request.body()))
        with self.market.transaction() as (world, now):
            return {"success": True, "count": world.serverless.delete_deployments(name, tag, now)}

    async def regenerate_backup_codes(self, request: Request) -> Any:
        fields = rules.validate_tfa(rules.parse_json(await request.body()))
        with self.market.transaction() as (world, now):
            return world.two_factor.regen_backup_codes(fields, now)

    async def list_pending_price_increases(self, request: Request) -> Any:
        with self.market.transaction() as (world, _):
            return world.price_increases.listing(world.list_limit)

    async def list_api_keys(self, request: Request) -> Any:
        with self.market.transaction() as (world, _):
            return {"apikeys": [{**k, "key": None} for k in world.api_keys]}

    async def list_cloud_integrations(self, request: Request) -> Any:
        with self.market.transaction() as (world, _):
            return [dict(c) for c in world.cloud_integrations]

    # --- live profile only: what the official CLI calls beyond the spec ------------------------------------
    async def current_user(self, request: Request) -> Any:
        """The account, its prepaid credit left as both ``credit`` and ``balance``.

        ``api_key`` is the caller's own key: the live service sends it (the official CLI removes it before printing).
        """
        _, _, key = request.scope[AUTH_SCOPE_KEY]
        with self.market.transaction() as (world, _):
            credit = world.account.credit
            return {
                "id": world.user_id,
                "username": "gpumarket-sim",
                "email": "sim@gpumarket.test",
                "fullname": "Simulated account",
                "api_key": key,
                "balance": credit,
                "credit": credit,
                "can_pay": credit > 0,
                "has_billing": True,
                "billing_creditonly": True,
                "ssh_key": "",
                "created_at": world.start_time,
            }

    async def list_charges(self, request: Request) -> Any:
        query = charges.parse_query(request.query_params, charges.CHARGE_COLUMNS, "charges")
        with self.market.transaction() as (world, now):
            rows = charges.charge_rows(world, now)
        return charges.page(rows, query)

    async def list_invoices(self, request: Request) -> Any:
        query = charges.parse_query(request.query_params, charges.INVOICE_COLUMNS, "invoices")
        with self.market.transaction() as (world, _):
            rows = charges.invoice_rows(world)
        return charges.page(rows, query)

    async def gpu_names(self, request: Request) -> Any:
        with self.market.transaction() as (world, _):
            return {"gpu_names": sorted({o.gpu_name for o in world.offers.values()})}

    async def instance_filters(self, request: Request) -> Any:
        return {"columns": sorted(listing.FILTERABLE_COLUMNS), "operators": list(listing.OPERATORS)}


def _live_offer_gone(offer_id: int, exc: ApiError, cancel_unavail: bool) -> ApiError:
    """The live service's answer when an offer cannot be rented.

    That is a 410 no_such_ask with cancel_unavail, else a 404 invalid_args whose msg carries the no_such_ask code.
    """
    if cancel_unavail:
        return ApiError(410, "no_such_ask", f"no_such_ask: offer {offer_id} is not available ({exc.msg})")
    return ApiError(404, "invalid_args", f"error 404/3603: no_such_ask  Offer {offer_id} is not available: {exc.msg}")
