"""The GPU rentals page's FastAPI app (ui/app.py, Airflow 3.1+), with the user, what they may do and the page's data
given: who sees which instance, and the destroy action's checks. The page in the real api-server, with Airflow's
auth managers and the simulator, is tested in tests/integration/test_gpu_rentals_page*.py."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

from airflow_gpumarket._compat import is_airflow_2
from airflow_gpumarket.exceptions import GpuMarketServerError
from airflow_gpumarket.ui.spend import LiveRental, Spend

pytestmark = pytest.mark.skipif(is_airflow_2(), reason="the page is an Airflow 3.1+ UI plugin")

OWNER = ("train_dag", "run-1", "train", -1)
ENDS: list[tuple] = []  # (owner, end record) written by the page


def rental(instance_id=1, *, owner=OWNER, orphan_reason="its lease expired at 12:00 UTC") -> LiveRental:
    return LiveRental(
        conn_id="c",
        instance_id=instance_id,
        status="running",
        label=None,
        offer_id=7,
        gpu_name="RTX 4090",
        num_gpus=1,
        hourly_price=0.5,
        uptime_seconds=60.0,
        cost_so_far=0.01,
        owner=owner,
        orphan_reason=orphan_reason,
    )


class Access:
    """What the user may see and do: read ``readable`` DAGs (every DAG with ``reads_all``), edit ``editable`` ones."""

    def __init__(self, readable=(), editable=(), *, reads_all=False, edits_all=False) -> None:
        self.readable, self.editable, self.reads_all, self.edits_all = (
            set(readable),
            set(editable),
            reads_all,
            edits_all,
        )

    def sees(self, dag_id):
        return self.reads_all if dag_id is None else dag_id in self.readable

    def may_destroy(self, row):
        if not row.orphan_reason:
            return False
        return self.edits_all if row.dag_id is None else row.dag_id in self.editable


class Hook:
    destroyed: list[int] = []
    fails = False

    def __init__(self, conn_id) -> None:
        self.conn_id = conn_id

    def service_now(self):
        return 1_800_000_000.0

    def destroy_instance(self, instance_id):
        if Hook.fails:
            raise GpuMarketServerError("destroy_instance: HTTP 503 after retries", status_code=503)
        Hook.destroyed.append(instance_id)
        return {"success": True}


@pytest.fixture
def page(monkeypatch):
    """``page(access, *rows)``: a test client of the app for a signed-in user with ``access``, the service listing
    ``rows``."""
    from airflow.api_fastapi.core_api.security import get_user
    from airflow.utils import session as session_module
    from fastapi.testclient import TestClient

    from airflow_gpumarket.hooks import gpumarket
    from airflow_gpumarket.ui import app as app_module

    Hook.destroyed, Hook.fails = [], False
    monkeypatch.setattr(gpumarket, "GpuMarketHook", Hook)
    monkeypatch.setattr(app_module.sources, "forget_listing", lambda conn_id: None)
    monkeypatch.setattr(session_module, "create_session", contextlib.nullcontext)  # no metadata database here
    monkeypatch.setattr(app_module.sources, "write_end", lambda session, owner, end: ENDS.append((owner, end)))
    ENDS.clear()

    def client(access: Access, *rows: LiveRental) -> TestClient:
        monkeypatch.setattr(app_module, "_Access", lambda user: access)
        shown = [r for r in rows if app_module._belongs(r, access)]
        monkeypatch.setattr(
            app_module, "_view", lambda access, days: app_module._View(shown, Spend(window_start=0.0, window_end=1.0))
        )
        app = app_module.create_app()
        app.dependency_overrides[get_user] = lambda: SimpleNamespace(get_name=lambda: "ada")
        return TestClient(app, base_url="http://airflow.test")

    return client


def test_rule_an_instance_is_shown_when_its_dag_is_readable_and_an_ownerless_orphan_to_who_reads_every_dag():
    from airflow_gpumarket.ui.app import _belongs

    mine, theirs = rental(1), rental(2, owner=("other_dag", "run-1", "t", -1))
    ownerless_orphan, by_hand = rental(3, owner=None), rental(4, owner=None, orphan_reason=None)
    reader = Access(readable={"train_dag"})
    assert [_belongs(r, reader) for r in (mine, theirs, ownerless_orphan, by_hand)] == [True, False, False, False]
    admin = Access(readable={"train_dag", "other_dag"}, reads_all=True)
    assert [_belongs(r, admin) for r in (mine, theirs, ownerless_orphan, by_hand)] == [True, True, True, False]


def test_the_json_shows_the_rows_this_user_sees_and_what_they_may_do(page):
    access = Access(readable={"train_dag"}, editable={"train_dag"})
    answer = page(access, rental(1), rental(2, owner=("other_dag", "run-1", "t", -1))).get("/api/rentals")
    assert answer.status_code == 200
    (row,) = answer.json()["live"]
    assert row["instance_id"] == 1 and row["dag_id"] == "train_dag" and row["may_destroy"] is True
    assert row["owner_from"] == "label" and row["orphan"].startswith("its lease expired")
    served = rental(3)
    served.used_by = (("train_dag", "run-1", "embed", 0), ("train_dag", "run-1", "embed", 1))
    (shown,) = page(access, served).get("/api/rentals").json()["live"]
    assert shown["used_by"] == [{"task_id": "embed", "map_index": 0}, {"task_id": "embed", "map_index": 1}]


def test_an_orphan_the_user_may_edit_is_destroyed_and_the_page_says_so(page):
    client = page(Access(readable={"train_dag"}, editable={"train_dag"}), rental(1))
    answer = client.post("/orphans/c/1/destroy", data={"confirm": "1"}, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "../../../?days=7&destroyed=1"
    assert Hook.destroyed == [1]
    ((owner, end),) = ENDS  # its end, on its owner's XComs: its cost stays in its DAG's spend
    assert owner == OWNER and end["instance_id"] == 1 and end["ended_by"] == "GPU rentals page (ada)"


@pytest.mark.parametrize(
    ("confirm", "headers", "status"),
    [
        ("2", {}, 400),  # the confirmation must repeat the instance id
        ("1", {"origin": "https://elsewhere.example"}, 403),  # another site's form
    ],
    ids=["confirm", "cross-site"],
)
def test_a_destroy_without_its_confirmation_or_from_another_site_is_refused(page, confirm, headers, status):
    client = page(Access(readable={"train_dag"}, editable={"train_dag"}), rental(1))
    answer = client.post("/orphans/c/1/destroy", data={"confirm": confirm}, headers=headers, follow_redirects=False)
    assert answer.status_code == status and Hook.destroyed == []


def test_a_destroy_from_the_page_itself_passes_the_origin_check(page):
    client = page(Access(readable={"train_dag"}, editable={"train_dag"}), rental(1))
    headers = {"origin": "http://airflow.test"}
    assert client.post(
        "/orphans/c/1/destroy", data={"confirm": "1"}, headers=headers, follow_redirects=False
    ).is_redirect
    assert Hook.destroyed == [1]


def test_only_an_orphan_the_user_may_edit_is_destroyed(page):
    reader = Access(readable={"train_dag"})  # may read the DAG, not edit it
    assert page(reader, rental(1)).post("/orphans/c/1/destroy", data={"confirm": "1"}).status_code == 403
    editor = Access(readable={"train_dag"}, editable={"train_dag"})
    held = rental(1, orphan_reason=None)  # its task still holds it
    assert page(editor, held).post("/orphans/c/1/destroy", data={"confirm": "1"}).status_code == 409
    assert page(editor).post("/orphans/c/1/destroy", data={"confirm": "1"}).status_code == 409  # not listed
    assert Hook.destroyed == []


def test_a_destroy_the_service_refused_answers_502_naming_the_instance(page):
    client = page(Access(readable={"train_dag"}, editable={"train_dag"}), rental(1))
    Hook.fails = True
    answer = client.post("/orphans/c/1/destroy", data={"confirm": "1"})
    assert answer.status_code == 502 and "destroying instance 1 failed" in answer.text


@pytest.fixture
def service(monkeypatch):
    """The page's own data path (``_view``) over a stubbed metadata database and service, for ``as_user(access)``.

    One connection ``c`` lists a running rental of train_dag's task; ``state.charges`` are its charges (an exception
    is raised instead), ``state.credit`` its credit, ``state.avoided`` the machines its account avoids. ``state.reads``
    counts the charges and account reads, ``state.memory_reads`` the host memory's.
    """
    from airflow.api_fastapi.core_api.security import get_user
    from airflow.utils import session as session_module
    from fastapi.testclient import TestClient

    from airflow_gpumarket import api
    from airflow_gpumarket.ui import app as app_module
    from airflow_gpumarket.ui.spend import TaskState

    from .rows import LABEL, NOW, row

    state = SimpleNamespace(charges=[], credit=100.0, reads=[], avoided=[], memory_reads=[], budgets=[])
    instance = {"id": 1, "actual_status": "running", "label": LABEL, "dph_total": 0.5, "start_date": NOW - 1800}

    def answer(what):
        state.reads.append(what)
        if isinstance(what, Exception):
            raise what
        return what

    src = app_module.sources
    monkeypatch.setattr(session_module, "create_session", contextlib.nullcontext)
    monkeypatch.setattr(app_module, "time", SimpleNamespace(time=lambda: NOW))
    monkeypatch.setattr(src, "connection_ids", lambda session: ["c"])
    monkeypatch.setattr(src, "listing", lambda conn_id: ([instance], 0.0))
    monkeypatch.setattr(
        src, "records", lambda session, since, instance_ids: [row(1), row(2, run_id="run-2", cost=0.01)]
    )
    monkeypatch.setattr(src, "label_owners", lambda session, keys, since: {})
    monkeypatch.setattr(src, "task_states", lambda session, tis: {row().ti_key: TaskState("running")})
    monkeypatch.setattr(src, "users", lambda session, instance_ids: {})
    monkeypatch.setattr(src, "charges", lambda conn_id, start, end: answer(state.charges))
    account = lambda conn_id: answer(api.Account(state.credit, None, 1, None, None))  # noqa: E731
    monkeypatch.setattr(src, "account", account)
    monkeypatch.setattr(
        src, "avoided_machines", lambda conn_ids, now, errors: state.memory_reads.append(conn_ids) or state.avoided
    )
    monkeypatch.setattr(src, "budgets_in_force", lambda now: state.budgets)

    def as_user(access: Access) -> TestClient:
        monkeypatch.setattr(app_module, "_Access", lambda user: access)
        app = app_module.create_app()
        app.dependency_overrides[get_user] = lambda: SimpleNamespace(get_name=lambda: "ada")
        return TestClient(app, base_url="http://airflow.test")

    state.as_user = as_user
    return state


def charge(instance_id: int, amount: float):
    from airflow_gpumarket import api

    from .rows import NOW

    return api.parse_charge({"type": "instance", "source": f"instance-{instance_id}", "amount": amount, "start": NOW})


def test_rule_a_service_without_charges_leaves_every_figure_an_estimate_marked_and_says_so_once(service):
    from airflow_gpumarket.exceptions import GpuMarketNotFoundError

    service.charges = GpuMarketNotFoundError("charges: this service has no GET /api/v0/charges/ (HTTP 404).")
    client = service.as_user(Access(readable={"train_dag"}, reads_all=True))
    data = client.get("/api/rentals").json()
    (live,) = data["live"]
    assert (live["source"], live["actual"], live["estimate"]) == ("estimate", None, live["cost_so_far"])
    assert {r["source"] for r in data["spend"]["per_rental"]} == {"estimate"}
    assert all(r["estimated"] == r["spend"] and r["difference"] is None for r in data["spend"]["per_run"])
    assert data["spend"]["actual"] == 0 and data["spend"]["estimated"] == data["spend"]["total"] > 0
    assert data["no_charges"] == ["c"] and data["errors"] == [] and data["unattributed"] is None
    (note,) = data["notes"]
    assert note == "The service gave no charges (connection 'c': no charges endpoint), so every figure is an estimate."
    assert data["accounts"][0]["burn"] is None and data["accounts"][0]["runway_days"] is None
    html = client.get("/").text
    assert html.count('<p class="note">') == 1 and note.replace("'", "&#x27;") in html
    assert 'class="error"' not in html and '<span class="est">≈ $0.2500 est.</span>' in html
    # Any other failure to read charges is an error line, and the figures are estimates all the same.
    from airflow_gpumarket.exceptions import GpuMarketServerError

    service.charges = GpuMarketServerError("charges: HTTP 503 after retries", status_code=503)
    data = client.get("/api/rentals").json()
    assert data["notes"] == [] and data["errors"][0].startswith("Could not read the charges of connection 'c'")
    assert data["live"][0]["source"] == "estimate"


def test_rule_a_rental_the_service_charged_shows_its_actual_beside_its_estimate_in_the_json(service):
    service.charges = [charge(1, 0.1), charge(1, 0.1), charge(1, 0.1)]
    data = service.as_user(Access(readable={"train_dag"})).get("/api/rentals").json()
    (live,) = data["live"]
    assert (live["source"], live["actual"], live["estimate"]) == ("charges", 0.3, 0.25)
    assert live["difference"] == pytest.approx(0.05) and live["actual_partial"] is False
    runs = {r["run_id"]: r for r in data["spend"]["per_run"]}
    assert (runs["run-1"]["actual"], runs["run-1"]["estimated"], runs["run-1"]["spend"]) == (0.3, 0, 0.3)
    assert runs["run-2"]["estimated_rentals"] == 1 and runs["run-2"]["estimated"] == runs["run-2"]["spend"]
    assert data["spend"]["dags"][0]["rentals"] == 2 and data["spend"]["dags"][0]["estimated_rentals"] == 1


def test_rule_only_a_user_who_reads_every_dag_sees_the_credit_the_runway_and_charges_no_dag_takes(service):
    service.charges = [charge(1, 0.3), charge(99, 0.7)]  # instance 99: no task recorded it
    admin = service.as_user(Access(readable={"train_dag"}, reads_all=True))
    data = admin.get("/api/rentals").json()
    (account,) = data["accounts"]
    assert (account["conn_id"], account["available"], account["problem"]) == ("c", 100.0, None)
    assert account["burn"] == 0 and account["runway_days"] is None  # today's charges: no full day yet
    assert data["unattributed"] == {"instances": 0.7, "instance_ids": [99], "other": 0.0}
    html = admin.get("/").text
    assert (
        '<tr id="balance-c">' in html and "$100.00" in html and "no spend in the 7 full UTC days before today" in html
    )
    assert "Charges of instances no task recorded: $0.7000 (instance 99)" in html

    service.reads.clear()
    reader = service.as_user(Access(readable={"train_dag"}))  # may read train_dag, not every DAG
    data = reader.get("/api/rentals").json()
    assert data["accounts"] is None and data["unattributed"] is None
    assert data["live"][0]["actual"] == 0.3  # the charges of their own DAG's rentals they do see
    html = reader.get("/").text
    assert "$100.00" not in html and "balance-c" not in html and "no task recorded" not in html
    assert "credit and runway, and the machines it avoids, are shown to users who may read every DAG" in html
    assert all(isinstance(r, list) for r in service.reads)  # their views read charges, never the account


def test_a_user_sees_the_budgets_of_the_dags_they_read_with_what_is_left(service):
    from airflow_gpumarket import budgets

    service.budgets = [
        ("train_dag", budgets.Limits(run=2.0, day=10.0), [budgets.Headroom("day", 10.0, 3.25, 1.5)]),
        ("other_dag", budgets.Limits(month=50.0), [budgets.Headroom("month", 50.0, 0.0, 0.0)]),
    ]
    reader = service.as_user(Access(readable={"train_dag"}))
    data = reader.get("/api/rentals").json()
    assert data["budgets"] == [
        {
            "dag_id": "train_dag",
            "run": 2.0,
            "windows": [{"period": "day", "limit": 10.0, "spent": 3.25, "reserved": 1.5, "left": 5.25}],
        }
    ]
    html = reader.get("/").text
    assert "<h2>Budgets</h2>" in html and "<td class=num>$5.2500</td>" in html and "other_dag" not in html


def test_a_malformed_budgets_variable_is_named_on_the_page(service, monkeypatch):
    from airflow_gpumarket import budgets
    from airflow_gpumarket.ui import app as app_module

    def malformed(now):
        raise budgets.BudgetConfigError(
            "The Variable gpumarket_budgets is not valid JSON (x); fix it in Admin > Variables"
        )

    monkeypatch.setattr(app_module.sources, "budgets_in_force", malformed)
    html = service.as_user(Access(readable={"train_dag"})).get("/").text
    assert "gpumarket_budgets is not valid JSON" in html and "<h2>Budgets</h2>" not in html


def test_rule_only_a_user_who_reads_every_dag_sees_the_machines_the_account_avoids(service):
    from airflow_gpumarket.host_memory import Memory

    from .rows import NOW

    service.avoided = [(("c",), Memory(11, "boot_timeout", "not running after 900 s", NOW - 60, NOW + 600, 1))]
    admin = service.as_user(Access(readable={"train_dag"}, reads_all=True))
    (machine,) = admin.get("/api/rentals").json()["avoided_machines"]
    assert machine == {
        "conn_ids": ["c"],
        "machine_id": 11,
        "reason": "boot_timeout",
        "detail": "not running after 900 s",
        "remembered_at": NOW - 60,
        "expires_at": NOW + 600,
        "failures": 1,
    }
    html = admin.get("/").text
    assert "Avoided machines (1)" in html and '<td class="num">10m00s</td>' in html
    service.avoided = []
    assert "No machine is avoided" in admin.get("/").text

    assert service.memory_reads == [["c"]] * 3
    reader = service.as_user(Access(readable={"train_dag"}))
    assert reader.get("/api/rentals").json()["avoided_machines"] is None
    assert "Avoided machines" not in reader.get("/").text
    assert len(service.memory_reads) == 3  # their views never read the host memory
