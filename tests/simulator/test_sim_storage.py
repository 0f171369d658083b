"""Instance disks, cloud buckets and the copy endpoints (issue 35), one behaviour per test.

The clock is frozen: only ``advance`` moves it, so every copy's timing is exact. Defaults: a copy starts 5 s after
its request, moves 50 MB/s, and shows in ``status_msg`` 30 s late.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from gpumarket_simulator import MarketSimulator
from gpumarket_simulator.storage import INSTANCE_ROOT_ENV
from gpumarket_simulator.worldgen import SAMPLE_BUCKET_FILES

from .helpers import Api, boot, finished_onstart, ledger

COPY_DIRECT = "/api/v0/commands/copy_direct/"
RCLONE = "/api/v0/commands/rclone/"
LATENCY = 5.0
DELAY = 30.0
BUCKET = 1  # the default world's first cloud integration


def two_instances(api: Api, sim: MarketSimulator) -> tuple[int, int]:
    offers = api.search({"limit": 2})
    ids = [api.create(o["id"])["new_contract"] for o in offers]
    boot(sim)
    return ids[0], ids[1]


def copy(api: Api, src: Any, dst: Any, src_path: str, dst_path: str) -> Any:
    body = {"client_id": "me", "src_id": src, "dst_id": dst, "src_path": src_path, "dst_path": dst_path}
    return api.put(COPY_DIRECT, body)


def cloud(api: Api, src: str, dst: str, instance: Any, transfer: str, selected: Any = BUCKET) -> Any:
    body = {"src": src, "dst": dst, "instance_id": instance, "selected": selected, "transfer": transfer, "flags": []}
    return api.post(RCLONE, body)


def paths(files: list[dict[str, Any]]) -> list[str]:
    return [f["path"] for f in files]


def only_copy(sim: MarketSimulator) -> dict[str, Any]:
    (one,) = sim.copies()
    return one


# --- disks ------------------------------------------------------------------------------------------------------
def test_each_instance_gets_a_disk_of_its_own_at_creation(sim, api):
    a, b = two_instances(api, sim)
    assert os.path.isdir(sim.disk_dir(a)) and os.path.isdir(sim.disk_dir(b))
    assert sim.disk_dir(a) != sim.disk_dir(b)
    assert sim.disk_dir(a) == os.path.join(sim.data_dir, "disks", f"instance-{a}")


def test_disks_are_isolated_between_instances(sim, api):
    a, b = two_instances(api, sim)
    sim.put_disk_file(a, "data/x.bin", b"x")
    assert paths(sim.disk_files(a)) == ["data/x.bin"]
    assert sim.disk_files(b) == []


def test_disk_is_removed_when_the_instance_is_destroyed(sim, api):
    a, _ = two_instances(api, sim)
    sim.put_disk_file(a, "x", b"x")
    assert api.delete(f"/api/v0/instances/{a}/").status_code == 200
    assert not os.path.exists(sim.disk_dir(a))


def test_disk_is_kept_while_the_instance_is_stopped(sim, api):
    a, _ = two_instances(api, sim)
    sim.put_disk_file(a, "ckpt/step-1", b"1")
    assert api.put(f"/api/v0/instances/{a}/", {"state": "stopped"}).status_code == 200
    sim.advance(3600)
    assert sim.read_disk_file(a, "ckpt/step-1") == b"1"


def test_reset_removes_disks_and_bucket_files(sim, api):
    a, _ = two_instances(api, sim)
    sim.put_disk_file(a, "x", b"x")
    sim.put_bucket_file(BUCKET, "y", b"y")
    sim.reset()
    assert not os.path.exists(sim.disk_dir(a))
    assert {f["path"] for f in sim.bucket_files(BUCKET)} == set(SAMPLE_BUCKET_FILES["training-data"])


def test_the_default_worlds_training_data_bucket_begins_with_a_sample_dataset(sim):
    assert {f["path"] for f in sim.bucket_files(BUCKET)} == {"datasets/mnist/train.csv", "datasets/mnist/test.csv"}
    assert all(sim.bucket_files(other) == [] for other in (2, 3))


def test_onstart_gets_its_disk_as_gpumarket_instance_root():
    with MarketSimulator(speed=0, execute_onstart=True, profile="spec") as osim:
        oapi = Api(osim, osim.api_key)
        script = f'echo "root=${INSTANCE_ROOT_ENV}"; echo hi > "${INSTANCE_ROOT_ENV}/out.txt"'
        instance_id = oapi.create(body={"image": "u", "onstart": script})["new_contract"]
        boot(osim)
        output = finished_onstart(osim, instance_id)["output"]
        assert f"root={osim.disk_dir(instance_id)}\n" in output
        assert osim.read_disk_file(instance_id, "out.txt") == b"hi\n"


# --- copy_direct ------------------------------------------------------------------------------------------------
def test_copy_direct_moves_a_directorys_contents_into_the_destination(sim, api):
    a, b = two_instances(api, sim)
    sim.put_disk_file(a, "work/out/a.txt", b"aa")
    sim.put_disk_file(a, "work/out/sub/b.txt", b"bbb")
    response = copy(api, a, b, "/work/out", "/restore/")
    assert response.status_code == 200, response.text
    assert response.json()["success"] is True
    sim.advance(LATENCY + 1)
    assert paths(sim.disk_files(b)) == ["restore/a.txt", "restore/sub/b.txt"]
    assert sim.read_disk_file(b, "restore/sub/b.txt") == b"bbb"
    assert only_copy(sim)["state"] == "finished"


def test_copy_direct_of_a_file_to_a_new_name_or_into_a_directory(sim, api):
    a, b = two_instances(api, sim)
    sim.put_disk_file(a, "m.pt", b"m")
    sim.put_disk_file(b, "existing/keep", b"k")
    copy(api, a, b, "/m.pt", "/renamed.pt")
    copy(api, a, b, "/m.pt", "/into/")
    copy(api, a, b, "/m.pt", "/existing")
    sim.advance(LATENCY + 1)
    assert set(paths(sim.disk_files(b))) == {"renamed.pt", "into/m.pt", "existing/m.pt", "existing/keep"}


def test_copy_direct_accepts_ids_as_digit_strings_and_c_dot_form(sim, api):
    a, b = two_instances(api, sim)
    sim.put_disk_file(a, "f", b"f")
    assert copy(api, str(a), f"C.{b}", "/f", "/g").status_code == 200
    sim.advance(LATENCY + 1)
    assert sim.read_disk_file(b, "g") == b"f"


def test_copy_direct_works_from_a_stopped_instance(sim, api):
    a, b = two_instances(api, sim)
    sim.put_disk_file(a, "ckpt/w.bin", b"w")
    api.put(f"/api/v0/instances/{a}/", {"state": "stopped"})
    assert copy(api, a, b, "/ckpt/", "/ckpt/").status_code == 200
    sim.advance(LATENCY + 1)
    assert sim.read_disk_file(b, "ckpt/w.bin") == b"w"


def test_files_move_in_sorted_order_and_appear_only_when_whole(sim, api):
    a, b = two_instances(api, sim)
    sim.set_copy_settings(bytes_per_second=1000)
    for name in ("c", "a", "b"):
        sim.put_disk_file(a, f"d/{name}", b"x" * 1000)
    copy(api, a, b, "/d", "/d")
    sim.advance(LATENCY + 1.5)  # a is whole, b half way
    files = sim.disk_files(b)
    assert [f["path"] for f in files if not f.get("partial")] == ["d/a"]
    assert [f for f in files if f.get("partial")], "the file in flight has a temporary name"
    view = only_copy(sim)
    assert (view["state"], view["files_done"], view["files_total"]) == ("running", 1, 3)
    sim.advance(2)
    assert paths(sim.disk_files(b)) == ["d/a", "d/b", "d/c"]


def test_a_missing_source_fails_the_copy_not_the_request(sim, api):
    a, b = two_instances(api, sim)
    assert copy(api, a, b, "/nothing/here", "/x").status_code == 200
    sim.advance(LATENCY + 1)
    view = only_copy(sim)
    assert view["state"] == "failed" and "does not exist" in view["error"]


def test_progress_then_finished_shows_in_status_msg_after_the_delay(sim, api):
    a, b = two_instances(api, sim)
    sim.set_copy_settings(bytes_per_second=1000)
    for name in ("1", "2", "3", "4"):
        sim.put_disk_file(a, f"d/{name}", b"x" * 1000)
    before = api.instance(b)["status_msg"]
    copy(api, a, b, "/d", "/d")
    sim.advance(LATENCY + 2.5)  # two of four files moved, not yet shown
    assert api.instance(b)["status_msg"] == before
    sim.advance(DELAY)
    assert api.instance(b)["status_msg"] == "Remote copy: 50% (2 of 4 files)"
    sim.advance(1)
    assert only_copy(sim)["state"] == "finished"
    assert api.instance(b)["status_msg"] == "Remote copy: 75% (3 of 4 files)"
    sim.advance(DELAY)
    assert api.instance(b)["status_msg"] == "Remote copy finished"


def test_status_delay_is_settable(sim, api):
    a, b = two_instances(api, sim)
    sim.put_disk_file(a, "f", b"f")
    sim.set_copy_settings(status_delay_seconds=0, start_latency_seconds=0)
    copy(api, a, b, "/f", "/f")
    sim.advance(1)
    assert api.instance(b)["status_msg"] == "Remote copy finished"


def test_cancel_copy_direct_stops_copies_into_the_destination(sim, api):
    a, b = two_instances(api, sim)
    sim.set_copy_settings(bytes_per_second=10)
    sim.put_disk_file(a, "big", b"x" * 1000)
    copy(api, a, b, "/big", "/big")
    sim.advance(LATENCY + 10)
    response = api.delete(COPY_DIRECT, {"client_id": "me", "dst_id": b})
    assert response.status_code == 200 and response.json()["success"] is True
    sim.advance(DELAY + 1)
    assert only_copy(sim)["state"] == "cancelled"
    assert sim.disk_files(b) == []  # no partial file is left behind
    assert api.instance(b)["status_msg"] == "Remote copy cancelled"


def test_destroying_the_source_mid_copy_fails_the_copy(sim, api):
    a, b = two_instances(api, sim)
    sim.set_copy_settings(bytes_per_second=10)
    sim.put_disk_file(a, "big", b"x" * 1000)
    copy(api, a, b, "/big", "/big")
    sim.advance(LATENCY + 10)
    api.delete(f"/api/v0/instances/{a}/")
    view = only_copy(sim)
    assert view["state"] == "failed" and f"instance {a} was destroyed" in view["error"]
    sim.advance(DELAY + 1)
    assert api.instance(b)["status_msg"] == f"Remote copy failed: instance {a} was destroyed"


def test_copy_faults_fail_the_next_copies_after_a_fraction_of_their_files(sim, api):
    a, b = two_instances(api, sim)
    for name in ("1", "2", "3", "4"):
        sim.put_disk_file(a, f"d/{name}", b"x")
    sim.set_copy_faults([{"times": 1, "kind": "copy_direct", "after_fraction": 0.5, "msg": "disk full"}])
    copy(api, a, b, "/d", "/first")
    copy(api, a, b, "/d", "/second")
    sim.advance(LATENCY + DELAY + 1)
    first, second = sim.copies()
    assert (first["state"], first["files_done"], first["error"]) == ("failed", 2, "disk full")
    assert second["state"] == "finished"
    assert paths(sim.disk_files(b)) == ["first/1", "first/2", *(f"second/{n}" for n in "1234")]


def test_copy_faults_filter_by_kind_and_direction(sim, api):
    a, _ = two_instances(api, sim)
    sim.put_disk_file(a, "f", b"f")
    sim.set_copy_faults([{"kind": "rclone", "direction": "cloud to instance", "after_fraction": 0}])
    cloud(api, "/f", "out/f", a, "Instance To Cloud")
    sim.put_bucket_file(BUCKET, "in/g", b"g")
    cloud(api, "in/g", "/g", a, "Cloud To Instance")
    sim.advance(LATENCY + 1)
    assert [c["state"] for c in sim.copies()] == ["finished", "failed"]


def test_a_copy_fault_may_report_done_a_copy_that_moved_nothing(sim, api):
    a, b = two_instances(api, sim)
    sim.put_disk_file(a, "d/1", b"x")
    sim.set_copy_faults([{"kind": "copy_direct", "after_fraction": 0, "ends": "finished"}])
    copy(api, a, b, "/d", "/d")
    sim.advance(LATENCY + DELAY + 1)
    (done,) = sim.copies()
    assert (done["state"], done["files_done"], done["error"]) == ("finished", 0, None)
    assert sim.disk_files(b) == []
    assert sim.state()["instances"][1]["status_msg"] == "Remote copy finished"


def test_a_copy_fault_may_word_its_end_as_another_service_would(sim, api):
    a, _ = two_instances(api, sim)
    sim.put_bucket_file(BUCKET, "in/g", b"g")
    sim.set_copy_faults([{"kind": "rclone", "after_fraction": 0, "status_msg": "Cloud Copy Operation Aborted"}])
    cloud(api, "in/g", "/g", a, "Cloud To Instance")
    sim.advance(LATENCY + DELAY + 1)
    assert only_copy(sim)["state"] == "failed"
    assert sim.state()["instances"][0]["status_msg"] == "Cloud Copy Operation Aborted"


# --- cloud copies -----------------------------------------------------------------------------------------------
def test_instance_to_cloud_copy_lands_in_the_integrations_bucket(sim, api):
    a, _ = two_instances(api, sim)
    sim.put_disk_file(a, "out/result.json", b"{}")
    response = cloud(api, "/out", "runs/1/", str(a), "Instance to Cloud", selected=str(BUCKET))
    assert response.status_code == 200, response.text
    sim.advance(LATENCY + 1)
    assert {"path": "runs/1/result.json", "size": 2} in sim.bucket_files(BUCKET)


def test_cloud_to_instance_copy_restores_into_the_disk(sim, api):
    a, _ = two_instances(api, sim)
    sim.put_bucket_file(BUCKET, "inputs/data.csv", b"a,b\n")
    assert cloud(api, "inputs", "/workspace/inputs", a, "CLOUD TO INSTANCE").status_code == 200
    sim.advance(LATENCY + 1)
    assert sim.read_disk_file(a, "workspace/inputs/data.csv") == b"a,b\n"


def test_cloud_copy_finished_reads_the_live_wording(sim, api):
    a, _ = two_instances(api, sim)
    sim.put_disk_file(a, "f", b"f")
    cloud(api, "/f", "f", a, "Instance To Cloud")
    sim.advance(LATENCY + DELAY + 1)
    assert api.instance(a)["status_msg"] == "Cloud Copy Operation Finished"


def test_cloud_copy_status_shows_in_the_live_v1_list_too():
    with MarketSimulator(speed=0, rate_limits=False) as live_sim:
        live = Api(live_sim, live_sim.api_key)
        instance_id = live.create(live.search({"limit": 1})[0]["id"])["new_contract"]
        boot(live_sim)
        live_sim.put_disk_file(instance_id, "f", b"f")
        cloud(live, "/f", "f", instance_id, "Instance To Cloud")
        live_sim.advance(LATENCY + DELAY + 1)
        rows = live.get("/api/v1/instances/").json()["instances"]
        assert [r["status_msg"] for r in rows if r["id"] == instance_id] == ["Cloud Copy Operation Finished"]
        assert live.get(f"/api/v0/instances/{instance_id}/").json()["instances"]["status_msg"] == (
            "Cloud Copy Operation Finished"
        )


def test_cancel_sync_cancels_the_instances_cloud_copies(sim, api):
    a, _ = two_instances(api, sim)
    sim.set_copy_settings(bytes_per_second=10)
    sim.put_disk_file(a, "big", b"x" * 1000)
    cloud(api, "/big", "big", a, "Instance To Cloud")
    sim.advance(LATENCY + 1)
    assert api.delete(RCLONE, {"client_id": "me", "dst_id": str(a)}).status_code == 200
    sim.advance(DELAY + 1)
    assert only_copy(sim)["state"] == "cancelled"
    assert api.instance(a)["status_msg"] == "Cloud Copy Operation Cancelled"


def test_an_unknown_integration_is_a_404(sim, api):
    a, _ = two_instances(api, sim)
    response = cloud(api, "/f", "f", a, "Instance To Cloud", selected=999)
    assert response.status_code == 404 and response.json()["error"] == "no_such_integration"


def test_added_integration_gets_a_bucket_and_is_listed(sim, api):
    added = sim.add_cloud_integration("results", "s3")
    assert added in api.get("/api/v0/users/cloud_integrations").json()
    sim.put_bucket_file(added["id"], "k", b"v")
    assert sim.read_bucket_file(added["id"], "k") == b"v"


# --- bad input --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"src_id": 1, "dst_id": 1, "src_path": "relative/p", "dst_path": "/x"}, "src_path"),
        ({"src_id": 1, "dst_id": 1, "src_path": "/x", "dst_path": "/a/../../instance-1/x"}, "dst_path"),
        ({"src_id": "V.12", "dst_id": 1, "src_path": "/x", "dst_path": "/x"}, "src_id"),
        ({"src_id": 1, "dst_path": "/x", "src_path": "/x"}, "dst_id"),
        ({"src_id": True, "dst_id": 1, "src_path": "/x", "dst_path": "/x"}, "src_id"),
        ({"src_id": 1, "dst_id": 1, "src_path": ["/x"], "dst_path": "/x"}, "src_path"),
    ],
)
def test_bad_copy_direct_bodies_are_400s_naming_the_field(sim, api, body, field):
    a, b = two_instances(api, sim)
    body = {k: (a if v == 1 and type(v) is int else v) for k, v in body.items()}
    response = api.put(COPY_DIRECT, body)
    assert response.status_code == 400, response.text
    assert field in response.json()["msg"]


@pytest.mark.parametrize(
    "body",
    [
        {"src": "/f", "dst": "f", "transfer": "Instance To Cloud", "selected": 1},
        {"src": "/f", "dst": "f", "instance_id": "X", "transfer": "Instance To Cloud", "selected": 1},
        {"src": "/f", "dst": "f", "instance_id": 1, "transfer": "sideways", "selected": 1},
        {"src": "/f", "dst": "../f", "instance_id": 1, "transfer": "Instance To Cloud", "selected": 1},
        {"src": "f", "dst": "f", "instance_id": 1, "transfer": "Instance To Cloud", "selected": 1},
        {"src": "/f", "dst": "f", "instance_id": 1, "transfer": "Instance To Cloud", "selected": "one"},
        {"src": "/f", "dst": "f", "instance_id": 1, "transfer": "Instance To Cloud", "selected": 1, "flags": "x"},
    ],
)
def test_bad_cloud_copy_bodies_are_400s(sim, api, body):
    a, _ = two_instances(api, sim)
    body = {**body, **({"instance_id": a} if type(body.get("instance_id")) is int else {})}
    response = api.post(RCLONE, body)
    assert response.status_code == 400, response.text


@pytest.mark.parametrize("raw", [b"", b"[]", b"{", b'{"dst_id": null}', b'{"dst_id": "C."}'])
@pytest.mark.parametrize("path", [COPY_DIRECT, RCLONE])
def test_bad_cancel_bodies_are_400s(sim, api, raw, path):
    response = api.call("DELETE", path, data=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert sim.state()["internal_errors"] == 0


def test_copies_of_unknown_or_destroyed_instances_are_404s(sim, api):
    a, b = two_instances(api, sim)
    api.delete(f"/api/v0/instances/{b}/")
    assert copy(api, a, b, "/x", "/x").status_code == 404
    assert copy(api, 99, a, "/x", "/x").status_code == 404
    assert api.delete(COPY_DIRECT, {"client_id": "me", "dst_id": b}).status_code == 404


def test_an_instance_key_may_not_copy(sim, api):
    offers = api.search({"limit": 2})
    created = [api.create(o["id"]) for o in offers]
    instance_api = Api(sim, created[0]["instance_api_key"])
    ids = [c["new_contract"] for c in created]
    assert copy(instance_api, ids[0], ids[1], "/x", "/x").status_code == 403


def test_admin_copy_settings_and_faults_refuse_bad_values(sim):
    with pytest.raises(ValueError):
        sim.set_copy_settings(bytes_per_second=0)
    with pytest.raises(ValueError):
        sim.set_copy_faults([{"after_fraction": 2}])
    with pytest.raises(ValueError):
        sim.set_copy_faults([{"kind": "scp"}])
    with pytest.raises(ValueError, match="ends"):
        sim.set_copy_faults([{"ends": "lost"}])
    with pytest.raises(ValueError, match="status_msg"):
        sim.set_copy_faults([{"status_msg": 3}])


# --- money and secrets ------------------------------------------------------------------------------------------
def test_bandwidth_is_billed_to_the_source_upload_and_the_destination_download(sim, api):
    a, b = two_instances(api, sim)
    offers = {o["id"]: o for o in sim.state()["offers"]}
    sim.put_disk_file(a, "f", b"x" * 2_000_000)
    before_a, before_b = ledger(sim, a)["cost"], ledger(sim, b)["cost"]
    copy(api, a, b, "/f", "/f")
    sim.advance(LATENCY + 1)
    src, dst = ledger(sim, a), ledger(sim, b)
    assert (src["bandwidth_up_bytes"], dst["bandwidth_down_bytes"]) == (2_000_000, 2_000_000)
    assert src["bandwidth_cost"] == pytest.approx(0.002 * offers[src["offer_id"]]["inet_up_cost"])
    assert dst["bandwidth_cost"] == pytest.approx(0.002 * offers[dst["offer_id"]]["inet_down_cost"])
    assert src["cost"] == pytest.approx(src["compute_cost"] + src["storage_cost"] + src["bandwidth_cost"])
    assert src["cost"] > before_a and dst["cost"] > before_b


def test_cloud_copy_bills_only_the_instance_side(sim, api):
    a, _ = two_instances(api, sim)
    sim.put_bucket_file(BUCKET, "in", b"x" * 1000)
    cloud(api, "in", "/in", a, "Cloud To Instance")
    sim.advance(LATENCY + 1)
    row = ledger(sim, a)
    assert (row["bandwidth_down_bytes"], row["bandwidth_up_bytes"]) == (1000, 0)


def test_offers_carry_bandwidth_prices(api):
    offer = api.search({"limit": 1})[0]
    assert 0.001 <= offer["inet_up_cost"] <= 0.02 and 0.001 <= offer["inet_down_cost"] <= 0.02


def test_request_log_keeps_create_bodies(sim, api):
    api.create(body={"image": "u", "env": {"A": "1"}, "onstart": "echo hi"})
    (entry,) = [r for r in sim.requests() if r["op"] == "create_instance"]
    assert entry["body"] == {"image": "u", "env": {"A": "1"}, "onstart": "echo hi"}


def test_a_given_data_dir_holds_disks_and_buckets_and_is_emptied_on_close(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    with MarketSimulator(speed=0, profile="spec", data_dir=data) as given:
        gapi = Api(given, given.api_key)
        instance_id = gapi.create()["new_contract"]
        assert os.path.isdir(data / "disks" / f"instance-{instance_id}")
        assert os.path.isdir(data / "buckets" / str(BUCKET))
    assert data.is_dir() and not (data / "disks").exists() and not (data / "buckets").exists()
