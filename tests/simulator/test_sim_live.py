"""The live profile (the default): the service as public reports describe it where it has moved past the spec.

One test per fact, named after it. The clock is frozen: only ``advance`` moves it, and so refills rate buckets.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from gpumarket_simulator import MarketSimulator
from gpumarket_simulator.ratelimits import RATES_PER_SECOND

from .helpers import Api

V1 = "/api/v1/instances/"


@pytest.fixture(scope="module")
def live_server() -> Iterator[MarketSimulator]:
    with MarketSimulator(speed=0, seed=0, rate_limits=False) as sim:
        yield sim


@pytest.fixture
def live(live_server: MarketSimulator) -> Api:
    live_server.reset()
    return Api(live_server, live_server.api_key)


def v1(api: Api, **params: object) -> dict:
    query = {k: v if isinstance(v, str | int) else json.dumps(v) for k, v in params.items()}
    response = api.get(V1, params=query)
    assert response.status_code == 200, response.text
    return response.json()


def make(api: Api, n: int, label: str = "") -> list[int]:
    offers = api.search({"order": [["dph_total", "asc"]]})
    return [
        api.create(o["id"], {"image": "img", "label": f"{label}{k}"})["new_contract"]
        for k, o in zip(range(n), offers, strict=False)
    ]


# --- listing -----------------------------------------------------------------------------------------------
def test_live_v0_instance_list_answers_410_deprecated(live):
    response = live.get("/api/v0/instances/")
    assert response.status_code == 410
    assert response.json() == {
        "success": False,
        "error": "deprecated_endpoint",
        "msg": "/api/v0/instances/ is deprecated. Use /api/v1/instances/ instead.",
    }


def test_live_v1_list_pages_with_next_token_until_null_without_skips_or_repeats(live):
    made = make(live, 12)
    seen, token, pages = [], None, 0
    while True:
        params: dict = {"limit": 5}
        if token:
            params["after_token"] = token
        page = v1(live, **params)
        pages += 1
        assert page["total_instances"] == 12 and page["instances_found"] == len(page["instances"])
        seen += [i["id"] for i in page["instances"]]
        token = page["next_token"]
        if token is None:
            break
    assert pages == 3 and seen == sorted(made)


def test_live_v1_list_walk_survives_destroys_and_creates_between_pages(live):
    made = make(live, 6)
    first = v1(live, limit=3)
    live.delete(f"/api/v0/instances/{first['instances'][0]['id']}/")  # already seen
    live.delete(f"/api/v0/instances/{made[4]}/")  # not seen yet: gone
    second = v1(live, limit=3, after_token=first["next_token"])
    assert [i["id"] for i in second["instances"]] == [made[3], made[5]]
    assert second["next_token"] is None


def test_live_v1_limit_is_at_most_25_and_zero_or_less_reads_as_5(live):
    make(live, 30)
    assert len(v1(live, limit=100)["instances"]) == 25
    assert len(v1(live, limit=0)["instances"]) == 5
    assert len(v1(live, limit=-3)["instances"]) == 5


def test_live_v1_invalid_token_is_a_400(live):
    response = live.get(V1, params={"after_token": "not-a-token"})
    assert response.status_code == 400 and response.json()["error"] == "invalid_token"


@pytest.mark.parametrize(
    "params",
    [{"select_filters": "{bad json"}, {"order_by": "[1]"}, {"select_filters": '{"id": {"like": 1}}'}, {"limit": "x"}],
)
def test_live_v1_bad_query_is_a_400_never_a_500(live, params):
    response = live.get(V1, params=params)
    assert response.status_code == 400, response.text


def test_live_v1_select_filters_by_label_and_ids(live):
    made = make(live, 4, label="job-")
    assert [i["id"] for i in v1(live, select_filters={"label": {"eq": "job-2"}})["instances"]] == [made[2]]
    page = v1(live, select_filters={"id": {"in": [made[0], made[3]]}})
    assert [i["id"] for i in page["instances"]] == [made[0], made[3]]
    assert v1(live, select_filters={"id": {"notin": made}})["instances"] == []


def test_live_v1_order_by_with_id_as_tie_breaker_and_select_cols(live):
    made = make(live, 3)
    page = v1(live, order_by=[{"col": "id", "dir": "desc"}], select_cols=["actual_status"])
    assert [i["id"] for i in page["instances"]] == sorted(made, reverse=True)
    assert set(page["instances"][0]) == {"id", "actual_status"}


def test_live_v1_label_counts_cover_every_matching_instance(live):
    make(live, 2, label="a")
    assert sum(v1(live, limit=1)["label_counts"].values()) == 2


# --- error shapes ------------------------------------------------------------------------------------------
def test_live_wrong_key_answers_404_auth_error_on_every_path(live):
    for method, path in [("GET", V1), ("GET", "/api/v0/instances/7/"), ("DELETE", "/api/v0/instances/7/")]:
        response = live.call(method, path, key="wrong-key")
        assert response.status_code == 404
        assert response.json() == {"error": "auth_error", "msg": "Invalid user key"}


def test_live_missing_key_answers_401_auth_error(live):
    response = live.get(V1, key=None)
    assert response.status_code == 401 and response.json()["error"] == "auth_error"


def test_live_read_of_a_destroyed_or_unknown_instance_is_200_null(live):
    (instance_id,) = make(live, 1)
    live.delete(f"/api/v0/instances/{instance_id}/")
    for some_id in (instance_id, 99_999_999):
        response = live.get(f"/api/v0/instances/{some_id}/")
        assert response.status_code == 200 and response.json() == {"instances": None}


def test_live_destroy_of_a_destroyed_instance_is_404_no_such_instance(live):
    (instance_id,) = make(live, 1)
    assert live.delete(f"/api/v0/instances/{instance_id}/").status_code == 200
    response = live.delete(f"/api/v0/instances/{instance_id}/")
    assert response.status_code == 404 and response.json()["error"] == "no_such_instance"


def test_live_put_label_changes_the_label_and_keeps_the_status(live, live_server):
    (instance_id,) = make(live, 1)
    live_server.advance(301)
    assert live.put(f"/api/v0/instances/{instance_id}/", {"label": "renamed"}).status_code == 200
    instance = live.instance(instance_id)
    assert instance["label"] == "renamed" and instance["actual_status"] == "running"


@pytest.mark.parametrize("body", [{"label": 3}, {}, {"state": "paused"}])
def test_live_put_instance_bad_body_is_a_400(live, body):
    (instance_id,) = make(live, 1)
    assert live.put(f"/api/v0/instances/{instance_id}/", body).status_code == 400


def test_live_instances_carry_extra_env_pairs_and_start_date(live):
    offer = live.cheapest()
    body = {"image": "img", "env": {"FOO": "bar", "-p 8080:8080": "1"}}
    instance = live.instance(live.create(offer["id"], body)["new_contract"])
    assert instance["extra_env"] == [["FOO", "bar"]]
    assert isinstance(instance["start_date"], float)


def test_live_offer_gone_at_create_is_404_invalid_args_no_such_ask(live, live_server):
    offer = live.cheapest()
    live_server.vanish_offer(offer["id"])
    response = live.put(f"/api/v0/asks/{offer['id']}/", {"image": "img"})
    assert response.status_code == 404
    assert response.json()["error"] == "invalid_args" and "no_such_ask" in response.json()["msg"]


def test_live_offer_gone_with_cancel_unavail_is_410_no_such_ask(live, live_server):
    offer = live.cheapest()
    live_server.vanish_offer(offer["id"])
    response = live.put(f"/api/v0/asks/{offer['id']}/", {"image": "img", "cancel_unavail": True})
    assert response.status_code == 410 and response.json()["error"] == "no_such_ask"


# --- what the official CLI sends ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path",
    [
        "/api/v0/auth/apikeys/",
        "/api/v0/users/cloud_integrations/",
        "/api/v0/instances/pending-price-increases/",
        "/api/v0/users/current",
        "/api/v0/users/current/",
        "/api/v1/instances",
    ],
)
def test_live_trailing_slash_is_tolerated(live, path):
    response = live.get(path)
    assert response.status_code == 200, response.text
    if "pending" in path:
        assert "pending_price_increases" in response.json()  # not caught by the /instances/{id}/ route


def test_live_search_ignores_unknown_fields_and_keys_and_reads_numeric_strings(live):
    body = {
        "verified": {"eq": True},
        "external": {"eq": False},
        "rentable": {"eq": True},
        "num_gpus": {"gte": "1"},
        "order": [["score", "desc"], ["dph_total", "asc"]],
        "type": "on-demand",
        "allocated_storage": 5.0,
    }
    offers = live.search(body)
    assert offers and all(o["verified"] and o["num_gpus"] >= 1 for o in offers)
    assert [o["dph_total"] for o in offers] == sorted(o["dph_total"] for o in offers)


def test_live_current_user_is_a_small_object(live):
    user = live.get("/api/v0/users/current").json()
    assert {"id", "username", "balance"} <= set(user)
    assert live.get("/api/v0/users/current", key="wrong").status_code == 404


# --- rate limits -------------------------------------------------------------------------------------------
@pytest.fixture
def limited() -> Iterator[tuple[MarketSimulator, Api]]:
    with MarketSimulator(speed=0, seed=0) as sim:
        yield sim, Api(sim, sim.api_key)


def test_live_rate_limits_are_buckets_without_burst_answered_in_plain_text(limited):
    sim, api = limited
    assert api.get(V1).status_code == 200
    refused = api.get(V1)
    assert refused.status_code == 429
    assert refused.text == "API requests too frequent" and "Retry-After" not in refused.headers
    assert api.get("/api/v0/users/current").status_code == 200  # another endpoint has its own bucket


def test_live_rate_limit_refills_on_the_simulated_clock_and_a_rejection_costs_a_penalty(limited):
    sim, api = limited
    interval = 1 / RATES_PER_SECOND["list_instances_v1"]
    assert api.get(V1).status_code == 200
    assert api.get(V1).status_code == 429  # and a penalty token
    sim.advance(interval)
    assert api.get(V1).status_code == 429  # one interval only repaid the penalty
    sim.advance(2 * interval)
    assert api.get(V1).status_code == 200


def test_live_rate_limit_is_per_key(limited):
    sim, api = limited
    other = Api(sim, "wrong")
    assert api.get(V1).status_code == 200
    assert other.get(V1).status_code == 404  # an unknown key is not rate limited: it is refused


def test_live_rate_limit_refusals_are_counted_per_operation_until_a_reset(limited):
    sim, api = limited
    rates = f"{sim.url}/_sim/rate-limits"
    assert api.session.get(rates).json()["refused"] == {}
    assert [api.get(V1).status_code for _ in range(3)] == [200, 429, 429]
    assert api.session.get(rates).json()["refused"] == {"list_instances_v1": 2}
    sim.reset()
    assert api.session.get(rates).json()["refused"] == {}


def test_spec_profile_has_no_rate_limits():
    with MarketSimulator(speed=0, profile="spec") as sim:
        api = Api(sim, sim.api_key)
        assert [api.get("/api/v0/instances/").status_code for _ in range(3)] == [200, 200, 200]


def test_search_quota_exceeded_fault_answers_a_far_retry_after_and_reset(live, live_server):
    live_server.set_faults(
        [
            {
                "kind": "status",
                "endpoint": "search_offers",
                "status": 429,
                "error": "search_quota_exceeded",
                "retry_after": 18000,
                "reset_after": 18000,
            }
        ]
    )
    response = live.post("/api/v0/bundles/", {})
    assert response.status_code == 429 and response.json()["error"] == "search_quota_exceeded"
    assert response.headers["Retry-After"] == "18000" and int(response.headers["X-RateLimit-Reset"]) > 1e9


def test_rate_limit_fault_can_answer_plain_text_without_retry_after(live, live_server):
    live_server.set_faults(
        [{"kind": "rate_limit", "capacity": 1, "per_second": 0, "body": "text", "retry_after": False}]
    )
    live.get(V1)
    response = live.get(V1)
    assert response.status_code == 429 and response.text == "API requests too frequent"
    assert "Retry-After" not in response.headers


def test_admin_turns_rate_limits_off_and_on(limited):
    sim, api = limited
    assert api.session.put(f"{sim.url}/_sim/rate-limits", json={"enabled": False}).json()["enabled"] is False
    assert [api.get(V1).status_code for _ in range(3)] == [200, 200, 200]
    api.session.put(f"{sim.url}/_sim/rate-limits", json={"enabled": True})
    assert [api.get(V1).status_code for _ in range(2)] == [200, 429]
    assert api.session.put(f"{sim.url}/_sim/rate-limits", json={"enabled": "yes"}).status_code == 400


def test_a_client_that_leaves_mid_request_is_an_ordinary_event_not_an_internal_error(live, live_server, caplog):
    import socket

    host, port = live_server.url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(
            b"PUT /api/v0/asks/1/ HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + live_server.api_key.encode() + b'\r\nContent-Length: 100\r\n\r\n{"ima'
        )  # promises 100 bytes, sends 5, and hangs up
    live.get("/api/v0/users/current")  # the server went on serving
    assert live_server.state()["internal_errors"] == 0
    assert "unexpected error" not in caplog.text
