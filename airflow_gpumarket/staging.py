"""Durable data as pure rules: where checkpoints, inputs and outputs live, and what each rental copies.

Data moves only through the service's copy endpoints: instance to instance (``copy_direct``, from a preempted
instance, whose disk the service keeps) and between an instance and the user's cloud integration (``rclone``),
whose credentials stay with the service. Nothing here sends a request; the renting operator does, in this order:

- **stage in**, once the rental runs and before its job starts: the checkpoint (from the preempted instance, else
  from ``checkpoint_uri``), then each input; then, when inputs came from the cloud, the *gate*: a tiny file the job
  wrapper waits for, copied last, which tells it that the provider saw every copy end. A restore needs no gate
  while it brings a complete checkpoint (the wrapper checks its manifest): only when the provider saw its copy end
  without the job starting (nothing saved there yet, or a copy that failed) does it send the gate (from the
  cloud) or abandon the restore (from an instance), and the wrapper applies ``on_restore_failure``;
- **save** the checkpoint to ``checkpoint_uri`` after a preemption (from the paused instance) and after the job
  ended, before the destroy;
- **stage out** each output after exit 0, before the destroy.

The wrapper (``job_script``) keeps a manifest of the checkpoint directory, so a restore is complete when every file
the manifest names has arrived; the service's ``status_msg`` only helps (its wording is partly unpublished).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import GpuMarketValidationError

#: Where the wrapper keeps its own files on the instance: the restore's staging area and the gate.
STATE_DIR = "/var/tmp/gpumarket"
#: Restores land here first; the wrapper moves the files the manifest names into the checkpoint directory.
RESTORE_DIR = f"{STATE_DIR}/restore"
#: The wrapper writes this file at start; the gate's round trip copies it out and back in.
GATE_SOURCE_DIR = f"{STATE_DIR}/gate"
#: The job starts once the gate arrived here (when the rental stages anything from the cloud).
GATE_DIR = f"{STATE_DIR}/go"
#: A gate copied here from the preempted instance tells the wrapper to stop waiting for its checkpoint.
ABANDON_DIR = f"{STATE_DIR}/abandon"
#: The gate's place in the cloud integration (one tiny file, overwritten by every rental).
CLOUD_GATE_DIR = ".gpumarket/gate"
#: The manifest the wrapper keeps in the checkpoint directory: one file name per line.
MANIFEST_NAME = ".gpumarket-manifest"
#: The exit status of a job wrapper that gave up a restore under ``on_restore_failure="fail"`` or lacked an input.
STAGING_FAILED_STATUS = 75
#: The service shows copy progress about this late in ``status_msg``; earlier readings describe an older copy.
STATUS_MSG_LAG_SECONDS = 30.0
#: The wrapper waits this much longer than the provider's bound, so that the provider decides first.
WRAPPER_MARGIN_SECONDS = 30.0
#: The wrapper looks for its staged files at least this often: a copy that finished this long ago without the
#: job starting brought no complete checkpoint.
WRAPPER_NOTICE_SECONDS = 2.0

RESTORE_POLICIES = ("restart", "fail")
_QUOTABLE = re.compile(r"^/[A-Za-z0-9._/@+=,:-]*$")


@dataclass(frozen=True)
class DataPlan:
    """What a renting task asked for: its checkpoint, inputs and outputs (all rendered, all checked)."""

    checkpoint_dir: str | None = None
    checkpoint_uri: str | None = None
    cloud_integration: str | int | None = None
    inputs: Mapping[str, str] = field(default_factory=dict)
    outputs: Mapping[str, str] = field(default_factory=dict)
    on_restore_failure: str = "restart"
    staging_timeout: float = 30 * 60.0

    @property
    def uses_cloud(self) -> bool:
        return bool(self.checkpoint_uri or self.inputs or self.outputs)

    @property
    def active(self) -> bool:
        return bool(self.checkpoint_dir or self.inputs or self.outputs)

    def restores_from_cloud(self, source_id: int | None) -> bool:
        """Whether a rental restores from ``checkpoint_uri`` (no preempted instance holds a newer checkpoint)."""
        return bool(self.checkpoint_uri) and source_id is None

    def stages_in(self, source_id: int | None) -> bool:
        """Whether a rental has anything to copy in before its job starts."""
        return source_id is not None or self.restores_from_cloud(source_id) or bool(self.inputs)

    def gated(self, source_id: int | None) -> bool:
        """Whether the job waits for its inputs: each one's manifest and files, or else the gate."""
        return bool(self.inputs)

    def checked_inputs(self) -> tuple[str, ...]:
        """The input paths the job wrapper checks by their manifests: every one, or none when one is unquotable."""
        paths = tuple(self.inputs)
        return paths if all(map(is_quotable, paths)) else ()

    def wrapper_timeout(self) -> float:
        return self.staging_timeout + WRAPPER_MARGIN_SECONDS


def instance_path(name: str, value: Any) -> str:
    """An absolute path on the instance, normalised, outside the wrapper's own directory."""
    api.require_instance_path(name, value)
    path = posixpath.normpath(value)
    if path == "/" or path == STATE_DIR or path.startswith(STATE_DIR + "/"):
        raise GpuMarketValidationError(
            name, f"{value!r} is the root or the job wrapper's {STATE_DIR}; pick a directory like '/workspace/x'"
        )
    return path


def is_quotable(path: str) -> bool:
    """Whether the job wrapper can put ``path`` in its script between single quotes."""
    return bool(_QUOTABLE.match(path))


def quotable_path(name: str, path: str) -> str:
    """``path`` when the job wrapper can put it in its script between single quotes, else a validation error."""
    if not is_quotable(path):
        raise GpuMarketValidationError(
            name, f"{path!r} holds characters the job wrapper cannot quote; use letters, digits and ._/@+=,:-"
        )
    return path


def cloud_path(name: str, value: Any) -> str:
    """A path in the cloud integration's storage, checked and sent as given."""
    api.require_integration_path(name, value)
    return value


def path_mapping(name: str, value: Any) -> dict[str, str]:
    """``inputs``/``outputs``: instance path -> cloud path, each checked."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise GpuMarketValidationError(
            name, f"must be a dict of instance path -> cloud integration path; got {type(value).__name__}"
        )
    return {instance_path(f"{name} key", k): cloud_path(f"{name}[{k!r}]", v) for k, v in value.items()}


def make_plan(
    *,
    checkpoint_dir: Any,
    checkpoint_uri: Any,
    cloud_integration: Any,
    inputs: Any,
    outputs: Any,
    on_restore_failure: Any,
    staging_timeout: float,
) -> DataPlan:
    """The plan from an operator's rendered arguments; every rule checked, each error naming its argument."""
    if on_restore_failure not in RESTORE_POLICIES:
        raise GpuMarketValidationError(
            "on_restore_failure",
            f"must be 'restart' (start from scratch) or 'fail' (fail the task); got {on_restore_failure!r}",
        )
    plan = DataPlan(
        checkpoint_dir=None
        if checkpoint_dir is None
        else quotable_path("checkpoint_dir", instance_path("checkpoint_dir", checkpoint_dir)),
        checkpoint_uri=None if checkpoint_uri is None else cloud_path("checkpoint_uri", checkpoint_uri),
        cloud_integration=cloud_integration,
        inputs=path_mapping("inputs", inputs),
        outputs=path_mapping("outputs", outputs),
        on_restore_failure=on_restore_failure,
        staging_timeout=staging_timeout,
    )
    if plan.checkpoint_uri and not plan.checkpoint_dir:
        raise GpuMarketValidationError(
            "checkpoint_uri", "saves and restores checkpoint_dir, which is not given; set checkpoint_dir too"
        )
    if plan.uses_cloud and cloud_integration is None:
        raise GpuMarketValidationError(
            "cloud_integration",
            "is needed by checkpoint_uri, inputs and outputs: name the integration set up in the console "
            "(see `vastai show connections`)",
        )
    if cloud_integration is not None:
        api.require_integration_ref(cloud_integration)
    if plan.checkpoint_dir:
        for path in (*plan.inputs, *plan.outputs):
            if path == plan.checkpoint_dir or path.startswith(plan.checkpoint_dir + "/"):
                raise GpuMarketValidationError(
                    "inputs" if path in plan.inputs else "outputs",
                    f"{path!r} lies inside checkpoint_dir {plan.checkpoint_dir!r}; keep them apart",
                )
    return plan


def as_dir(path: str) -> str:
    """A directory path as the copy endpoints take it: contents of, with one trailing slash."""
    return path.rstrip("/") + "/"


def copy_reading(status_msg: Any) -> api.CopyProgress:
    """What an instance's status message says of its latest copy (best effort, see ``api.copy_progress``)."""
    return api.copy_progress(status_msg if isinstance(status_msg, str) else None)
