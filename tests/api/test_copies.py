"""The copies' pure rules (api/copies.py, api/validation.py): the bodies the official CLI sends, the checks of paths,
transfers and flags (each naming its field), cloud integrations by name or id, and the reading of a copy's progress."""

from __future__ import annotations

import pytest

from airflow_gpumarket import api
from airflow_gpumarket.api import CopyProgress
from airflow_gpumarket.exceptions import GpuMarketError, GpuMarketValidationError

INTEGRATIONS = [
    {"id": 11, "cloud_type": "s3", "name": "checkpoints"},
    {"id": 12, "cloud_type": "gdrive", "name": "datasets"},
]


def rejected(call, field: str, *words: str) -> GpuMarketValidationError:
    with pytest.raises(GpuMarketValidationError) as caught:
        call()
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")
    for word in words:
        assert word in str(caught.value)
    return caught.value


def test_copy_paths_and_constants_are_the_live_services():
    assert api.PATH_COPY_DIRECT == "/api/v0/commands/copy_direct/"
    assert api.PATH_RCLONE == "/api/v0/commands/rclone/"
    assert (api.TRANSFER_TO_CLOUD, api.TRANSFER_FROM_CLOUD) == ("Instance To Cloud", "Cloud To Instance")
    assert api.CLOUD_COPY_FINISHED == "Cloud Copy Operation Finished"


# --- Bodies ------------------------------------------------------------------------------------------------
def test_instance_copy_body_is_the_clis_with_client_id_me():
    assert api.build_instance_copy_body(1, 2, "/workspace/out/", "/data/in/") == {
        "client_id": "me",
        "src_id": 1,
        "dst_id": 2,
        "src_path": "/workspace/out/",
        "dst_path": "/data/in/",
    }


def test_cloud_copy_body_names_the_integration_selected_and_sends_flags_as_a_list():
    body = api.build_cloud_copy_body(
        7, 11, src="/workspace/ckpt", dst="bucket/run-1", transfer=api.TRANSFER_TO_CLOUD, flags=("--size-only",)
    )
    assert body == {
        "src": "/workspace/ckpt",
        "dst": "bucket/run-1",
        "instance_id": 7,
        "selected": 11,
        "transfer": "Instance To Cloud",
        "flags": ["--size-only"],
    }


def test_cancel_body_names_the_destination_instance():
    assert api.build_cancel_copy_body(9) == {"client_id": "me", "dst_id": 9}


def test_an_empty_answer_reads_as_success_and_a_non_object_as_an_error():
    assert api.copy_answer("start_cloud_copy", None) == {"success": True}
    assert api.copy_answer("start_cloud_copy", {"success": True, "msg": "ok"}) == {"success": True, "msg": "ok"}
    with pytest.raises(GpuMarketError, match="instead of a JSON object"):
        api.copy_answer("start_cloud_copy", "<html>proxy</html>")


# --- Instance paths ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["workspace/out", "", None, 5, "./out"])
def test_an_instance_path_must_be_absolute(path):
    rejected(lambda: api.build_instance_copy_body(1, 2, path, "/in"), "src_path", "absolute")


@pytest.mark.parametrize("path", ["/workspace/../etc", "/..", "/a/b/.."])
def test_an_instance_path_must_not_climb_with_dot_dot(path):
    rejected(lambda: api.build_instance_copy_body(1, 2, "/out", path), "dst_path", "'..'")


def test_dots_inside_a_name_are_not_dot_dot_components():
    assert api.build_instance_copy_body(1, 2, "/w/a..b/", "/w/..c")["src_path"] == "/w/a..b/"


def test_an_instance_path_must_not_hold_nul():
    rejected(lambda: api.build_instance_copy_body(1, 2, "/out\0x", "/in"), "src_path", "NUL")


@pytest.mark.parametrize(("args", "field"), [((0, 2), "src_id"), ((1, True), "dst_id"), (("1", 2), "src_id")])
def test_instance_copy_ids_must_be_positive_ints(args, field):
    rejected(lambda: api.build_instance_copy_body(*args, "/out", "/in"), field)


# --- Cloud copies ------------------------------------------------------------------------------------------
def test_transfer_must_be_one_of_the_two_directions():
    rejected(
        lambda: api.build_cloud_copy_body(7, 11, src="/a", dst="b", transfer="instance to cloud"),
        "transfer",
        "Instance To Cloud",
    )


def test_to_cloud_src_is_an_instance_path_and_dst_an_integration_path():
    rejected(lambda: api.build_cloud_copy_body(7, 11, src="a", dst="b", transfer=api.TRANSFER_TO_CLOUD), "src")
    rejected(lambda: api.build_cloud_copy_body(7, 11, src="/a", dst="", transfer=api.TRANSFER_TO_CLOUD), "dst")


def test_from_cloud_src_is_an_integration_path_and_dst_an_instance_path():
    body = api.build_cloud_copy_body(7, 11, src="bucket/x", dst="/in", transfer=api.TRANSFER_FROM_CLOUD)
    assert (body["src"], body["dst"]) == ("bucket/x", "/in")
    rejected(lambda: api.build_cloud_copy_body(7, 11, src=" ", dst="/in", transfer=api.TRANSFER_FROM_CLOUD), "src")
    rejected(lambda: api.build_cloud_copy_body(7, 11, src="b", dst="in", transfer=api.TRANSFER_FROM_CLOUD), "dst")


def test_an_integration_path_keeps_a_leading_slash_and_refuses_dot_dot_and_nul():
    body = api.build_cloud_copy_body(7, 11, src="/folder", dst="/in", transfer=api.TRANSFER_FROM_CLOUD)
    assert body["src"] == "/folder"
    rejected(lambda: api.build_cloud_copy_body(7, 11, src="b/../c", dst="/in", transfer=api.TRANSFER_FROM_CLOUD), "src")
    rejected(lambda: api.build_cloud_copy_body(7, 11, src="b\0", dst="/in", transfer=api.TRANSFER_FROM_CLOUD), "src")


@pytest.mark.parametrize("flags", ["--size-only", ["-v"], ["--"], ["--max-age 24h"], [3], {"--update": True}])
def test_flags_are_a_list_of_double_dash_strings(flags):
    call = lambda: api.build_cloud_copy_body(  # noqa: E731
        7, 11, src="/a", dst="b", transfer=api.TRANSFER_TO_CLOUD, flags=flags
    )
    rejected(call, "flags", "'--size-only'")


def test_cloud_copy_ids_must_be_positive_ints():
    rejected(lambda: api.build_cloud_copy_body(0, 11, src="/a", dst="b", transfer=api.TRANSFER_TO_CLOUD), "instance_id")
    rejected(
        lambda: api.build_cloud_copy_body(7, "s3", src="/a", dst="b", transfer=api.TRANSFER_TO_CLOUD), "integration_id"
    )


# --- Cloud integrations ------------------------------------------------------------------------------------
@pytest.mark.parametrize("ref", [12, "12", "datasets"])
def test_an_integration_is_found_by_id_digits_or_exact_name(ref):
    assert api.resolve_cloud_integration(INTEGRATIONS, ref)["id"] == 12


def test_a_missing_integration_lists_those_there_are_and_says_to_add_one():
    exc = rejected(
        lambda: api.resolve_cloud_integration(INTEGRATIONS, "Datasets"),
        "cloud_integration",
        "'checkpoints' (id 11, s3)",
        "'datasets' (id 12, gdrive)",
        "console",
    )
    assert exc.problem


def test_an_account_without_integrations_says_it_has_none():
    rejected(lambda: api.resolve_cloud_integration([], 11), "cloud_integration", "has: none", "console")


def test_two_integrations_of_one_name_ask_for_the_id():
    twins = [*INTEGRATIONS, {"id": 13, "cloud_type": "s3", "name": "checkpoints"}]
    rejected(lambda: api.resolve_cloud_integration(twins, "checkpoints"), "cloud_integration", "11, 13", "id")


def test_digits_that_match_no_id_may_still_be_a_name():
    named = [{"id": 5, "cloud_type": "s3", "name": "2024"}]
    assert api.resolve_cloud_integration(named, "2024")["id"] == 5


@pytest.mark.parametrize("ref", ["", "  ", None, True, 0, -1, 1.5])
def test_an_integration_reference_must_be_a_name_or_a_positive_id(ref):
    rejected(lambda: api.resolve_cloud_integration(INTEGRATIONS, ref), "cloud_integration", "name or id")


# --- Progress ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status_msg", "progress"),
    [
        ("Cloud Copy Operation Finished", CopyProgress.FINISHED),
        ("cloud copy operation finished at 12:00", CopyProgress.FINISHED),
        ("Done receiving copy", CopyProgress.FINISHED),
        ("Remote copy complete", CopyProgress.FINISHED),
        ("Copy finished with errors", CopyProgress.FAILED),
        ("rclone: Failed to copy: access denied", CopyProgress.FAILED),
        ("Error during copy", CopyProgress.FAILED),
        ("Remote copy canceled", CopyProgress.CANCELLED),
        ("Cloud Copy Started", CopyProgress.RUNNING),
        ("Receiving copy...", CopyProgress.RUNNING),
        ("copying: 0 errors, 40% done of 12 GB", CopyProgress.RUNNING),
        ("Copy 100% complete", CopyProgress.FINISHED),
        ("success, running pytorch/pytorch_latest/jupyter", CopyProgress.UNKNOWN),
        # the cloud copy's news: the operation's name, then its state; any state but a good end or one under way
        ("Cloud Copy Operation Aborted: source not reachable", CopyProgress.FAILED),
        ("Cloud Copy Operation Stopped", CopyProgress.FAILED),
        ("Cloud Copy Operation: 40% (2 of 5 files)", CopyProgress.RUNNING),
        ("Cloud Copy Operation Started", CopyProgress.RUNNING),
        ("Cloud Copy Operation in progress", CopyProgress.RUNNING),
        ("Cloud Copy Operation Completed", CopyProgress.FINISHED),
        ("Cloud Copy Operation", CopyProgress.RUNNING),
        ("Remote copy aborted: host unreachable", CopyProgress.FAILED),
        ("Copy: source directory not found", CopyProgress.FAILED),
        ("", CopyProgress.UNKNOWN),
        (None, CopyProgress.UNKNOWN),
    ],
)
def test_copy_progress_is_read_from_the_status_msg(status_msg, progress):
    assert api.copy_progress(status_msg) is progress
