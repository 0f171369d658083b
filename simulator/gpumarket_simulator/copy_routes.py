"""The service's copy endpoints: instance to instance (``copy_direct``) and instance to/from cloud (``rclone``).

Not in the spec; the official CLI's source shows the paths and bodies, in both profiles. A request is checked
and answered at once; the copy itself runs later on the simulated clock (see storage.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from gpumarket_simulator import rules
from gpumarket_simulator.errors import ApiError, bad_request
from gpumarket_simulator.market import Market
from gpumarket_simulator.storage import (
    CLOUD_TO_INSTANCE,
    COPY_DIRECT,
    INSTANCE_TO_CLOUD,
    INSTANCE_TO_INSTANCE,
    RCLONE,
    TRANSFERS,
    Endpoint,
    bucket_path,
    instance_path,
)

if TYPE_CHECKING:
    from gpumarket_simulator.instances import Instance
    from gpumarket_simulator.world import World

COPY_STARTED = "Remote to remote copy started; progress shows in the destination's status_msg (~30 s late)."
CLOUD_COPY_STARTED = "Cloud copy started; progress shows in the instance's status_msg (~30 s late)."


def _body(raw: bytes) -> dict[str, Any]:
    return rules.require_object(rules.parse_json(raw))


def _required(body: dict[str, Any], name: str) -> Any:
    if body.get(name) is None:
        raise bad_request(f"{name} is required")
    return body[name]


class CopyRoutes:
    def __init__(self, market: Market) -> None:
        self.market = market

    async def copy_direct(self, request: Request) -> Any:
        body = _body(await request.body())
        src_id = parse_instance_id(_required(body, "src_id"), "src_id")
        dst_id = parse_instance_id(_required(body, "dst_id"), "dst_id")
        src_path = instance_path(_required(body, "src_path"), "src_path")
        dst_path = instance_path(_required(body, "dst_path"), "dst_path")
        with self.market.transaction() as (world, now):
            own_instance(world, src_id, "src_id")
            own_instance(world, dst_id, "dst_id")
            self.market.storage.start_copy(
                COPY_DIRECT,
                INSTANCE_TO_INSTANCE,
                Endpoint(src_id, None, src_path),
                Endpoint(dst_id, None, dst_path),
                shown_on=dst_id,
                now=now,
            )
        return {"success": True, "msg": COPY_STARTED}

    async def cancel_copy_direct(self, request: Request) -> Any:
        dst_id = parse_instance_id(_required(_body(await request.body()), "dst_id"), "dst_id")
        with self.market.transaction() as (world, now):
            own_instance(world, dst_id, "dst_id")
            n = self.market.storage.cancel(world, lambda c: c.kind == COPY_DIRECT and c.dst.instance_id == dst_id, now)
        return {"success": True, "msg": f"{n} remote copies into instance {dst_id} cancelled"}

    async def cloud_copy(self, request: Request) -> Any:
        body = _body(await request.body())
        instance_id = parse_instance_id(_required(body, "instance_id"), "instance_id")
        selected = body.get("selected")
        if isinstance(selected, str) and selected.strip().isascii() and selected.strip().isdigit():
            selected = int(selected.strip())
        if isinstance(selected, bool) or not isinstance(selected, int):
            raise bad_request(f"selected must be a cloud integration id (an integer), got {selected!r}")
        transfer = body.get("transfer")
        if not isinstance(transfer, str) or transfer.strip().lower() not in TRANSFERS:
            raise bad_request(f"transfer must be {INSTANCE_TO_CLOUD!r} or {CLOUD_TO_INSTANCE!r}, got {transfer!r}")
        transfer = TRANSFERS[transfer.strip().lower()]
        flags = body.get("flags", [])
        if flags is None:
            flags = []
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
            raise bad_request("flags must be a list of strings")
        if transfer == INSTANCE_TO_CLOUD:
            src = Endpoint(instance_id, None, instance_path(_required(body, "src"), "src"))
            dst = Endpoint(None, selected, bucket_path(_required(body, "dst"), "dst"))
        else:
            src = Endpoint(None, selected, bucket_path(_required(body, "src"), "src"))
            dst = Endpoint(instance_id, None, instance_path(_required(body, "dst"), "dst"))
        with self.market.transaction() as (world, now):
            own_instance(world, instance_id, "instance_id")
            integration = next((c for c in world.cloud_integrations if c["id"] == selected), None)
            if integration is None:
                raise ApiError(404, "no_such_integration", f"selected: no cloud integration {selected} on your account")
            owner = integration.get("user_id")
            if owner is not None and owner != world.user_id:
                raise ApiError(403, "forbidden", f"selected: cloud integration {selected} is not yours")
            self.market.storage.start_copy(RCLONE, transfer, src, dst, shown_on=instance_id, now=now, flags=flags)
        return {"success": True, "msg": CLOUD_COPY_STARTED}

    async def cancel_cloud_copy(self, request: Request) -> Any:
        dst_id = parse_instance_id(_required(_body(await request.body()), "dst_id"), "dst_id")
        with self.market.transaction() as (world, now):
            own_instance(world, dst_id, "dst_id")
            n = self.market.storage.cancel(world, lambda c: c.kind == RCLONE and c.shown_on == dst_id, now)
        return {"success": True, "msg": f"{n} cloud copies of instance {dst_id} cancelled"}


def parse_instance_id(value: Any, field_name: str) -> int:
    """An instance id as an int, a string of digits or ``"C.<id>"`` (the official CLI's ``C.123:/path``)."""
    raw = value
    if isinstance(raw, str):
        raw = raw.strip()
        if raw[:2] in ("C.", "c."):
            raw = raw[2:]
        if raw.isascii() and raw.isdigit():
            raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int) or raw <= 0:
        raise bad_request(
            f"{field_name} must be an instance id (an integer, a string of digits or 'C.<id>'), got {value!r}"
        )
    return raw


def own_instance(world: World, instance_id: int, field_name: str) -> Instance:
    inst = world.live.get(instance_id)
    if inst is None:
        raise ApiError(404, "no_such_instance", f"{field_name}: instance {instance_id} does not exist or was destroyed")
    return inst
