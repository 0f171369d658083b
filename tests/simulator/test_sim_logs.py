"""The logs endpoint (live service; not in the spec), in both profiles: a request snapshots the log and answers
an unguessable ``result_url`` that is 404 until the upload lands (on the simulated clock), then the text, with no
key needed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from gpumarket_simulator import MarketSimulator
from gpumarket_simulator.logs import UPLOAD_SECONDS

from .helpers import Api, boot, finished_onstart


def logs_path(instance_id: int) -> str:
    return f"/api/v0/instances/request_logs/{instance_id}/"


@pytest.fixture(scope="module", params=["spec", "live"])
def logs_server(request) -> Iterator[MarketSimulator]:
    with MarketSimulator(speed=0, seed=0, execute_onstart=True, profile=request.param, rate_limits=False) as sim:
        yield sim


@pytest.fixture
def lsim(logs_server):
    logs_server.reset()
    return logs_server


@pytest.fixture
def lapi(lsim):
    return Api(lsim, lsim.api_key)


def request_logs(api: Api, instance_id: int, body=None) -> str:
    response = api.put(logs_path(instance_id), body if body is not None else {})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["success"] is True and answer["msg"]
    return answer["result_url"]


def fetch(url: str, **kwargs) -> requests.Response:
    return requests.get(url, timeout=10, **kwargs)


def landed(sim: MarketSimulator, url: str) -> str:
    sim.advance(UPLOAD_SECONDS)
    response = fetch(url)
    assert response.status_code == 200, response.text
    return response.text


def test_the_container_log_is_what_the_onstart_script_printed(lsim, lapi):
    instance_id = lapi.create(body={"image": "u", "onstart": "echo out $((6*7)); echo err >&2; exit 3"})["new_contract"]
    boot(lsim)
    finished_onstart(lsim, instance_id)
    assert landed(lsim, request_logs(lapi, instance_id)).splitlines() == ["out 42", "err"]


def test_the_upload_is_404_until_it_lands_on_the_simulated_clock_and_needs_no_key(lsim, lapi):
    instance_id = lapi.create(body={"image": "u", "onstart": "echo hi"})["new_contract"]
    boot(lsim)
    finished_onstart(lsim, instance_id)
    url = request_logs(lapi, instance_id)
    assert fetch(url).status_code == 404
    lsim.advance(UPLOAD_SECONDS)
    assert fetch(url).text == "hi\n"
    fetches = [r for r in lsim.state()["requests"] if r["op"] == "fetch_log_upload"]
    assert [(r["status"], r["key"]) for r in fetches] == [(404, "none"), (200, "none")]


def test_result_urls_are_unguessable_and_unknown_ones_are_404(lsim, lapi):
    instance_id = lapi.create()["new_contract"]
    first, second = request_logs(lapi, instance_id), request_logs(lapi, instance_id)
    assert first != second and len(first.rsplit("/", 1)[1]) >= 32
    lsim.advance(UPLOAD_SECONDS)
    assert fetch(first.rsplit("/", 1)[0] + "/not-a-token").status_code == 404


def test_tail_and_filter_select_lines(lsim, lapi):
    script = "for i in 1 2 3 4 5 6; do echo step $i; echo noise; done"
    instance_id = lapi.create(body={"image": "u", "onstart": script})["new_contract"]
    boot(lsim)
    finished_onstart(lsim, instance_id)
    assert landed(lsim, request_logs(lapi, instance_id, {"tail": "3"})).splitlines() == ["noise", "step 6", "noise"]
    picked = landed(lsim, request_logs(lapi, instance_id, {"tail": 2, "filter": "step"})).splitlines()
    assert picked == ["step 5", "step 6"]


def test_without_execute_onstart_the_container_log_is_a_short_boot_log(sim, api):
    instance_id = api.create(body={"image": "ubuntu", "onstart": "echo hi"})["new_contract"]
    url = request_logs(api, instance_id)
    sim.advance(UPLOAD_SECONDS)
    assert fetch(url).text == ""  # not started yet: nothing printed
    boot(sim)
    text = landed(sim, request_logs(api, instance_id))
    assert "container started from image ubuntu" in text and "--execute-onstart" in text


def test_the_daemon_log_tells_why_an_instance_never_ran(lsim, lapi):
    offer = lapi.cheapest()
    lsim.set_offer_fate(offer["id"], "offline")
    instance_id = lapi.create(offer["id"], {"image": "u"})["new_contract"]
    boot(lsim)
    text = landed(lsim, request_logs(lapi, instance_id, {"daemon_logs": "true"}))
    assert f"instance {instance_id} created" in text and "is offline" in text


def test_an_unknown_or_destroyed_instance_is_404_invalid_id(lsim, lapi):
    instance_id = lapi.create()["new_contract"]
    lapi.delete(f"/api/v0/instances/{instance_id}/")
    for missing in (instance_id, 99):
        response = lapi.put(logs_path(missing), {})
        assert response.status_code == 404 and response.json()["error"] == "invalid_id"


@pytest.mark.parametrize(
    "body",
    [{"tail": "ten"}, {"tail": 0}, {"tail": True}, {"filter": 3}, {"daemon_logs": "maybe"}, ["tail"]],
)
def test_bad_log_requests_are_400_naming_the_field(lsim, lapi, body):
    instance_id = lapi.create()["new_contract"]
    response = lapi.put(logs_path(instance_id), body)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "invalid_args"


def test_an_empty_body_is_accepted(lsim, lapi):
    instance_id = lapi.create()["new_contract"]
    assert lapi.call("PUT", logs_path(instance_id)).status_code == 200


def test_logs_need_the_account_key(lsim, lapi):
    instance_id = lapi.create()["new_contract"]
    assert lapi.put(logs_path(instance_id), {}, key=None).status_code == 401
