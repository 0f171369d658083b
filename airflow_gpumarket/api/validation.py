"""Checks of single values against the spec's rules; each names the field and says how to fix it."""

from __future__ import annotations

import base64
import gzip
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeGuard

from airflow_gpumarket.api.paths import ONSTART_MAX_CHARS, ORDER_DIRECTIONS
from airflow_gpumarket.exceptions import (
    GpuMarketValidationError,
)

_PORT_KEY = re.compile(r"^-p (\d{1,5}):(\d{1,5})$")
HIGHEST_PORT = 65535
#: Public docs: ``-p N:N`` with N from 70000 asks for an identity port, one the service picks, the same outside and
#: inside the container, which finds it in ``VAST_TCP_PORT_<N>``.
IDENTITY_PORTS = range(70000, 100000)
OPERATOR_NAME = re.compile(r"^[a-z_]+$")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def is_positive_number(value: Any) -> TypeGuard[float]:
    return _is_number(value) and value > 0


def require_positive_number(field: str, value: Any) -> None:
    if not is_positive_number(value):
        raise GpuMarketValidationError(field, f"must be a number greater than 0, got {value!r}")


def require_non_negative_number(field: str, value: Any) -> None:
    if not _is_number(value) or value < 0:
        raise GpuMarketValidationError(field, f"must be a number of at least 0, got {value!r}")


def is_positive_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def require_positive_int(field: str, value: Any) -> None:
    if not is_positive_int(value):
        raise GpuMarketValidationError(field, f"must be a positive integer, got {value!r}")


def require_non_negative_int(field: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise GpuMarketValidationError(field, f"must be an integer of at least 0, got {value!r}")


def require_bool(field: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise GpuMarketValidationError(field, f"must be true or false, got {value!r}")


def require_text(field: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise GpuMarketValidationError(field, f"must be a non-empty string, got {value!r}")


def require_choice(field: str, value: Any, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise GpuMarketValidationError(field, f"{value!r} is not one of {', '.join(choices)}")


def require_field_names(field: str, value: Any) -> tuple[str, ...]:
    """``value`` as a tuple of field names: a list or tuple of non-empty strings (one string is refused)."""
    if (
        isinstance(value, str)
        or not isinstance(value, list | tuple)
        or not all(isinstance(v, str) and v for v in value)
    ):
        raise GpuMarketValidationError(field, f"must be a list of offer field names, like ['new_field'], got {value!r}")
    return tuple(value)


def drop_none(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Only the fields the caller gave are sent; nothing goes on the wire as null."""
    return {k: v for k, v in fields.items() if v is not None}


def port_mappings(*ports: int) -> dict[str, str]:
    """Build the env entries that open ports: ``port_mappings(8080, 22)`` -> ``{"-p 8080:8080": "1", ...}``.

    A port from 70000 is an identity port: the service picks one, the same outside and inside the container.
    """
    for port in ports:
        _require_port("port_mappings", port, identity=True)
    return {f"-p {port}:{port}": "1" for port in ports}


def _require_port(field: str, port: Any, *, identity: bool = False) -> None:
    """A port from 1 to 65535, or (``identity``: the same port on both sides) an identity port."""
    if (
        not isinstance(port, int)
        or isinstance(port, bool)
        or not (1 <= port <= HIGHEST_PORT or identity and port in IDENTITY_PORTS)
    ):
        raise GpuMarketValidationError(
            field,
            f"port must be an integer from 1 to {HIGHEST_PORT}, or the same port from {IDENTITY_PORTS.start} to "
            f"{IDENTITY_PORTS.stop - 1} on both sides (an identity port); got {port!r}",
        )


def validate_env(env: Any, field: str = "env") -> None:
    """env is a JSON object of string keys to string values; port mappings are ``"-p N:N": "1"``."""
    if not isinstance(env, Mapping):
        raise GpuMarketValidationError(
            field,
            f"must be an object of NAME: value pairs (a dict), got {type(env).__name__}; "
            "the '-e NAME=value -p 8080:8080' flag string is only for templates",
        )
    for key, value in env.items():
        if not isinstance(key, str) or not key:
            raise GpuMarketValidationError(field, f"keys must be non-empty strings, got {key!r}")
        if key.startswith("-"):
            match = _PORT_KEY.match(key)
            if not match:
                raise GpuMarketValidationError(
                    field, f"{key!r} is not a port mapping; write it as '-p 8080:8080' (see port_mappings())"
                )
            same = match.group(1) == match.group(2)
            _require_port(f"{field}[{key!r}]", int(match.group(1)), identity=same)
            _require_port(f"{field}[{key!r}]", int(match.group(2)), identity=same)
            if value != "1":
                raise GpuMarketValidationError(
                    f"{field}[{key!r}]", f'a port mapping takes the string value "1", got {value!r}'
                )
        elif not isinstance(value, str):
            raise GpuMarketValidationError(
                f"{field}[{key!r}]", f"environment values must be strings, got {type(value).__name__}; quote it"
            )


def env_variables(env: Mapping[str, str]) -> dict[str, str]:
    """The environment variables of an env object, without its port mappings."""
    return {k: v for k, v in env.items() if not k.startswith("-p ")}


def pack_onstart(script: str) -> str:
    """Return ``script`` unchanged when it fits the onstart limit, else a gzip+base64 self-unpacking form.

    :raises GpuMarketValidationError: when even the packed form exceeds 4048 characters.
    """
    if len(script) <= ONSTART_MAX_CHARS:
        return script
    payload = base64.b64encode(gzip.compress(script.encode(), compresslevel=9, mtime=0)).decode()
    # Unpacked into a file of this shell's own (two scripts on one host must never share one), removed at the end.
    packed = (
        "#!/bin/sh\n# packed by airflow-provider-gpumarket: gzip+base64 of the original script\n"
        'f="${TMPDIR:-/tmp}/.gpumarket_onstart.$$.sh"\n'
        f"echo '{payload}' | base64 -d | gunzip > \"$f\" || exit 1\n"
        'sh "$f"; rc=$?; rm -f "$f"; exit $rc\n'
    )
    if len(packed) > ONSTART_MAX_CHARS:
        raise GpuMarketValidationError(
            "onstart",
            f"the script is {len(script)} characters and still {len(packed)} after gzip+base64 packing, over "
            f"the service's {ONSTART_MAX_CHARS}-character limit; ship the code in the image or download it "
            "from the script instead",
        )
    return packed


def validate_onstart(onstart: Any) -> None:
    if not isinstance(onstart, str):
        raise GpuMarketValidationError("onstart", f"must be a string of shell commands, got {onstart!r}")
    if len(onstart) > ONSTART_MAX_CHARS:
        raise GpuMarketValidationError(
            "onstart",
            f"is {len(onstart)} characters, over the service's limit of {ONSTART_MAX_CHARS}; "
            "pack it with airflow_gpumarket.api.pack_onstart() (gzip+base64)",
        )


def validate_order(order: Any) -> list[list[str]]:
    if not isinstance(order, list | tuple):
        raise GpuMarketValidationError("order", f"must be a list of [field, direction] pairs, got {order!r}")
    pairs = []
    for pair in order:
        if not isinstance(pair, list | tuple) or len(pair) != 2 or not isinstance(pair[0], str):
            raise GpuMarketValidationError(
                "order", f"each entry must be a [field, direction] pair like ['dph_total', 'asc'], got {pair!r}"
            )
        require_choice(f"order[{pair[0]!r}]", pair[1], ORDER_DIRECTIONS)
        pairs.append([pair[0], pair[1]])
    return pairs


_IMAGE_LOGIN = re.compile(r"^-u \S+ -p \S+ \S+$")


def require_bid(field: str, price: Any) -> None:
    if not _is_number(price) or price <= 0:
        raise GpuMarketValidationError(
            field,
            f"must be a bid in dollars per hour greater than 0, got {price!r}; "
            "omit it for an on-demand (not interruptible) instance",
        )


def require_string(field: str, value: Any) -> None:
    if not isinstance(value, str):
        raise GpuMarketValidationError(field, f"must be a string, got {value!r}")


def require_image_login(field: str, value: Any) -> None:
    if not isinstance(value, str) or not _IMAGE_LOGIN.match(value):
        # The value holds a registry token: never echo it.
        raise GpuMarketValidationError(
            field, "must have the form '-u <user> -p <access_token> <registry_host>' (value not shown)"
        )


def validate_volume_info(volume_info: Any) -> None:
    if not isinstance(volume_info, Mapping):
        raise GpuMarketValidationError(
            "volume_info", f"must be an object {{'volume_id': int, 'mount_path': str}}, got {volume_info!r}"
        )
    unknown = set(volume_info) - {"volume_id", "mount_path"}
    if unknown:
        raise GpuMarketValidationError(
            "volume_info", f"unknown keys {sorted(unknown)}; only volume_id and mount_path are allowed"
        )
    require_positive_int("volume_info.volume_id", volume_info.get("volume_id"))
    mount_path = volume_info.get("mount_path")
    if not isinstance(mount_path, str) or not mount_path.startswith("/"):
        raise GpuMarketValidationError(
            "volume_info.mount_path", f"must be an absolute path like '/workspace/data', got {mount_path!r}"
        )


def _require_plain_path(field: str, path: str) -> None:
    if "\0" in path:
        raise GpuMarketValidationError(field, "contains a NUL character; remove it from the path")
    if ".." in path.split("/"):
        raise GpuMarketValidationError(
            field, f"must not contain '..' components, got {path!r}; write the path the copy should reach directly"
        )


def require_instance_path(field: str, path: Any) -> None:
    """An absolute path on an instance (``/workspace/out/``), without ``..`` components or NUL.

    The path is sent as given: a trailing ``/`` keeps whatever meaning the service's copy gives it.
    """
    if not isinstance(path, str) or not path.startswith("/"):
        raise GpuMarketValidationError(
            field, f"must be an absolute path on the instance like '/workspace/out/', got {path!r}"
        )
    _require_plain_path(field, path)


def require_integration_path(field: str, path: Any) -> None:
    """A non-empty path in a cloud integration's storage (``my-bucket/checkpoints``), without ``..`` or NUL.

    A leading ``/`` is allowed and sent unchanged, not stripped: the official CLI's own examples send ``/folder``,
    and whether it names the storage's root is the storage backend's reading, not the client's.
    """
    if not isinstance(path, str) or not path.strip():
        raise GpuMarketValidationError(
            field,
            f"must be a non-empty path in the cloud integration's storage like 'my-bucket/checkpoints', got {path!r}",
        )
    _require_plain_path(field, path)


def validate_copy_flags(flags: Any, field: str = "flags") -> list[str]:
    """Extra rclone flags of a cloud copy (``["--size-only"]``): a list of strings, each one ``--`` option."""
    if isinstance(flags, str) or not isinstance(flags, list | tuple):
        raise GpuMarketValidationError(field, f"must be a list of flags like ['--size-only'], got {flags!r}")
    for flag in flags:
        if (
            not isinstance(flag, str)
            or not flag.startswith("--")
            or len(flag) < 3
            or any(c.isspace() or c == "\0" for c in flag)
        ):
            raise GpuMarketValidationError(
                field,
                f"each flag must be one string starting with '--' like '--size-only' (a value joined by '='), "
                f"got {flag!r}",
            )
    return list(flags)
