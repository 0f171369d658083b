"""The service's copies: request bodies, the cloud integration a name picks, and a copy's progress as read.

Neither copy is in the spec: the paths and bodies are the live service's, as its official CLI sends them. Both run
on the service after the call answers (on a stopped instance too); their progress shows only in the instance's
``status_msg``, about 30 s late.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_gpumarket.api.paths import CLOUD_COPY_FINISHED, TRANSFER_TO_CLOUD, TRANSFERS
from airflow_gpumarket.api.responses import redact
from airflow_gpumarket.api.validation import (
    require_choice,
    require_instance_path,
    require_integration_path,
    require_positive_int,
    validate_copy_flags,
)
from airflow_gpumarket.exceptions import GpuMarketError, GpuMarketValidationError

if TYPE_CHECKING:
    from airflow_gpumarket.types import CloudIntegration, CopyResult


def build_instance_copy_body(src_id: int, dst_id: int, src_path: str, dst_path: str) -> dict[str, Any]:
    """``PUT commands/copy_direct/``: copy ``src_path`` of instance ``src_id`` to ``dst_path`` of ``dst_id``."""
    require_positive_int("src_id", src_id)
    require_positive_int("dst_id", dst_id)
    require_instance_path("src_path", src_path)
    require_instance_path("dst_path", dst_path)
    return {"client_id": "me", "src_id": src_id, "dst_id": dst_id, "src_path": src_path, "dst_path": dst_path}


def build_cloud_copy_body(
    instance_id: int, integration_id: int, *, src: str, dst: str, transfer: str, flags: Sequence[str] = ()
) -> dict[str, Any]:
    """``POST commands/rclone/``: copy between an instance and the cloud integration ``integration_id``.

    ``transfer`` says which way (``TRANSFER_TO_CLOUD``: ``src`` is on the instance and ``dst`` in the integration's
    storage; ``TRANSFER_FROM_CLOUD``: the other way round). ``flags`` are extra rclone options (``--size-only``).
    """
    require_positive_int("instance_id", instance_id)
    require_positive_int("integration_id", integration_id)
    require_choice("transfer", transfer, TRANSFERS)
    if transfer == TRANSFER_TO_CLOUD:
        require_instance_path("src", src)
        require_integration_path("dst", dst)
    else:
        require_integration_path("src", src)
        require_instance_path("dst", dst)
    return {
        "src": src,
        "dst": dst,
        "instance_id": instance_id,
        "selected": integration_id,
        "transfer": transfer,
        "flags": validate_copy_flags(flags),
    }


def build_cancel_copy_body(instance_id: int, field: str = "dst_id") -> dict[str, Any]:
    """``DELETE`` of either copy path: cancels the copies into instance ``instance_id`` (``field`` names it)."""
    require_positive_int(field, instance_id)
    return {"client_id": "me", "dst_id": instance_id}


def copy_answer(operation: str, body: Any) -> CopyResult:
    """A copy call's answer as a dict; an empty 200 (the official CLI reads only a cloud copy's status) is success."""
    if body is None:
        return {"success": True}
    if isinstance(body, dict):
        return body  # type: ignore[return-value]
    raise GpuMarketError(
        f"{operation}: the service answered HTTP 200 with a {type(body).__name__} instead of a JSON object; the "
        "connection's host may point at a proxy or the wrong server. Check the instance's status_msg before retrying.",
        status_code=200,
        operation=operation,
    )


def require_integration_ref(name_or_id: Any) -> None:
    """A cloud integration's name (a non-empty string) or id (a positive int, or a string of digits)."""
    if isinstance(name_or_id, int) and not isinstance(name_or_id, bool) and name_or_id > 0:
        return
    if not isinstance(name_or_id, str) or not name_or_id.strip():
        raise GpuMarketValidationError(
            "cloud_integration", f"must be an integration's name or id (as in the console), got {name_or_id!r}"
        )


def resolve_cloud_integration(
    integrations: Iterable[Mapping[str, Any]], name_or_id: str | int, *, secrets: Iterable[str | None] = ()
) -> CloudIntegration:
    """The integration ``name_or_id`` names among ``integrations`` (``GET users/cloud_integrations``' records).

    An int, or a string of digits, matches ``id`` (then, when no id matches, a ``name`` of those digits); anything
    else must match a ``name`` exactly. ``secrets`` (the API key) are replaced by ``***`` where the messages quote
    ``name_or_id``.

    :raises GpuMarketValidationError: ("cloud_integration") when none matches (the message lists the names there
        are) or two share the name (then the id picks one).
    """
    require_integration_ref(name_or_id)
    records = [dict(r) for r in integrations if isinstance(r, Mapping)]
    wanted = str(name_or_id).strip() if isinstance(name_or_id, str) else name_or_id
    matches: list[dict[str, Any]] = []
    if isinstance(wanted, int) or wanted.isdigit():
        matches = [r for r in records if str(r.get("id")) == str(int(wanted))]
    if not matches and isinstance(wanted, str):
        matches = [r for r in records if r.get("name") == wanted]
    if len(matches) == 1:
        return matches[0]  # type: ignore[return-value]
    if matches:
        ids = ", ".join(str(r.get("id")) for r in matches)
        raise GpuMarketValidationError(
            "cloud_integration",
            f"{len(matches)} integrations are named {redact(repr(wanted), secrets)} (ids {ids}); pass the id instead",
        )
    there = "; ".join(f"{r.get('name')!r} (id {r.get('id')}, {r.get('cloud_type')})" for r in records) or "none"
    asked = redact(repr(name_or_id), secrets)
    raise GpuMarketValidationError(
        "cloud_integration",
        f"the account has no cloud integration {asked} (it has: {there}); pass one of these names or ids, "
        "or add the integration in the console's cloud connections",
    )


class CopyProgress(str, enum.Enum):  # noqa: UP042 - StrEnum is 3.11+; Airflow 2.11 runs on 3.10
    """A copy's state as an instance's ``status_msg`` reads (see :func:`copy_progress`)."""

    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RUNNING = "running"
    UNKNOWN = "unknown"


#: Patterns, compiled on first use (``re`` caches them) rather than when a DAG file imports the package.
#: "No errors" and "0 errors" (rclone's summary words) do not mean a failure.
_NO_ERRORS = r"\b(?:no|0)\s+errors?\b"
#: Words of a copy whose source holds nothing (yet): a checkpoint_uri before its first save.
NOTHING_THERE = r"not found|no such|does not exist|doesn't exist"
_FAILED = r"fail|error|abort|unable|cannot|could not|denied|timed out|" + NOTHING_THERE
_CANCELLED = r"cancel"
#: The live service names a cloud copy's news after the operation, then its state: "Finished" is published. A
#: state that is neither that, nor a copy under way, is an end that is no success, whatever its wording.
_CLOUD_OPERATION = CLOUD_COPY_FINISHED.lower().rsplit(" ", 1)[0]
_UNDER_WAY = r"\d\s*%|start|progress|running|queued|pending|waiting|transferr|copying|sending|receiving"
_COPY = r"\bcop(?:y|ying|ied)\b|rclone|rsync|transfer|receiving|sending"
_ENDED = r"finish|complete|\bdone\b"
#: A share under 100 % ("40% done") is a copy under way, whatever word follows it.
_PARTIAL = r"(?<![\d.])(?:\d|[1-9]\d)(?:\.\d+)?\s*%"


def copy_progress(status_msg: str | None) -> CopyProgress:
    """A best-effort reading of a copy's state from an instance's ``status_msg``.

    Read in this order, case ignored: ``FINISHED`` for ``CLOUD_COPY_FINISHED``; ``FAILED`` for words of a failure
    ("fail", "error" but not "no errors", "abort", "unable", "denied", "not found", "timed out", ...);
    ``CANCELLED`` for "cancel"; ``FAILED`` for "Cloud Copy Operation" followed by any other state that neither
    ended well nor is under way (a share, "started", "in progress", ...); ``FINISHED`` for words of a copy that
    ended ("copy" with "finished", "complete" or "done", and no share under 100 %); ``RUNNING`` for other words of a
    copy; ``UNKNOWN`` otherwise (nothing about a copy, or no message). The service publishes only the cloud copy's
    end wording, and the message is about 30 s late and overwritten by other news: callers must bound their waits
    and confirm the files arrived another way (a listing, a checksum, a marker file).
    """
    text = (status_msg or "").lower()
    if CLOUD_COPY_FINISHED.lower() in text:
        return CopyProgress.FINISHED
    if re.search(_FAILED, re.sub(_NO_ERRORS, "", text)):
        return CopyProgress.FAILED
    if re.search(_CANCELLED, text):
        return CopyProgress.CANCELLED
    state = (
        text.strip().removeprefix(_CLOUD_OPERATION).strip(" :.") if text.strip().startswith(_CLOUD_OPERATION) else ""
    )
    if state and not re.search(_UNDER_WAY, state) and not re.search(_ENDED, state):
        return CopyProgress.FAILED
    if re.search(_COPY, text):
        ended = re.search(_ENDED, text) and not re.search(_PARTIAL, text)
        return CopyProgress.FINISHED if ended else CopyProgress.RUNNING
    return CopyProgress.UNKNOWN
