"""A rented GPU as a service, as pure rules: its port, address, credential, certificate, readiness and lease.

The server listens on an *identity port* (``-p 70000:70000``): the service picks a port that is the same inside the
container and outside, and tells it in ``VAST_TCP_PORT_70000``; the simulator does the same, so one command runs on
both. The instance shows the host's address in ``public_ipaddr`` and the mapping in ``ports``, in Docker's shape,
under the port picked.

The credential is per rental: an HMAC of the connection's API key over the rental's label. The create request
carries it to the instance (``GPUMARKET_SERVICE_TOKEN``); a downstream task derives it again from the connection and
the label its setup task returned, so it is never stored. The certificate is made on the instance for the rental
(its key never leaves it), printed in the job's log, and pinned by every client. Imported when a DAG file is
parsed: standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from airflow_gpumarket.exceptions import GpuMarketValidationError

#: The identity port the server listens on, inside and outside alike.
SERVICE_PORT = 70000
#: The port mapping the create request asks for (an ``env`` entry).
PORT_MAPPING = f"-p {SERVICE_PORT}:{SERVICE_PORT}"
#: The variable that tells the server its port (``$VAST_TCP_PORT_70000``, else 70000).
PORT_VARIABLE = "GPUMARKET_SERVICE_PORT"
#: The variable that holds the rental's credential on the instance.
TOKEN_VARIABLE = "GPUMARKET_SERVICE_TOKEN"
#: The variables that give the server the rental's TLS certificate and its key (PEM files).
CERT_VARIABLE, KEY_VARIABLE = "GPUMARKET_SERVICE_CERT", "GPUMARKET_SERVICE_KEY"
#: The job wrapper's line that carries the certificate made on the instance (its DER, base64), before the server.
CERTIFICATE_LINE = "gpumarket: service certificate "
#: The line when no certificate could be made (no openssl on the image).
NO_CERTIFICATE_LINE = "gpumarket: no service certificate (openssl failed)"
#: The exit status of ``timeout`` when the lease ran out.
_TIMED_OUT = 124
#: Seconds the server has between the lease's TERM and a KILL.
_KILL_AFTER = 30


def token(api_key: str, label: str) -> str:
    """The rental's credential: whoever holds the connection's key and the rental's label can derive it."""
    return hmac.new(api_key.encode(), f"gpumarket-service:{label}".encode(), hashlib.sha256).hexdigest()


def address(instance: Mapping[str, Any]) -> tuple[str, int] | None:
    """The host and port of the instance's server, from ``public_ipaddr`` and ``ports``.

    The identity port shows under the port the service picked, mapped to itself (``{"41234/tcp": [{"HostPort":
    "41234"}]}``); other mappings (SSH's, the user's own) map to other ports. None while no single such entry shows.
    """
    host = instance.get("public_ipaddr")
    ports = instance.get("ports")
    if not isinstance(host, str) or not host.strip() or not isinstance(ports, Mapping):
        return None
    found = {port for key, mapped in ports.items() if (port := _identity(key, mapped)) is not None}
    return (host.strip(), found.pop()) if len(found) == 1 else None


def _identity(key: Any, mapped: Any) -> int | None:
    """The port of one ``ports`` entry when it maps a TCP port to itself."""
    if not isinstance(key, str) or not key.endswith("/tcp") or not isinstance(mapped, list):
        return None
    for each in mapped:
        try:
            inside, outside = int(key[: -len("/tcp")]), int(str(each.get("HostPort")))
        except (AttributeError, TypeError, ValueError):
            continue
        if inside == outside and 0 < inside < 65536:
            return inside
    return None


def base_url(instance: Mapping[str, Any], *, tls: bool = True) -> str | None:
    """``https://host:port`` (``http`` without ``tls``) of the instance's server; None while it shows no address."""
    found = address(instance)
    if found is None:
        return None
    host, port = found
    scheme = "https" if tls else "http"
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def certificate_in(lines: Any) -> str | None:
    """The certificate (DER, base64) a job wrapper's lines carry; ``""`` when it said none could be made."""
    for line in lines:
        if line.startswith(CERTIFICATE_LINE):
            return line[len(CERTIFICATE_LINE) :].strip()
        if line.startswith(NO_CERTIFICATE_LINE):
            return ""
    return None


def pinned_context(certificate: str) -> Any:
    """An SSL context that trusts ``certificate`` (DER, base64) and nothing else: the rental's own server."""
    import base64
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # the certificate itself is pinned; the host's address may show under any name
    context.load_verify_locations(cadata=ssl.DER_cert_to_PEM_cert(base64.b64decode(certificate)))
    return context


def ready_path(value: Any) -> str | None:
    """``ready_path``: an HTTP path starting with ``/``, or None for a TLS handshake only."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith("/") or any(c in value for c in " \r\n\t"):
        raise GpuMarketValidationError(
            "ready_path", f"must be a path starting with '/' and without spaces, or None; got {value!r}"
        )
    return value


def ready_status(value: Any) -> int:
    """``ready_status``: the HTTP status a ready server answers."""
    if not isinstance(value, int) or isinstance(value, bool) or not 100 <= value <= 599:
        raise GpuMarketValidationError("ready_status", f"must be an HTTP status from 100 to 599; got {value!r}")
    return value


#: Makes the rental's certificate on the instance (its key never leaves it) and prints the certificate.
_TLS = f"""gpm_tls="${{TMPDIR:-/tmp}}/gpumarket-tls-$$"
if mkdir -p "$gpm_tls" && chmod 700 "$gpm_tls" && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
  -nodes -days 30 -subj /CN=gpumarket-service -addext "subjectAltName=IP:${{PUBLIC_IPADDR:-127.0.0.1}}" \
  -keyout "$gpm_tls/key.pem" -out "$gpm_tls/cert.pem" >/dev/null 2>&1; then
  export {CERT_VARIABLE}="$gpm_tls/cert.pem" {KEY_VARIABLE}="$gpm_tls/key.pem"
  echo "{CERTIFICATE_LINE}$(openssl x509 -in "$gpm_tls/cert.pem" -outform DER | base64 | tr -d '\\n')"
else
  echo "{NO_CERTIFICATE_LINE}"
fi
"""


def server_command(command: str, lease_seconds: float) -> str:
    """The job wrapper's command for a server: its port and certificate told, ended at the lease, that end exit 0.

    Exit 0 makes the job wrapper destroy the instance itself, so a service outlives its lease by a KILL's grace at
    most even when Airflow never runs its teardown.
    """
    from airflow_gpumarket.job_script import shell_quote

    lease = max(1, int(lease_seconds))
    return (
        f'export {PORT_VARIABLE}="${{VAST_TCP_PORT_{SERVICE_PORT}:-{SERVICE_PORT}}}"\n'
        + _TLS
        + f"timeout -k {_KILL_AFTER} {lease} sh -c {shell_quote(command)}\n"
        "rc=$?\n"
        f'if [ "$rc" = {_TIMED_OUT} ]; then echo "gpumarket: the service\'s lease of {lease} s ended"; exit 0; fi\n'
        "exit $rc\n"
    )
