"""The GPU rentals page (Airflow 3.1+) in the real api-server app, and what renting tasks record for it.

The page is Airflow's own FastAPI app with the provider's plugin mounted (as the api-server serves it), asked with
the JWT cookie the UI sends, for users of the default SimpleAuthManager's roles. The browser test (``make
ui-test``) clicks through the same page in a real deployment.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from airflow_gpumarket import lifecycle
from airflow_gpumarket.ui import records

from .conftest import AIRFLOW_2, alive, handed_over_run, task_states

#: The page's tests; the records and the link work on every supported Airflow.
page = pytest.mark.skipif(AIRFLOW_2, reason="the page is an Airflow 3.1+ UI plugin")


def xcoms_of(run, task_id: str) -> dict:
    from airflow.utils.session import create_session

    if AIRFLOW_2:
        from airflow.models.xcom import XCom

        where = {"dag_id": run.dag_id, "run_id": run.run_id, "task_id": task_id}
        with create_session() as session:
            keys = [key for (key,) in session.query(XCom.key).filter_by(**where)]
        return {key: XCom.get_one(key=key, **where) for key in keys}
    from airflow.models.xcom import XComModel

    with create_session() as session:
        rows = session.query(XComModel).filter_by(dag_id=run.dag_id, run_id=run.run_id, task_id=task_id).all()
        return {row.key: XComModel.deserialize_value(row) for row in rows}


def forget_service_reads() -> None:
    """The page reuses a connection's listing, charges and account for a while: not across tests."""
    from airflow_gpumarket.ui import sources

    for cache in (sources._listings, sources._charges, sources._accounts):
        cache.clear()


@pytest.fixture
def api_client(airflow_db, sim):
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    forget_service_reads()
    client = TestClient(create_app(apps="all"), base_url="http://airflow.test")

    def as_user(role: str | None):
        client.cookies.clear()
        if role is not None:
            token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username=f"{role}-user", role=role))
            client.cookies.set("_token", token)
        return client

    return as_user


def test_a_job_records_its_rental_with_its_cost_and_the_link_to_its_row(example_dag, sim):
    dag = example_dag("gpm_ui_job")
    run = dag.test()
    assert run.state == "success", task_states(run)
    (instance,) = sim.state()["instances"]
    stored = xcoms_of(run, "train")
    record = stored[records.record_key(instance["id"])]
    assert record["instance_id"] == instance["id"] and record["conn_id"] == "gpumarket_default"
    assert record["ended_at"] >= record["created_at"] and record["cost"] > 0 and record["try_number"] == 1
    assert stored[records.URL_XCOM_KEY] == f"gpumarket/?instance={instance['id']}#rental-{instance['id']}"
    (link,) = dag.get_task("train").operator_extra_links
    assert link.name == "GPU rental"
    if AIRFLOW_2:  # the webserver asks the link; there is no page to open there
        (ti,) = run.get_task_instances()
        assert link.get_link(dag.get_task("train"), ti_key=ti.key) == ""
    else:  # the task runner asked it as the task finished, and stored its answer for the UI
        assert stored[link.xcom_key] == stored[records.URL_XCOM_KEY]
    assert alive(sim) == []


@page
def test_anonymous_requests_get_nothing(api_client):
    assert api_client(None).get("/gpumarket/").status_code == 401
    assert api_client(None).get("/gpumarket/api/rentals").status_code == 401
    assert (
        api_client(None).post("/gpumarket/orphans/gpumarket_default/1/destroy", data={"confirm": "1"}).status_code
        == 401
    )


@page
def test_rule_the_page_shows_a_live_rental_with_its_dag_run_task_and_cost(example_dag, sim, api_client):
    run = handed_over_run(example_dag, run_still_running=True)
    (instance,) = alive(sim)
    data = api_client("viewer").get("/gpumarket/api/rentals").json()
    (row,) = data["live"]
    assert (row["instance_id"], row["dag_id"], row["run_id"], row["task_id"]) == (
        instance["id"],
        "gpm_ui_handover",
        run.run_id,
        "rent",
    )
    # Counted on the service's clock (the Date header of its answers): the simulator's runs 600x ahead of this host's.
    sim_uptime = sim.now() - instance["start_date"]
    assert row["orphan"] is None and 0 < row["uptime_seconds"] <= sim_uptime + 1 and row["cost_so_far"] > 0
    assert row["hourly_price"] == instance["dph_total"]
    assert row["try_number"] == 1 and row["status"] == "running"
    html = api_client("viewer").get("/gpumarket/", params={"instance": instance["id"]}).text
    assert f'<tr id="rental-{instance["id"]}" class="target">' in html and "gpm_ui_handover" in html
    assert "Destroy…</button>" not in html
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    GpuMarketHook().destroy_instance(instance["id"])


@page
def test_rule_an_orphan_is_destroyed_by_an_admin_after_confirming_and_never_by_a_viewer(example_dag, sim, api_client):
    handed_over_run(example_dag, run_still_running=False)
    (instance,) = alive(sim)
    path = f"/gpumarket/orphans/gpumarket_default/{instance['id']}/destroy"

    viewer = api_client("viewer").get("/gpumarket/api/rentals").json()["live"]
    assert viewer[0]["orphan"] == "it was handed to its DAG run, which is success"
    assert viewer[0]["may_destroy"] is False
    assert "Destroy…</button>" not in api_client("viewer").get("/gpumarket/").text
    asked = {"destroy": instance["id"], "conn": "gpumarket_default"}
    refused = api_client("viewer").get("/gpumarket/", params=asked).text
    assert "is not an orphan you may destroy" in refused and "/destroy" not in refused
    assert api_client("viewer").post(path, data={"confirm": str(instance["id"])}).status_code == 403
    assert alive(sim) != []

    admin = api_client("admin")
    assert "Destroy…</button>" in admin.get("/gpumarket/").text and alive(sim) != []  # pressing it asks first:
    question = admin.get("/gpumarket/", params=asked).text
    assert f"<strong>Destroy instance {instance['id']}</strong>" in question and alive(sim) != []
    assert f'action="orphans/gpumarket_default/{instance["id"]}/destroy?days=7"' in question
    assert admin.post(path, data={}).status_code == 400  # no confirmation
    foreign = admin.post(path, data={"confirm": str(instance["id"])}, headers={"Origin": "http://evil.test"})
    assert foreign.status_code == 403 and alive(sim) != []  # a cross-site form cannot use the cookie
    done = admin.post(path, data={"confirm": str(instance["id"])}, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == f"../../../?days=7&destroyed={instance['id']}"
    assert alive(sim) == []
    assert (
        f"Instance {instance['id']} was destroyed."
        in admin.get("/gpumarket/?days=7&destroyed=" + str(instance["id"])).text
    )


@page
def test_rule_an_instance_whose_lease_expired_is_an_orphan_even_unrecorded(example_dag, sim, api_client):
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    # An instance no DAG is found for is shown to who may read every DAG: with no DAG at all, to nobody.
    assert example_dag("gpm_ui_job").test().state == "success"

    hook = GpuMarketHook()
    offer = hook.search_offers({"num_gpus": {"gte": 1}}, limit=1)[0]
    made = hook.create_instance(offer["id"], image="img", label=lifecycle.make_label("0123456789ab", time.time() - 60))
    rows = api_client("viewer").get("/gpumarket/api/rentals").json()["live"]
    assert [(r["instance_id"], r["dag_id"]) for r in rows] == [(made["new_contract"], None)]
    assert rows[0]["orphan"].startswith("its lease expired at")
    hook.create_instance(offer_id=hook.search_offers({"num_gpus": {"gte": 1}}, limit=1)[0]["id"], image="byhand")
    assert len(api_client("viewer").get("/gpumarket/api/rentals").json()["live"]) == 1  # made by hand: not shown
    for instance in alive(sim):
        hook.destroy_instance(instance["id"])


@page
def test_rule_a_user_who_may_not_read_a_dag_sees_neither_its_rentals_nor_its_spend(
    example_dag, sim, api_client, monkeypatch
):
    from airflow.api_fastapi.app import get_auth_manager

    handed_over_run(example_dag, run_still_running=False)
    (instance,) = alive(sim)
    manager = get_auth_manager()
    with monkeypatch.context() as m:  # an auth manager that lets this user read no DAG
        m.setattr(manager, "get_authorized_dag_ids", lambda **_: set())
        m.setattr(manager, "is_authorized_dag", lambda **_: False)
        data = api_client("user").get("/gpumarket/api/rentals").json()
        assert data["live"] == [] and data["spend"]["per_dag"] == {}
        path = f"/gpumarket/orphans/gpumarket_default/{instance['id']}/destroy"
        assert api_client("user").post(path, data={"confirm": str(instance["id"])}).status_code == 409
    assert alive(sim) != []
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    GpuMarketHook().destroy_instance(instance["id"])


@page
def test_rule_spend_per_dag_and_per_run_comes_from_the_recorded_costs_with_a_plot(example_dag, sim, api_client):
    def spend_now() -> dict:
        return api_client("viewer").get("/gpumarket/api/rentals", params={"days": 1}).json()["spend"]

    before = spend_now()["per_dag"].get("gpm_ui_job", 0.0)  # the test database holds earlier tests' runs too
    runs = [example_dag("gpm_ui_job").test() for _ in range(2)]
    costs = {
        run.run_id: sum(
            v["cost"]
            for k, v in xcoms_of(run, "train").items()
            if k.startswith(records.RECORD_KEY_PREFIX) and k != records.URL_XCOM_KEY
        )
        for run in runs
    }
    spend = spend_now()
    assert spend["per_dag"]["gpm_ui_job"] == pytest.approx(before + sum(costs.values()))
    assert {r["run_id"]: r["spend"] for r in spend["per_run"] if r["run_id"] in costs} == pytest.approx(costs)
    html = api_client("viewer").get("/gpumarket/", params={"days": 1}).text
    assert re.search(r"<svg[^>]*aria-label=\"GPU spend per day and DAG\"", html) and "gpm_ui_job" in html
    assert api_client("viewer").get("/gpumarket/", params={"days": 0}).status_code == 422  # a bad window: said so
    assert alive(sim) == []


def test_rule_a_teardown_task_writes_the_end_of_the_rental_it_destroys_and_the_run_is_costed_to_it(
    example_dag, sim, request
):
    run = example_dag("gpm_ui_create_teardown").test()
    assert run.state == "success", task_states(run)
    (instance,) = sim.state()["instances"]
    start = xcoms_of(run, "rent")[records.record_key(instance["id"])]
    end = xcoms_of(run, "destroy")[records.end_key(instance["id"])]
    assert start["ended_at"] is None and start["running_at"] >= start["created_at"]  # handed over while running
    assert end["end_only"] and end["label"] == instance["label"] and end["ended_by"] == "destroy"
    # On the service's clock: the simulator's runs 600x ahead of this host's.
    assert instance["created_at"] - 60 <= start["created_at"] <= start["running_at"] <= end["ended_at"]
    assert end["ended_at"] <= instance["destroyed_at"] + 60
    if AIRFLOW_2:  # the records are written on every version; the page is Airflow 3.1+'s
        return
    api_client = request.getfixturevalue("api_client")
    per_run = api_client("viewer").get("/gpumarket/api/rentals").json()["spend"]["per_run"]
    (spent,) = [r["spend"] for r in per_run if r["run_id"] == run.run_id]
    whole_life = instance["dph_total"] * (instance["destroyed_at"] - instance["created_at"]) / 3600
    assert 0.9 * instance["compute_cost"] <= spent <= whole_life
    assert alive(sim) == []


@pytest.fixture
def spec_sim(sim, monkeypatch):
    """A simulator of the spec profile, which has no charges and no account endpoint, as the DAGs' connection."""
    from gpumarket_simulator import MarketSimulator

    with MarketSimulator(speed=600, seed=11, execute_onstart=True, profile="spec") as spec:
        for name, value in spec.connection_env().items():
            conn = json.loads(value)
            conn["extra"] |= {"retry_min_wait": 0.01, "retry_max_wait": 0.05, "max_retries": 6, "timeout": 2}
            monkeypatch.setenv(name, json.dumps(conn))
        forget_service_reads()
        yield spec
        forget_service_reads()


@page
def test_rule_a_service_without_charges_leaves_every_figure_an_estimate_marked_and_says_so_once(
    example_dag, spec_sim, api_client
):
    run = example_dag("gpm_ui_job").test()
    assert run.state == "success", task_states(run)
    data = api_client("admin").get("/gpumarket/api/rentals", params={"days": 1}).json()
    mine = [r for r in data["spend"]["per_rental"] if r["run_id"] == run.run_id]
    assert mine and all(r["source"] == "estimate" and r["actual"] is None and r["estimate"] > 0 for r in mine)
    (spent,) = [r for r in data["spend"]["per_run"] if r["run_id"] == run.run_id]
    assert spent["estimated"] == spent["spend"] > 0 and spent["difference"] is None
    assert "gpumarket_default" in data["no_charges"] and data["errors"] == [] and len(data["notes"]) == 1
    assert {a["conn_id"]: a["problem"] for a in data["accounts"]}["gpumarket_default"] == (
        "the service has no account endpoint"
    )
    html = api_client("admin").get("/gpumarket/", params={"days": 1}).text
    assert html.count('<p class="note">') == 1 and "no charges endpoint" in html and 'class="error"' not in html
    assert re.search(
        r'<tr id="spend-\d+"><td>\d+</td><td>gpm_ui_job / [^<]+</td><td>[^<]+</td><td class="num cost">'
        r'<span class="est">≈ \$[\d,]+\.\d{4} est\.</span>',
        html,
    )
    assert alive(spec_sim) == []


@page
def test_rule_a_rental_the_service_charged_costs_what_the_simulators_ledger_says_to_the_cent(
    example_dag, sim, api_client
):
    run = example_dag("gpm_ui_job").test()
    assert run.state == "success", task_states(run)
    (instance,) = sim.state()["instances"]
    sim.advance(2 * 86400)  # past the end of the rental's day: the service posts a day's charges after it
    forget_service_reads()
    ledger = next(i for i in sim.state()["instances"] if i["id"] == instance["id"])["cost"]
    data = api_client("viewer").get("/gpumarket/api/rentals").json()
    (rental,) = [r for r in data["spend"]["per_rental"] if r["instance_id"] == instance["id"]]
    assert rental["source"] == "charges" and abs(rental["actual"] - ledger) < 0.005, (rental, ledger)
    assert rental["difference"] == pytest.approx(rental["actual"] - rental["estimate"])
    html = api_client("viewer").get("/gpumarket/").text
    shown = re.search(rf'<tr id="spend-{instance["id"]}">.*?<span class="actual">\$([\d,]+\.\d+)</span>', html)
    assert shown and abs(float(shown.group(1).replace(",", "")) - ledger) < 0.005, (shown, ledger)
    assert alive(sim) == []
