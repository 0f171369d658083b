"""The completion protocol: wrap a job command into an onstart script that ends its own billing.

The service emits no events, but every instance gets a restricted key (``CONTAINER_API_KEY``) that may stop or
destroy that one instance. The wrapper runs the user's command, then:

- any exit status -> stops its own instance (compute billing stops at once; disk storage bills until the
  operator, having read the end of the job's log with every line since its last read and the exit status,
  destroys the instance a few seconds later);
- exit status 0 with ``stop_on_success=False`` (the operator reads no log: ``log_interval=0``, or a created
  instance's command that nobody waits for) -> destroys its own instance (all billing stops at once; its output
  goes with it).

The command's stdout and stderr both go to the wrapper's output, which the service keeps as the container's log
(read back through the logs endpoint, see ``airflow_gpumarket.job_logs``); the wrapper's last line before ending
billing is ``EXIT_STATUS_LINE``, which the operator parses. The command is written to a temporary file that the
wrapper removes when it ends.

The operator reads the outcome from the log's status line (with ``stop_on_success=False``: gone = succeeded,
stopped = failed). The wrapper keeps the command's
exit status as its own, needs only ``sh`` plus one of curl, python3 or wget, and retries its callback. It assumes
the instance exposes ``CONTAINER_API_KEY`` (stated by the spec) and ``CONTAINER_ID`` (its own id; assumed, not in
the spec) to the onstart script. The API key of the account never appears in the script.
"""

from __future__ import annotations

import functools
import re
import secrets
from collections.abc import Iterable

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import GpuMarketValidationError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: The line the wrapper prints when the command ended; the operator reads the status from it.
EXIT_STATUS_LINE = "gpumarket: job exited with status {rc}"
#: The line the wrapper prints before it runs the command.
STARTED_LINE = "gpumarket: job started"
#: How every line the wrapper itself prints begins: a log without one holds nothing of the wrapper.
WRAPPER_LINE_PREFIX = "gpumarket: "
# {url}, {delimiter}, {command}, {export_env}, {run}, {kill_writer}, {exit_line}, {tries} and {timeout} are filled
# in; everything else is literal shell.
#: The exit status of a wrapper whose preflight failed: the host, not the job, failed (the job never ran). The
#: provider tells it by ``PREFLIGHT_FAILED_LINE`` as well, so a command that itself exits with it is the job's.
PREFLIGHT_FAILED_STATUS = 69
#: The one line a failed preflight prints: ``{check}`` is ``gpus`` or ``command``, ``{seen}`` what it found.
PREFLIGHT_FAILED_LINE = "gpumarket: preflight failed ({check}): {seen}"
#: Characters of the checks' output that the marker line quotes at most.
PREFLIGHT_SEEN_CHARS = 200
#: Tries of the wrapper's own call that ends billing, and seconds each waits for an answer.
END_BILLING_TRIES = 6
END_BILLING_TIMEOUT_SECONDS = 30

_TEMPLATE = """#!/bin/sh
# airflow-provider-gpumarket job wrapper: run the command, then end billing from inside the instance.
# exit 0 -> stop this instance (destroy it when nobody reads its log); other exit status -> stop it.
GPM_URL='{url}'"$CONTAINER_ID/"
GPM_JOB="${{TMPDIR:-/tmp}}/gpumarket-job-$$.sh"
trap 'rm -f "$GPM_JOB"{kill_writer}' EXIT
trap 'exit 143' HUP INT TERM
cat > "$GPM_JOB" <<'{delimiter}'
{command}
{delimiter}
{export_env}{preflight}{run}{preflight_end}rm -f "$GPM_JOB"
echo "{exit_line}"
if [ "$rc" -eq 0 ]; then {on_success}; else m=PUT; b='{{"state":"stopped"}}'; fi
gpm_call() {{
  if command -v curl >/dev/null 2>&1; then
    if [ -n "$b" ]; then set -- -d "$b"; else set --; fi
    curl -fsS --max-time {timeout} -o /dev/null -X "$m" -H "Authorization: Bearer $CONTAINER_API_KEY" \\
      -H 'Content-Type: application/json' "$@" "$GPM_URL"
  elif command -v python3 >/dev/null 2>&1; then
    python3 -c 'import os,sys,urllib.request as u
u.urlopen(u.Request(sys.argv[1],data=sys.argv[3].encode() or None,method=sys.argv[2],headers={{"Authorization":"Bearer "+os.environ["CONTAINER_API_KEY"],"Content-Type":"application/json"}}),timeout={timeout})' "$GPM_URL" "$m" "$b"
  else
    if [ -n "$b" ]; then set -- --body-data="$b"; else set --; fi
    wget -q --timeout={timeout} -O /dev/null --method="$m" --header="Authorization: Bearer $CONTAINER_API_KEY" \\
      --header='Content-Type: application/json' "$@" "$GPM_URL"
  fi
}}
i=0
until gpm_call; do
  i=$((i+1)); [ "$i" -ge {tries} ] && echo "gpumarket: could not end billing ($m); the operator will" && break
  sleep $((i*i))
done
exit "$rc"
"""


# The preflight: the GPUs the offer promised are visible, then the user's check passes; else one marker line and
# PREFLIGHT_FAILED_STATUS, without running (or staging for) the command.
_PREFLIGHT_GPUS = """GPM_PF=$(nvidia-smi -L 2>&1); GPM_N=$(printf '%s\\n' "$GPM_PF" | grep -c '^GPU [0-9]')
[ "$GPM_N" -ge {gpus} ] || GPM_PF="expected {gpus} GPUs, nvidia-smi -L listed $GPM_N: $(printf '%s' "$GPM_PF" | head -n 1)" \
  GPM_CHECK=gpus
"""
_PREFLIGHT_COMMAND = """if [ -z "$GPM_CHECK" ]; then GPM_PF=$(sh -c {command} 2>&1) || GPM_PF="exit status $?: $(printf '%s' \
  "$GPM_PF" | tail -n 1)" GPM_CHECK=command; fi
"""
_PREFLIGHT_END = """if [ -n "$GPM_CHECK" ]; then
  echo "gpumarket: preflight failed ($GPM_CHECK): $(printf '%s' "$GPM_PF" | tr -d '\\n' | cut -c1-{chars})"
  rc={failed}
else
"""


def shell_quote(text: str) -> str:
    """``text`` as one word of sh, between single quotes."""
    return "'" + text.replace("'", "'\\''") + "'"


def _preflight(gpu_count: int, preflight: str | None) -> str:
    """The shell of the checks; the command runs in the ``else`` branch it opens."""
    checks = ""
    if gpu_count:
        checks += _PREFLIGHT_GPUS.format(gpus=gpu_count)
    if preflight is not None:
        checks += _PREFLIGHT_COMMAND.format(command=shell_quote(preflight))
    return "GPM_CHECK=\n" + checks + _PREFLIGHT_END.format(chars=PREFLIGHT_SEEN_CHARS, failed=PREFLIGHT_FAILED_STATUS)


def validate_preflight(gpu_count: object, preflight: object) -> None:
    """Raise GpuMarketValidationError naming ``gpu_count`` or ``preflight`` when either cannot be checked."""
    if not isinstance(gpu_count, int) or isinstance(gpu_count, bool) or gpu_count < 0:
        raise GpuMarketValidationError("gpu_count", f"must be an integer >= 0 (0: no GPU check), got {gpu_count!r}")
    if preflight is not None and (not isinstance(preflight, str) or not preflight.strip()):
        raise GpuMarketValidationError(
            "preflight", f"must be a non-empty string of shell commands or None, got {type(preflight).__name__}"
        )


#: How the wrapper runs the command when it stages nothing.
_RUN = """echo "{started_line}"
sh "$GPM_JOB" 2>&1
rc=$?
"""

# Staging (see ``airflow_gpumarket.staging``): before the command, wait for what the provider copies in; keep a
# manifest of the checkpoint directory (its files but hidden and *.tmp ones) while the command runs and at its end,
# and write one into each output directory after it. A restore is ready once every file its manifest names arrived;
# inputs (GPM_GATED) once each input directory's manifest and files arrived (GPM_IN lists them all) or the gate did;
# a cloud restore that brought no complete manifest once the gate arrived.
_STAGED_RUN = """GPM_ROOT="${{GPUMARKET_INSTANCE_ROOT:-}}"
GPM_S="$GPM_ROOT{state_dir}"
mkdir -p "$GPM_S/gate" && echo gpumarket > "$GPM_S/gate/gate"
export GPUMARKET_CHECKPOINT_DIR="$GPM_ROOT{checkpoint_dir}" GPUMARKET_RESUMED_FROM=
GPM_CK="$GPUMARKET_CHECKPOINT_DIR"
GPM_FROM='{restore_from}'
GPM_GATED='{gated}'
GPM_IN='{inputs}'
GPM_SEEN=
gpm_list() {{
  (cd "$1" && shift && find . -type f "$@" | sed 's|^\\./||' | sort > {manifest}.t && mv -f {manifest}.t {manifest}) \
    2>/dev/null
}}
gpm_manifest() {{
  [ -n '{checkpoint_dir}' ] || return 0
  mkdir -p "$GPM_CK" && gpm_list "$GPM_CK" ! -name '.*' ! -name '*.tmp'
}}
gpm_listed() {{
  [ -f "$1/{manifest}" ] || return 1
  while IFS= read -r f; do [ -f "$1/$f" ] || return 1; done < "$1/{manifest}"
}}
gpm_complete() {{ gpm_listed "$GPM_S/restore"; }}
gpm_inputs() {{
  [ -n "$GPM_IN" ] || return 1
  gpm_all=0
  for p in $GPM_IN; do
    case " $GPM_SEEN " in *" $p "*) continue ;; esac
    if gpm_listed "$GPM_ROOT$p"; then
      GPM_SEEN="$GPM_SEEN $p"; echo "{input_arrived} ($(wc -l < "$GPM_ROOT$p/{manifest}") files, as its manifest lists)"
    else
      gpm_all=1
    fi
  done
  return $gpm_all
}}
gpm_ready() {{
  if [ -f "$GPM_S/go/gate" ]; then
    case "$GPM_FROM" in ""|cloud) return 0 ;; esac
  elif [ -n "$GPM_GATED" ]; then
    gpm_inputs || return 1
    [ -n "$GPM_FROM" ] || return 0
  fi
  gpm_complete || [ -f "$GPM_S/abandon/gate" ]
}}
gpm_outputs() {{
  for p in {outputs}; do
    [ -d "$GPM_ROOT$p" ] && [ "$GPM_ROOT$p" != "$GPM_CK" ] && gpm_list "$GPM_ROOT$p" ! -name '{manifest}*'
  done
}}
gpm_rc=
if [ -n "$GPM_FROM$GPM_GATED" ]; then
  echo "gpumarket: waiting up to {timeout} s for the staged data${{GPM_FROM:+ (checkpoint from $GPM_FROM)}}"
  gpm_end=$(($(date +%s) + {timeout}))
  until gpm_ready || [ "$(date +%s)" -ge "$gpm_end" ]; do sleep 0.2 2>/dev/null || sleep 1; done
  if [ ! -f "$GPM_S/go/gate" ] && {{ {{ [ -n "$GPM_GATED" ] && ! gpm_inputs; }} || \
    {{ [ "$GPM_FROM" = cloud ] && ! gpm_complete; }}; }}; then
    echo "gpumarket: the staged data did not arrive within {timeout} s{not_started}"; gpm_rc={failed}
  elif [ -n "$GPM_FROM" ]; then
    if gpm_complete; then
      (cd "$GPM_S/restore" && while IFS= read -r f; do
        mkdir -p "$GPM_CK/$(dirname "$f")" && cp -p "$f" "$GPM_CK/$f"; done < {manifest})
      GPUMARKET_RESUMED_FROM='{resumed_from}'
      echo "gpumarket: restored the checkpoint from $GPM_FROM ($(wc -l < "$GPM_S/restore/{manifest}") files)"
    elif [ "$GPM_FROM" = cloud ] && [ -z "$(ls -A "$GPM_S/restore" 2>/dev/null)" ]; then
      echo "gpumarket: no checkpoint at checkpoint_uri yet; the job starts from scratch"
    elif [ '{policy}' = fail ]; then
      echo "gpumarket: the checkpoint restore from $GPM_FROM did not complete{not_started} (on_restore_failure='fail')"
      gpm_rc={failed}
    else
      echo "gpumarket: the checkpoint restore from $GPM_FROM did not complete; the job starts from scratch (on_restore_failure='restart')"
    fi
  fi
  rm -rf "$GPM_S/restore" "$GPM_S/go" "$GPM_S/abandon"
fi
if [ -z "$gpm_rc" ]; then
  gpm_manifest
  (while sleep {manifest_seconds}; do gpm_manifest; done) >/dev/null 2>&1 &
  GPM_MW=$!
  echo "{started_line}"
  sh "$GPM_JOB" 2>&1
  rc=$?
  kill "$GPM_MW" 2>/dev/null
  gpm_manifest
  gpm_outputs
else
  rc=$gpm_rc
fi
"""
#: The start of the line the wrapper prints when an input directory's manifest and every file it names arrived.
INPUT_ARRIVED_LINE = "gpumarket: input {path} arrived"
#: Ends the wrapper's line when staging failed and the command never ran (its exit status is then 75).
NOT_STARTED = "; the job does not start"
#: Seconds between two manifests of the checkpoint directory while the command runs.
MANIFEST_SECONDS = 1


class WrapperStaging:
    """What the wrapper of one rental stages: its checkpoint directory, where a restore comes from, the gate.

    ``restore_from``: ``""`` (nothing), ``"instance <id>"`` (a preempted instance) or ``"cloud"`` (checkpoint_uri).
    ``inputs``: every input's instance path, for the wrapper to start once each one's manifest arrived (empty: the
    gate only). ``outputs``: the output paths, each directory given a manifest after the command.
    A plain class, not a dataclass: this module is imported when a DAG file is parsed.
    """

    def __init__(
        self,
        checkpoint_dir: str | None,
        restore_from: str = "",
        gated: bool = False,
        timeout: float = 0.0,
        on_restore_failure: str = "restart",
        inputs: tuple[str, ...] = (),
        outputs: tuple[str, ...] = (),
    ) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.restore_from = restore_from
        self.gated = gated
        self.timeout = timeout
        self.on_restore_failure = on_restore_failure
        self.inputs = inputs
        self.outputs = outputs

    def shell(self, started_line: str) -> str:
        from airflow_gpumarket import staging  # only a task that stages data needs its rules

        if self.checkpoint_dir is not None:
            staging.quotable_path("checkpoint_dir", self.checkpoint_dir)
        for name, paths in (("inputs", self.inputs), ("outputs", self.outputs)):
            for path in paths:
                staging.quotable_path(f"{name} key", path)
        resumed_from = (
            self.restore_from.split(" ", 1)[1] if self.restore_from.startswith("instance ") else self.restore_from
        )
        return _STAGED_RUN.format(
            state_dir=staging.STATE_DIR,
            checkpoint_dir=self.checkpoint_dir or "",
            restore_from=self.restore_from,
            resumed_from=resumed_from,
            gated="1" if self.gated else "",
            inputs=" ".join(self.inputs),
            input_arrived=INPUT_ARRIVED_LINE.format(path="$p"),
            outputs=" ".join(f"'{path}'" for path in self.outputs),
            manifest=staging.MANIFEST_NAME,
            timeout=max(1, int(self.timeout)),
            failed=staging.STAGING_FAILED_STATUS,
            policy=self.on_restore_failure,
            manifest_seconds=MANIFEST_SECONDS,
            not_started=NOT_STARTED,
            started_line=started_line,
        )


#: What the wrapper does after exit 0: destroy the instance, or (``stop_on_success``) stop it so that its log can
#: still be read (every line since the last read, the exit status, a Python job's return value) before the operator
#: destroys it.
_DESTROY = "m=DELETE; b=''"
_STOP = 'm=PUT; b=\'{"state":"stopped"}\''


def build_job_onstart(
    command: str,
    *,
    base_url: str,
    export_env: Iterable[str] = (),
    stop_on_success: bool = False,
    staged: WrapperStaging | None = None,
    gpu_count: int = 0,
    preflight: str | None = None,
) -> str:
    """The onstart script for ``command``; packed with gzip+base64 when over the 4048-character limit.

    :param command: shell commands to run on the instance.
    :param base_url: the service's base URL as the instance reaches it (the connection's host).
    :param export_env: names of env variables to append to ``/etc/environment`` (``$GPUMARKET_ENV_FILE``
        when set) so SSH sessions see them; the spec says env is not visible there otherwise.
    :param stop_on_success: after exit 0 stop the instance instead of destroying it (compute billing ends all the
        same); the operator reads the log, then destroys it.
    :param staged: wait for a restore and the inputs before the command, and keep the checkpoint's manifest.
    :param gpu_count: the GPUs the offer promised; before anything else the wrapper checks that ``nvidia-smi -L``
        lists at least that many (0: no check).
    :param preflight: shell commands run after the GPU check (``sh -c``); a non-zero exit fails the preflight.
        A failed preflight prints ``PREFLIGHT_FAILED_LINE`` and ends with ``PREFLIGHT_FAILED_STATUS``.
    :raises GpuMarketValidationError: empty command, bad preflight, or too long even when packed.
    """
    validate_preflight(gpu_count, preflight)
    if not isinstance(command, str) or not command.strip():
        raise GpuMarketValidationError("command", "must be a non-empty string of shell commands")
    names = list(export_env)
    for name in names:
        if not _ENV_NAME.match(name):
            raise GpuMarketValidationError("env", f"{name!r} is not a valid environment variable name to export")
    delimiter = f"GPUMARKET_JOB_{secrets.token_hex(4).upper()}"
    while delimiter in command:
        delimiter = f"GPUMARKET_JOB_{secrets.token_hex(4).upper()}"
    export = "".join(
        f'printf "%s=%s\\n" {name} "${name}" >> "${{GPUMARKET_ENV_FILE:-/etc/environment}}" 2>/dev/null || true\n'
        for name in names
    )
    script = _TEMPLATE.format(
        url=f"{base_url.rstrip('/')}{api.API_PREFIX}/instances/",
        delimiter=delimiter,
        command=command.rstrip("\n"),
        export_env=export,
        tries=END_BILLING_TRIES,
        timeout=END_BILLING_TIMEOUT_SECONDS,
        exit_line=EXIT_STATUS_LINE.format(rc="$rc"),
        run=_RUN.format(started_line=STARTED_LINE) if staged is None else staged.shell(STARTED_LINE),
        kill_writer="" if staged is None else '; kill "$GPM_MW" 2>/dev/null',
        preflight=_preflight(gpu_count, preflight) if gpu_count or preflight is not None else "",
        preflight_end="fi\n" if gpu_count or preflight is not None else "",
        on_success=_STOP if stop_on_success else _DESTROY,
    )
    try:
        return api.pack_onstart(script)
    except GpuMarketValidationError as exc:
        raise GpuMarketValidationError("command", exc.problem) from None


@functools.cache
def _room_for_command(stop_on_success: bool, gpu_check: bool = False, preflight: bool = False) -> int:
    """Characters left for the command (and the preflight's) in an unpacked script that exports nothing.

    Counted behind a base URL of up to 200 characters and a GPU count of up to three digits.
    """
    wrapper = build_job_onstart(
        "x",
        base_url="https://" + "h" * 192,
        stop_on_success=stop_on_success,
        gpu_count=100 if gpu_check else 0,
        preflight="x" if preflight else None,
    )
    return api.ONSTART_MAX_CHARS - (len(wrapper) - 1 - preflight)


def certainly_fits(
    command: str, *, stop_on_success: bool = False, gpu_count: int = 0, preflight: str | None = None
) -> bool:
    """True when ``command``'s script fits the onstart limit without even being packed.

    A DAG's parse then need not write it; the task writes it, and checks it again, before renting.
    """
    used = len(command.rstrip("\n")) + (0 if preflight is None else len(shell_quote(preflight)) - 2)
    return used <= _room_for_command(stop_on_success, bool(gpu_count), preflight is not None)
