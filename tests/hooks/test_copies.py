"""The hook's copies (``GpuMarketHook.start_instance_copy`` and friends, through ``hooks/core.py``): the exact paths
(trailing slashes) and bodies sent, a refusal raising ``GpuMarketCopyRefusedError``, the cancels, validation before
anything is sent, cloud integrations by name or id, retries, and the key kept out of every message."""

from __future__ import annotations

import logging
import pickle
import traceback

import pytest
import requests
from hook_fakes import API_KEY, AUTH_HEADER, methods_and_urls, url

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import (
    GpuMarketCopyRefusedError,
    GpuMarketError,
    GpuMarketServerError,
    GpuMarketValidationError,
)

COPY_DIRECT = url("/api/v0/commands/copy_direct/")
RCLONE = url("/api/v0/commands/rclone/")
INTEGRATIONS = url("/api/v0/users/cloud_integrations")
RECORDS = [
    {"id": 11, "cloud_type": "s3", "name": "checkpoints"},
    {"id": 12, "cloud_type": "gdrive", "name": "datasets"},
]


def sent(mocker, method: str, full_url: str, body: dict) -> None:
    """Exactly one request: this method, URL, bearer header and JSON body."""
    assert methods_and_urls(mocker) == [(method, full_url)]
    assert mocker.last_request.headers["Authorization"] == AUTH_HEADER
    assert mocker.last_request.json() == body


def key_absent(exc: BaseException) -> None:
    assert API_KEY not in "".join(traceback.format_exception(exc))
    assert API_KEY not in repr(vars(exc))
    assert API_KEY not in repr(pickle.loads(pickle.dumps(exc)).__dict__)


# --- Instance to instance: PUT/DELETE /api/v0/commands/copy_direct/ ------------------------------------------
def test_start_instance_copy_puts_the_clis_body_to_copy_direct_with_trailing_slash(requests_mock, hook):
    requests_mock.put(COPY_DIRECT, json={"success": True, "msg": "Remote to Remote copy initiated"})

    result = hook.start_instance_copy(101, 202, "/workspace/ckpt/", "/workspace/restore/")

    assert result == {"success": True, "msg": "Remote to Remote copy initiated"}
    body = {
        "client_id": "me",
        "src_id": 101,
        "dst_id": 202,
        "src_path": "/workspace/ckpt/",
        "dst_path": "/workspace/restore/",
    }
    sent(requests_mock, "PUT", COPY_DIRECT, body)


def test_a_refused_instance_copy_raises_the_typed_error_with_the_services_msg_and_is_not_retried(requests_mock, hook):
    requests_mock.put(COPY_DIRECT, json={"success": False, "msg": "src instance 101 not found"})

    with pytest.raises(GpuMarketCopyRefusedError) as caught:
        hook.start_instance_copy(101, 202, "/a", "/b")

    assert caught.value.msg == "src instance 101 not found"
    assert caught.value.operation == "start_instance_copy"
    assert caught.value.status_code == 200
    assert "src instance 101 not found" in str(caught.value)
    assert requests_mock.call_count == 1


def test_cancel_instance_copy_deletes_copy_direct_with_the_destination(requests_mock, hook):
    requests_mock.delete(COPY_DIRECT, json={"success": True})

    assert hook.cancel_instance_copy(202) == {"success": True}
    sent(requests_mock, "DELETE", COPY_DIRECT, {"client_id": "me", "dst_id": 202})


def test_start_instance_copy_is_retried_on_503_then_succeeds(requests_mock, hook):
    requests_mock.put(COPY_DIRECT, [{"status_code": 503, "json": {"msg": "busy"}}, {"json": {"success": True}}])

    assert hook.start_instance_copy(101, 202, "/a", "/b") == {"success": True}
    assert requests_mock.call_count == 2


def test_start_instance_copy_is_retried_after_a_read_timeout(requests_mock, hook):
    # Not idempotent on the wire, but a copy sent twice converges to the same files.
    requests_mock.put(COPY_DIRECT, [{"exc": requests.exceptions.ReadTimeout}, {"json": {"success": True}}])

    assert hook.start_instance_copy(101, 202, "/a", "/b") == {"success": True}
    assert requests_mock.call_count == 2


@pytest.mark.parametrize(
    ("args", "field"),
    [((0, 2, "/a", "/b"), "src_id"), ((1, 2, "a", "/b"), "src_path"), ((1, 2, "/a", "/b/../c"), "dst_path")],
)
def test_bad_instance_copy_arguments_are_refused_before_anything_is_sent(wire, hook, args, field):
    with pytest.raises(GpuMarketValidationError) as caught:
        hook.start_instance_copy(*args)
    assert caught.value.field == field
    assert wire.call_count == 0


# --- Cloud copies: POST/DELETE /api/v0/commands/rclone/ ----------------------------------------------------
def test_start_cloud_copy_to_cloud_posts_the_clis_body_to_rclone_with_trailing_slash(requests_mock, hook):
    requests_mock.post(RCLONE, json={"success": True})

    result = hook.start_cloud_copy(
        7001, 11, src="/workspace/ckpt", dst="bucket/run-1", transfer=api.TRANSFER_TO_CLOUD, flags=["--size-only"]
    )

    assert result == {"success": True}
    body = {
        "src": "/workspace/ckpt",
        "dst": "bucket/run-1",
        "instance_id": 7001,
        "selected": 11,
        "transfer": "Instance To Cloud",
        "flags": ["--size-only"],
    }
    sent(requests_mock, "POST", RCLONE, body)


def test_start_cloud_copy_from_cloud_sends_no_flags_as_an_empty_list(requests_mock, hook):
    requests_mock.post(RCLONE, status_code=200, text="")  # the CLI reads only the status

    assert hook.start_cloud_copy(7001, 12, src="/folder", dst="/data", transfer=api.TRANSFER_FROM_CLOUD) == {
        "success": True
    }
    assert requests_mock.last_request.json()["flags"] == []
    assert requests_mock.last_request.json()["transfer"] == "Cloud To Instance"


def test_a_refused_cloud_copy_raises_the_typed_error_with_the_services_msg(requests_mock, hook):
    requests_mock.post(RCLONE, json={"success": False, "msg": "Invalid cloud connection"})

    with pytest.raises(GpuMarketCopyRefusedError, match="Invalid cloud connection") as caught:
        hook.start_cloud_copy(7001, 11, src="/a", dst="b", transfer=api.TRANSFER_TO_CLOUD)

    assert (caught.value.msg, caught.value.operation) == ("Invalid cloud connection", "start_cloud_copy")


def test_start_cloud_copy_is_retried_on_503_then_succeeds(requests_mock, hook):
    requests_mock.post(RCLONE, [{"status_code": 503, "json": {"msg": "busy"}}, {"json": {"success": True}}])

    assert hook.start_cloud_copy(7001, 11, src="/a", dst="b", transfer=api.TRANSFER_TO_CLOUD) == {"success": True}
    assert requests_mock.call_count == 2


def test_start_cloud_copy_retries_run_out_with_the_last_error(requests_mock, hook):
    requests_mock.post(RCLONE, status_code=502, json={"msg": "bad gateway"})

    with pytest.raises(GpuMarketServerError):
        hook.start_cloud_copy(7001, 11, src="/a", dst="b", transfer=api.TRANSFER_TO_CLOUD)
    assert requests_mock.call_count == 4  # 1 + the connection's max_retries (3)


def test_cancel_cloud_copy_deletes_rclone_with_the_instance_as_dst_id(requests_mock, hook):
    requests_mock.delete(RCLONE, json={"success": True})

    assert hook.cancel_cloud_copy(7001) == {"success": True}
    sent(requests_mock, "DELETE", RCLONE, {"client_id": "me", "dst_id": 7001})


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"src": "a", "dst": "b", "transfer": api.TRANSFER_TO_CLOUD}, "src"),
        ({"src": "/a", "dst": "b", "transfer": api.TRANSFER_FROM_CLOUD}, "dst"),
        ({"src": "/a", "dst": "b", "transfer": "up"}, "transfer"),
        ({"src": "/a", "dst": "b", "transfer": api.TRANSFER_TO_CLOUD, "flags": ["-v"]}, "flags"),
    ],
)
def test_bad_cloud_copy_arguments_are_refused_before_anything_is_sent(wire, hook, kwargs, field):
    with pytest.raises(GpuMarketValidationError) as caught:
        hook.start_cloud_copy(7001, 11, **kwargs)
    assert caught.value.field == field
    assert wire.call_count == 0


def test_bad_cancel_ids_are_refused_before_anything_is_sent(wire, hook):
    with pytest.raises(GpuMarketValidationError, match="^instance_id: "):
        hook.cancel_cloud_copy(0)
    with pytest.raises(GpuMarketValidationError, match="^dst_id: "):
        hook.cancel_instance_copy(-3)
    assert wire.call_count == 0


# --- Cloud integrations by name or id ----------------------------------------------------------------------
@pytest.mark.parametrize("ref", ["datasets", 12, "12"])
def test_cloud_integration_is_found_by_name_or_id_in_one_listing(requests_mock, hook, ref):
    requests_mock.get(INTEGRATIONS, json=RECORDS)

    assert hook.cloud_integration(ref) == RECORDS[1]
    assert methods_and_urls(requests_mock) == [("GET", INTEGRATIONS)]


def test_a_missing_cloud_integration_names_those_there_are(requests_mock, hook):
    requests_mock.get(INTEGRATIONS, json=RECORDS)

    with pytest.raises(GpuMarketValidationError) as caught:
        hook.cloud_integration("backups")

    assert caught.value.field == "cloud_integration"
    assert "'checkpoints'" in str(caught.value) and "'datasets'" in str(caught.value)
    assert "console" in str(caught.value)


def test_a_duplicate_cloud_integration_name_asks_for_the_id(requests_mock, hook):
    requests_mock.get(INTEGRATIONS, json=[*RECORDS, {"id": 13, "cloud_type": "s3", "name": "datasets"}])

    with pytest.raises(GpuMarketValidationError, match="12, 13.*pass the id"):
        hook.cloud_integration("datasets")


def test_a_bad_cloud_integration_reference_is_refused_before_listing(wire, hook):
    with pytest.raises(GpuMarketValidationError, match="^cloud_integration: "):
        hook.cloud_integration("")
    assert wire.call_count == 0


# --- The key stays secret ----------------------------------------------------------------------------------
def test_a_refusal_echoing_the_key_leaves_it_out_of_the_exception_and_logs(requests_mock, hook, caplog):
    caplog.set_level(logging.DEBUG)
    requests_mock.put(COPY_DIRECT, json={"success": False, "msg": f"denied for Bearer {API_KEY}"})

    with pytest.raises(GpuMarketCopyRefusedError) as caught:
        hook.start_instance_copy(101, 202, "/a", "/b")

    assert caught.value.msg == "denied for Bearer ***"
    key_absent(caught.value)
    assert API_KEY not in caplog.text


def test_a_retried_cloud_copy_failure_echoing_the_key_leaves_it_out(requests_mock, hook, caplog):
    caplog.set_level(logging.DEBUG)
    requests_mock.post(RCLONE, status_code=500, json={"error": "x", "msg": f"upstream saw {API_KEY}"})

    with pytest.raises(GpuMarketError) as caught:
        hook.start_cloud_copy(7001, 11, src="/a", dst="b", transfer=api.TRANSFER_TO_CLOUD)

    key_absent(caught.value)
    assert API_KEY not in caplog.text


def test_a_key_pasted_as_an_integration_name_is_left_out_of_the_error(requests_mock, hook):
    requests_mock.get(INTEGRATIONS, json=[{"id": 1, "cloud_type": "s3", "name": "other"}])

    with pytest.raises(GpuMarketValidationError) as caught:
        hook.cloud_integration(API_KEY)

    assert "'***'" in str(caught.value) and "'other'" in str(caught.value)
    key_absent(caught.value)
