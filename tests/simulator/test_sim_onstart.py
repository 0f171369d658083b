"""--execute-onstart: the onstart script runs as a local process when its instance first reaches running."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpumarket_simulator import MarketSimulator

from .helpers import Api, boot, finished_onstart, wait_for

needs_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="the callback script uses curl")


@pytest.fixture(scope="module")
def onstart_server() -> Iterator[MarketSimulator]:
    with MarketSimulator(speed=0, seed=0, execute_onstart=True, profile="spec") as sim:
        yield sim


@pytest.fixture
def osim(onstart_server):
    onstart_server.reset()
    return onstart_server


@pytest.fixture
def oapi(osim):
    return Api(osim, osim.api_key)


def launch(api, onstart, **fields):
    return api.create(body={"image": "ubuntu", "onstart": onstart, **fields})


def test_onstart_does_not_run_before_running(osim, oapi):
    instance_id = launch(oapi, "echo hi")["new_contract"]
    osim.advance(30)
    assert osim.onstart_result(instance_id) is None


def test_onstart_runs_when_the_instance_reaches_running(osim, oapi):
    instance_id = launch(oapi, "echo out; echo err >&2; exit 3")["new_contract"]
    boot(osim)
    result = finished_onstart(osim, instance_id)
    assert result["exit_code"] == 3 and result["running"] is False
    assert "out" in result["output"] and "err" in result["output"]


def test_onstart_env_is_the_request_env_without_port_mappings(osim, oapi):
    created = launch(oapi, "env", env={"FOO": "bar baz", "-p 8080:8080": "1"})
    boot(osim)
    lines = set(finished_onstart(osim, created["new_contract"])["output"].splitlines())
    assert "FOO=bar baz" in lines
    assert not any(line.startswith("-p") for line in lines)


def test_onstart_env_has_container_api_key_and_container_id(osim, oapi):
    created = launch(oapi, "env")
    boot(osim)
    lines = set(finished_onstart(osim, created["new_contract"])["output"].splitlines())
    assert f"CONTAINER_API_KEY={created['instance_api_key']}" in lines
    assert f"CONTAINER_ID={created['new_contract']}" in lines


def test_onstart_env_has_path_home_and_nothing_else_from_the_simulator(osim, oapi, monkeypatch):
    monkeypatch.setenv("GPUMARKET_TEST_SECRET", "leak")
    created = launch(oapi, "env", env={"PATH": "/opt/conda/bin"})
    boot(osim)
    output = finished_onstart(osim, created["new_contract"])["output"]
    assert "GPUMARKET_TEST_SECRET" not in output
    assert "PATH=/opt/conda/bin\n" not in output and "PATH=" in output


def test_onstart_runs_in_a_fresh_scratch_directory(osim, oapi):
    offers = oapi.search({"limit": 2})
    ids = [oapi.create(o["id"], {"image": "u", "onstart": "pwd; ls -A"})["new_contract"] for o in offers]
    boot(osim)
    outputs = [finished_onstart(osim, i)["output"].split() for i in ids]
    assert outputs[0][0] != outputs[1][0]
    assert all(out[1:] == ["onstart.sh"] for out in outputs)


@needs_curl
def test_onstart_can_destroy_its_own_instance_over_loopback(osim, oapi):
    script = (
        'curl -fsS -X DELETE -H "Authorization: Bearer $CONTAINER_API_KEY" '
        f'"{osim.url}/api/v0/instances/$CONTAINER_ID/"; echo; echo done'
    )
    instance_id = launch(oapi, script)["new_contract"]
    boot(osim)
    result = finished_onstart(osim, instance_id)
    assert result["exit_code"] == 0, result["output"]
    assert '{"success":true}' in result["output"] and "done" in result["output"]
    assert oapi.get(f"/api/v0/instances/{instance_id}/").status_code == 404


@needs_curl
def test_onstart_can_stop_its_own_instance_over_loopback(osim, oapi):
    script = (
        f'curl -fsS -X PUT -H "Authorization: Bearer $CONTAINER_API_KEY" -d \'{{"state": "stopped"}}\' '
        f'"{osim.url}/api/v0/instances/$CONTAINER_ID/"'
    )
    instance_id = launch(oapi, script)["new_contract"]
    boot(osim)
    finished_onstart(osim, instance_id)
    assert oapi.status(instance_id) == "stopped"


def test_onstart_is_killed_when_the_instance_is_destroyed(osim, oapi):
    instance_id = launch(oapi, "echo started; sleep 30; echo never")["new_contract"]
    boot(osim)
    wait_for(lambda: "started" in osim.onstart_result(instance_id)["output"])
    oapi.delete(f"/api/v0/instances/{instance_id}/")
    result = finished_onstart(osim, instance_id)
    assert result["exit_code"] < 0 and "never" not in result["output"]


def test_rule_a_process_that_left_the_scripts_group_ends_with_the_instance_too(osim, oapi, tmp_path):
    import os

    pid_file = tmp_path / "pid"
    # timeout, like setsid, runs its command in a process group of its own; a container's end stops it all the same
    script = f"timeout 300 sh -c 'echo $$ > {pid_file}; sleep 300' & echo started; wait"
    instance_id = launch(oapi, script)["new_contract"]
    boot(osim)
    wait_for(lambda: "started" in osim.onstart_result(instance_id)["output"] and pid_file.exists())
    pid = int(pid_file.read_text())
    oapi.delete(f"/api/v0/instances/{instance_id}/")
    finished_onstart(osim, instance_id)

    def ended() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(ended)


def test_onstart_is_killed_when_the_instance_is_stopped(osim, oapi):
    instance_id = launch(oapi, "echo started; sleep 30")["new_contract"]
    boot(osim)
    wait_for(lambda: "started" in osim.onstart_result(instance_id)["output"])
    oapi.put(f"/api/v0/instances/{instance_id}/", {"state": "stopped"})
    assert finished_onstart(osim, instance_id)["exit_code"] < 0


def test_onstart_runs_only_once_per_instance(osim, oapi):
    instance_id = launch(oapi, "echo run")["new_contract"]
    boot(osim)
    finished_onstart(osim, instance_id)
    oapi.put(f"/api/v0/instances/{instance_id}/", {"state": "stopped"})
    oapi.put(f"/api/v0/instances/{instance_id}/", {"state": "running"})
    boot(osim)
    assert oapi.status(instance_id) == "running"
    assert finished_onstart(osim, instance_id)["output"].count("run") == 1


def test_onstart_does_not_run_with_runtype_args(osim, oapi):
    instance_id = launch(oapi, "echo hi", runtype="args", args_str="--x")["new_contract"]
    boot(osim)
    assert oapi.status(instance_id) == "running"
    assert osim.onstart_result(instance_id) is None


def test_onstart_does_not_run_on_a_failing_host(osim, oapi):
    failing = next(o for o in osim.state()["offers"] if o["fate"] == "exited" and o["rentable"])
    instance_id = oapi.create(failing["id"], {"image": "u", "onstart": "echo hi"})["new_contract"]
    boot(osim)
    assert osim.onstart_result(instance_id) is None


def test_template_onstart_runs_with_the_merged_env(osim, oapi):
    template = next(t for t in osim.state()["templates"] if t["name"] == "private-trainer")
    body = {"template_hash_id": template["hash_id"], "onstart": "echo $MODE $EXTRA", "env": {"EXTRA": "x"}}
    created = oapi.create(body=body)
    boot(osim)
    assert finished_onstart(osim, created["new_contract"])["output"].strip() == "train x"


def test_onstart_output_is_visible_through_the_admin_surface(osim, oapi):
    instance_id = launch(oapi, "echo visible")["new_contract"]
    boot(osim)
    finished_onstart(osim, instance_id)
    body = oapi.get(f"/_sim/instances/{instance_id}/onstart", key=None).json()
    assert body == {"exit_code": 0, "output": "visible\n", "running": False}


def test_reset_kills_running_scripts(osim, oapi):
    instance_id = launch(oapi, "sleep 30")["new_contract"]
    boot(osim)
    assert osim.onstart_result(instance_id)["running"] is True
    osim.reset()
    assert osim.onstart_result(instance_id) is None


def test_onstart_is_not_run_without_execute_onstart(sim, api):
    instance_id = api.create(body={"image": "u", "onstart": "echo hi"})["new_contract"]
    boot(sim)
    assert sim.onstart_result(instance_id) is None


def test_ticker_starts_onstart_without_anyone_polling(tmp_path: Path):
    marker = tmp_path / "ran"
    with MarketSimulator(speed=100_000, execute_onstart=True, profile="spec") as sim:
        api = Api(sim, sim.api_key)
        api.create(body={"image": "u", "onstart": f"touch {marker}"})
        wait_for(marker.exists, timeout=10)  # watches the file system only: no request reaches the simulator


def test_onstart_starts_even_when_the_request_that_brought_the_instance_to_running_fails():
    """Regression: the request that updates the world may answer an error (here a 409 on a rented offer);
    the instance it brought to running must still get its onstart script."""
    import time as _time

    import requests as _requests

    from gpumarket_simulator import MarketSimulator

    with MarketSimulator(speed=0, execute_onstart=True, profile="spec") as sim:  # frozen clock: only this test moves it
        headers = {"Authorization": f"Bearer {sim.api_key}"}
        offer = _requests.post(f"{sim.url}/api/v0/bundles/", json={"limit": 1}, headers=headers).json()["offers"][0]
        body = {"image": "img", "runtype": "ssh", "onstart": "echo started"}
        made = _requests.put(f"{sim.url}/api/v0/asks/{offer['id']}/", json=body, headers=headers).json()
        sim._market.clock.advance(400)  # past any boot, without a transaction seeing it yet
        again = _requests.put(f"{sim.url}/api/v0/asks/{offer['id']}/", json=body, headers=headers)
        assert again.status_code == 409
        deadline = _time.monotonic() + 10
        while _time.monotonic() < deadline and not (sim.onstart_result(made["new_contract"]) or {}).get("output"):
            _time.sleep(0.02)  # bounded wait for the subprocess, not for simulated time
        assert "started" in sim.onstart_result(made["new_contract"])["output"]


def test_onstart_has_its_own_tmpdir_which_goes_when_the_instance_stops_running(osim, oapi):
    instance_id = launch(oapi, 'echo "$TMPDIR"; touch "$TMPDIR/scratch"; sleep 30')["new_contract"]
    boot(osim)
    tmpdir = Path(wait_for(lambda: osim.onstart_result(instance_id)["output"].strip()))
    assert wait_for(lambda: (tmpdir / "scratch").exists())
    oapi.delete(f"/api/v0/instances/{instance_id}/")
    assert wait_for(lambda: not tmpdir.exists())


# --- outbids -----------------------------------------------------------------------------------------------
def test_an_outbid_stops_a_bid_instance_kills_its_script_and_bills_storage_only(osim, oapi):
    offer = oapi.cheapest()
    instance_id = launch(oapi, "echo started; sleep 600", price=offer["min_bid"])["new_contract"]
    boot(osim)
    wait_for(lambda: "started" in (osim.onstart_result(instance_id) or {}).get("output", ""))

    osim.outbid(instance_id)

    seen = oapi.instance(instance_id)
    assert (seen["actual_status"], seen["intended_status"], seen["cur_state"], seen["next_state"]) == ("stopped",) * 4
    assert seen["status_msg"].startswith("Outbid")
    assert finished_onstart(osim, instance_id)["exit_code"] != 0  # killed, not ended
    before = next(i for i in osim.state()["instances"] if i["id"] == instance_id)
    osim.advance(600)
    after = next(i for i in osim.state()["instances"] if i["id"] == instance_id)
    assert after["compute_seconds"] == before["compute_seconds"]  # no GPU billed while stopped
    assert after["storage_seconds"] == before["storage_seconds"] + 600  # the disk bills on
    assert not after["destroyed"] and osim.onstart_result(instance_id)["running"] is False


def test_an_outbid_instance_whose_bid_wins_again_runs_its_script_again_after_the_first_output(osim, oapi):
    offer = oapi.cheapest()
    instance_id = launch(oapi, "echo run; sleep 600", price=offer["min_bid"])["new_contract"]
    boot(osim)
    wait_for(lambda: "run" in (osim.onstart_result(instance_id) or {}).get("output", ""))

    osim.outbid(instance_id, resume_after=100)
    finished_onstart(osim, instance_id)
    osim.advance(99)
    assert oapi.instance(instance_id)["actual_status"] == "stopped"
    osim.advance(1)
    back = oapi.instance(instance_id)
    assert (back["actual_status"], back["intended_status"], back["status_msg"]) == ("loading", "running", None)
    osim.advance(130)
    assert oapi.instance(instance_id)["actual_status"] == "running"
    wait_for(lambda: osim.onstart_result(instance_id)["output"].count("run") == 2)


@pytest.mark.parametrize(
    ("fields", "resume_after", "status", "words"),
    [
        ({}, None, 400, "on demand"),
        ({"price": 10.0}, -1, 400, "resume_after"),
        ({"price": 10.0}, "soon", 400, "resume_after"),
    ],
)
def test_bad_outbids_are_400_naming_the_problem(osim, oapi, fields, resume_after, status, words):
    instance_id = launch(oapi, "true", **fields)["new_contract"]
    response = oapi.session.post(f"{osim.url}/_sim/instances/{instance_id}/outbid", json={"resume_after": resume_after})
    assert response.status_code == status and words in response.json()["msg"]
    assert oapi.session.post(f"{osim.url}/_sim/instances/999/outbid", json={}).status_code == 404


def test_nvidia_smi_on_the_scripts_path_answers_for_the_offers_gpus(osim, oapi):
    offer = oapi.search({"num_gpus": {"eq": 2}, "limit": 1})[0]
    created = oapi.create(
        offer["id"],
        {"image": "u", "onstart": "nvidia-smi -L | wc -l; nvidia-smi --query-gpu=name --format=csv,noheader"},
    )
    boot(osim)
    lines = finished_onstart(osim, created["new_contract"])["output"].split("\n")
    assert lines[0].strip() == "2" and lines[1] == f"NVIDIA {offer['gpu_name']}"


def test_nvidia_smi_fails_on_a_host_that_fails_the_gpu_check(osim, oapi):
    created = launch(oapi, "nvidia-smi -L; echo rc=$?")
    osim._market.run(lambda world, now: setattr(world.instances[created["new_contract"]], "gpu_fault", True))
    boot(osim)
    output = finished_onstart(osim, created["new_contract"])["output"]
    assert "couldn't communicate with the NVIDIA driver" in output and "rc=9" in output


#: A server on the identity port the service picked: the same script runs on the live service.
SERVE = 'exec python3 -m http.server "$VAST_TCP_PORT_70000" --bind 0.0.0.0'


def _answers(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


def test_rule_a_server_on_a_mapped_port_answers_at_the_instance_address_until_the_destroy(osim, oapi):
    created = launch(oapi, f"echo $PUBLIC_IPADDR:$VAST_TCP_PORT_70000; {SERVE}", env={"-p 70000:70000": "1"})
    instance_id = created["new_contract"]
    boot(osim)
    instance = oapi.instance(instance_id)
    ((name, [mapping]),) = instance["ports"].items()
    port = int(mapping["HostPort"])
    assert name == f"{port}/tcp" and mapping["HostIp"] == "0.0.0.0"  # an identity port is named after its port
    url = f"http://{instance['public_ipaddr']}:{port}/"
    assert wait_for(lambda: _answers(url))
    assert f"{instance['public_ipaddr']}:{port}" in osim.onstart_result(instance_id)["output"]
    assert oapi.delete(f"/api/v0/instances/{instance_id}/").status_code == 200
    assert wait_for(lambda: not _answers(url))


def test_rule_mapped_ports_are_named_in_docker_s_shape_and_told_to_the_container(osim, oapi):
    created = launch(oapi, "env", env={"-p 8000:8000": "1", "-p 9000:9000/udp": "1"})
    boot(osim)
    instance = oapi.instance(created["new_contract"])
    tcp = int(instance["ports"]["8000/tcp"][0]["HostPort"])
    udp = int(instance["ports"]["9000/udp"][0]["HostPort"])
    lines = set(finished_onstart(osim, created["new_contract"])["output"].splitlines())
    assert {f"VAST_TCP_PORT_8000={tcp}", f"VAST_UDP_PORT_9000={udp}", "PUBLIC_IPADDR=127.0.0.1"} <= lines
