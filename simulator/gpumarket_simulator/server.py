"""``MarketSimulator``: the simulator as a context manager, served by uvicorn in a background thread."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gpumarket_simulator.market import Market
from gpumarket_simulator.worldgen import load_world_file

CONNECTION_ENV = "AIRFLOW_CONN_GPUMARKET_DEFAULT"
STARTUP_TIMEOUT_SECONDS = 10.0
KEEP_ALIVE_SECONDS = 60


class MarketSimulator:
    """A running simulated marketplace on a loopback port.

    ``with MarketSimulator(speed=600) as sim: ...`` gives ``sim.url``, ``sim.api_key``, ``sim.conn_uri`` and
    the admin methods below. ``speed`` is simulated seconds per real second (0 freezes the clock: only
    :meth:`advance` moves it). ``world`` is a world file path or an already loaded dict (see
    docs/simulator.md). ``data_dir`` holds the instance disks and cloud buckets (default: a temporary directory,
    removed on close). ``credit`` is the account's starting credit in dollars (default: the world file's, else
    $100). Every method is thread-safe.
    """

    def __init__(
        self,
        speed: float = 60.0,
        seed: int = 0,
        api_key: str | None = None,
        execute_onstart: bool = False,
        world: str | os.PathLike[str] | dict[str, Any] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        profile: str = "live",
        rate_limits: bool | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        credit: float | None = None,
    ) -> None:
        overrides = load_world_file(world) if isinstance(world, str | Path | os.PathLike) else world
        self._market = Market(
            speed=speed,
            seed=seed,
            api_key=api_key,
            execute_onstart=execute_onstart,
            world=overrides,
            profile=profile,
            rate_limits=rate_limits,
            data_dir=None if data_dir is None else os.fspath(data_dir),
            credit=credit,
        )
        self.host = host
        self._requested_port = port
        self.port: int | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None

    # --- life cycle -----------------------------------------------------------------------------------------
    def start(self) -> MarketSimulator:
        if self._thread is not None:
            return self
        import uvicorn

        from gpumarket_simulator.app import build_app

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self._requested_port))
        except OSError:
            sock.close()
            raise
        self._socket = sock
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            build_app(self._market),
            log_config=None,  # leave the host process's logging configuration alone
            log_level="warning",
            access_log=False,
            lifespan="off",
            proxy_headers=False,  # the loopback check must see the real peer, not a header
            server_header=False,
            date_header=False,
            timeout_graceful_shutdown=2,
            # Idle connections are kept as long as a load balancer in front of a real service keeps them, so
            # clients must expire theirs first (see CLIENT_KEEPALIVE_SECONDS in the hook).
            timeout_keep_alive=KEEP_ALIVE_SECONDS,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="gpumarket-sim-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("gpumarket-sim did not start; see the log above")
            time.sleep(0.002)
        self._market.start_ticker()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._market.close()
        if self._socket is not None:
            self._socket.close()
        self._thread = None
        self._server = None
        self._socket = None

    def __enter__(self) -> MarketSimulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- how to reach it ------------------------------------------------------------------------------------
    @property
    def _netloc(self) -> str:
        if self.port is None:
            raise RuntimeError("the simulator is not started; use it as a context manager or call start()")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self._netloc}"

    @property
    def api_key(self) -> str:
        return self._market.api_key

    @property
    def rate_limit_scale(self) -> float:
        """The connection extra ``rate_limit_scale`` that fits this simulator now.

        Its buckets refill on its clock, so at speed S they allow S times the published budgets. It is 0 (the client
        paces nothing) when the simulator has no buckets (the spec profile, rate limits off) or a frozen clock, which
        only ``advance`` refills.
        """
        market = self._market
        if market.profile != "live" or not market.rate_limits.enabled or market.clock.speed <= 0:
            return 0.0
        return market.clock.speed

    @property
    def conn_uri(self) -> str:
        """The Airflow connection URI for this simulator.

        The key is the password, the host has no scheme (plain http implied), and the extra travels as JSON in
        ``__extra__``, so its ``rate_limit_scale`` stays a number (Airflow would warn of a query value's short
        string as too short a secret to mask). It is the current scale: a later speed change is not in it.
        """
        extra = quote(json.dumps(self._extra(), separators=(",", ":")), safe="")
        return f"gpumarket://:{quote(self.api_key, safe='')}@{self._netloc}?__extra__={extra}"

    def connection_env(self) -> dict[str, str]:
        connection = {"conn_type": "gpumarket", "host": self.url, "password": self.api_key, "extra": self._extra()}
        return {CONNECTION_ENV: json.dumps(connection)}

    def _extra(self) -> dict[str, float]:
        return {"rate_limit_scale": self.rate_limit_scale}

    # --- admin ----------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The same document as ``GET /_sim/state`` (a JSON round trip, so it is a copy)."""
        return json.loads(json.dumps(self._market.state()))

    def now(self) -> float:
        return self._market.now()

    def advance(self, seconds: float) -> float:
        return self._market.advance(seconds)

    def set_speed(self, speed: float) -> None:
        self._market.set_speed(speed)

    def reset(self, seed: int | None = None) -> None:
        self._market.reset(seed)

    def set_faults(self, rules: list[dict[str, Any]]) -> None:
        self._market.faults.set_rules(rules)

    def clear_faults(self) -> None:
        self._market.faults.clear()

    def force_status(self, instance_id: int, status: str | None) -> None:
        self._market.force_status(instance_id, status)

    def outbid(self, instance_id: int, resume_after: float | None = None) -> None:
        """A higher bid takes a bid instance's machine (``POST /_sim/instances/{id}/outbid``): see docs/simulator.md."""
        self._market.outbid(instance_id, resume_after)

    def set_competing_bid(self, offer_id: int, price: float | None) -> None:
        """Someone else bids ``price`` $/h for the offer's machine (``POST /_sim/offers/{id}/competing-bid``).

        A bid of ours below it is outbid at once and resumes by itself once it wins again. See docs/simulator.md.
        """
        self._market.set_competing_bid(offer_id, price)

    def set_bid_drift(self, interval: float | None, volatility: float = 0.3) -> None:
        """Competing bids move on their own every ``interval`` simulated seconds (None: they stop moving).

        Same as ``PUT /_sim/bid-drift``. See docs/simulator.md.
        """
        self._market.set_bid_drift(None if interval is None else {"interval": interval, "volatility": volatility})

    def set_market_swing(self, swing: dict[str, Any] | None) -> dict[str, Any] | None:
        """Offers come and go and prices follow the day's demand, seeded (None: they stop).

        Same as ``PUT /_sim/market-swing``. See docs/simulator.md.
        """
        return self._market.set_market_swing(swing)

    def set_offer_fate(self, offer_id: int, fate: str) -> None:
        self._market.set_offer_fate(offer_id, fate)

    def set_gpu_check(self, offer_id: int, check: str) -> None:
        """Make the offer's machine fail (``"fail"``) or pass (``"ok"``) the GPU check of its next rentals."""
        self._market.set_gpu_check(offer_id, check)

    def vanish_offer(self, offer_id: int) -> None:
        self._market.vanish_offer(offer_id)

    def set_machine_online(self, machine_id: int, online: bool) -> None:
        self._market.set_machine_online(machine_id, online)

    def alive_instances(self) -> list[dict[str, Any]]:
        return json.loads(json.dumps(self._market.alive_instances()))

    def onstart_result(self, instance_id: int) -> dict[str, Any] | None:
        return self._market.onstart_result(instance_id)

    def add_pending_price_increases(self, n: int, contract_id: int | None = None) -> list[dict[str, Any]]:
        return self._market.add_pending_price_increases(n, contract_id)

    def set_list_limit(self, n: int) -> None:
        self._market.set_list_limit(n)

    def set_rate_limits(self, enabled: bool) -> None:
        """The live profile's per-endpoint buckets on or off (emptied either way), as ``PUT /_sim/rate-limits``."""
        with self._market.lock:
            self._market.rate_limits.enabled = enabled
            self._market.rate_limits.clear()

    def requests(self) -> list[dict[str, Any]]:
        """The request log of the API (not of /_sim/), oldest first, with the $0 stops (``op`` credit_exhausted)."""
        return list(self._market.requests)

    # --- money ----------------------------------------------------------------------------------------------
    def account(self) -> dict[str, Any]:
        """The credit, invoices and $0 stops, as ``GET /_sim/account``."""
        return json.loads(json.dumps(self._market.account()))

    def set_charges_delay(self, delay: float | None) -> dict[str, Any]:
        """List a UTC day's charges ``delay`` seconds after it ends (None: as they accrue), as ``POST /_sim/account
        {"charges_delay": ...}``."""
        return json.loads(json.dumps(self._market.set_charges_delay(delay)))

    def set_credit(self, credit: float) -> dict[str, Any]:
        """Make the account's credit ``credit`` dollars, as ``POST /_sim/account {"credit": ...}``."""
        return json.loads(json.dumps(self._market.set_credit(credit)))

    def top_up(self, amount: float) -> dict[str, Any]:
        """Add ``amount`` dollars to the account's credit, as ``POST /_sim/account {"top_up": ...}``."""
        return json.loads(json.dumps(self._market.top_up(amount)))

    # --- storage: disks, buckets, copies --------------------------------------------------------------------
    @property
    def data_dir(self) -> str:
        return self._market.storage.root

    def disk_dir(self, instance_id: int) -> str:
        """The instance's disk (its ``GPUMARKET_INSTANCE_ROOT``): instance path ``/a/b`` is ``<disk>/a/b``."""
        return self._market.storage.disk(instance_id)

    def bucket_dir(self, integration_id: int) -> str:
        return self._market.storage.bucket(integration_id)

    def copies(self) -> list[dict[str, Any]]:
        """Every copy requested since the last reset, as ``GET /_sim/copies``."""
        return json.loads(json.dumps(self._market.copies()))

    def set_copy_settings(self, **settings: float) -> dict[str, Any]:
        """``bytes_per_second``, ``start_latency_seconds``, ``status_delay_seconds``, as ``PUT /_sim/copy-settings``."""
        return self._market.set_copy_settings(settings)

    def set_copy_faults(self, rules: list[dict[str, Any]]) -> None:
        """The next copies fail after a fraction of their files, as ``PUT /_sim/copy-faults``."""
        self._market.set_copy_faults(rules)

    def add_cloud_integration(self, name: str, cloud_type: str) -> dict[str, Any]:
        return self._market.add_cloud_integration(name, cloud_type)

    def bucket_files(self, integration_id: int) -> list[dict[str, Any]]:
        return self._market.list_files("bucket", integration_id)

    def disk_files(self, instance_id: int) -> list[dict[str, Any]]:
        return self._market.list_files("disk", instance_id)

    def read_bucket_file(self, integration_id: int, path: str) -> bytes:
        return self._market.read_file("bucket", integration_id, path)

    def read_disk_file(self, instance_id: int, path: str) -> bytes:
        return self._market.read_file("disk", instance_id, path)

    def put_bucket_file(self, integration_id: int, path: str, data: bytes) -> None:
        self._market.put_file("bucket", integration_id, path, data)

    def put_disk_file(self, instance_id: int, path: str, data: bytes) -> None:
        self._market.put_file("disk", instance_id, path, data)
