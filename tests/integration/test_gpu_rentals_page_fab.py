"""The GPU rentals page with the FAB auth manager and per-DAG roles, as most production deployments run it.

Airflow's own api-server app with the FAB auth manager, its users and roles in the test database: ``reader_a`` may
read ``gpm_ui_job`` only, ``editor_b`` may read and edit ``gpm_ui_handover`` only, ``admin`` has FAB's Admin role.
FAB answers "may read DAGs" (no DAG named) with yes for anyone who may read one DAG: the page must never ask that.
"""

from __future__ import annotations

import time

import pytest

from airflow_gpumarket import lifecycle

from .conftest import AIRFLOW_2, alive, task_states

pytestmark = pytest.mark.skipif(AIRFLOW_2, reason="the page is an Airflow 3.1+ UI plugin")
FAB = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
ROLES = {
    "reader_a": [("can_read", "DAG:gpm_ui_job")],
    "editor_b": [("can_read", "DAG:gpm_ui_handover"), ("can_edit", "DAG:gpm_ui_handover")],
}


@pytest.fixture
def fab_client(airflow_db, sim, monkeypatch):
    """``as_user(name)``: a client of the api-server app with that FAB user's JWT cookie (None: anonymous)."""
    pytest.importorskip("airflow.providers.fab", reason="the FAB provider is installed by make test's Airflow 3 leg")
    from airflow.api_fastapi.app import create_app, get_auth_manager, purge_cached_app
    from fastapi.testclient import TestClient

    from airflow_gpumarket.ui import sources

    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", FAB)
    purge_cached_app()
    for cache in (sources._listings, sources._charges, sources._accounts):
        cache.clear()
    client = TestClient(create_app(apps="all"), base_url="http://airflow.test")
    manager = get_auth_manager()
    users = {}
    with manager.flask_app.app_context():
        sm = manager.security_manager
        for name, grants in ROLES.items():
            role = sm.find_role(name) or sm.add_role(name)
            for action, resource in grants:
                sm.add_permission_to_role(role, sm.create_permission(action, resource))
        for name in (*ROLES, "admin"):
            found = sm.find_user(username=name)
            role = sm.find_role("Admin" if name == "admin" else name)
            users[name] = found or sm.add_user(name, name, "user", f"{name}@example.test", role, password="unused")

    def as_user(name: str | None):
        client.cookies.clear()
        if name is not None:
            client.cookies.set("_token", manager.generate_jwt(users[name]))
        return client

    yield as_user
    purge_cached_app()


def label_for(dag_id: str, run_id: str, task_id: str) -> str:
    return lifecycle.make_label(lifecycle.rental_key(dag_id, run_id, task_id, -1), time.time() + 3600)


def create(label: str) -> int:
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    hook = GpuMarketHook()
    offer = hook.search_offers({"num_gpus": {"gte": 1}}, limit=1)[0]
    return int(hook.create_instance(offer["id"], image="img", label=label)["new_contract"])


def live_ids(client) -> set[int]:
    return {row["instance_id"] for row in client.get("/gpumarket/api/rentals").json()["live"]}


def test_rule_with_fab_per_dag_roles_no_user_sees_an_instance_of_a_dag_they_may_not_read(example_dag, sim, fab_client):
    assert example_dag("gpm_ui_job").test().state == "success"  # team a's DAG, with a rental that ended
    run = example_dag("gpm_ui_handover").test()  # team b's: its instance outlives the run (a recorded orphan)
    assert run.state == "success", task_states(run)
    (recorded,) = alive(sim)
    by_label = create(label_for("gpm_ui_handover", run.run_id, "rent"))  # its record is gone: only its label says
    nobodys = create(lifecycle.make_label("0123456789ab", time.time() + 3600))  # names no task instance

    reader = fab_client("reader_a").get("/gpumarket/api/rentals").json()
    assert reader["live"] == [] and set(reader["spend"]["per_dag"]) == {"gpm_ui_job"}
    html = fab_client("reader_a").get("/gpumarket/").text
    assert not [i for i in (recorded["id"], by_label, nobodys) if f"rental-{i}" in html]
    refused = fab_client("reader_a").post(
        f"/gpumarket/orphans/gpumarket_default/{by_label}/destroy", data={"confirm": str(by_label)}
    )
    assert refused.status_code == 409

    editor = {row["instance_id"]: row for row in fab_client("editor_b").get("/gpumarket/api/rentals").json()["live"]}
    assert set(editor) == {recorded["id"], by_label}  # not the instance no DAG can be found for
    assert (editor[by_label]["dag_id"], editor[by_label]["run_id"], editor[by_label]["owner_from"]) == (
        "gpm_ui_handover",
        run.run_id,
        "label",
    )
    assert editor[by_label]["orphan"].startswith("no task recorded renting it; its label names gpm_ui_handover")
    assert editor[by_label]["may_destroy"] is True
    refused = fab_client("editor_b").post(
        f"/gpumarket/orphans/gpumarket_default/{nobodys}/destroy", data={"confirm": str(nobodys)}
    )
    assert refused.status_code == 409 and nobodys in {i["id"] for i in alive(sim)}

    assert live_ids(fab_client("admin")) == {recorded["id"], by_label, nobodys}
    for instance_id in (recorded["id"], nobodys):
        done = fab_client("admin").post(
            f"/gpumarket/orphans/gpumarket_default/{instance_id}/destroy",
            data={"confirm": str(instance_id)},
            follow_redirects=False,
        )
        assert done.status_code == 303


def test_rule_an_orphan_attributed_by_its_label_is_destroyed_by_its_dags_editor_and_costed_to_its_dag(
    example_dag, sim, fab_client
):
    from airflow_gpumarket.ui import sources

    unknown_before = fab_client("editor_b").get("/gpumarket/api/rentals").json()["spend"]["unknown_cost"]
    run = example_dag("gpm_ui_handover").test()
    (recorded,) = alive(sim)
    by_label = create(label_for("gpm_ui_handover", run.run_id, "rent"))
    sources._listings.clear()  # the page reuses a listing for 5 s: this one predates the rentals
    page = fab_client("editor_b").get("/gpumarket/", params={"destroy": by_label, "conn": "gpumarket_default"}).text
    assert f"<strong>Destroy instance {by_label}</strong>" in page and "from its label" in page
    done = fab_client("editor_b").post(
        f"/gpumarket/orphans/gpumarket_default/{by_label}/destroy",
        data={"confirm": str(by_label)},
        follow_redirects=False,
    )
    assert done.status_code == 303 and by_label not in {i["id"] for i in alive(sim)}
    done = fab_client("editor_b").post(
        f"/gpumarket/orphans/gpumarket_default/{recorded['id']}/destroy",
        data={"confirm": str(recorded["id"])},
        follow_redirects=False,
    )
    assert done.status_code == 303
    spend = fab_client("editor_b").get("/gpumarket/api/rentals").json()["spend"]
    (spent,) = [r["spend"] for r in spend["per_run"] if r["run_id"] == run.run_id]
    # Both rentals are counted, on the service's clock: the page wrote the end of each one it destroyed on the task
    # instance that owns it (for one, the task instance its label names). Each costs its price from when its task
    # first saw it running (else from its start) to its destroy: between the ledger's compute and its whole life.
    lives = [i for i in sim.state()["instances"] if i["id"] in (recorded["id"], by_label)]
    whole_lives = sum(i["dph_total"] * (i["destroyed_at"] - i["created_at"]) / 3600 for i in lives)
    assert 0.9 * sum(i["compute_cost"] for i in lives) <= spent <= whole_lives
    assert spend["unknown_cost"] == unknown_before  # neither is of unknown cost (earlier tests' may be)
    assert alive(sim) == []


def test_rule_with_fab_only_who_may_read_every_dag_sees_the_accounts_credit_runway_and_avoided_machines(
    example_dag, sim, fab_client
):
    import time

    from airflow import settings

    from airflow_gpumarket import host_memory
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    assert example_dag("gpm_ui_job").test().state == "success"
    account = host_memory.account_of(GpuMarketHook().settings.api_key)
    host_memory.clear(settings.engine, account)
    host_memory.remember(settings.engine, account, 4242, "preflight", now=time.time(), detail="expected 2 GPUs, saw 0")
    credit = f"${GpuMarketHook().account().available:,.2f}"
    admin = fab_client("admin").get("/gpumarket/api/rentals").json()
    accounts = {a["conn_id"]: a for a in admin["accounts"]}
    assert f"${accounts['gpumarket_default']['available']:,.2f}" == credit
    (avoided,) = admin["avoided_machines"]
    assert (avoided["machine_id"], avoided["reason"], avoided["conn_ids"]) == (4242, "preflight", ["gpumarket_default"])
    html = fab_client("admin").get("/gpumarket/").text
    assert '<tr id="balance-gpumarket_default">' in html and credit in html and "Runway at that rate" in html
    assert '<tr id="avoided-4242">' in html and "expected 2 GPUs, saw 0" in html
    for user in ("reader_a", "editor_b"):  # each may read one DAG: the account's money is not theirs to see
        data = fab_client(user).get("/gpumarket/api/rentals").json()
        assert data["accounts"] is None and data["unattributed"] is None and data["avoided_machines"] is None
        html = fab_client(user).get("/gpumarket/").text
        assert "balance-gpumarket_default" not in html and "Runway at that rate" not in html
        assert "avoided-4242" not in html
        assert "credit and runway, and the machines it avoids, are shown to users who may read every DAG" in html
    host_memory.clear(settings.engine, account)
    assert alive(sim) == []
