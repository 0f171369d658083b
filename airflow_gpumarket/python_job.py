"""A Python function as a job: the shell command that runs it on the instance, and its return value read back.

``@task.gpumarket`` ships the function's source and its JSON arguments inside the job's command (the job wrapper
of ``airflow_gpumarket.job_script`` runs it and packs the whole script under the onstart limit). On the instance,
``python3`` defines the function, calls it, and, only after it returned, prints one marker line carrying the
JSON return value in base64. The operator reads the job's log, takes the **last** marker line carrying this task
instance's key, and decodes it. Whatever the function printed comes before that line, so its own output cannot
pass for the result; an exception prints its traceback and exits 1. Pure functions; no Airflow import.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import secrets
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from airflow_gpumarket.exceptions import GpuMarketValidationError

#: Start of the marker line that carries the return value; the rest is ``<key> <base64 of the JSON>``.
RESULT_PREFIX = "GPUMARKET-RESULT-"
#: The largest return value, in bytes of JSON. Larger results belong in object storage (return their path).
RESULT_MAX_BYTES = 64 * 1024
#: Exit status of the runner when the function's return value cannot be sent back (not JSON, or too large).
RESULT_UNSENDABLE_STATUS = 86
#: A pip requirement or URL without spaces or shell syntax (each is also shell-quoted).
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-\[\],<>=!~*+:@/#]*$")

# The runner: the payload file holds the source, the function's name and its arguments. The source goes into a
# file of its own so that a traceback shows the function's lines. {limit}, {prefix} and {unsendable} are filled in.
_RUNNER = """import base64, json, os, sys, traceback
with open(sys.argv[1], encoding="utf-8") as fh:
    p = json.load(fh)
os.remove(sys.argv[1])
path = os.path.join(os.path.dirname(sys.argv[1]), "gpumarket_task_%d.py" % os.getpid())
with open(path, "w", encoding="utf-8") as fh:
    fh.write(p["source"])
try:
    ns = {{"__name__": "__gpumarket_task__"}}
    exec(compile(p["source"], path, "exec"), ns)
    try:
        value = ns[p["name"]](*p["args"], **p["kwargs"])
    except SystemExit as exc:
        if exc.code in (0, None):
            print("gpumarket: the function called sys.exit() instead of returning", file=sys.stderr)
            sys.exit(1)
        raise
    except Exception:
        traceback.print_exc()
        sys.exit(1)
    try:
        out = json.dumps(value)
    except (TypeError, ValueError) as exc:
        print("gpumarket: the return value is not JSON (%s): return dicts, lists, strings, numbers" % exc,
              file=sys.stderr)
        sys.exit({unsendable})
    if len(out.encode()) > {limit}:
        print("gpumarket: the return value is %d bytes of JSON, over the %d allowed: write it to object storage "
              "and return its path" % (len(out.encode()), {limit}), file=sys.stderr)
        sys.exit({unsendable})
    sys.stdout.flush()
    sys.stderr.flush()
    line = "\\n{prefix}" + p["key"] + " " + base64.b64encode(out.encode()).decode()
finally:
    os.remove(path)
print(line, flush=True)
os._exit(0)  # the marker is the last thing printed: threads the function left behind print nothing after it
"""


def marker(key: str) -> str:
    """The marker of one task instance's result.

    It is the rental key: the same on every try, so a retry that adopts the earlier try's instance reads its result.
    """
    return f"{RESULT_PREFIX}{key}"


def json_arguments(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """The arguments as JSON values; a validation error naming the argument that is not one."""
    named = [("op_args", f"positional argument {i + 1}", v) for i, v in enumerate(args)]
    named += [("op_kwargs", f"argument {k!r}", v) for k, v in kwargs.items()]
    for field, where, value in named:
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise GpuMarketValidationError(
                field,
                f"{where} of the function is not a JSON value ({exc}); pass JSON values (dict, list, str, number, "
                "bool, None), or write large or binary inputs to object storage and pass their path",
            ) from None
    return list(args), dict(kwargs)


def _delimiter(text: str) -> str:
    while True:
        candidate = f"GPUMARKET_PY_{secrets.token_hex(4).upper()}"
        if candidate not in text:
            return candidate


def build_command(
    *,
    source: str,
    name: str,
    key: str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    requirements: Iterable[str] = (),
    python: str = "python3",
) -> str:
    """The shell command that runs ``name`` from ``source`` and prints its result's marker line.

    It installs ``requirements`` first and runs the function with the arguments under ``python`` (see the module
    docstring).
    """
    args, kw = json_arguments(args, kwargs or {})
    payload = json.dumps({"source": source, "name": name, "key": key, "args": args, "kwargs": kw})
    runner = _RUNNER.format(limit=RESULT_MAX_BYTES, prefix=RESULT_PREFIX, unsendable=RESULT_UNSENDABLE_STATUS)
    data_end, code_end = _delimiter(payload), _delimiter(runner + payload)
    lines = ['GPM_PAYLOAD="${TMPDIR:-/tmp}/gpumarket-payload-$$.json"', f"cat > \"$GPM_PAYLOAD\" <<'{data_end}'"]
    lines += [payload, data_end]
    reqs = [validate_requirement(r) for r in requirements]
    if reqs:
        quoted = " ".join(shlex.quote(r) for r in reqs)
        lines.append(f"{python} -m pip install --quiet --disable-pip-version-check {quoted} || exit $?")
    lines += [f"{python} - \"$GPM_PAYLOAD\" <<'{code_end}'", runner.rstrip("\n"), code_end]
    return "\n".join(lines)


def validate_requirement(requirement: Any) -> str:
    if not isinstance(requirement, str) or not _REQUIREMENT.match(requirement.strip()):
        raise GpuMarketValidationError(
            "requirements", f"{requirement!r} is not a pip requirement such as 'scikit-learn==1.5.2' or 'torch>=2'"
        )
    return requirement.strip()


def read_result(text: str, key: str) -> tuple[bool, Any]:
    """(True, value) from the last marker line of this key in the job's log; (False, None) without one."""
    prefix = marker(key) + " "
    found = None
    for line in text.splitlines():
        if line.startswith(prefix):
            found = line[len(prefix) :].strip()
    if found is None:
        return False, None
    try:
        return True, json.loads(base64.b64decode(found, validate=True).decode())
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return False, None


def is_marker_line(line: str) -> bool:
    return line.startswith(RESULT_PREFIX)
