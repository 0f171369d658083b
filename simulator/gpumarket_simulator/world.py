"""The simulated market's state and the service rules that change it: the clock, instances' lives, bids, credit.

Every method takes the simulated time ``now`` from its caller and must be called with the market lock held (see
``market.py``); nothing here reads a clock, sleeps or starts a process. Side effects the outside world must carry
out (starting or killing an onstart script) are queued in ``events`` for the caller to drain. What the world holds
has modules of its own: ``offers.py`` (machines, offers), ``instances.py``, ``billing.py`` (ledgers, the account),
``serverless.py``, ``two_factor.py`` and ``price_increases.py``.
"""

from __future__ import annotations

import operator
import random
from collections.abc import Callable
from typing import Any

from gpumarket_simulator.bidding import BidMarket
from gpumarket_simulator.billing import (
    ADMIN_SERVICE,
    CREDIT_EPSILON,
    CREDIT_STOP_MSG,
    SIGNUP_SERVICE,
    Account,
    dollars,
)
from gpumarket_simulator.errors import ApiError
from gpumarket_simulator.hosts import GPU_CHECKS, OUTBID, HostProfile, draw_attempt
from gpumarket_simulator.instance_rules import DIRECT_RUNTYPES
from gpumarket_simulator.instances import FAILED_STATUSES, FATES, FORCEABLE_STATUSES, Instance, bid_loses, network
from gpumarket_simulator.market_swing import Swing
from gpumarket_simulator.offers import Machine, Offer
from gpumarket_simulator.price_increases import PendingPriceIncreases
from gpumarket_simulator.rules import SearchQuery, is_number, offer_matches
from gpumarket_simulator.serverless import Serverless
from gpumarket_simulator.snapshot import world_state
from gpumarket_simulator.templates import configure
from gpumarket_simulator.two_factor import TwoFactor
from gpumarket_simulator.volume_listings import VolumeListings

#: The month that an offer's storage_cost ($/GB/month) is spread over: 30 days, as the live service's client counts.
SECONDS_PER_MONTH = 30 * 86400
BOOT_SECONDS = (60.0, 300.0)
#: A step of an instance's schedule that is no status: an outbid instance's bid wins again (see ``World.outbid``).
RESUME = "resume"
#: A restart finds the image already on the host, so it only goes through a (shorter) loading phase.
RESTART_LOADING_SECONDS = (20.0, 120.0)


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
        market: HostProfile | None = None,
    ) -> None:
        self.seed = seed
        self.start_time = start_time
        self.user_id = user_id
        #: Instances' ports are free ports of this host, reached at 127.0.0.1 (set when onstart scripts run).
        self.local_ports = False
        self.machines = {m.id: m for m in machines}
        self.offers = {o.id: o for o in offers}
        self.templates = {t["hash_id"]: t for t in templates}
        self.serverless = Serverless(endpoints, deployments)
        self.api_keys = api_keys
        self.cloud_integrations = cloud_integrations
        self.list_limit = list_limit
        self.disk_price_per_gb_month = disk_price_per_gb_month
        # Outcomes (boot times, ports, codes) draw from their own stream, so editing the world file does not
        # change them, and the same sequence of requests always gets the same outcomes.
        self.rng = random.Random(f"gpumarket-outcomes-{seed}")
        self.two_factor = TwoFactor(tfa, self.rng)
        self.price_increases = PendingPriceIncreases(pending_price_increases, self.rng)
        self.bids = BidMarket(seed)
        self.profile = market
        self.billed_statuses = ("running", "loading") if market is not None and market.bill_loading else ("running",)
        # A heterogeneous market's outcomes (see hosts.py) draw from a stream of their own as well.
        self.host_rng = random.Random(f"gpumarket-hosts-{seed}")
        self.bids.set_drift(bid_drift, start_time)
        self.swing: Swing | None = None  # offers that come and go over the day (market_swing.py)
        self.instances: dict[int, Instance] = {}
        self.live: dict[int, Instance] = {}
        self.instance_keys: dict[str, int] = {}
        self.volume_listings = VolumeListings(self.machines, self.live, user_id)
        self.events: list[tuple[str, int]] = []
        self.account = Account()
        self._rate_bound_cache: float | None = None
        if credit:
            self.account.add(credit, start_time, service=SIGNUP_SERVICE, source="signup", description="Starting credit")
        self.settle_credit(start_time)
        self._last_update = start_time

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
        if self.swing is not None:
            self.swing.apply(self.offers.values(), now)

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
            if status == OUTBID and inst.status not in (None, "loading", "running"):
                continue  # the host lost it first
            if status == OUTBID:
                self._take_machine(inst, at)
                inst.awaiting_bid = True
                assert self.profile is not None
                inst.schedule = [(at + self.host_rng.uniform(*self.profile.outbid_seconds), RESUME)]
            elif status == RESUME and not bid_loses(inst):
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
            compute = (b - a) / 3600.0 * inst.hourly_price() if inst.status in self.billed_statuses else None
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
        final = self._final_status(inst)
        if full:
            if self.profile is not None:
                provisioning, total = self.profile.boot_seconds(self.host_rng, inst.config.get("image"), inst.offer)
            else:
                total = self.rng.uniform(*BOOT_SECONDS)
                provisioning = total * self.rng.uniform(0.2, 0.4)
            self._set_status(inst, None, now)
            inst.schedule = [(now + provisioning, "loading"), (now + total, final)]
        else:
            self._set_status(inst, "loading", now)
            inst.schedule = [(now + self.rng.uniform(*RESTART_LOADING_SECONDS), final)]
        if self.profile is not None:
            self.profile.add_losses(self.host_rng, inst, now, final)

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

    # --- instances ------------------------------------------------------------------------------------------
    def create_instance(
        self, offer_id: int, request: dict[str, Any], now: float, *, new_id: Callable[[], int], api_key: str
    ) -> Instance:
        self.update(now)
        self.require_credit()
        offer = self.offers.get(offer_id)
        if offer is None:
            raise ApiError(404, "no_such_ask", f"No offer (ask) with id {offer_id} exists")
        reason = offer.unavailable_reason(self.machines.get(offer.machine_id))
        if reason:
            raise ApiError(409, "offer_unavailable", f"Offer {offer_id} is no longer available: {reason}")
        # Resolve the template before renting, so a bad request does not use the offer up.
        config, logins = configure(request, self.templates)
        instance_id = new_id()
        machine = self.machines.get(offer.machine_id)
        direct = config["runtype"] in DIRECT_RUNTYPES
        public_ip = machine.public_ip if machine else "198.51.100.1"
        ports, address = network(config, public_ip, local=self.local_ports, draw=lambda: self.rng.randint(20000, 60000))
        inst = Instance(
            id=instance_id,
            offer=offer,
            api_key=api_key,
            config=config,
            logins=logins,
            created_at=now,
            ssh_host=public_ip if direct else f"ssh{self.rng.randint(1, 9)}.gpumarket.test",
            ssh_port=self.rng.randint(20000, 60000) if direct else 10000 + instance_id % 50000,
            ports=ports,
            public_ipaddr=address,
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
        inst.gpu_fault = offer.gpu_check == "fail"
        if self.profile is not None and offer.fate == "running" and not inst.gpu_fault:
            attempt = draw_attempt(self.host_rng, self.profile, offer.reliability)
            inst.fate, inst.lost_after, inst.lost_status = attempt.fate, attempt.lost_after, attempt.lost_status
        if bid_loses(inst):  # made, but stopped: it lost to the machine's minimum before it ever ran
            config["target_state"] = "stopped"
            inst.awaiting_bid = True
        if config["target_state"] == "stopped":
            self._set_status(inst, "stopped", now)
        else:
            self._schedule_boot(inst, now, full=True)
        return inst

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
            if inst.status != "stopped" and inst.status not in FAILED_STATUSES:  # a failed host's status stays
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

    def set_gpu_check(self, offer_id: int, check: str) -> None:
        """``"fail"``: the machine's next rentals boot, but their ``nvidia-smi`` finds no driver; ``"ok"``: working."""
        if check not in GPU_CHECKS:
            raise ValueError(f"gpu_check must be one of {', '.join(GPU_CHECKS)}")
        self.offers[offer_id].gpu_check = check

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

    def state(self, now: float) -> dict[str, Any]:
        return world_state(self, now)
