"""P14: a rented service. Rental running -> the server answers -> a downstream task reaches it, and the provider's
client's requests per second against a raw ``httpx`` client on the same server, in one sitting.

    python bench/bench_service.py [--quick]

Readiness runs ``GpuMarketServiceOperator`` with the example DAG's server against the embedded simulator: boots at
60x, then the clock at 1x from the rental's first ``running`` (as P11), so the figures are real seconds. The bench
itself asks the server every 10 ms (over TLS, pinned to the certificate in the job's log) from the moment the
instance shows its address, which tells when it first answered; the downstream side is ``connect_service`` and
one request right after the task returned (Airflow's own scheduling of the next task is not in it). The client
figure starts the same server as a local process and sends small POSTs through each client in turn, both over TLS.
Readiness is measured twice: the example's server, which answers at once, and the same server after a
``LOAD_SECONDS`` load, as a model server loads its weights first. The certificate is read from the job's log,
which the service uploads a couple of seconds after a request: a server that answers sooner waits for it.
``--quick`` is a smoke run with the same lines.
"""

from __future__ import annotations

import argparse
import base64
import os
import runpy
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import bench_provider as b
import httpx

from gpumarket_simulator import MarketSimulator

ROOT = Path(__file__).resolve().parents[1]
#: The example DAG's stand-in model server.
SERVER: str = runpy.run_path(str(ROOT / "example_dags" / "example_gpumarket_service.py"))["SERVER"]
#: The task's poll_interval: the goal is to see the server ready within one of it.
POLL = 1.0
BOOT_SPEED = 60.0
#: The second case's load before the server listens: longer than the service takes to upload a log (2 s), shorter
#: than any model server's load of its weights.
LOAD_SECONDS = 5.0


def _slow_at_running(sim: MarketSimulator, offsets: dict[int, float], stop: threading.Event) -> threading.Thread:
    """The clock at 1x from the first rental's ``running`` on (sim - real kept by instance id)."""

    def watch() -> None:
        while not stop.wait(0.002):
            for instance in sim.state()["instances"]:
                if instance["id"] not in offsets and instance["first_running_at"] is not None:
                    sim.set_speed(1.0)
                    offsets[instance["id"]] = sim.now() - time.time()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _first_answer(sim: MarketSimulator, token: dict[str, str], stop: threading.Event, seen: dict) -> threading.Thread:
    """Record the real time the server first answers 200, asked every 10 ms once its address shows."""
    from airflow_gpumarket import job_logs, services

    def ask() -> None:
        while not stop.wait(0.01):
            for instance in sim.alive_instances():
                url = services.base_url(instance)
                output = (sim.onstart_result(instance["id"]) or {}).get("output", "")
                certificate = services.certificate_in(job_logs.split_lines(output, complete_only=True))
                if url is None or not token or not certificate:
                    continue
                try:
                    pinned = services.pinned_context(certificate)
                    if httpx.get(url + "/", headers=token, timeout=1, verify=pinned).status_code == 200:
                        seen.setdefault("answered", time.time())
                        return
                except httpx.HTTPError:
                    pass

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    return thread


def readiness_run(seed: int, load_seconds: float = 0.0) -> tuple[float, float]:
    """(running -> first answer, first answer -> a downstream request answered), real seconds, for one rental whose
    server first loads for ``load_seconds`` (as a model server loads its weights)."""
    from airflow_gpumarket import services
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
    from airflow_gpumarket.operators.service import GpuMarketServiceOperator
    from airflow_gpumarket.service_client import connect_service

    with MarketSimulator(speed=BOOT_SPEED, seed=seed, execute_onstart=True, **b.SIM_PROFILE) as sim:
        b.connect(sim)
        hook = GpuMarketHook()
        for offer in hook.search_offers(b.P10_FILTERS, limit=50):
            sim.set_offer_fate(offer["id"], "running")
        op = GpuMarketServiceOperator(
            task_id="serve",
            offer_filters=b.P10_FILTERS,
            image="bench",
            command=f"sleep {load_seconds:g}; {SERVER}" if load_seconds else SERVER,
            poll_interval=POLL,
        )
        stop, offsets, seen, token = threading.Event(), {}, {}, {}
        clock = _slow_at_running(sim, offsets, stop)

        def credential() -> None:  # the label is known once the instance exists
            while not stop.wait(0.005):
                for instance in sim.alive_instances():
                    key = services.token(hook.settings.api_key, instance["label"])
                    token["Authorization"] = f"Bearer {key}"
                    return

        threads = [threading.Thread(target=credential, daemon=True), _first_answer(sim, token, stop, seen)]
        threads[0].start()
        handed: dict[str, Any] = {}
        try:
            handed = op.execute(b.context(f"p14-{seed}"))
            ctx = {"ti": type("TI", (), {"xcom_pull": staticmethod(lambda task_ids: handed)})()}
            with connect_service("serve", context=ctx).client() as client:
                client.post("/embed", json=["ready"]).raise_for_status()
            reached = time.time()
        finally:
            stop.set()
            for thread in [clock, *threads]:
                thread.join(timeout=5)
            if handed:  # the teardown's part
                hook.destroy_instance(handed["instance_id"])
        instance = b.instance_record(sim, handed["instance_id"])
        running = instance["first_running_at"] - offsets[instance["id"]]
        return seen["answered"] - running, reached - seen["answered"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def client_rates(requests: int, rounds: int) -> tuple[float, float]:
    """Median requests per second through the provider's client and through a raw httpx client, in turns (both
    over TLS to the same certificate)."""
    from airflow_gpumarket import services
    from airflow_gpumarket.service_client import GpuMarketService

    folder = Path(tempfile.mkdtemp(prefix="gpm-p14-"))
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days",
         "1", "-subj", "/CN=gpumarket-service", "-keyout", str(folder / "key.pem"), "-out", str(folder / "cert.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    certificate = base64.b64encode(ssl.PEM_cert_to_DER_cert((folder / "cert.pem").read_text())).decode()
    port, credential = _free_port(), "bench-credential"
    env = {
        **os.environ,
        "GPUMARKET_SERVICE_PORT": str(port),
        "GPUMARKET_SERVICE_TOKEN": credential,
        "GPUMARKET_SERVICE_CERT": str(folder / "cert.pem"),
        "GPUMARKET_SERVICE_KEY": str(folder / "key.pem"),
    }
    server = subprocess.Popen(
        ["sh", "-c", SERVER], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    base = f"https://127.0.0.1:{port}"
    pinned = services.pinned_context(certificate)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(base + "/", timeout=1, verify=pinned)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        service = GpuMarketService(
            base_url=base, credential=credential, instance_id=0, hook=None, certificate=certificate
        )
        headers = {"Authorization": f"Bearer {credential}"}
        clients: dict[str, Any] = {
            "provider": service.client,
            "raw": lambda: httpx.Client(base_url=base, headers=headers, verify=pinned),
        }
        rates: dict[str, list[float]] = {name: [] for name in clients}
        for make in clients.values():  # a round each not counted: the first connections and imports
            with make() as client:
                client.post("/embed", json=["warm"]).raise_for_status()
        for _ in range(rounds):
            for name, make in clients.items():  # in turns, so machine noise hits both alike
                with make() as client:
                    started = time.perf_counter()
                    for _ in range(requests):
                        client.post("/embed", json=["a", "bb"]).raise_for_status()
                    rates[name].append(requests / (time.perf_counter() - started))
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the shell and the server it started
        server.wait(timeout=10)
    return statistics.median(rates["provider"]), statistics.median(rates["raw"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a smoke run: one rental, few requests")
    args = parser.parse_args()
    home = os.environ.get("AIRFLOW_HOME") or tempfile.mkdtemp(prefix="gpm-bench-")
    log_path = Path(home) / "bench_service.log"
    log_stream = b.route_logs_to(log_path)
    runs = 1 if args.quick else 3
    if shutil.which("openssl") is None:
        print("P14: not measured: openssl, which makes the service's certificate, is not on this machine")
        return 0
    try:
        for load, what in (
            (0.0, "a server that answers at once"),
            (LOAD_SECONDS, f"a server that loads {LOAD_SECONDS:g} s"),
        ):
            measured = [readiness_run(seed=40 + run, load_seconds=load) for run in range(runs)]
            answered = statistics.median(m[0] for m in measured)
            seen = statistics.median(m[1] for m in measured)
            print(
                f"P14 readiness, {what} (poll_interval {POLL:g} s, medians of {runs}): rental running -> server "
                f"answers {answered:.1f} s, server answers -> a downstream request answered {seen:.1f} s (runs "
                f"{', '.join(f'{m[1]:.1f}' for m in measured)}; goal: <= {POLL:g} s, one poll interval): "
                + ("met" if seen <= POLL else "MISSED")
            )
        provider, raw = client_rates(requests=50 if args.quick else 300, rounds=1 if args.quick else 5)
        print(
            f"P14 client: {provider:.0f} requests/s through connect_service's client vs {raw:.0f} through a raw "
            f"httpx.Client on the same server, {provider / raw:.2f}x (goal: >= 0.9x): "
            + ("met" if provider / raw >= 0.9 else "MISSED")
        )
    finally:
        log_stream.flush()
        print(f"bench_service: the log lines of Airflow and the simulator are in {log_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
