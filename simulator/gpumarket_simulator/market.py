"""The simulator's core: world, clock, faults, onstart runner and request log behind one lock.

Both the HTTP routes and the Python API (``MarketSimulator``) go through this object, so they see the same
state and the same rules. States are brought up to date lazily on every access, and by a ticker thread so
that onstart scripts start even when nobody polls.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import itertools
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from gpumarket_simulator import market_swing
from gpumarket_simulator.bidding import parse_drift
from gpumarket_simulator.clock import SimClock
from gpumarket_simulator.copy_faults import parse_copy_faults
from gpumarket_simulator.faults import Faults
from gpumarket_simulator.hosts import nvidia_smi_script
from gpumarket_simulator.logs import LogUploads
from gpumarket_simulator.onstart import HALT_GRACE_SECONDS, OnstartRunner
from gpumarket_simulator.ratelimits import RateLimits
from gpumarket_simulator.storage import INSTANCE_ROOT_ENV, Storage
from gpumarket_simulator.world import World
from gpumarket_simulator.worldgen import SAMPLE_BUCKET_FILES, build_world

log = logging.getLogger(__name__)

#: ``live``: the service as public reports describe it today; ``spec``: exactly the published API reference.
PROFILES = ("live", "spec")
TICK_SECONDS = 0.05
REQUEST_LOG_SIZE = 10_000
FIRST_INSTANCE_ID = 12_000_001
#: Operations whose request body the request log keeps (a test can check that no storage credential is sent).
LOGGED_BODIES = frozenset({"create_instance"})
#: The request log's entry for the market's own doing: the $0 stop (``op``), with ``method`` EVENT.
EVENT_METHOD = "EVENT"
CREDIT_EXHAUSTED = "credit_exhausted"


def default_api_key(seed: int) -> str:
    """The account key when none is given: derived from the seed, so a CLI user can predict it."""
    return hashlib.sha256(f"gpumarket-sim-account-{seed}".encode()).hexdigest()[:40]


class Market:
    def __init__(
        self,
        *,
        speed: float = 60.0,
        seed: int = 0,
        api_key: str | None = None,
        execute_onstart: bool = False,
        world: dict[str, Any] | None = None,
        profile: str = "live",
        rate_limits: bool | None = None,
        data_dir: str | None = None,
        credit: float | None = None,
    ) -> None:
        if profile not in PROFILES:
            raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
        self.profile = profile
        #: The live service's per-endpoint buckets; on by default in the live profile only.
        self.rate_limits = RateLimits(profile == "live" if rate_limits is None else rate_limits)
        self.lock = threading.RLock()
        self.seed = seed
        self.api_key = api_key or default_api_key(seed)
        self._initial_speed = float(speed)
        # A starting credit given here replaces the world file's, for every reset too.
        self._overrides = world if credit is None else {**(world or {}), "credit": credit}
        # The clock starts at the wall-clock time of start-up (or the world file's start_time); a reset
        # rewinds it to that same instant, so a reset world is the same world.
        self._start_time = float(int(time.time()))
        self.world: World = build_world(seed, self._start_time, self._overrides)
        self.clock = SimClock(speed, self.world.start_time)
        self.faults = Faults(seed)
        self.runner = OnstartRunner(execute_onstart)
        self.world.local_ports = self.runner.enabled
        #: Instance disks, cloud buckets and the copies between them, under ``data_dir`` (default: a temp dir).
        self.storage = Storage(data_dir)
        for integration_id, files in self._buckets().items():
            self.storage.create_bucket(integration_id, files)
        self.log_uploads = LogUploads()
        self.requests: collections.deque[dict[str, Any]] = collections.deque(maxlen=REQUEST_LOG_SIZE)
        self.internal_errors = 0
        # Instance ids are never reused, not even across resets: a script left over from an earlier test
        # must not be able to reach a newer instance.
        self._instance_ids = itertools.count(FIRST_INSTANCE_ID)
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # --- life cycle ----------------------------------------------------------------------------------------
    def start_ticker(self) -> None:
        if self._ticker is None:
            self._ticker = threading.Thread(target=self._tick_forever, name="gpumarket-sim-ticker", daemon=True)
            self._ticker.start()

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2)
        self.runner.close()
        with self.lock:
            self.storage.close()

    def _tick_forever(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            try:
                if self.clock.speed > 0:
                    with self.transaction():
                        pass
            except Exception:  # the ticker must survive a bug; requests still update lazily
                log.exception("gpumarket-sim ticker failed")

    @contextmanager
    def transaction(self) -> Iterator[tuple[World, float]]:
        """Hold the lock with the world brought up to now; carry out the resulting side effects afterwards.

        The side effects (starting and halting onstart scripts) happen even when the request body raises: a 409
        or 404 answered by the request that happened to bring an instance to running must not lose its script.
        """
        events: list[tuple[str, int]] = []
        starts: list[tuple[int, str, dict[str, str], bool, dict[str, str]] | None] = []
        try:
            with self.lock:
                now = self.clock.now()
                try:
                    self.world.update(now)
                    self.storage.update(self.world, now)
                    self.world.settle_credit(now)  # a copy's bytes may have spent the last of the credit
                    yield self.world, now
                finally:
                    self._log_credit_stops()
                    events, self.world.events = self.world.events, []
                    for kind, iid in events:
                        if kind == "created":
                            self.storage.create_disk(iid)
                        elif kind == "destroyed":
                            self.storage.instance_destroyed(self.world, iid, now)
                    starts = [
                        self._onstart_job(iid, again=kind == "restarted")
                        for kind, iid in events
                        if kind in ("first_running", "restarted")
                    ]
        finally:
            killed = {iid for kind, iid in events if kind == "kill"}
            for kind, iid in events:
                if kind == "halt":
                    self.runner.halt(iid, grace=0.0 if iid in killed else HALT_GRACE_SECONDS)
            for job in starts:
                if job is not None:
                    self.runner.start(*job)

    def _onstart_job(
        self, instance_id: int, *, again: bool = False
    ) -> tuple[int, str, dict[str, str], bool, dict[str, str]] | None:
        inst = self.world.instances[instance_id]
        script = inst.config.get("onstart")
        # The service's entrypoint runs onstart for the SSH and Jupyter runtypes only (spec: onstart field).
        if not self.runner.enabled or not script or inst.config["runtype"] == "args":
            return None
        env = {k: v for k, v in inst.config["env"].items() if not k.startswith("-p ")}
        env.update(inst.port_env())
        env["CONTAINER_API_KEY"] = inst.api_key
        env[INSTANCE_ROOT_ENV] = self.storage.disk(instance_id)
        offer = inst.offer
        tools = {"nvidia-smi": nvidia_smi_script(offer.gpu_name, offer.num_gpus, works=not inst.gpu_fault)}
        return instance_id, script, env, again, tools

    def next_instance_id(self) -> int:
        return next(self._instance_ids)

    # --- auth and request log -------------------------------------------------------------------------------
    def principal(self, key: str | None) -> tuple[str, int | None]:
        """("account", None), ("instance", id), ("none", None) for no key, or ("invalid", None)."""
        if key is None:
            return "none", None
        if hmac.compare_digest(key.encode(), self.api_key.encode()):
            return "account", None
        instance_id = self.world.instance_keys.get(key)
        if instance_id is not None:
            return "instance", instance_id
        return "invalid", None

    def log_request(
        self,
        method: str,
        path: str,
        status: int | None,
        key: str,
        op: str | None,
        *,
        dropped: bool = False,
        body: Any = None,
    ) -> None:
        entry = {
            "t": self.clock.now(),
            "method": method,
            "path": path,
            "status": status,
            "key": key,
            "op": op,
            "dropped": dropped,
        }
        if op in LOGGED_BODIES:
            entry["body"] = body
        self.requests.append(entry)

    def _log_credit_stops(self) -> None:
        """Put the $0 stops into the request log, as the market's own entries (``key`` "service")."""
        account = self.world.account
        for stop in account.unlogged:
            self.requests.append(
                {
                    "t": stop["t"],
                    "method": EVENT_METHOD,
                    "path": "",
                    "status": None,
                    "key": "service",
                    "op": CREDIT_EXHAUSTED,
                    "dropped": False,
                    "credit": stop["credit"],
                    "stopped": list(stop["stopped"]),
                }
            )
        account.unlogged.clear()

    def note_internal_error(self) -> None:
        with self.lock:
            self.internal_errors += 1

    # --- admin operations (used by both the /_sim/ routes and MarketSimulator) ------------------------------
    def now(self) -> float:
        return self.clock.now()

    def state(self) -> dict[str, Any]:
        with self.transaction() as (world, now):
            state = world.state(now)
            state["speed"] = self.clock.speed
            state["faults"] = self.faults.view()
            state["internal_errors"] = self.internal_errors
            state["copies"] = self.storage.view()
            state["copy_settings"] = self.storage.settings()
            state["data_dir"] = self.storage.root
            state["requests"] = list(self.requests)
        return state

    def advance(self, seconds: float) -> float:
        with self.transaction():
            self.clock.advance(seconds)
        with self.transaction() as (_, now):
            return now

    def set_speed(self, speed: float) -> None:
        with self.transaction():
            self.clock.set_speed(speed)

    def _buckets(self) -> dict[int, dict[str, bytes]]:
        """Each cloud integration's bucket as the world begins: the default world's ``training-data`` has a sample."""
        return {c["id"]: dict(SAMPLE_BUCKET_FILES.get(c["name"], {})) for c in self.world.cloud_integrations}

    def reset(self, seed: int | None = None) -> None:
        with self.lock:
            if seed is not None:
                self.seed = seed
            self.runner.reset()
            self.world = build_world(self.seed, self._start_time, self._overrides)
            self.world.local_ports = self.runner.enabled
            self.storage.reset(self._buckets())
            self.clock.reset(self._initial_speed, self.world.start_time)
            self.faults.clear(self.seed)
            self.rate_limits.clear()
            self.log_uploads.clear()
            self.requests.clear()
            self.internal_errors = 0

    def force_status(self, instance_id: int, status: str | None) -> None:
        with self.transaction() as (world, now):
            world.force_status(instance_id, status, now)

    def outbid(self, instance_id: int, resume_after: float | None = None) -> None:
        with self.transaction() as (world, now):
            world.outbid(instance_id, now, resume_after)

    def set_competing_bid(self, offer_id: int, price: float | None) -> None:
        with self.transaction() as (world, now):
            world.set_competing_bid(offer_id, price, now)

    def set_bid_drift(self, drift: Any) -> None:
        """``None`` or ``{"interval": s, "volatility": v}`` (see bidding.py); ValueError naming the field."""
        parsed = parse_drift(drift)
        with self.transaction() as (world, now):
            world.bids.set_drift(parsed, now)

    def set_market_swing(self, swing: Any) -> dict[str, Any] | None:
        """Offers come and go, prices follow the day (``market_swing.parse``); ValueError naming the field."""
        with self.transaction() as (world, now):
            return market_swing.set_swing(world, swing, now)

    def set_offer_fate(self, offer_id: int, fate: str) -> None:
        with self.transaction() as (world, _):
            world.set_offer_fate(offer_id, fate)

    def set_gpu_check(self, offer_id: int, check: str) -> None:
        with self.transaction() as (world, _):
            world.set_gpu_check(offer_id, check)

    def vanish_offer(self, offer_id: int) -> None:
        with self.transaction() as (world, _):
            world.vanish_offer(offer_id)

    def set_machine_online(self, machine_id: int, online: bool) -> None:
        with self.transaction() as (world, now):
            world.set_machine_online(machine_id, online, now)

    def alive_instances(self) -> list[dict[str, Any]]:
        with self.transaction() as (world, _):
            return [i.admin_view() for i in world.live.values()]

    def onstart_result(self, instance_id: int) -> dict[str, Any] | None:
        with self.transaction():
            pass
        return self.runner.result(instance_id)

    def add_pending_price_increases(self, n: int, contract_id: int | None = None) -> list[dict[str, Any]]:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError("n must be an integer >= 0")
        if contract_id is not None and (isinstance(contract_id, bool) or not isinstance(contract_id, int)):
            raise ValueError("contract_id must be an integer or null")
        with self.transaction() as (world, now):
            inst = world.instances.get(contract_id) if contract_id is not None else None
            return world.price_increases.add(n, contract_id, inst.offer.host_id if inst else None, now)

    def account(self) -> dict[str, Any]:
        """The credit, what was put in and billed, the invoices and the $0 stops (``GET /_sim/account``)."""
        with self.transaction() as (world, _):
            return world.account.view()

    def set_credit(self, credit: float) -> dict[str, Any]:
        """Make the credit ``credit`` dollars (an invoice for the difference); ValueError if not a number."""
        with self.transaction() as (world, now):
            world.set_credit(credit, now)
            return world.account.view()

    def set_charges_delay(self, delay: Any) -> dict[str, Any]:
        """List a day's charges ``delay`` seconds after the day ends (None: as they accrue); ValueError if bad."""
        if delay is not None and (isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0):
            raise ValueError("charges_delay must be a number of seconds >= 0, or null to list charges as they accrue")
        with self.transaction() as (world, _):
            world.account.charges_delay = None if delay is None else float(delay)
            return world.account.view()

    def top_up(self, amount: float) -> dict[str, Any]:
        """Add ``amount`` dollars to the credit (an invoice); ValueError if not a number."""
        with self.transaction() as (world, now):
            world.top_up(amount, now)
            return world.account.view()

    def set_list_limit(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError("the list limit must be an integer >= 0")
        with self.lock:
            self.world.list_limit = limit

    def new_instance_key(self) -> str:
        return secrets.token_hex(24)

    def run(self, fn: Callable[[World, float], Any]) -> Any:
        with self.transaction() as (world, now):
            return fn(world, now)

    # --- storage: disks, buckets, copies (used by the /_sim/ routes and MarketSimulator) --------------------
    def copies(self) -> list[dict[str, Any]]:
        with self.transaction():
            return self.storage.view()

    def copy_settings(self) -> dict[str, Any]:
        with self.lock:
            return self.storage.settings()

    def set_copy_settings(self, settings: dict[str, Any]) -> dict[str, Any]:
        """Partial update of ``bytes_per_second``, ``start_latency_seconds``, ``status_delay_seconds``."""
        with self.transaction():
            self.storage.set_settings(settings)
            return self.storage.settings()

    def copy_faults(self) -> list[dict[str, Any]]:
        with self.lock:
            return [rule.view() for rule in self.storage.faults]

    def set_copy_faults(self, rules: Any) -> list[dict[str, Any]]:
        parsed = parse_copy_faults(rules)
        with self.lock:
            self.storage.faults = parsed
        return self.copy_faults()

    def _integration_root(self, integration_id: int) -> str:
        if not any(c["id"] == integration_id for c in self.world.cloud_integrations):
            raise KeyError(integration_id)
        return self.storage.bucket(integration_id)

    def _disk_root(self, instance_id: int) -> str:
        if instance_id not in self.world.live:
            raise KeyError(instance_id)
        return self.storage.disk(instance_id)

    def _root(self, where: str, ident: int) -> str:
        return self._integration_root(ident) if where == "bucket" else self._disk_root(ident)

    def list_files(self, where: str, ident: int) -> list[dict[str, Any]]:
        """The files of a bucket (``where="bucket"``, an integration id) or a disk (``"disk"``, an instance id)."""
        with self.transaction():
            return self.storage.list_files(self._root(where, ident))

    def read_file(self, where: str, ident: int, path: str) -> bytes:
        with self.transaction():
            full = self.storage.resolve(self._root(where, ident), path)
            if not os.path.isfile(full):
                raise FileNotFoundError(path)
            with open(full, "rb") as fh:
                return fh.read()

    def put_file(self, where: str, ident: int, path: str, data: bytes) -> dict[str, Any]:
        with self.transaction():
            full = self.storage.resolve(self._root(where, ident), path)
            if os.path.isdir(full):
                raise ValueError(f"{path!r} is a directory")
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as fh:
                fh.write(data)
            return {"path": os.path.relpath(full, self._root(where, ident)), "size": len(data)}

    def add_cloud_integration(self, name: Any, cloud_type: Any) -> dict[str, Any]:
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string")
        if not isinstance(cloud_type, str) or not cloud_type:
            raise ValueError("cloud_type must be a non-empty string (s3, gdrive, backblaze, ...)")
        with self.transaction() as (world, _):
            integration_id = int(max((c["id"] for c in world.cloud_integrations), default=0)) + 1
            integration: dict[str, Any] = {"id": integration_id, "cloud_type": cloud_type, "name": name}
            world.cloud_integrations.append(integration)
            self.storage.create_bucket(integration_id)
            return dict(integration)
