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
            app_module, "_view", lambda access, days: (shown, Spend(window_start=0.0, window_end=1.0), [])
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
