"""Templates: the configuration an instance gets from its create request and the template it names (rules 1-6)."""

from __future__ import annotations

import re
from typing import Any

from gpumarket_simulator.errors import bad_request

#: Disk in GB an instance gets when its creation names none (the spec does not say; this is the simulator's choice).
DEFAULT_DISK_GB = 8
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


def configure(request: dict[str, Any], templates: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    """Apply the template rules 1-6 of the spec: template as base, request values win, env merged."""
    config: dict[str, Any] = {"env": {}}
    logins: dict[str, str] = {}
    hash_id = request.get("template_hash_id")
    if hash_id is not None:
        template = templates.get(hash_id)
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
