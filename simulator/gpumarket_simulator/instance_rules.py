"""The simulated server's rules for the instance endpoints' bodies: create, state, label, bid and logs requests.

Written from the server's side of the published API reference, as ``rules.py`` is (see there why).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from gpumarket_simulator.errors import bad_request
from gpumarket_simulator.instances import HIGHEST_PORT, IDENTITY_PORTS
from gpumarket_simulator.paths import ONSTART_MAX_CHARS
from gpumarket_simulator.rules import is_int, is_number, kind_of, one_of, present, require_object

RUNTYPES = frozenset({"ssh_direct", "ssh_proxy", "ssh", "jupyter_direct", "jupyter_proxy", "jupyter", "args"})
DIRECT_RUNTYPES = frozenset({"ssh_direct", "jupyter_direct"})
TARGET_STATES = frozenset({"running", "stopped"})

#: A disk this large cannot exist on one host; the cap also keeps the ledger's arithmetic finite.
MAX_DISK_GB = 100_000

_PORT_KEY = re.compile(r"^-p (\d{1,5}):(\d{1,5})(/(tcp|udp))?$")
_IMAGE_LOGIN = re.compile(r"^-u (\S+) -p (\S+) (\S+)$")


# --- Create instance ----------------------------------------------------------------------------------------
def validate_create(body: Any) -> dict[str, Any]:
    """Check the creation request fields; return only the fields that were given (nulls dropped)."""
    body = require_object(body)
    out: dict[str, Any] = {}
    for name in ("image", "template_hash_id"):
        if present(body, name):
            value = body[name]
            if not isinstance(value, str) or not value.strip():
                raise bad_request(f"{name} must be a non-empty string")
            out[name] = value
    if "image" not in out and "template_hash_id" not in out:
        raise bad_request("image is required unless template_hash_id is given", "missing_image")
    for name in ("label", "args_str", "jupyter_dir", "onstart"):
        if present(body, name):
            if not isinstance(body[name], str):
                raise bad_request(f"{name} must be a string, got {kind_of(body[name])}")
            out[name] = body[name]
    if "onstart" in out and len(out["onstart"]) > ONSTART_MAX_CHARS:
        raise bad_request(
            f"onstart is {len(out['onstart'])} characters; the limit is {ONSTART_MAX_CHARS}",
            "onstart_too_long",
        )
    if present(body, "disk"):
        disk = body["disk"]
        if not is_number(disk) or disk <= 0 or disk > MAX_DISK_GB:
            raise bad_request(f"disk must be a number of GB greater than 0 and at most {MAX_DISK_GB}")
        out["disk"] = disk
    if present(body, "price"):
        if not is_number(body["price"]) or body["price"] <= 0:
            raise bad_request("price must be a positive number of dollars per hour")
        out["price"] = body["price"]
    if present(body, "runtype"):
        if not one_of(body["runtype"], RUNTYPES):
            raise bad_request(f"runtype must be one of {', '.join(sorted(RUNTYPES))}")
        out["runtype"] = body["runtype"]
    if present(body, "target_state"):
        if not one_of(body["target_state"], TARGET_STATES):
            raise bad_request("target_state must be running or stopped")
        out["target_state"] = body["target_state"]
    for name in ("use_jupyter_lab", "python_utf8", "lang_utf8", "cancel_unavail", "vm"):
        if present(body, name):
            if not isinstance(body[name], bool):
                raise bad_request(f"{name} must be true or false, got {kind_of(body[name])}")
            out[name] = body[name]
    if present(body, "env"):
        out["env"] = validate_env(body["env"])
    if present(body, "image_login"):
        out["image_login"] = parse_image_login(body["image_login"])
    if present(body, "volume_info"):
        out["volume_info"] = validate_volume_info(body["volume_info"])
    return out


def validate_env(env: Any) -> dict[str, str]:
    """env is an object of variables plus ``"-p N:N": "1"`` port mappings (rule 1 of the spec)."""
    if not isinstance(env, dict):
        raise bad_request(
            f"env must be a JSON object of NAME: value pairs, got {kind_of(env)}; "
            "the '-e NAME=value -p 8080:8080' flag string is only for templates"
        )
    out: dict[str, str] = {}
    for key, value in env.items():
        if not key or "=" in key or "\x00" in key:
            raise bad_request(f"env key {key!r} is not a valid variable name")
        if key.startswith("-"):
            match = _PORT_KEY.match(key)
            ports = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
            identity = ports[0] == ports[1] and ports[0] in IDENTITY_PORTS  # public docs: picked by the service
            if not match or not (identity or all(1 <= port <= HIGHEST_PORT for port in ports)):
                raise bad_request(
                    f"env key {key!r} is neither a variable nor a '-p N:N' port mapping (N from 1 to "
                    f"{HIGHEST_PORT}, or the same N from {IDENTITY_PORTS.start} on both sides for an identity port)"
                )
            if value != "1":
                raise bad_request(f'the port mapping {key!r} takes the string value "1"')
            out[key] = value
            continue
        if isinstance(value, str):
            if "\x00" in value:
                raise bad_request(f"env value of {key} contains a NUL character")
            out[key] = value
        elif is_number(value):
            out[key] = str(value)
        else:
            raise bad_request(f"env value of {key} must be a string, got {kind_of(value)}")
    return out


def parse_template_env(env: Any) -> dict[str, str]:
    """A template's env: the flag-string form templates use (``-e A=1 -p 22:22``) or an object."""
    if env is None:
        return {}
    if isinstance(env, dict):
        return validate_env(env)
    if not isinstance(env, str):
        raise ValueError(f"template env must be a flag string or an object, got {kind_of(env)}")
    out: dict[str, str] = {}
    words = shlex.split(env)
    i = 0
    while i < len(words):
        flag = words[i]
        if flag in ("-e", "-p") and i + 1 < len(words):
            arg = words[i + 1]
            if flag == "-e":
                name, _, value = arg.partition("=")
                out[name] = value
            else:
                out[f"-p {arg}"] = "1"
            i += 2
        else:
            raise ValueError(f"cannot read template env flag {flag!r}; use -e NAME=value or -p N:N")
    return validate_env(out)


def parse_image_login(value: Any) -> dict[str, str]:
    """``-u <user> -p <token> <registry>`` -> the ``docker_login_*`` fields a template would carry."""
    match = _IMAGE_LOGIN.match(value) if isinstance(value, str) else None
    if not match:
        # The value holds a registry token: never echo it.
        raise bad_request("image_login must have the form '-u <user> -p <access_token> <registry_host>'")
    return {
        "docker_login_user": match.group(1),
        "docker_login_pass": match.group(2),
        "docker_login_repo": match.group(3),
    }


def validate_volume_info(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad_request("volume_info must be an object with volume_id and mount_path")
    unknown = set(value) - {"volume_id", "mount_path"}
    if unknown:
        raise bad_request(f"volume_info has unknown keys: {', '.join(sorted(unknown))}")
    if not is_int(value.get("volume_id")) or value["volume_id"] <= 0:
        raise bad_request("volume_info.volume_id must be a positive integer")
    mount = value.get("mount_path")
    if not isinstance(mount, str) or not mount.startswith("/"):
        raise bad_request("volume_info.mount_path must be an absolute path")
    return {"volume_id": value["volume_id"], "mount_path": mount}


def validate_state_change(body: Any) -> str:
    body = require_object(body)
    state = body.get("state")
    if not one_of(state, TARGET_STATES):
        raise bad_request("state must be stopped or running")
    return str(state)


def validate_instance_change(body: Any) -> tuple[str | None, str | None]:
    """Live profile: ``PUT /instances/{id}/`` takes ``state``, ``label`` or both; returns (state, label)."""
    body = require_object(body)
    state = body.get("state")
    label = body.get("label")
    if state is None and label is None:
        raise bad_request('send "state" (stopped or running), "label" (a string) or both')
    if state is not None and not one_of(state, TARGET_STATES):
        raise bad_request("state must be stopped or running")
    if label is not None and not isinstance(label, str):
        raise bad_request(f"label must be a string, got {kind_of(label)}")
    return state, label


def validate_change_bid(body: Any) -> float:
    """Validate ``PUT /instances/bid_price/{id}/`` and return the price.

    ``price`` is a number > 0 ($/h); ``client_id`` is "me" or the account's id, as the official client sends it.
    """
    body = require_object(body)
    price = body.get("price")
    if not is_number(price) or price <= 0:
        raise bad_request(f"price must be a number of dollars per hour greater than 0, got {price!r}")
    client = body.get("client_id", "me")
    if not (client == "me" or (isinstance(client, int) and not isinstance(client, bool))):
        raise bad_request(f'client_id must be "me" or your user id, got {client!r}')
    return float(price)


def validate_logs_request(body: Any) -> tuple[int | None, str | None, bool]:
    """Validate ``PUT /instances/request_logs/{id}/`` and return (tail, filter, daemon_logs).

    All are optional: ``tail`` (a number of lines, as a string the way the official client sends it, or a number),
    ``filter`` (text) and ``daemon_logs`` ("true"/"false" or a boolean).
    """
    body = require_object(body)
    tail = body.get("tail")
    if tail is not None:
        text = str(tail).strip() if isinstance(tail, str | int) and not isinstance(tail, bool) else ""
        if not text.isdigit() or int(text) <= 0:
            raise bad_request(f'tail must be a positive number of lines such as "1000", got {tail!r}')
        tail = int(text)
    log_filter = body.get("filter")
    if log_filter is not None and not isinstance(log_filter, str):
        raise bad_request(f"filter must be a string, got {kind_of(log_filter)}")
    daemon = body.get("daemon_logs", False)
    if isinstance(daemon, str) and daemon.lower() in ("true", "false"):
        daemon = daemon.lower() == "true"
    if not isinstance(daemon, bool):
        raise bad_request(f'daemon_logs must be "true" or "false", got {daemon!r}')
    return tail, log_filter or None, daemon
