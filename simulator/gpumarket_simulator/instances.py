"""An instance of the account: its configuration, status, schedule of boot steps and billing ledger by day.

What an instance is and shows; what happens to it (boots, stops, bids, the $0 stop) is the world's (``world.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpumarket_simulator.billing import DayLedger, day_of
from gpumarket_simulator.offers import Offer
from gpumarket_simulator.onstart import free_local_port

FAILED_STATUSES = ("exited", "unknown", "offline")
HIGHEST_PORT = 65535
#: Public docs: a port asked for from 70000 (``-p 70000:70000``) is mapped to the same port outside and inside, one
#: the service picks and tells in ``VAST_TCP_PORT_70000``.
IDENTITY_PORTS = range(70000, 100000)
#: Where a server on this host is reached when the simulator runs onstart scripts (``World.local_ports``).
LOCAL_ADDRESS = "127.0.0.1"
#: What an offer's instances end up as after booting.
FATES = ("running", *FAILED_STATUSES)
#: Statuses the admin surface may force an instance into (None is "provisioning").
FORCEABLE_STATUSES = (None, "loading", "running", "stopped", *FAILED_STATUSES)


def network(
    config: dict[str, Any], public_ip: str, *, local: bool, draw: Callable[[], int]
) -> tuple[dict[str, int], str]:
    """An instance's ports (each it asks for, ``"8000/tcp"``, mapped to a host port) and its public address.

    With ``local`` (onstart scripts run), free ports of this host at ``LOCAL_ADDRESS``, where a server the script
    starts answers; otherwise ports from ``draw`` at ``public_ip``, with nothing behind them.
    """
    wanted = {"ssh_direct": ["22/tcp"], "jupyter_direct": ["22/tcp", "8080/tcp"]}.get(config["runtype"], [])
    for key in config["env"]:
        if key.startswith("-p "):
            port, _, proto = key[3:].split(":", 1)[1].partition("/")
            wanted.append(f"{port}/{proto or 'tcp'}")
    drawn = {name: draw() for name in dict.fromkeys(wanted)}  # drawn either way: a seed's outcomes stay the same
    if local:
        return {name: free_local_port() for name in drawn}, LOCAL_ADDRESS
    return drawn, public_ip


def bid_loses(inst: Instance) -> bool:
    """Whether a bid instance's bid is below its machine's minimum now.

    At creation the live service still makes it, stopped, and answers ``success: false`` with its ``new_contract``
    (public reports); later it is outbid.
    """
    price = inst.config.get("price")
    return price is not None and price < inst.offer.min_bid


@dataclass
class Instance:
    id: int
    offer: Offer
    api_key: str
    config: dict[str, Any]
    logins: dict[str, str]
    created_at: float
    ssh_host: str
    ssh_port: int
    ports: dict[str, int]  # each port asked for ("8000/tcp") -> its host port
    public_ipaddr: str
    fate: str
    status: str | None = None
    #: Future (time, status) steps of a boot, in order.
    schedule: list[tuple[float, str | None]] = field(default_factory=list)
    #: Once an instance has failed it never runs again, even if restarted (spec: States, rule 1).
    doomed: str | None = None
    provisioned: bool = False
    first_running_at: float | None = None
    #: The market's last word on the instance (live: ``status_msg``), e.g. why it was stopped.
    status_msg: str | None = None
    outbids: int = 0
    first_outbid_at: float | None = None  # when a higher bid first took its machine (compute billing stopped)
    #: Stopped by the market until its bid is again the highest (it then resumes by itself); see ``settle_bid``.
    awaiting_bid: bool = False
    #: The next ``running`` starts the onstart script again (a container that comes back after an outbid).
    rerun_onstart: bool = False
    destroyed_at: float | None = None
    #: Its ``nvidia-smi`` finds no driver (a host that fails the GPU check; see hosts.py).
    gpu_fault: bool = False
    #: Seconds after it first runs when the host loses it, and the status it ends in (see hosts.py).
    lost_after: float | None = None
    lost_status: str = "offline"
    accounted_until: float = 0.0
    #: Dollars per second its disk costs, from creation until destroyed.
    storage_rate: float = 0.0
    #: The billing ledger by UTC day (see billing.py): compute each running second at the price of that second
    #: (a bid may change), storage every second until destroyed, and the bytes its copies moved (storage.py).
    days: dict[int, DayLedger] = field(default_factory=dict)
    #: The day ledger the clock is in (saves a lookup on every update).
    today: DayLedger | None = None

    @property
    def destroyed(self) -> bool:
        return self.destroyed_at is not None

    def day_ledger(self, t: float) -> DayLedger:
        """The ledger of the UTC day ``t`` falls in, begun at ``t`` if nothing was billed that day yet."""
        today = self.today
        if today is not None and today.day <= t < today.next_day:
            return today
        day = day_of(t)
        ledger = self.days.get(day)
        if ledger is None:
            ledger = self.days[day] = DayLedger(day, t, t)
        if today is None or ledger.day >= today.day:
            self.today = ledger
        return ledger

    # The ledger's totals are the sums of its days, so a day's charge and the totals never disagree.
    @property
    def compute_seconds(self) -> float:
        return sum(d.compute_seconds for d in self.days.values())

    @property
    def compute_cost(self) -> float:
        return sum(d.compute_dollars for d in self.days.values())

    @property
    def storage_seconds(self) -> float:
        return sum(d.storage_seconds for d in self.days.values())

    @property
    def storage_cost(self) -> float:
        return sum(d.storage_dollars for d in self.days.values())

    @property
    def bandwidth_up_bytes(self) -> int:
        return sum(d.bandwidth_up_bytes for d in self.days.values())

    @property
    def bandwidth_down_bytes(self) -> int:
        return sum(d.bandwidth_down_bytes for d in self.days.values())

    @property
    def bandwidth_cost(self) -> float:
        return sum(d.bandwidth_dollars for d in self.days.values())

    def hourly_price(self) -> float:
        """What an hour of compute costs: the bid for an interruptible instance, else the on-demand price.

        A bid instance pays its bid, public reports say.
        """
        price = self.config.get("price")
        return float(price) if price is not None else self.offer.dph_total

    @staticmethod
    def _mapped_name(name: str, port: int) -> str:
        """The port's name in ``ports``: an identity port is named after the port it got."""
        number, _, proto = name.partition("/")
        return f"{port}/{proto}" if int(number) in IDENTITY_PORTS else name

    def port_env(self) -> dict[str, str]:
        """What the service tells the container of its address: ``PUBLIC_IPADDR`` and ``VAST_TCP_PORT_<port>``."""
        env = {"PUBLIC_IPADDR": self.public_ipaddr}
        for name, port in self.ports.items():
            number, _, proto = name.partition("/")
            env[f"VAST_{proto.upper()}_PORT_{number}"] = str(port)
        return env

    def api_view(self) -> dict[str, Any]:
        """The instance object of the public API: never the instance key or registry credentials."""
        c = self.config
        return {
            "id": self.id,
            "actual_status": self.status,
            "intended_status": c["target_state"],
            "cur_state": "running" if self.status in ("loading", "running") else "stopped",
            "next_state": c["target_state"],
            "status_msg": self.status_msg,
            "label": c["label"],
            "ssh_host": self.ssh_host,
            "ssh_port": self.ssh_port,
            "public_ipaddr": self.public_ipaddr,
            "ports": {
                self._mapped_name(name, port): [{"HostIp": "0.0.0.0", "HostPort": str(port)}]
                for name, port in self.ports.items()
            },
            "offer_id": self.offer.id,
            "machine_id": self.offer.machine_id,
            "host_id": self.offer.host_id,
            "gpu_name": self.offer.gpu_name,
            "num_gpus": self.offer.num_gpus,
            "gpu_ram": self.offer.gpu_ram,
            "dph_total": self.offer.dph_total,
            "inet_up_cost": self.offer.inet_up_cost,
            "inet_down_cost": self.offer.inet_down_cost,
            "disk_space": c["disk"],
            "image": c.get("image"),
            "env": dict(c["env"]),
            "onstart": c.get("onstart"),
            "args_str": c.get("args_str"),
            "runtype": c["runtype"],
            "template_hash_id": c.get("template_hash_id"),
            "jupyter_dir": c.get("jupyter_dir"),
            "use_jupyter_lab": c.get("use_jupyter_lab", False),
            "python_utf8": c.get("python_utf8", False),
            "lang_utf8": c.get("lang_utf8", False),
            "vm": c.get("vm", False),
            "volume_info": c.get("volume_info"),
            "bid_price": c.get("price"),
            "is_bid": c.get("price") is not None,
            "min_bid": self.offer.min_bid,
            "start_date": self.created_at,
            # How the live service shows the environment (the official CLI reads it): [name, value] pairs.
            "extra_env": [[k, v] for k, v in c["env"].items() if not k.startswith("-p ")],
        }

    def admin_view(self) -> dict[str, Any]:
        """The instance as ``/_sim/state`` shows it: the API's object, its secrets, its fate and its billing ledger."""
        compute_cost, storage_cost, bandwidth_cost = self.compute_cost, self.storage_cost, self.bandwidth_cost
        return {
            **self.api_view(),
            "destroyed": self.destroyed,
            "created_at": self.created_at,
            "destroyed_at": self.destroyed_at,
            "first_running_at": self.first_running_at,
            "outbids": self.outbids,
            "first_outbid_at": self.first_outbid_at,
            "awaiting_bid": self.awaiting_bid,
            "fate": self.fate,
            "gpu_fault": self.gpu_fault,
            "lost_after": self.lost_after,
            "doomed": self.doomed,
            "cancel_unavail": self.config.get("cancel_unavail", False),
            "instance_api_key": self.api_key,
            **self.logins,
            "compute_seconds": self.compute_seconds,
            "storage_seconds": self.storage_seconds,
            "compute_cost": compute_cost,
            "storage_cost": storage_cost,
            "bandwidth_up_bytes": self.bandwidth_up_bytes,
            "bandwidth_down_bytes": self.bandwidth_down_bytes,
            "bandwidth_cost": bandwidth_cost,
            "cost": compute_cost + storage_cost + bandwidth_cost,
            "ledger_days": [d.view() for d in sorted(self.days.values(), key=lambda d: d.day)],
        }
