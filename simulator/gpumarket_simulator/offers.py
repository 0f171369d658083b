"""The market's machines and the offers on them: what search shows of an offer and whether it can be rented."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpumarket_simulator.bidding import MIN_BID_SHARE

#: An offer's upload and download price in $/GB when the world file names none.
DEFAULT_INET_COST_PER_GB = 0.005
#: An offer's download speed in Mbps when the world file names none.
DEFAULT_INET_DOWN_MBPS = 500.0


@dataclass
class Machine:
    id: int
    host_id: int
    online: bool = True
    owned: bool = False
    public_ip: str = "198.51.100.1"
    disk_gb: float = 1000.0

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "host_id": self.host_id,
            "online": self.online,
            "owned": self.owned,
            "public_ip": self.public_ip,
            "disk_gb": self.disk_gb,
        }


@dataclass
class Offer:
    id: int
    machine_id: int
    host_id: int
    num_gpus: int
    gpu_name: str
    gpu_ram: float
    dph_total: float
    reliability: float
    verified: bool
    direct_port_count: int
    dlperf_per_dphtotal: float
    #: The host accepts rentals. The offer's ``rentable`` field also needs "not rented" and "machine online".
    listed: bool = True
    fate: str = "running"
    #: None, the id of our instance, or "other" (rented by someone else).
    rented_by: int | str | None = None
    #: The highest bid of other renters for this machine (None: nobody bids); see bidding.py.
    competing_bid: float | None = None
    #: Bandwidth prices in $/GB (1e9 bytes), billed for the bytes a copy moves (see storage.py).
    inet_up_cost: float = DEFAULT_INET_COST_PER_GB
    inet_down_cost: float = DEFAULT_INET_COST_PER_GB
    #: Download speed in Mbps, as the live offers show it; a boot's image pull goes at it (see hosts.py).
    inet_down: float = DEFAULT_INET_DOWN_MBPS
    #: "fail": the machine boots, but its ``nvidia-smi`` finds no driver (see hosts.py).
    gpu_check: str = "ok"

    @property
    def floor_bid(self) -> float:
        return round(self.dph_total * MIN_BID_SHARE, 4)

    @property
    def min_bid(self) -> float:
        """What wins this machine now: the host's floor, or more when someone else bids more."""
        return max(self.floor_bid, self.competing_bid or 0.0)

    def view(self, machine_online: bool) -> dict[str, Any]:
        return {
            "id": self.id,
            "num_gpus": self.num_gpus,
            "gpu_name": self.gpu_name,
            "gpu_ram": self.gpu_ram,
            "dph_total": self.dph_total,
            "reliability": self.reliability,
            "verified": self.verified,
            "rentable": self.listed and self.rented_by is None and machine_online,
            "direct_port_count": self.direct_port_count,
            "dlperf_per_dphtotal": self.dlperf_per_dphtotal,
            "min_bid": self.min_bid,
            "inet_up_cost": self.inet_up_cost,
            "inet_down_cost": self.inet_down_cost,
            "inet_down": self.inet_down,
            "machine_id": self.machine_id,
            "host_id": self.host_id,
        }

    def unavailable_reason(self, machine: Machine | None) -> str | None:
        """Why this offer cannot be rented now (None: it can), ``machine`` being the one it is on."""
        if self.rented_by == "other":
            return "it was rented by another user"
        if self.rented_by is not None:
            return f"it is already rented (instance {self.rented_by})"
        if not self.listed:
            return "the host is not accepting rentals on it"
        if machine is not None and not machine.online:
            return "its machine is offline"
        return None
