"""Typed shapes of the service's results, for type checkers and readers.

They are plain dicts at run time (so results go to XCom unchanged). This module deliberately does not use
``from __future__ import annotations``: string annotations make ``typing`` compile a ForwardRef per field when the
classes are created, which DAG files would pay for at import. Only the hooks import it at run time.
"""

from collections.abc import Iterable
from typing import TypedDict


class Offer(TypedDict, total=False):
    id: int
    num_gpus: int
    gpu_name: str
    gpu_ram: float
    dph_total: float
    reliability: float
    verified: bool
    rentable: bool
    direct_port_count: int
    dlperf_per_dphtotal: float
    min_bid: float  # the lowest bid ($/h) an interruptible rental of this offer may make
    machine_id: int


class Instance(TypedDict, total=False):
    id: int
    actual_status: str | None
    label: str
    ssh_host: str
    ssh_port: int
    is_bid: bool  # an interruptible (bid) instance
    bid_price: float
    min_bid: float
    status_msg: str | None  # the service's words on the status (an outbid says so here): shown, never parsed
    machine_id: int


class CreateInstanceResult(TypedDict, total=False):
    success: bool
    new_contract: int
    instance_api_key: str | None
    ambiguous: bool  # set by the hook when the result was reached after an ambiguous failure


class LogsRequestResult(TypedDict, total=False):
    success: bool
    result_url: str  # where the log appears shortly after; fetched without the API key
    msg: str


class VolumeListingResult(TypedDict, total=False):
    success: bool
    you_sent: dict
    results: list[dict]


class EndpointResult(TypedDict):
    success: bool
    result: int


class DeleteDeploymentsResult(TypedDict):
    success: bool
    count: int


class BackupCodesResult(TypedDict):
    msg: str
    backup_codes: list[str]


class PendingPriceIncreases(TypedDict, total=False):
    success: bool
    count: int
    pending_price_increases: list[dict]
    truncated: bool


class CopyResult(TypedDict, total=False):
    success: bool
    msg: str  # the service's words; the copy itself runs on, shown only in the instance's status_msg


class CloudIntegration(TypedDict, total=False):
    id: int  # what a cloud copy's ``selected`` takes
    cloud_type: str
    name: str


class LogRequestOptions(TypedDict, total=False):
    """How a log is asked for (``request_instance_logs``; defaults in ``hooks.core``).

    ``tail``: the last lines only (a number; ``get_instance_logs`` asks for 1000);
    ``filter``: a server-side grep; ``daemon_logs``: the host daemon's log instead of the container's;
    ``retry``: False sends one try (for periodic reads, whose next round is the retry)."""

    tail: int | str | None
    filter: str | None
    daemon_logs: bool | None
    retry: bool


class LogReadOptions(LogRequestOptions, total=False):
    """How a log is read (``get_instance_logs``): ``key_digests`` are sha256 digests of keys to mask."""

    key_digests: Iterable[str | None]
