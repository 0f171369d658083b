"""Whether a rented service answers yet: one round of its readiness probe, for the task and for the triggerer.

A round (``round_flow``, a flow the sync and async hooks both run) reads the instance (its status and address),
the job's log while the rental's certificate is not known yet, then yields a ``Probe``: the driver asks the server
over TLS pinned to that certificate, blocking (``probe``) or awaited (``aprobe``). Whoever loops over rounds stops
at the first that ``settles`` or at its deadline.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from airflow_gpumarket import api, job_logs, services
from airflow_gpumarket.exceptions import GpuMarketError
from airflow_gpumarket.hooks.flow import Flow, Probe

#: Seconds one probe waits for an answer.
PROBE_TIMEOUT_SECONDS = 5.0
#: The log lines that carry the certificate, or say none could be made (a regular expression, as the log's filter).
CERTIFICATE_FILTER = "gpumarket: (no )?service certificate"


@dataclass(frozen=True)
class Round:
    """What one round saw: the instance's ``status`` (None: gone), the rental's ``certificate`` (``""``: none could
    be made on the instance), whether the server answered as ready at ``url``, and what was ``seen`` if not."""

    status: str | None
    certificate: str | None = None
    ready: bool = False
    seen: str = ""
    url: str | None = None

    @property
    def settles(self) -> bool:
        """Whether probing is over: ready, the instance no longer runs, or no certificate can ever come."""
        return self.ready or self.status != api.STATUS_RUNNING or self.certificate == ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, value: Any) -> Round:
        if not isinstance(value, dict):
            raise ValueError(f"not a probe's round: {value!r}")
        return cls(**{k: value.get(k) for k in ("status", "certificate", "url")}, ready=bool(value.get("ready")),
                   seen=str(value.get("seen") or ""))  # fmt: skip


def round_flow(
    hook: Any, instance_id: int, *, label: str, certificate: str | None, path: str | None, status: int
) -> Flow[Round]:
    """One round of the probe of ``instance_id``'s server; ``certificate``: the one a round before found."""
    try:
        instance = yield from hook.find_instance_flow(instance_id)
    except GpuMarketError as exc:  # a read that failed: not a verdict, the next round reads again
        return Round(api.STATUS_RUNNING, certificate, seen=f"reading the instance failed ({exc})")
    if instance is None or instance.get("actual_status") != api.STATUS_RUNNING:
        return Round(None if instance is None else instance.get("actual_status"), certificate)
    if certificate is None:
        try:
            text = yield from hook.get_instance_logs_flow(instance_id, filter=CERTIFICATE_FILTER, retry=False)
        except GpuMarketError:
            text = ""
        certificate = services.certificate_in(job_logs.split_lines(text, complete_only=True))
    url = services.base_url(instance)
    if certificate is None:
        return Round(api.STATUS_RUNNING, None, seen="the server's certificate was not in the job's log yet", url=url)
    if url is None or certificate == "":
        return Round(api.STATUS_RUNNING, certificate, seen="the instance showed no address for the service port")
    credential = services.token(hook.settings.api_key, label)
    ready, seen = yield Probe(url, path, status, credential=credential, certificate=certificate)
    return Round(api.STATUS_RUNNING, certificate, ready=ready, seen=seen, url=url)


def probe(effect: Probe) -> tuple[bool, str]:
    """Run ``effect``, blocking: whether the server is ready, and what was seen."""
    import socket

    import httpx

    pinned = services.pinned_context(effect.certificate)
    if effect.path is None:
        host, port = _host_port(effect.url)
        try:
            with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_SECONDS) as raw:
                pinned.wrap_socket(raw).close()
        except OSError as exc:
            return False, f"a TLS connect to {effect.url} failed ({exc.__class__.__name__})"
        return True, "it accepted a TLS connect"
    try:
        answer = httpx.get(
            effect.url + effect.path, headers=_headers(effect), verify=pinned, timeout=PROBE_TIMEOUT_SECONDS
        )
    except httpx.HTTPError as exc:
        return False, f"GET {effect.path} got no answer ({exc.__class__.__name__})"
    return _judged(effect, answer.status_code)


async def aprobe(effect: Probe) -> tuple[bool, str]:
    """Run ``effect`` without blocking the triggerer's loop: whether the server is ready, and what was seen."""
    import asyncio

    import httpx

    pinned = services.pinned_context(effect.certificate)
    if effect.path is None:
        host, port = _host_port(effect.url)
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_SECONDS):
                _, writer = await asyncio.open_connection(host, port, ssl=pinned)
            writer.close()
        except (OSError, TimeoutError) as exc:
            return False, f"a TLS connect to {effect.url} failed ({exc.__class__.__name__})"
        return True, "it accepted a TLS connect"
    try:
        async with httpx.AsyncClient(verify=pinned, timeout=PROBE_TIMEOUT_SECONDS) as client:
            answer = await client.get(effect.url + effect.path, headers=_headers(effect))
    except httpx.HTTPError as exc:
        return False, f"GET {effect.path} got no answer ({exc.__class__.__name__})"
    return _judged(effect, answer.status_code)


def _headers(effect: Probe) -> dict[str, str]:
    return {"Authorization": f"Bearer {effect.credential}"}


def _host_port(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("https://").rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)  # an IPv6 address comes bracketed


def _judged(effect: Probe, status_code: int) -> tuple[bool, str]:
    if status_code == effect.status:
        return True, f"GET {effect.path} answered {status_code}"
    return False, f"GET {effect.path} answered {status_code}, not {effect.status}"
