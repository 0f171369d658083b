"""Secrets a job takes from Airflow: where each comes from (checked as the DAG is parsed), read and masked at run time.

``secrets={"HF_TOKEN": "variable:hf_token", "WANDB_API_KEY": "connection:wandb"}`` names, for each environment
variable of the job, an Airflow Variable or a field of an Airflow Connection (its password unless
``connection:<conn_id>:<field>`` names another); Airflow's secrets backends answer both. ``registry_conn_id`` names
a Connection whose login, password and host log the service in to a private image's registry. Values are read
when the task runs, masked in Airflow by value whatever their names, and sent only in the create request: never in
a template field, XCom, the task state store or the GPU rentals page. A process that forwards the job's log
without holding them (the triggerer) masks them by salted digest (``digests``, read by ``job_logs.Redactor``).
"""

from __future__ import annotations

import hashlib
import re
import secrets as _random
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from airflow_gpumarket.exceptions import GpuMarketValidationError

SOURCES = ("variable", "connection")
#: The fields of a Connection a secret may name (``connection:<conn_id>:<field>``); the password by default.
CONNECTION_FIELDS = ("password", "login", "host", "schema")
#: Environment variables the provider sets itself: a secret may not take their names.
RESERVED_PREFIXES = ("GPUMARKET_", "CONTAINER_")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: A salted digest as ``job_logs.Redactor`` reads it: ``s:<length>:<salt>:<sha256 of salt + value>``.
DIGEST_PREFIX = "s:"
#: Values shorter than this are refused: Airflow masks none shorter (``[logging] min_length_masked_secret``).
MIN_LENGTH = 5
#: Words that make an ``env`` name a secret's, as whole parts of the name (``HF_TOKEN``, not ``TOKENIZERS_...``):
#: Airflow's default sensitive names, less those naming proxies.
SENSITIVE_WORDS = (
    "access_key",
    "access_token",
    "api_key",
    "apikey",
    "auth_header",
    "authorization",
    "bearer",
    "connection_string",
    "dsn",
    "keyfile_dict",
    "passphrase",
    "passwd",
    "password",
    "private_key",
    "secret",
    "service_account",
    "service_key",
    "token",
    "webhook_url",
)


class Reference(NamedTuple):
    """Where one secret comes from: a Variable's key, or a Connection's id and field."""

    source: str
    name: str
    field: str | None = None

    def __str__(self) -> str:
        return f"{self.source}:{self.name}" + (f":{self.field}" if self.field else "")


def check(secrets: Any, *, env: Any = None) -> dict[str, Reference]:
    """``secrets`` as ``{environment variable: Reference}``; a name ``env`` sets too is refused."""
    if secrets is None:
        return {}
    if not isinstance(secrets, Mapping):
        raise GpuMarketValidationError(
            "secrets",
            f'must be a dict of {{ENV_NAME: "variable:<key>" or "connection:<conn_id>"}}, got {type(secrets).__name__}',
        )
    plain = set(env) if isinstance(env, Mapping) else set()
    found: dict[str, Reference] = {}
    for name, where in secrets.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise GpuMarketValidationError(
                "secrets", f"{name!r} is not an environment variable name; use letters, digits and _ (e.g. HF_TOKEN)"
            )
        if name.startswith(RESERVED_PREFIXES):
            raise GpuMarketValidationError(
                f"secrets[{name!r}]", f"names starting with {' or '.join(RESERVED_PREFIXES)} are the provider's own"
            )
        if name in plain:
            raise GpuMarketValidationError(
                f"secrets[{name!r}]", "is also set in env; give the variable in one of them (secrets for a secret)"
            )
        found[name] = _reference(name, where)
    return found


def _reference(name: str, where: Any) -> Reference:
    source, _, rest = where.partition(":") if isinstance(where, str) else ("", "", "")
    if source not in SOURCES or not rest.strip():
        raise GpuMarketValidationError(
            f"secrets[{name!r}]",
            'must be "variable:<key>" or "connection:<conn_id>[:<field>]" (what was given is not shown: it may be '
            "the secret itself, which never goes in a DAG file)",
        )
    if source == "variable":
        return Reference(source, rest)
    conn_id, _, field = rest.rpartition(":")
    if not conn_id or field not in CONNECTION_FIELDS:
        return Reference(source, rest)  # no field named: its password (a conn_id may hold a colon)
    return Reference(source, conn_id, field)


def check_registry(registry_conn_id: Any, image_login: Any) -> None:
    """``registry_conn_id`` is a connection id, and not given beside ``image_login``."""
    if registry_conn_id is None:
        return
    if not isinstance(registry_conn_id, str) or not registry_conn_id.strip():
        raise GpuMarketValidationError(
            "registry_conn_id", f"must be the id of an Airflow connection, got {registry_conn_id!r}"
        )
    if image_login is not None:
        raise GpuMarketValidationError(
            "registry_conn_id", "and image_login both log in to the registry; keep registry_conn_id, drop image_login"
        )


def read_values(references: Mapping[str, Reference]) -> dict[str, str]:
    """Each secret's value, masked in Airflow by value. Raises ``GpuMarketValidationError`` naming a missing one."""
    from airflow_gpumarket._compat import mask_secret

    values = {}
    for name, ref in references.items():
        if ref.source == "connection":
            value = _connection_field(ref.name, ref.field or "password", f"secrets[{name!r}]")
        else:
            value = _variable(name, ref)
        if len(value) < MIN_LENGTH:
            raise GpuMarketValidationError(
                f"secrets[{name!r}]",
                f"{ref} holds {len(value)} characters (value not shown), too short for Airflow to mask in logs; use a "
                f"real token of at least {MIN_LENGTH} characters",
            )
        mask_secret(value)
        values[name] = value
    return values


def registry_login(conn_id: str) -> str:
    """``image_login`` made of connection ``conn_id``'s login, password and host, the password masked."""
    from airflow_gpumarket._compat import mask_secret

    field = "registry_conn_id"
    login = _connection_field(conn_id, "login", field)
    password = _connection_field(conn_id, "password", field)
    host = _connection_field(conn_id, "host", field)
    mask_secret(password)
    return f"-u {login} -p {password} {host}"


def _variable(name: str, ref: Reference) -> str:
    from airflow_gpumarket._compat import get_variable

    value = get_variable(ref.name)
    if not isinstance(value, str) or not value:
        raise GpuMarketValidationError(
            f"secrets[{name!r}]",
            f"Variable {ref.name!r} is not set (or empty); create it (Admin > Variables, AIRFLOW_VAR_"
            f"{ref.name.upper()} or a secrets backend). Nothing was rented",
        )
    return value


def _connection_field(conn_id: str, field: str, argument: str) -> str:
    from airflow_gpumarket._compat import AirflowNotFoundException, BaseHook

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise GpuMarketValidationError(
            argument,
            f"connection {conn_id!r} does not exist; create it (Admin > Connections, AIRFLOW_CONN_"
            f"{conn_id.upper()} or a secrets backend). Nothing was rented",
        ) from None
    value = getattr(conn, field, None)
    if not isinstance(value, str) or not value:
        raise GpuMarketValidationError(
            argument, f"connection {conn_id!r} has no {field}; set it, or name another field. Nothing was rented"
        )
    return value


def looks_secret(name: Any) -> bool:
    """Whether an environment variable's name holds one of ``SENSITIVE_WORDS`` as a whole part."""
    if not isinstance(name, str):
        return False
    padded = "_" + re.sub(r"\W+", "_", name.strip().lower()) + "_"
    return any(f"_{word}_" in padded for word in SENSITIVE_WORDS)


def exposed_in_env(env: Any) -> dict[str, str]:
    """The values ``env`` sets under a secret's name, long enough for Airflow to mask, each masked by value."""
    if not isinstance(env, Mapping):
        return {}
    from airflow_gpumarket._compat import mask_secret

    exposed = {k: v for k, v in env.items() if looks_secret(k) and isinstance(v, str) and len(v) >= MIN_LENGTH}
    for value in exposed.values():
        mask_secret(value)
    return exposed


class Read(NamedTuple):
    """A try's secrets as read: the job's environment, the registry login, the values' salted digests."""

    env: dict[str, str]
    image_login: str | None
    digests: tuple[str, ...]


class TrySecrets:
    """One try's secrets (``secrets`` and ``registry_conn_id``), read once: before its first create.

    Values ``env`` sets under a secret's name are masked too, and said once in ``log`` to belong in ``secrets``.
    """

    def __init__(self, secrets: Any, registry_conn_id: str | None, *, env: Any = None, log: Any = None) -> None:
        self.secrets = secrets
        self.registry_conn_id = registry_conn_id
        self.env = env
        self.log = log
        self._read: Read | None = None

    def read(self) -> Read:
        if self._read is None:
            values = read_values(check(self.secrets))
            login = registry_login(self.registry_conn_id) if self.registry_conn_id else None
            exposed = exposed_in_env(self.env)
            if exposed and self.log is not None:
                self.log.warning(
                    "env sets %s, named like a secret: masked in this log, but env is a template field kept with "
                    "the run. Move it to secrets= (e.g. secrets={%r: 'variable:<key>'}; see the secrets how-to)",
                    ", ".join(sorted(exposed)),
                    min(exposed),
                )
            self._read = Read(values, login, digests([*values.values(), *exposed.values()]))
        return self._read


def digests(values: Iterable[str]) -> tuple[str, ...]:
    """Salted digests by which a process that must not hold ``values`` still masks them in a log."""
    made = []
    for value in values:
        salt = _random.token_hex(8)
        made.append(f"{DIGEST_PREFIX}{len(value)}:{salt}:{salted(salt, value)}")
    return tuple(made)


def salted(salt: str, value: str) -> str:
    return hashlib.sha256((salt + value).encode()).hexdigest()
