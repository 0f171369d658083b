"""The /_sim/ admin surface: read the whole state, drive the clock, inject faults, force outcomes.

No authentication (the wire layer refuses non-loopback clients). Every route is a thin shell over a
``Market`` method, the same one ``MarketSimulator`` calls from Python.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gpumarket_simulator import rules
from gpumarket_simulator.errors import ApiError, bad_request
from gpumarket_simulator.market import Market

Handler = Callable[[Request], Awaitable[Any]]
Endpoint = Callable[[Request], Awaitable[Response]]


def _path_id(request: Request, name: str) -> int:
    try:
        return int(request.path_params[name])
    except ValueError:
        raise ApiError(404, "not_found", f"{name} must be an integer") from None


async def _body(request: Request) -> dict[str, Any]:
    return rules.require_object(rules.parse_json(await request.body(), required=False))


def _number(body: dict[str, Any], name: str) -> float:
    value: Any = body.get(name)
    if not rules.is_number(value) or value < 0:
        raise bad_request(f"{name} must be a number >= 0")
    return float(value)


class AdminRoutes:
    def __init__(self, market: Market) -> None:
        self.market = market

    def routes(self) -> list[tuple[str, list[str], Endpoint]]:
        w = self._endpoint
        return [
            ("/_sim/state", ["GET"], w(self.state)),
            ("/_sim/clock", ["GET"], w(self.clock)),
            ("/_sim/advance", ["POST"], w(self.advance)),
            ("/_sim/speed", ["PUT"], w(self.speed)),
            ("/_sim/reset", ["POST"], w(self.reset)),
            ("/_sim/faults", ["GET"], w(self.get_faults)),
            ("/_sim/faults", ["PUT"], w(self.set_faults)),
            ("/_sim/faults", ["DELETE"], w(self.clear_faults)),
            ("/_sim/requests", ["GET"], w(self.requests)),
            ("/_sim/alive-instances", ["GET"], w(self.alive_instances)),
            ("/_sim/instances/{instance_id}/status", ["POST"], w(self.force_status)),
            ("/_sim/instances/{instance_id}/onstart", ["GET"], w(self.onstart)),
            ("/_sim/instances/{instance_id}/outbid", ["POST"], w(self.outbid)),
            ("/_sim/offers/{offer_id}/fate", ["POST"], w(self.offer_fate)),
            ("/_sim/offers/{offer_id}/gpu_check", ["POST"], w(self.offer_gpu_check)),
            ("/_sim/offers/{offer_id}/competing-bid", ["POST"], w(self.competing_bid)),
            ("/_sim/bid-drift", ["PUT"], w(self.bid_drift)),
            ("/_sim/market-swing", ["PUT"], w(self.market_swing)),
            ("/_sim/offers/{offer_id}/vanish", ["POST"], w(self.vanish_offer)),
            ("/_sim/machines/{machine_id}/online", ["POST"], w(self.machine_online)),
            ("/_sim/pending-price-increases", ["POST"], w(self.add_pending)),
            ("/_sim/list-limit", ["PUT"], w(self.list_limit)),
            ("/_sim/account", ["GET"], w(self.get_account)),
            ("/_sim/account", ["POST"], w(self.change_account)),
            ("/_sim/rate-limits", ["GET"], w(self.get_rate_limits)),
            ("/_sim/rate-limits", ["PUT"], w(self.set_rate_limits)),
            ("/_sim/copies", ["GET"], w(self.copies)),
            ("/_sim/copy-settings", ["GET"], w(self.get_copy_settings)),
            ("/_sim/copy-settings", ["PUT"], w(self.set_copy_settings)),
            ("/_sim/copy-faults", ["GET"], w(self.get_copy_faults)),
            ("/_sim/copy-faults", ["PUT"], w(self.set_copy_faults)),
            ("/_sim/copy-faults", ["DELETE"], w(self.clear_copy_faults)),
            ("/_sim/cloud-integrations", ["POST"], w(self.add_cloud_integration)),
            ("/_sim/buckets/{ident}", ["GET"], w(self.bucket_files)),
            ("/_sim/buckets/{ident}/files/{path:path}", ["GET"], w(self.read_bucket_file)),
            ("/_sim/buckets/{ident}/files/{path:path}", ["PUT"], w(self.put_bucket_file)),
            ("/_sim/disks/{ident}", ["GET"], w(self.disk_files)),
            ("/_sim/disks/{ident}/files/{path:path}", ["GET"], w(self.read_disk_file)),
            ("/_sim/disks/{ident}/files/{path:path}", ["PUT"], w(self.put_disk_file)),
        ]

    def _endpoint(self, handler: Handler) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            try:
                result = await handler(request)
                return result if isinstance(result, Response) else JSONResponse(result)
            except ApiError as exc:
                return JSONResponse(exc.body(), status_code=exc.status)
            except KeyError as exc:
                return JSONResponse({"error": "not_found", "msg": f"no such id: {exc}"}, status_code=404)
            except FileNotFoundError as exc:
                return JSONResponse({"error": "not_found", "msg": f"no such file: {exc}"}, status_code=404)
            except ValueError as exc:
                return JSONResponse({"error": "invalid_args", "msg": str(exc)}, status_code=400)

        return endpoint

    async def state(self, request: Request) -> Any:
        return self.market.state()

    async def clock(self, request: Request) -> Any:
        return {"now": self.market.now(), "speed": self.market.clock.speed}

    async def advance(self, request: Request) -> Any:
        return {"now": self.market.advance(_number(await _body(request), "seconds"))}

    async def speed(self, request: Request) -> Any:
        self.market.set_speed(_number(await _body(request), "speed"))
        return await self.clock(request)

    async def reset(self, request: Request) -> Any:
        seed = (await _body(request)).get("seed")
        if seed is not None and not rules.is_int(seed):
            raise bad_request("seed must be an integer")
        self.market.reset(seed)
        return {"now": self.market.now(), "seed": self.market.seed}

    async def get_faults(self, request: Request) -> Any:
        return {"rules": self.market.faults.view()}

    async def set_faults(self, request: Request) -> Any:
        body = rules.parse_json(await request.body())
        # Both {"rules": [...]} and a bare list are accepted.
        self.market.faults.set_rules(body.get("rules") if isinstance(body, dict) else body)
        return {"rules": self.market.faults.view()}

    async def clear_faults(self, request: Request) -> Any:
        self.market.faults.clear()
        return {"rules": []}

    async def requests(self, request: Request) -> Any:
        return {"requests": list(self.market.requests)}

    async def alive_instances(self, request: Request) -> Any:
        return {"instances": self.market.alive_instances()}

    async def force_status(self, request: Request) -> Any:
        body = await _body(request)
        if "status" not in body:
            raise bad_request("status is required (null, loading, running, stopped, exited, unknown, offline)")
        self.market.force_status(_path_id(request, "instance_id"), body["status"])
        return {"success": True}

    async def outbid(self, request: Request) -> Any:
        body = await _body(request)
        self.market.outbid(_path_id(request, "instance_id"), body.get("resume_after"))
        return {"success": True}

    async def onstart(self, request: Request) -> Any:
        result = self.market.onstart_result(_path_id(request, "instance_id"))
        if result is None:
            raise ApiError(404, "not_found", "no onstart script ran for this instance")
        return result

    async def offer_fate(self, request: Request) -> Any:
        fate: Any = (await _body(request)).get("fate")
        self.market.set_offer_fate(_path_id(request, "offer_id"), fate)
        return {"success": True}

    async def offer_gpu_check(self, request: Request) -> Any:
        check: Any = (await _body(request)).get("gpu_check")
        self.market.set_gpu_check(_path_id(request, "offer_id"), check)
        return {"success": True}

    async def competing_bid(self, request: Request) -> Any:
        body = await _body(request)
        if "price" not in body:
            raise bad_request("price is required: someone else's bid for this machine in $/h, or null for nobody")
        self.market.set_competing_bid(_path_id(request, "offer_id"), body["price"])
        return {"success": True}

    async def bid_drift(self, request: Request) -> Any:
        body = await _body(request)
        if "drift" not in body:
            raise bad_request('drift is required: {"interval": seconds, "volatility": number} or null')
        self.market.set_bid_drift(body["drift"])
        return {"drift": body["drift"]}

    async def market_swing(self, request: Request) -> Any:
        body = await _body(request)
        if "swing" not in body:
            raise bad_request('swing is required: {"preset": "calm" | "typical" | "tight", ...} or null')
        return {"swing": self.market.set_market_swing(body["swing"])}

    async def vanish_offer(self, request: Request) -> Any:
        self.market.vanish_offer(_path_id(request, "offer_id"))
        return {"success": True}

    async def machine_online(self, request: Request) -> Any:
        online = (await _body(request)).get("online")
        if not isinstance(online, bool):
            raise bad_request("online must be true or false")
        self.market.set_machine_online(_path_id(request, "machine_id"), online)
        return {"success": True}

    async def add_pending(self, request: Request) -> Any:
        body = await _body(request)
        added = self.market.add_pending_price_increases(body.get("n", 1), body.get("contract_id"))
        return {"added": added}

    async def list_limit(self, request: Request) -> Any:
        limit: Any = (await _body(request)).get("limit")
        self.market.set_list_limit(limit)
        return {"limit": self.market.world.list_limit}

    async def get_account(self, request: Request) -> Any:
        return self.market.account()

    async def change_account(self, request: Request) -> Any:
        body = await _body(request)
        given = [name for name in ("credit", "top_up", "charges_delay") if name in body]
        if len(given) != 1:
            raise bad_request(
                'send {"credit": dollars} to set the credit, {"top_up": dollars} to add to it, or '
                '{"charges_delay": seconds or null} to post a day\'s charges that long after it ends'
            )
        if given == ["charges_delay"]:
            return self.market.set_charges_delay(body["charges_delay"])
        if given == ["credit"]:
            return self.market.set_credit(body["credit"])
        return self.market.top_up(body["top_up"])

    async def get_rate_limits(self, request: Request) -> Any:
        limits = self.market.rate_limits
        return {"enabled": limits.enabled, "profile": self.market.profile, "refused": limits.refused()}

    async def set_rate_limits(self, request: Request) -> Any:
        enabled = (await _body(request)).get("enabled")
        if not isinstance(enabled, bool):
            raise ValueError('send {"enabled": true} or {"enabled": false}')
        self.market.rate_limits.enabled = enabled
        self.market.rate_limits.clear()
        return {"enabled": enabled, "profile": self.market.profile, "refused": {}}

    # --- storage: copies, buckets, disks --------------------------------------------------------------------
    async def copies(self, request: Request) -> Any:
        return {"copies": self.market.copies()}

    async def get_copy_settings(self, request: Request) -> Any:
        return self.market.copy_settings()

    async def set_copy_settings(self, request: Request) -> Any:
        return self.market.set_copy_settings(await _body(request))

    async def get_copy_faults(self, request: Request) -> Any:
        return {"rules": self.market.copy_faults()}

    async def set_copy_faults(self, request: Request) -> Any:
        body = rules.parse_json(await request.body())
        # Both {"rules": [...]} and a bare list are accepted, as for /_sim/faults.
        return {"rules": self.market.set_copy_faults(body.get("rules") if isinstance(body, dict) else body)}

    async def clear_copy_faults(self, request: Request) -> Any:
        return {"rules": self.market.set_copy_faults([])}

    async def add_cloud_integration(self, request: Request) -> Any:
        body = await _body(request)
        return self.market.add_cloud_integration(body.get("name"), body.get("cloud_type"))

    async def _files(self, request: Request, where: str) -> Any:
        ident = _path_id(request, "ident")
        return {"id": ident, "files": self.market.list_files(where, ident)}

    async def _read(self, request: Request, where: str) -> Any:
        data = self.market.read_file(where, _path_id(request, "ident"), request.path_params["path"])
        return Response(data, media_type="application/octet-stream")

    async def _put(self, request: Request, where: str) -> Any:
        data = await request.body()
        return self.market.put_file(where, _path_id(request, "ident"), request.path_params["path"], data)

    async def bucket_files(self, request: Request) -> Any:
        return await self._files(request, "bucket")

    async def read_bucket_file(self, request: Request) -> Any:
        return await self._read(request, "bucket")

    async def put_bucket_file(self, request: Request) -> Any:
        return await self._put(request, "bucket")

    async def disk_files(self, request: Request) -> Any:
        return await self._files(request, "disk")

    async def read_disk_file(self, request: Request) -> Any:
        return await self._read(request, "disk")

    async def put_disk_file(self, request: Request) -> Any:
        return await self._put(request, "disk")
