"""The simulated market's state and the service rules that change it.

Offers, instances and their lifecycle, the billing ledger and the prepaid credit it draws on (with the $0 stop),
volume asks, serverless endpoints, deployments, account items and two-factor codes. Every method takes the
simulated time ``now`` from its caller and must be called with the market lock held (see ``market.py``); nothing
here reads a clock, sleeps or starts a process. Side effects the outside world must carry out (starting or killing
an onstart script) are queued in ``events`` for the caller to drain.
"""

from __future__ import annotations

import hmac
import operator
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpumarket_simulator import totp
from gpumarket_simulator.bidding import MIN_BID_SHARE, BidMarket
from gpumarket_simulator.billing import (
    ADMIN_SERVICE,
    CREDIT_EPSILON,
    CREDIT_STOP_MSG,
    SIGNUP_SERVICE,
    Account,
    DayLedger,
    day_of,
)
from gpumarket_simulator.errors import ApiError, bad_request
from gpumarket_simulator.rules import DIRECT_RUNTYPES, SearchQuery, is_number, offer_matches

FAILED_STATUSES = ("exited", "unknown", "offline")
#: What an offer's instances end up as after booting.
FATES = ("running", *FAILED_STATUSES)
#: Statuses the admin surface may force an instance into (None is "provisioning").
FORCEABLE_STATUSES = (None, "loading", "running", "stopped", *FAILED_STATUSES)
#: The month that an offer's storage_cost ($/GB/month) is spread over: 30 days, as the live service's client counts.
SECONDS_PER_MONTH = 30 * 86400
#: Disk in GB an instance gets when its creation names none (the spec does not say; this is the simulator's choice).
DEFAULT_DISK_GB = 8
BOOT_SECONDS = (60.0, 300.0)
#: A step of an instance's schedule that is no status: an outbid instance's bid wins again (see ``World.outbid``).
RESUME = "resume"
#: A restart finds the image already on the host, so it only goes through a (shorter) loading phase.
RESTART_LOADING_SECONDS = (20.0, 120.0)
BACKUP_CODES_PER_REGENERATION = 10
#: An offer's upload and download price in $/GB when the world file names none.
DEFAULT_INET_COST_PER_GB = 0.005

_LOGIN_KEY = re.compile(r"^[a-z0-9]+_login_(repo|user|pass)$")
#: Template fields that become instance configuration (rule 6: request values override them).
TEMPLATE_CONFIG_KEYS = (
    "image",
    "runtype",
    "onstart",
    "disk",
    "args_str",
    "jupyter_dir",
    "use_jupyter_lab",
    "python_utf8",
    "lang_utf8",
    "vm",
)
ENDPOINT_DEFAULTS: dict[str, Any] = {
    "min_load": 0.0,
    "min_cold_load": 0.0,
    "target_util": 0.9,
    "cold_mult": 2.5,
    "cold_workers": 5,
    "max_workers": 20,
    "max_queue_time": 30.0,
    "target_queue_time": 10.0,
    "autoscaler_instance": "prod",
    "endpoint_state": "active",
    "inactivity_timeout": None,
    "overrecruit_ratio": 1.0,
}


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
            "machine_id": self.machine_id,
            "host_id": self.host_id,
        }


def dollars(amount: float) -> str:
    """``$12.50`` or ``-$0.42`` (float dust around zero is ``$0.00``)."""
    cents = round(amount * 100)
    return f"-${-cents / 100:,.2f}" if cents < 0 else f"${cents / 100:,.2f}"


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
    ports: dict[str, int]
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
            "ports": dict(self.ports),
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


class World:
    """All state of one simulated market. See the module docstring for the locking contract."""

    def __init__(
        self,
        *,
        seed: int,
        start_time: float,
        user_id: int,
        machines: list[Machine],
        offers: list[Offer],
        templates: list[dict[str, Any]],
        deployments: list[dict[str, Any]],
        endpoints: list[dict[str, Any]],
        pending_price_increases: list[dict[str, Any]],
        api_keys: list[dict[str, Any]],
        cloud_integrations: list[dict[str, Any]],
        tfa: dict[str, Any],
        list_limit: int,
        disk_price_per_gb_month: float,
        bid_drift: tuple[float, float] | None,
        credit: float,
    ) -> None:
        self.seed = seed
        self.start_time = start_time
        self.user_id = user_id
        self.machines = {m.id: m for m in machines}
        self.offers = {o.id: o for o in offers}
        self.templates = {t["hash_id"]: t for t in templates}
        self.deployments = {d["id"]: d for d in deployments}
        self.endpoints = {e["id"]: e for e in endpoints}
        self.pending_price_increases = pending_price_increases
        self.api_keys = api_keys
        self.cloud_integrations = cloud_integrations
        self.tfa = tfa
        self.list_limit = list_limit
        self.disk_price_per_gb_month = disk_price_per_gb_month
        # Outcomes (boot times, ports, codes) draw from their own stream, so editing the world file does not
        # change them, and the same sequence of requests always gets the same outcomes.
        self.rng = random.Random(f"gpumarket-outcomes-{seed}")
        self.bids = BidMarket(seed)
        self.bids.set_drift(bid_drift, start_time)
        self.instances: dict[int, Instance] = {}
        self.live: dict[int, Instance] = {}
        self.instance_keys: dict[str, int] = {}
        self.volume_asks: dict[int, dict[str, Any]] = {}
        self.events: list[tuple[str, int]] = []
        self.account = Account()
        self._rate_bound_cache: float | None = None
        if credit:
            self.account.add(credit, start_time, service=SIGNUP_SERVICE, source="signup", description="Starting credit")
        self.settle_credit(start_time)
        self._last_update = start_time
        self._next_ask_id = 5_000_001
        self._next_endpoint_id = max(self.endpoints, default=100) + 1
        self._next_ppi_id = max((p["pending_price_increase_id"] for p in pending_price_increases), default=0) + 1

    # --- time -----------------------------------------------------------------------------------------------
    def update(self, now: float) -> None:
        """Bring every live instance's status and ledger up to ``now``."""
        if now <= self._last_update:
            return
        for step_at in self.bids.steps_due(self._last_update, now):
            self._run_until(step_at)
            self.bids.step(self.offers.values())
            for inst in list(self.live.values()):
                self.settle_bid(inst, step_at)
        self._run_until(now)

    def _run_until(self, t: float) -> None:
        """Advance every live instance to ``t``, stopping them all at the moment the credit reaches $0.

        Between two scheduled steps of any instance the money flows at a constant rate, so the moment the credit
        runs out is exact. When even the most the instances could spend by ``t`` leaves credit, each instance is
        advanced on its own (the common case, and the cheap one).
        """
        cur = self._last_update
        if t <= cur:
            return
        self._last_update = t
        account = self.account
        if not account.exhausted and account.credit - self._rate_bound() * (t - cur) > CREDIT_EPSILON:
            for inst in list(self.live.values()):
                self._advance(inst, t)
            return
        while True:
            self._enforce_credit(cur)
            step = min((i.schedule[0][0] for i in self.live.values() if i.schedule), default=t)
            step = min(step, t)
            rate = 0.0 if account.exhausted else self._spend_rate()
            if rate > 0 and account.credit - rate * (step - cur) <= CREDIT_EPSILON:
                at = min(step, cur + account.credit / rate)
                for inst in list(self.live.values()):
                    self._account(inst, at)
                self._exhaust(at)
            for inst in list(self.live.values()):
                self._advance(inst, step)
            cur = step
            if step >= t:
                return

    def _spend_rate(self) -> float:
        """Dollars per second billed now."""
        rate = 0.0
        for inst in self.live.values():
            rate += inst.storage_rate
            if inst.status == "running":
                rate += inst.hourly_price() / 3600.0
        return rate

    def _rate_bound(self) -> float:
        """The most dollars per second the live instances could cost: as if all of them ran.

        It changes only when an instance is created or destroyed or a bid changes (``_rate_bound_cache`` is reset
        then), so the common update does not walk the instances twice.
        """
        if self._rate_bound_cache is None:
            self._rate_bound_cache = sum(i.storage_rate + i.hourly_price() / 3600.0 for i in self.live.values())
        return self._rate_bound_cache

    def _advance(self, inst: Instance, t: float) -> None:
        while inst.schedule and inst.schedule[0][0] <= t:
            at, status = inst.schedule.pop(0)
            self._account(inst, at)
            if status == RESUME and not bid_loses(inst):
                self._resume(inst, at)
            elif status == RESUME:  # the admin's outbid is over, but a competing bid is higher still
                inst.awaiting_bid = True
            else:
                self._set_status(inst, status, at)
        self._account(inst, t)

    def _account(self, inst: Instance, t: float) -> None:
        """Bill the instance up to ``t``, into the ledger of each UTC day the time falls in."""
        while t > inst.accounted_until:
            a = inst.accounted_until
            ledger = inst.today
            if ledger is None or not ledger.day <= a < ledger.next_day:
                ledger = inst.day_ledger(a)
            b = t if t < ledger.next_day else ledger.next_day
            storage = (b - a) * inst.storage_rate
            compute = (b - a) / 3600.0 * inst.hourly_price() if inst.status == "running" else None
            ledger.add_time(a, b, storage, compute)
            self.account.spent += storage if compute is None else storage + compute
            inst.accounted_until = b

    # --- money --------------------------------------------------------------------------------------------------
    def bill_bandwidth(self, inst: Instance, moved: int, dollars: float, *, up: bool, at: float) -> None:
        """Bill the bytes a copy moved (storage.py prices them) to the day they moved on."""
        inst.day_ledger(at).add_bandwidth(at, moved, dollars, up=up)
        self.account.spent += dollars

    def settle_credit(self, now: float) -> None:
        """Apply the $0 stop if something spent the last of the credit outside the clock (a copy's bytes, the admin)."""
        self._enforce_credit(now)

    def _enforce_credit(self, at: float) -> None:
        account = self.account
        if not account.exhausted:
            if account.credit > CREDIT_EPSILON:
                return
            self._exhaust(at)
            return
        stopped = self._credit_stop(at)
        if stopped:  # something ran while the credit was gone (the admin forced it): it stops at once
            account.record_stop(at, stopped)

    def _exhaust(self, at: float) -> None:
        """The credit reached $0 at ``at``: every instance of the account that runs or boots stops."""
        self.account.exhausted = True
        self.account.record_stop(at, self._credit_stop(at))

    def _credit_stop(self, at: float) -> list[int]:
        stopped = []
        for inst in self.live.values():
            inst.awaiting_bid = False  # a bid waiting for its machine does not come back by itself either
            if inst.status in (None, "loading", "running"):
                inst.config["target_state"] = "stopped"
                inst.status_msg = CREDIT_STOP_MSG
                inst.schedule = []
                self._set_status(inst, "stopped", at)
                stopped.append(inst.id)
            else:
                inst.schedule = []  # an admin's outbid does not resume
        return stopped

    def require_credit(self) -> None:
        """Refuse to start anything while the credit is $0 or less (creates and starts of stopped instances)."""
        if self.account.exhausted or self.account.credit <= CREDIT_EPSILON:
            raise ApiError(
                402,
                "insufficient_credit",
                f"Your account's credit is {dollars(self.account.credit)}: add credit before creating or starting "
                "instances.",
                extra={"success": False},
            )

    def top_up(self, amount: float, now: float) -> None:
        """Put ``amount`` dollars into the account (take them out, if negative): an invoice of the admin's."""
        if not is_number(amount):
            raise ValueError(f"top_up must be a finite number of dollars, got {amount!r}")
        self.update(now)
        self._add_credit(float(amount), now, f"Top-up of {dollars(amount)} by the simulator's admin")

    def set_credit(self, credit: float, now: float) -> None:
        """Make the credit ``credit`` dollars: an invoice of the admin's for the difference."""
        if not is_number(credit):
            raise ValueError(f"credit must be a finite number of dollars, got {credit!r}")
        self.update(now)
        self._add_credit(credit - self.account.credit, now, f"Credit set to {dollars(credit)} by the simulator's admin")

    def _add_credit(self, amount: float, now: float, description: str) -> None:
        if amount:
            self.account.add(amount, now, service=ADMIN_SERVICE, source="admin", description=description)
        self.settle_credit(now)  # a top-up starts nothing again; taking credit out may stop everything

    def _set_status(self, inst: Instance, status: str | None, at: float) -> None:
        if inst.status == "running" and status != "running":
            self.events.append(("halt", inst.id))
        if status in ("loading", "running"):
            inst.provisioned = True
        if status in FAILED_STATUSES:
            inst.doomed = status
        inst.status = status
        if status == "running" and inst.first_running_at is None:
            inst.first_running_at = at
            self.events.append(("first_running", inst.id))
        elif status == "running" and inst.rerun_onstart:
            inst.rerun_onstart = False
            self.events.append(("restarted", inst.id))

    def _final_status(self, inst: Instance) -> str:
        return inst.doomed or inst.fate

    def _schedule_boot(self, inst: Instance, now: float, *, full: bool) -> None:
        if full:
            total = self.rng.uniform(*BOOT_SECONDS)
            provisioning = total * self.rng.uniform(0.2, 0.4)
            self._set_status(inst, None, now)
            inst.schedule = [(now + provisioning, "loading"), (now + total, self._final_status(inst))]
        else:
            self._set_status(inst, "loading", now)
            inst.schedule = [(now + self.rng.uniform(*RESTART_LOADING_SECONDS), self._final_status(inst))]

    # --- offers ---------------------------------------------------------------------------------------------
    def offer_view(self, offer: Offer) -> dict[str, Any]:
        """An offer as search shows it; ``storage_cost`` ($/GB/month, as the live service names it) is the disk's
        price, the same for every offer here."""
        machine = self.machines.get(offer.machine_id)
        return {**offer.view(machine.online if machine else True), "storage_cost": self.disk_price_per_gb_month}

    def search(self, query: SearchQuery) -> list[dict[str, Any]]:
        views = [self.offer_view(o) for o in sorted(self.offers.values(), key=lambda o: o.id)]
        if not query.filters_rentable:
            views = [v for v in views if v["rentable"]]
        views = [v for v in views if offer_matches(v, query.filters)]
        # Stable sorts from the last key to the first give a multi-key order (ties keep the id order).
        for name, descending in reversed(query.order or [("dph_total", False)]):
            views.sort(key=operator.itemgetter(name), reverse=descending)
        return views[: query.limit] if query.limit else views

    def _unavailable_reason(self, offer: Offer) -> str | None:
        machine = self.machines.get(offer.machine_id)
        if offer.rented_by == "other":
            return "it was rented by another user"
        if offer.rented_by is not None:
            return f"it is already rented (instance {offer.rented_by})"
        if not offer.listed:
            return "the host is not accepting rentals on it"
        if machine is not None and not machine.online:
            return "its machine is offline"
        return None

    # --- instances ------------------------------------------------------------------------------------------
    def create_instance(
        self, offer_id: int, request: dict[str, Any], now: float, *, new_id: Callable[[], int], api_key: str
    ) -> Instance:
        self.update(now)
        self.require_credit()
        offer = self.offers.get(offer_id)
        if offer is None:
            raise ApiError(404, "no_such_ask", f"No offer (ask) with id {offer_id} exists")
        reason = self._unavailable_reason(offer)
        if reason:
            raise ApiError(409, "offer_unavailable", f"Offer {offer_id} is no longer available: {reason}")
        # Resolve the template before renting, so a bad request does not use the offer up.
        config, logins = self._configure(request)
        instance_id = new_id()
        machine = self.machines.get(offer.machine_id)
        direct = config["runtype"] in DIRECT_RUNTYPES
        inst = Instance(
            id=instance_id,
            offer=offer,
            api_key=api_key,
            config=config,
            logins=logins,
            created_at=now,
            ssh_host=(machine.public_ip if machine else "198.51.100.1")
            if direct
            else f"ssh{self.rng.randint(1, 9)}.gpumarket.test",
            ssh_port=self.rng.randint(20000, 60000) if direct else 10000 + instance_id % 50000,
            ports=self._ports(config),
            fate=offer.fate,
            accounted_until=now,
            storage_rate=float(config["disk"]) * self.disk_price_per_gb_month / SECONDS_PER_MONTH,
        )
        self._rate_bound_cache = None
        offer.rented_by = instance_id
        self.instances[inst.id] = inst
        self.live[inst.id] = inst
        self.instance_keys[api_key] = inst.id
        self.events.append(("created", inst.id))  # the market gives it a disk (storage.py)
        if bid_loses(inst):  # made, but stopped: it lost to the machine's minimum before it ever ran
            config["target_state"] = "stopped"
            inst.awaiting_bid = True
        if config["target_state"] == "stopped":
            self._set_status(inst, "stopped", now)
        else:
            self._schedule_boot(inst, now, full=True)
        return inst

    def _configure(self, request: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """Apply the template rules 1-6 of the spec: template as base, request values win, env merged."""
        config: dict[str, Any] = {"env": {}}
        logins: dict[str, str] = {}
        hash_id = request.get("template_hash_id")
        if hash_id is not None:
            template = self.templates.get(hash_id)
            if template is None:
                raise bad_request(f"No template with hash_id {hash_id!r}", "no_such_template")
            config.update({k: template[k] for k in TEMPLATE_CONFIG_KEYS if template.get(k) is not None})
            config["env"] = dict(template.get("env") or {})
            logins = {k: v for k, v in template.items() if _LOGIN_KEY.match(k)}
            # A template's volume_info is only a hint for the web interface (rule 4): not copied.
        for key, value in request.items():
            if key == "env":
                config["env"] = {**config["env"], **value}
            elif key == "image_login":
                logins = dict(value)
            else:
                config[key] = value
        config.setdefault("disk", DEFAULT_DISK_GB)
        config.setdefault("runtype", "ssh")
        config.setdefault("target_state", "running")
        config.setdefault("label", "")
        return config, logins

    def _ports(self, config: dict[str, Any]) -> dict[str, int]:
        wanted = {"ssh_direct": ["22/tcp"], "jupyter_direct": ["22/tcp", "8080/tcp"]}.get(config["runtype"], [])
        for key in config["env"]:
            if key.startswith("-p "):
                port, _, proto = key[3:].split(":", 1)[1].partition("/")
                wanted.append(f"{port}/{proto or 'tcp'}")
        return {name: self.rng.randint(20000, 60000) for name in dict.fromkeys(wanted)}

    def live_instance(self, instance_id: int) -> Instance:
        inst = self.live.get(instance_id)
        if inst is None:
            raise ApiError(404, "no_such_instance", f"Instance {instance_id} does not exist or was destroyed")
        return inst

    def set_state(self, inst: Instance, state: str, now: float) -> None:
        """PUT state: stopped halts compute billing (disk continues); running boots it again, credit permitting."""
        self.update(now)
        if state == "running":
            self.require_credit()
        inst.config["target_state"] = state
        inst.awaiting_bid = False
        if state == "stopped":
            if inst.status != "stopped":
                inst.schedule = []
                self._set_status(inst, "stopped", now)
        elif inst.status == "stopped" or inst.status in FAILED_STATUSES:
            if bid_loses(inst):  # a start does not win the machine: the bid waits, stopped
                self._take_machine(inst, now)
                inst.awaiting_bid = True
                return
            self._schedule_boot(inst, now, full=not inst.provisioned)

    def destroy(self, inst: Instance, now: float) -> None:
        self.update(now)
        if inst.status == "running":
            self.events.append(("halt", inst.id))
        inst.schedule = []
        inst.destroyed_at = now
        self.live.pop(inst.id, None)
        self._rate_bound_cache = None
        self.events.append(("destroyed", inst.id))  # its copies fail and its disk goes (storage.py)
        if inst.offer.rented_by == inst.id:  # the machine is free again: its offer is back on the market
            inst.offer.rented_by = None

    def force_status(self, instance_id: int, status: str | None, now: float) -> None:
        if status not in FORCEABLE_STATUSES:
            raise ValueError(f"status must be one of {', '.join(str(s) for s in FORCEABLE_STATUSES)}")
        inst = self.live.get(instance_id)
        if inst is None:
            raise KeyError(instance_id)
        self.update(now)
        inst.schedule = []
        if status == "running":
            inst.doomed = None
        if status is None:
            self._schedule_boot(inst, now, full=True)
        elif status == "loading":
            self._schedule_boot(inst, now, full=False)
        else:
            self._set_status(inst, status, now)

    def outbid(self, instance_id: int, now: float, resume_after: float | None = None) -> None:
        """A higher bid takes the machine of a bid instance (the admin's doing): see ``_take_machine``.

        The machine stays taken until ``resume_after`` (simulated seconds; None: until destroyed), whatever the
        competing bids do meanwhile.
        """
        inst = self.live.get(instance_id)
        if inst is None:
            raise KeyError(instance_id)
        if inst.config.get("price") is None:
            raise ValueError(f"instance {instance_id} is on demand (created without a price): only a bid is outbid")
        if resume_after is not None and (not is_number(resume_after) or resume_after < 0):
            raise ValueError(f"resume_after must be a number of seconds >= 0 or null, got {resume_after!r}")
        self.update(now)
        if inst.status not in (None, "loading", "running"):
            raise ValueError(f"instance {instance_id} is {inst.status!r}: only a booting or running bid is outbid")
        self._take_machine(inst, now)
        if resume_after is not None:
            inst.schedule = [(now + resume_after, RESUME)]

    def change_bid(self, inst: Instance, price: float, now: float) -> None:
        """``PUT /instances/bid_price/{id}/``: the new bid counts at once, both ways (see ``settle_bid``)."""
        self.update(now)
        inst.config["price"] = price
        self._rate_bound_cache = None
        self.settle_bid(inst, now)

    def settle_bid(self, inst: Instance, now: float) -> None:
        """Outbid or resume a bid instance after its bid or a competing bid changed.

        A booting or running bid that no longer wins its machine is outbid (the market's doing: it comes back by itself
        once its bid wins again); a bid the market stopped that wins again resumes. An instance the user stopped, or the
        admin outbid, is left as it is.
        """
        if inst.config.get("price") is None:
            return
        wins = not bid_loses(inst)
        if not wins and inst.status in (None, "loading", "running") and inst.config["target_state"] == "running":
            self._take_machine(inst, now)
            inst.awaiting_bid = True
        elif wins and inst.awaiting_bid and inst.status == "stopped":
            self._resume(inst, now)

    def _take_machine(self, inst: Instance, now: float) -> None:
        """Stop the bid instance at once: its processes killed, its disk kept.

        Storage bills on, compute does not; ``intended_status``/``cur_state``/``next_state`` become "stopped" and a
        ``status_msg`` is set.
        """
        if inst.status in (None, "loading", "running"):
            inst.outbids += 1
            if inst.first_outbid_at is None:
                inst.first_outbid_at = now
        inst.config["target_state"] = "stopped"
        inst.awaiting_bid = False
        inst.status_msg = "Outbid: a higher bid took this machine; stopped until your bid wins again."
        inst.schedule = []
        if inst.status == "running":
            self.events.append(("kill", inst.id))  # the market takes the machine: no grace for the script
        self._set_status(inst, "stopped", now)

    def _resume(self, inst: Instance, at: float) -> None:
        """The bid wins again: the instance loads and runs, and its onstart script runs again.

        This is what a container that comes back does.
        """
        inst.config["target_state"] = "running"
        inst.awaiting_bid = False
        inst.status_msg = None
        inst.rerun_onstart = inst.first_running_at is not None
        self._schedule_boot(inst, at, full=not inst.provisioned)

    def set_competing_bid(self, offer_id: int, price: float | None, now: float) -> None:
        """Someone else now bids ``price`` ($/h) for this offer's machine (None: nobody).

        Our bid on it is settled at once.
        """
        if price is not None and (not is_number(price) or price <= 0):
            raise ValueError(f"price must be a number of $/h > 0 or null, got {price!r}")
        offer = self.offers[offer_id]
        self.update(now)
        offer.competing_bid = None if price is None else float(price)
        for inst in list(self.live.values()):
            if inst.offer is offer:
                self.settle_bid(inst, now)

    def set_offer_fate(self, offer_id: int, fate: str) -> None:
        if fate not in FATES:
            raise ValueError(f"fate must be one of {', '.join(FATES)}")
        self.offers[offer_id].fate = fate

    def vanish_offer(self, offer_id: int) -> None:
        offer = self.offers[offer_id]
        if offer.rented_by is None:
            offer.rented_by = "other"

    def set_machine_online(self, machine_id: int, online: bool, now: float) -> None:
        machine = self.machines[machine_id]
        self.update(now)
        machine.online = online
        if not online:
            # The host disconnected: its instances go offline and, per the spec, never run again.
            for inst in list(self.live.values()):
                if inst.offer.machine_id == machine_id:
                    inst.schedule = []
                    self._set_status(inst, "offline", now)

    # --- host volume listings -------------------------------------------------------------------------------
    def create_volume_listings(
        self, machine_ids: list[int], hidden: bool | None, sent: dict[str, Any]
    ) -> dict[str, Any]:
        machines = [self.machines.get(i) for i in machine_ids]
        if any(m is None or not m.owned for m in machines):
            raise bad_request("No such machine(s) for your account", "no_such_machine")
        offline = [m.id for m in machines if m is not None and not m.online]
        if offline:
            raise ApiError(
                402,
                "machine_offline",
                f"Asks can only be created for an online machine; offline: {', '.join(map(str, offline))}",
                extra={"success": False},
            )
        results = []
        for machine in machines:
            assert machine is not None
            ask = self.volume_asks.get(machine.id)
            new_contracts: list[dict[str, Any]] = []
            upd_contracts: list[int] = []
            if ask is None:
                ask = {
                    "id": self._next_ask_id,
                    "machine_id": machine.id,
                    "size": machine.disk_gb,
                    "hidden": False,
                }
                self._next_ask_id += 1
                self.volume_asks[machine.id] = ask
                new_contracts.append({"id": ask["id"], "size": ask["size"]})
            else:
                upd_contracts.append(ask["id"])
            if hidden is not None:
                ask["hidden"] = hidden
            results.append(
                {
                    "machine_id": machine.id,
                    "user_id": self.user_id,
                    "extended": sum(1 for i in self.live.values() if i.offer.machine_id == machine.id),
                    "new_contracts": new_contracts,
                    "upd_contracts": upd_contracts,
                }
            )
        return {"success": True, "you_sent": sent, "results": results}

    # --- serverless -----------------------------------------------------------------------------------------
    def create_endpoint(self, fields: dict[str, Any], now: float) -> int:
        endpoint_id = self._next_endpoint_id
        self._next_endpoint_id += 1
        self.endpoints[endpoint_id] = {
            "id": endpoint_id,
            **ENDPOINT_DEFAULTS,
            "endpoint_name": f"endpoint-{endpoint_id}",
            **fields,
            "deployment_id": None,
            "deleted": False,
            "created_at": now,
        }
        return endpoint_id

    def delete_deployments(self, name: str, tag: str | None, now: float) -> int:
        matches = [
            d
            for d in self.deployments.values()
            if d["name"] == name and (tag is None or d["tag"] == tag) and not d["deleted"]
        ]
        for deployment in matches:
            deployment["deleted"] = True
            deployment["deleted_at"] = now
            for endpoint_id in deployment["endpoint_ids"]:
                if endpoint_id in self.endpoints:
                    self.endpoints[endpoint_id]["deleted"] = True
            for worker in deployment["workers"]:
                worker["deleted"] = True
        return len(matches)

    def deployment_view(self, deployment: dict[str, Any]) -> dict[str, Any]:
        view = {k: v for k, v in deployment.items() if k not in ("endpoint_ids", "workers")}
        view["endpoints"] = [dict(self.endpoints[i]) for i in deployment["endpoint_ids"] if i in self.endpoints]
        view["workers"] = [dict(w) for w in deployment["workers"]]
        return view

    # --- two-factor backup codes ----------------------------------------------------------------------------
    def regen_backup_codes(self, request: dict[str, Any], now: float) -> dict[str, Any]:
        tfa = self.tfa
        if "backup_code" in request:
            if request["backup_code"] not in tfa["backup_codes"]:
                raise bad_request("The backup code is wrong or was already used", "invalid_backup_code")
        else:
            method = request.get("tfa_method")
            if "tfa_method_id" in request:
                known = {m["id"]: m["method"] for m in tfa["methods"]}
                by_id = known.get(request["tfa_method_id"])
                if by_id is None:
                    raise bad_request(f"No two-factor method with id {request['tfa_method_id']}", "no_such_method")
                if method is not None and method != by_id:
                    raise bad_request(f"tfa_method_id {request['tfa_method_id']} is a {by_id} method, not {method}")
                method = by_id
            if method == "totp":
                if not totp.verify(tfa["totp_secret"], request["code"], now):
                    raise bad_request("The verification code is wrong or expired", "invalid_code")
            else:
                if "secret" not in request:
                    raise bad_request(f"secret (the tfa_secret from the send step) is required for {method}")
                if not (
                    hmac.compare_digest(request["secret"], tfa["tfa_secret"])
                    and hmac.compare_digest(request["code"], tfa["code"])
                ):
                    raise bad_request("The verification code or secret is wrong or expired", "invalid_code")
                # A sent code works once: the next send step would issue a new one.
                tfa["code"] = f"{self.rng.randrange(10**6):06d}"
                tfa["tfa_secret"] = f"{self.rng.getrandbits(128):032x}"
        codes = [f"{self.rng.getrandbits(40):010x}" for _ in range(BACKUP_CODES_PER_REGENERATION)]
        tfa["backup_codes"] = codes
        return {
            "msg": "New backup codes generated; the previous codes no longer work.",
            "backup_codes": list(codes),
        }

    # --- pending price increases ----------------------------------------------------------------------------
    def list_pending_price_increases(self) -> dict[str, Any]:
        items = [dict(p) for p in self.pending_price_increases[: self.list_limit]]
        return {
            "success": True,
            "count": len(items),
            "pending_price_increases": items,
            "truncated": len(self.pending_price_increases) > self.list_limit,
        }

    def add_pending_price_increases(self, n: int, contract_id: int | None, now: float) -> list[dict[str, Any]]:
        added = []
        for k in range(n):
            inst = self.instances.get(contract_id) if contract_id is not None else None
            old_gpu = round(self.rng.uniform(0.00005, 0.0008), 8)
            old_disk = round(self.rng.uniform(0.0000001, 0.000002), 10)
            end = now + self.rng.uniform(1, 30) * 86400
            record = {
                "pending_price_increase_id": self._next_ppi_id,
                "contract_id": contract_id if contract_id is not None else 7_000_001 + self._next_ppi_id + k,
                "host_id": inst.offer.host_id if inst else self.rng.randint(60000, 69999),
                "new_gpu_costpersec": round(old_gpu * self.rng.uniform(1.05, 1.5), 8),
                "new_disk_ram_costpersec": round(old_disk * self.rng.uniform(1.0, 1.3), 10),
                "old_gpu_costpersec": old_gpu,
                "old_disk_ram_costpersec": old_disk,
                "contract_end_date": round(end, 3),
                "ask_end_date": round(end + self.rng.uniform(0, 30) * 86400, 3),
                "created_at": round(now - self.rng.uniform(0, 86400), 3),
            }
            self._next_ppi_id += 1
            self.pending_price_increases.append(record)
            added.append(record)
        return added

    # --- admin views ----------------------------------------------------------------------------------------
    def instance_admin_view(self, inst: Instance) -> dict[str, Any]:
        compute_cost, storage_cost, bandwidth_cost = inst.compute_cost, inst.storage_cost, inst.bandwidth_cost
        return {
            **inst.api_view(),
            "destroyed": inst.destroyed,
            "created_at": inst.created_at,
            "destroyed_at": inst.destroyed_at,
            "first_running_at": inst.first_running_at,
            "outbids": inst.outbids,
            "first_outbid_at": inst.first_outbid_at,
            "awaiting_bid": inst.awaiting_bid,
            "fate": inst.fate,
            "doomed": inst.doomed,
            "cancel_unavail": inst.config.get("cancel_unavail", False),
            "instance_api_key": inst.api_key,
            **inst.logins,
            "compute_seconds": inst.compute_seconds,
            "storage_seconds": inst.storage_seconds,
            "compute_cost": compute_cost,
            "storage_cost": storage_cost,
            "bandwidth_up_bytes": inst.bandwidth_up_bytes,
            "bandwidth_down_bytes": inst.bandwidth_down_bytes,
            "bandwidth_cost": bandwidth_cost,
            "cost": compute_cost + storage_cost + bandwidth_cost,
            "ledger_days": [d.view() for d in sorted(inst.days.values(), key=lambda d: d.day)],
        }

    def state(self, now: float) -> dict[str, Any]:
        return {
            "now": now,
            "seed": self.seed,
            "start_time": self.start_time,
            "user_id": self.user_id,
            "disk_price_per_gb_month": self.disk_price_per_gb_month,
            "list_limit": self.list_limit,
            "account": self.account.view(),
            "machines": [m.view() for m in self.machines.values()],
            "offers": [
                {**self.offer_view(o), "fate": o.fate, "rented_by": o.rented_by, "competing_bid": o.competing_bid}
                for o in self.offers.values()
            ],
            "bid_drift": None if self.bids.drift is None else self.bids.drift.view(),
            "templates": [dict(t) for t in self.templates.values()],
            "instances": [self.instance_admin_view(i) for i in self.instances.values()],
            "volume_asks": [dict(a) for a in self.volume_asks.values()],
            "deployments": [self.deployment_view(d) for d in self.deployments.values()],
            "endpoints": [dict(e) for e in self.endpoints.values()],
            "pending_price_increases": [dict(p) for p in self.pending_price_increases],
            "api_keys": [dict(k) for k in self.api_keys],
            "cloud_integrations": [dict(c) for c in self.cloud_integrations],
            "tfa": {
                **{k: v for k, v in self.tfa.items() if k != "backup_codes"},
                "totp_code": totp.totp(self.tfa["totp_secret"], now),
                "backup_codes": list(self.tfa["backup_codes"]),
            },
        }
