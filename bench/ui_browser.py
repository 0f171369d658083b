"""`make ui-test`: the GPU rentals page and the "GPU rental" link in a real browser, on a real Airflow deployment.

1. The deployment of `make system`'s small shape (tests/system/deployment.py: PostgreSQL, LocalExecutor, the
   api-server, a scheduler, a dag-processor, a triggerer) against the simulator, with the FAB auth manager, as most
   production deployments run it: `admin` (FAB's Admin), `viewer` (Viewer), `reader_a` (may read team_a_train only)
   and `editor_b` (may read and edit team_b_train only), whose passwords this script makes up (bench/fab_users.py).
2. The DAGs of bench/ui_dags: a job that keeps running, jobs that end (spend), an instance handed to its run that
   outlives it (an orphan), and two teams' DAGs: a job, @task.gpumarket, create -> work -> teardown, and a deferred
   job the test marks failed. The test also makes, through the service's API, an instance with a team_b_train
   task's label and no record, and one whose label names no task instance.
3. Headless Chromium (Debian's chromium and chromium-driver) driven by Selenium logs in through Airflow's own login
   page and checks, one `UI <check>: PASS|FAIL` line each (CHECKS below).
4. The tasks still running are marked failed through the REST API, and the script counts what is alive
   (`UI alive_total`, goal 0). The last line: `UI: <passed>/<total> checks pass, <n> instances alive`.

    python -m bench.ui_browser                                      # make ui-test
    python -m bench.ui_browser --screenshot docs/gpu-rentals-page.png   # also refresh the README's screenshot

Screenshots of the page (alone, and inside the Airflow UI) are saved in the Airflow home (.airflow/ui-<time>),
and, on a failed check, the browser's page as it was.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from tests.system.deployment import (
    BIN,
    ROOT,
    SMALL,
    AirflowApi,
    Deployment,
    Shape,
    Workload,
    clip,
    interrupt_on_signals,
)

DAGS_FOLDER = ROOT / "bench" / "ui_dags"
sys.path.insert(0, str(DAGS_FOLDER))
from ui_dags import GPUS, LABEL_ORPHAN_GPU  # noqa: E402 - the DAG file's own names, so both sides agree

SPEED = 20.0  # simulated seconds per real second: boots take 3-15 s, and a running rental costs something to see
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
WAIT = 60.0  # seconds any one thing in the browser may take to show
RUNS = {
    "embeddings_batch": 2,
    "eval_sweep": 1,
    "gpu_sandbox": 1,
    "nightly_finetune": 1,
    "team_a_train": 1,
    "team_a_embed": 1,
    "team_b_train": 2,
    "team_b_serve": 1,
}
RUN_UNTIL_STOPPED = ("nightly_finetune", "team_b_serve")  # their jobs run until the test marks them failed
#: The renting task of each DAG whose spend is checked against the simulator's ledger.
RENTING_TASKS = {"team_a_train": "train", "team_a_embed": "embed", "team_b_train": "rent", "team_b_serve": "serve"}
LEDGER_TOLERANCE = 0.10
FAB_AUTH_MANAGER = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
#: The deployment's users and their FAB roles (bench/fab_users.py makes them). FAB shows plugin pages in the menu only
#: to roles with menu access on Plugins (Admin and Op have it): the viewer's second role grants it.
USERS = {
    "admin": {"roles": {"Admin": []}},
    "viewer": {"roles": {"Viewer": [], "plugin_menu": [["menu_access", "Plugins"], ["can_read", "Plugins"]]}},
    "reader_a": {"roles": {"team_a_reader": [["can_read", "DAG:team_a_train"]]}},
    "editor_b": {"roles": {"team_b_editor": [["can_read", "DAG:team_b_train"], ["can_edit", "DAG:team_b_train"]]}},
}

CHECKS = {
    "anonymous": "without a login the page, its JSON and the destroy action answer 401, and nothing is destroyed",
    "menu": "the viewer finds 'GPU rentals' in the UI's Browse menu, and it opens the page inside the Airflow UI",
    "live_rental": "the running job's rental shows its DAG, run, task and try, status running and a cost above $0",
    "spend": "spend per DAG lists the DAGs whose jobs ended, with a chart of spend per day and DAG",
    "estimate_marked": "every rental the page's JSON calls an estimate shows '≈ $… est.' in its cost cell and no "
    "charged one does, and a service without charges is said in one line (there is an estimate to look at)",
    "viewer_cannot_destroy": "the viewer sees the orphan without a Destroy button, a POST from the page is refused "
    "(403), and the orphan stays alive",
    "admin_destroys_orphan": "inside the Airflow UI, the admin's Destroy… asks for confirmation, then the orphan "
    "is destroyed on the service and the page says so",
    "extra_link": "the running task instance's 'GPU rental' link opens its rental's row, highlighted",
    "team_isolation": "reader_a (FAB role: read team_a_train only) sees team_a_train's spend, and no instance id, "
    "GPU or price of team b's DAGs nor of an instance no DAG is found for, in the page or its JSON; a POST to "
    "destroy team b's orphan answers 409",
    "label_orphan": "editor_b (read and edit team_b_train only) sees an instance with a team_b_train task's label "
    "and no record as that task's orphan, and destroys it after the confirmation; reader_a never saw it",
    "spend_matches_ledger": "once every rental ended (team_b_serve's deferred job marked failed), each run's spend "
    "on the page is within 10 % of the simulator's ledger: RunJob, @task.gpumarket, create -> teardown, deferred "
    "marked failed",
    "balance_access": "the admin sees the account's credit as the service gives it (within one cached read's "
    "drift) and its runway; reader_a (one DAG) sees neither in the page nor in its JSON",
    "actual_matches_ledger": "once every rental ended and the service posted its charges, each rental's actual on "
    "the page (its charges) equals the simulator's ledger for its instance to the cent",
    "avoided_machines": "a machine remembered through host memory's signed route shows on the admin's page with its "
    "reason, detail and failures, and not on reader_a's page or JSON; cleared through the route, it is gone",
}
#: The machine the avoided_machines check remembers (no offer of the workload has it).
AVOIDED_MACHINE = 987_654
#: Seconds the page's actuals may take to show once the service posted the charges (the page reuses them 30 s).
CHARGES_WAIT = 90.0
#: Dollars the credit may drop between the page's cached read of the account and the check's own (one running job).
CREDIT_DRIFT = 5.0


class Failed(Exception):
    """A check missed its goal; the message says how."""


def offers() -> tuple[dict, ...]:
    """Two offers of each DAG's GPU model, so a rental that fails over finds another machine."""
    return tuple(
        {"id": 900_000 + 10 * n + k, "gpu_name": gpu, "num_gpus": 1 + (n % 2), "dph_total": round(0.6 + n + k / 10, 2)}
        for n, gpu in enumerate([*GPUS.values(), LABEL_ORPHAN_GPU])
        for k in range(2)
    )


class UiDeployment(Deployment):
    """The small deployment with the FAB auth manager, as most production deployments run it: made-up passwords,
    FAB's Admin and Viewer roles, and one role per team that may see its own DAGs only (``USERS``)."""

    def __init__(self, shape: Shape, workload: Workload) -> None:
        super().__init__(shape, workload)
        self.passwords = {user: secrets.token_urlsafe(12) for user in USERS}
        self.api = AirflowApi(self.api.base, credentials=("admin", self.passwords["admin"]))

    def airflow_env(self, conn_uri: str) -> dict[str, str]:
        env = super().airflow_env(conn_uri)
        env.update(AIRFLOW__CORE__AUTH_MANAGER=FAB_AUTH_MANAGER)
        return env

    def after_migrate(self) -> None:
        users = {name: {**spec, "password": self.passwords[name]} for name, spec in USERS.items()}
        with open(self.home / "fab-users.log", "wb") as log:
            subprocess.run(
                [str(BIN / "python"), str(ROOT / "bench" / "fab_users.py")],
                input=json.dumps(users).encode(),
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
            )


def new_browser(profile: Path) -> Any:
    """Headless Debian Chromium with the flags this machine's closed network needs (no background connections)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",  # run as root in a container
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1050",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


class UiTest:
    def __init__(self, screenshot_to: Path | None) -> None:
        self.started = time.time()
        workload = Workload("ui", DAGS_FOLDER, frozenset(GPUS), offers(), SPEED, worker_concurrency=4)
        self.deployment = UiDeployment(SMALL, workload)
        self.base = self.deployment.api.base
        self.screenshot_to = screenshot_to
        self.results: dict[str, str | None] = {}  # check -> None (pass) or why it failed
        self.sessions: dict[str, dict] = {}  # user -> the browser cookie of their login
        self.runs: dict[str, list[str]] = {}  # DAG id -> run ids
        self.browser: Any = None
        self.page_shot: Path | None = None  # the admin's view of the page inside the Airflow UI
        self.profile = Path(tempfile.mkdtemp(prefix="gpumarket-ui-chromium-"))
        self.summary = f"UI: 0/{len(CHECKS)} checks pass, alive unknown (the simulator was never reached)"
        self.label_orphan = self.nobodys = 0  # made by make_label_orphan

    @property
    def api(self) -> AirflowApi:
        return self.deployment.api

    @property
    def sim(self) -> Any:
        assert self.deployment.sim is not None
        return self.deployment.sim

    def say(self, text: str) -> None:
        print(f"  {time.time() - self.started:6.1f}s  {text}", flush=True)

    # --- the deployment and its runs ---------------------------------------------------------------------------

    def wait(self, what: str, timeout: float, check: Callable[[], Any], interval: float = 1.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            found = check()
            if found:
                return found
            if time.monotonic() > deadline:
                raise Failed(f"{what}: not after {timeout:.0f} s")
            time.sleep(interval)

    def trigger(self, dag_id: str) -> str:
        run_id = f"ui-{time.strftime('%H%M%S')}-{secrets.token_hex(3)}"
        self.api.call("POST", f"/dags/{dag_id}/dagRuns", {"logical_date": None, "dag_run_id": run_id})
        self.runs.setdefault(dag_id, []).append(run_id)
        return run_id

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        return self.api.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}").get("state")

    def instances_of(self, dag_id: str) -> list[dict]:
        return [i for i in self.sim.refresh() if i.get("gpu_name") == GPUS[dag_id]]

    def alive_of(self, dag_id: str) -> list[dict]:
        return [i for i in self.instances_of(dag_id) if not i["destroyed"]]

    def prepare(self) -> None:
        self.deployment.start(self.say)
        self.deployment.wait_ready(self.say)
        # Today's charges are posted once the day has ended, as a service that bills later does: until then the
        # page shows estimates, marked (estimate_marked); actual_matches_ledger moves the clock past midnight.
        self.sim.post("/_sim/account", {"charges_delay": 0})
        for dag_id, count in RUNS.items():
            for _ in range(count):
                self.say(f"triggered {dag_id} run {self.trigger(dag_id)}")
        ended = [(d, r) for d, runs in self.runs.items() if d not in RUN_UNTIL_STOPPED for r in runs]

        def all_ended() -> bool:
            states = {run: self.run_state(d, run) for d, run in ended}
            failed = [run for run, state in states.items() if state == "failed"]
            if failed:
                raise Failed(f"runs failed: {failed}; see the task logs under {self.deployment.home / 'logs'}")
            return all(state == "success" for state in states.values())

        self.wait("the short runs succeed", 300, all_ended, interval=2)
        self.say("the short runs succeeded")
        for dag_id in RUN_UNTIL_STOPPED:
            self.wait(f"{dag_id}'s job runs", 120, lambda d=dag_id: self.job_running(d), interval=2)
            self.say(f"{dag_id}'s job is running")

    def job_running(self, dag_id: str) -> dict | None:
        alive = [i for i in self.alive_of(dag_id) if i.get("actual_status") == "running"]
        return alive[0] if alive else None

    def mark_failed(self, dag_id: str, task_id: str) -> None:
        for run_id in self.runs.get(dag_id, []):
            with contextlib.suppress(RuntimeError):
                path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
                self.api.call("PATCH", path, {"new_state": "failed"})

    def finish(self) -> None:
        """Mark the jobs that would run forever failed (their operator or trigger destroys the instance), then wait
        for every instance to be gone."""
        self.mark_failed("nightly_finetune", "train")
        self.mark_failed("team_b_serve", "serve")
        if self.nobodys:  # no DAG is found for it: destroyed here, as its maker would
            with contextlib.suppress(Exception):
                from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

                GpuMarketHook().destroy_instance(self.nobodys)
        with contextlib.suppress(Failed):
            self.wait("every instance destroyed", 90, lambda: not any(not i["destroyed"] for i in self.sim.refresh()))

    # --- the browser ---------------------------------------------------------------------------------------------

    def login(self, user: str) -> None:
        """Through Airflow's login page, once per user: FAB allows 5 logins per 40 s (AUTH_RATE_LIMIT), so a
        user's session cookie is kept and set again to switch back to them."""
        from selenium.webdriver.common.by import By

        b = self.browser
        b.delete_all_cookies()
        b.get(f"{self.base}/auth/login/")
        if user in self.sessions:
            b.delete_all_cookies()
            b.add_cookie(self.sessions[user])
            return
        self.wait_for(lambda: b.find_elements(By.NAME, "username"), "the login form")
        b.find_element(By.NAME, "username").send_keys(user)
        b.find_element(By.NAME, "password").send_keys(self.deployment.passwords[user])
        b.find_element(By.CSS_SELECTOR, "button[type=submit], input[type=submit]").click()  # FAB's form
        self.sessions[user] = self.wait_for(lambda: b.get_cookie("_token"), f"{user}'s login (the _token cookie)")

    def wait_for(self, found: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
        from selenium.common.exceptions import StaleElementReferenceException

        def look() -> Any:
            try:
                return found()
            except StaleElementReferenceException:  # the page re-rendered while we read it: look again
                return None

        try:
            return self.wait(what, timeout, look, interval=0.3)
        except Failed:
            where = self.browser.current_url
            raise Failed(f"{what} did not show in the browser within {timeout:.0f} s (at {where})") from None

    def open_page(self, query: str = "") -> None:
        from selenium.webdriver.common.by import By

        self.browser.get(f"{self.base}/gpumarket/{query}")
        self.wait_for(lambda: self.browser.find_elements(By.TAG_NAME, "h1"), "the GPU rentals page")

    def row(self, instance_id: int) -> Any:
        from selenium.webdriver.common.by import By

        rows = self.browser.find_elements(By.ID, f"rental-{instance_id}")
        if not rows:
            raise Failed(f"no row for instance {instance_id} on the page: {clip(self.page_text(), 600)}")
        return rows[0]

    def page_text(self) -> str:
        from selenium.webdriver.common.by import By

        return self.browser.find_element(By.TAG_NAME, "body").text

    def section(self, heading_start: str) -> str:
        """The text of the page's table (or note) under the h2 that starts with ``heading_start``."""
        text = self.page_text()
        start = text.find(heading_start)
        if start < 0:
            raise Failed(f"no section {heading_start!r} on the page")
        rest = text[start + len(heading_start) :]
        following = [
            rest.find(h) for h in ("Live rentals", "Orphans", "Avoided machines", "Spend, last") if rest.find(h) > 0
        ]
        return rest[: min(following)] if following else rest

    def screenshot(self, name: str) -> Path:
        path = self.deployment.home / f"{name}.png"
        self.browser.save_screenshot(str(path))
        return path

    # --- the checks ----------------------------------------------------------------------------------------------

    def check(self, name: str, run: Callable[[], None]) -> None:
        try:
            run()
            self.results[name] = None
        except Failed as failed:
            self.results[name] = str(failed)
        except Exception as exc:  # noqa: BLE001 - a harness or browser error is this check's failure
            self.results[name] = f"{type(exc).__name__}: {clip(str(exc), 300)}"
            traceback.print_exc()
        if self.results[name] is not None and self.browser is not None:
            with contextlib.suppress(Exception):
                (self.deployment.home / f"failed-{name}.html").write_text(self.browser.page_source)
                self.screenshot(f"failed-{name}")
        self.say(f"{name}: {'PASS' if self.results[name] is None else 'FAIL: ' + self.results[name]}")

    def orphan(self) -> dict:
        (orphan,) = self.alive_of("gpu_sandbox")
        return orphan

    def check_anonymous(self) -> None:
        orphan = self.orphan()
        anonymous = requests.Session()
        for method, path in (
            ("GET", "/gpumarket/"),
            ("GET", "/gpumarket/api/rentals"),
            ("POST", f"/gpumarket/orphans/gpumarket_default/{orphan['id']}/destroy"),
        ):
            response = anonymous.request(method, f"{self.base}{path}", data={"confirm": orphan["id"]}, timeout=30)
            if response.status_code != 401:
                raise Failed(f"{method} {path} without a login answered {response.status_code}, not 401")
        if self.orphan()["destroyed"]:
            raise Failed("the anonymous POST destroyed the orphan")

    def check_menu(self) -> None:
        from selenium.webdriver.common.by import By

        b = self.browser
        self.login("viewer")
        b.get(f"{self.base}/")
        browse = self.wait_for(
            lambda: [e for e in b.find_elements(By.CSS_SELECTOR, "button, a") if e.text.strip() == "Browse"],
            "the navigation's Browse menu",
        )
        browse[0].click()
        item = self.wait_for(
            lambda: [e for e in b.find_elements(By.XPATH, "//*[normalize-space(text())='GPU rentals']")],
            "'GPU rentals' in the Browse menu",
        )
        item[0].click()
        frame = self.wait_for(lambda: b.find_elements(By.TAG_NAME, "iframe"), "the page's frame in the Airflow UI")
        b.switch_to.frame(frame[0])
        try:
            heading = self.wait_for(lambda: b.find_elements(By.TAG_NAME, "h1"), "the page inside its frame")
            if heading[0].text != "GPU rentals":
                raise Failed(f"the frame shows {heading[0].text!r}, not the GPU rentals page")
        finally:
            b.switch_to.default_content()
        self.screenshot("gpu-rentals-in-airflow-ui-as-viewer")

    def check_live_rental(self) -> None:
        job = self.job_running("nightly_finetune")
        if job is None:
            raise Failed("nightly_finetune's instance is not running on the service")
        (run_id,) = self.runs["nightly_finetune"]
        self.login("viewer")
        self.open_page()
        row = self.row(job["id"])
        text = row.text
        wanted = f"nightly_finetune / {run_id} / train (try 1)"
        if wanted not in text.replace("\n", " "):
            raise Failed(f"the row does not name {wanted!r}: {text!r}")
        if "running" not in text:
            raise Failed(f"the row does not say running: {text!r}")
        costs = [float(c.replace(",", "")) for c in re.findall(r"\$([\d,]+\.\d+)(?!/h)", text)]
        if not costs or max(costs) <= 0:
            raise Failed(f"no cost above $0 in the row: {text!r}")
        if str(job["id"]) not in self.section("Live rentals"):
            raise Failed("the running rental is not under Live rentals")

    def check_spend(self) -> None:
        from selenium.webdriver.common.by import By

        spend = self.section("Spend, last")
        for dag_id in ("embeddings_batch", "eval_sweep"):
            amounts = re.findall(rf"{dag_id} (?:≈ )?\$([\d,]+\.\d+)", spend)  # "≈ $… est.": an estimate
            if not amounts or float(amounts[0].replace(",", "")) <= 0:
                raise Failed(f"no spend above $0 for {dag_id} in: {clip(spend, 400)}")
        for run_id in self.runs["embeddings_batch"]:
            if run_id not in spend:
                raise Failed(f"embeddings_batch's run {run_id} is not in the spend per run")
        bars = self.browser.find_elements(By.CSS_SELECTOR, "svg rect title")
        if not any("embeddings_batch" in (bar.get_attribute("textContent") or "") for bar in bars):
            raise Failed("the chart has no bar for embeddings_batch")

    def cost_cell(self, row_id: str) -> str:
        """The text of a row's cost cell (the live rows' "Cost so far", the spend's "Cost")."""
        from selenium.webdriver.common.by import By

        cells = self.browser.find_elements(By.CSS_SELECTOR, f"#{row_id} td.cost")
        if not cells:
            raise Failed(f"no cost cell in row {row_id!r}: {clip(self.page_text(), 400)}")
        return cells[0].text

    def check_estimate_marked(self) -> None:
        from selenium.webdriver.common.by import By

        self.login("viewer")
        self.open_page()
        data = self.page_json()
        rows = [(f"rental-{r['instance_id']}", r) for r in data["live"]]
        rows += [(f"spend-{r['instance_id']}", r) for r in data["spend"]["per_rental"]]
        if not any(r["source"] == "estimate" for _, r in rows):
            raise Failed(f"no rental is an estimate, so none shows the mark: {clip(json.dumps(data['spend']), 300)}")
        for row_id, figure in rows:
            if figure["actual"] is None and figure["estimate"] is None:
                continue  # a live row the service gives no start for: no figure at all ("—")
            cell = self.cost_cell(row_id)
            marked = cell.startswith("≈ $") and cell.endswith(" est.")
            if marked != (figure["source"] == "estimate"):
                raise Failed(f"{row_id}'s cost {cell!r} is {'' if marked else 'not '}marked, its JSON: {figure}")
        notes = [p.text for p in self.browser.find_elements(By.CSS_SELECTOR, "p.note")]
        if data["no_charges"] and (len(notes) != 1 or "gave no charges" not in notes[0]):
            raise Failed(f"the service gave no charges, and the page's notes are {notes!r}, not one line saying so")
        self.say(f"{len(rows)} cost cells checked; no charges from {data['no_charges'] or 'no connection'}")

    def check_viewer_cannot_destroy(self) -> None:
        from selenium.webdriver.common.by import By

        orphan = self.orphan()
        self.open_page()
        row = self.row(orphan["id"])
        if "gpu_sandbox" not in row.text or row.find_elements(By.TAG_NAME, "button"):
            raise Failed(f"the viewer's orphan row names no DAG or has a button: {row.text!r}")
        status = self.browser.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(arguments[0], {method: 'POST', body: new URLSearchParams({confirm: arguments[1]}),"
            " credentials: 'same-origin'}).then(r => done(r.status), e => done(String(e)));",
            f"orphans/gpumarket_default/{orphan['id']}/destroy",
            str(orphan["id"]),
        )
        if status != 403:
            raise Failed(f"the viewer's POST to destroy the orphan answered {status}, not 403")
        if self.orphan()["destroyed"]:
            raise Failed("the viewer's POST destroyed the orphan")

    def check_admin_destroys_orphan(self) -> None:
        """Inside the Airflow UI's frame, as a user would: the frame is sandboxed without dialogs, so the page asks
        for the confirmation itself."""
        from selenium.webdriver.common.by import By

        orphan = self.orphan()
        self.login("admin")
        self.open_page()
        self.screenshot("gpu-rentals-page")
        b = self.browser
        b.get(f"{self.base}/plugin/gpu-rentals")
        frame = self.wait_for(lambda: b.find_elements(By.TAG_NAME, "iframe"), "the page's frame in the Airflow UI")
        b.switch_to.frame(frame[0])
        try:
            self.wait_for(lambda: b.find_elements(By.ID, f"rental-{orphan['id']}"), "the orphan's row in the frame")
            b.switch_to.default_content()
            self.page_shot = self.screenshot("gpu-rentals-in-airflow-ui")  # the README's picture
            b.switch_to.frame(frame[0])
            buttons = self.row(orphan["id"]).find_elements(By.TAG_NAME, "button")
            if [button.text for button in buttons] != ["Destroy…"]:
                raise Failed(f"the admin's orphan row has {[button.text for button in buttons]}, not one Destroy…")
            buttons[0].click()
            question = self.wait_for(lambda: b.find_elements(By.ID, "confirm-destroy"), "the confirmation")[0]
            if f"Destroy instance {orphan['id']}" not in question.text:
                raise Failed(f"the confirmation does not name the instance: {question.text!r}")
            if self.orphan()["destroyed"]:
                raise Failed("pressing Destroy… destroyed the orphan before it was confirmed")
            question.find_element(By.TAG_NAME, "button").click()
            said = f"Instance {orphan['id']} was destroyed."
            self.wait_for(lambda: said in self.page_text() and "Orphans (0)" in self.page_text(), repr(said))
        finally:
            b.switch_to.default_content()
        found = next(i for i in self.instances_of("gpu_sandbox") if i["id"] == orphan["id"])
        if not found["destroyed"]:
            raise Failed("the page says destroyed, but the service still runs the orphan")

    def check_extra_link(self) -> None:
        from selenium.webdriver.common.by import By

        job = self.job_running("nightly_finetune")
        if job is None:
            raise Failed("nightly_finetune's instance is not running on the service")
        (run_id,) = self.runs["nightly_finetune"]
        b = self.browser
        b.get(f"{self.base}/dags/nightly_finetune/runs/{run_id}/tasks/train")
        details = self.wait_for(  # Airflow 3.3 lists a task instance's extra links on its Details tab
            lambda: [e for e in b.find_elements(By.CSS_SELECTOR, "button, a") if e.text.strip() == "Details"],
            "the task instance's Details tab",
        )
        details[0].click()
        link = self.wait_for(
            lambda: [a for a in b.find_elements(By.TAG_NAME, "a") if a.text.strip() == "GPU rental"],
            "the task instance's 'GPU rental' link",
        )[0]
        link.click()
        self.wait_for(lambda: f"gpumarket/?instance={job['id']}" in b.current_url, "the rental's row after the click")
        row = self.wait_for(lambda: b.find_elements(By.ID, f"rental-{job['id']}"), "the rental's row")[0]
        if "target" not in (row.get_attribute("class") or ""):
            raise Failed(f"the rental's row is not highlighted (class {row.get_attribute('class')!r})")

    def page_json(self) -> dict:
        """The page's JSON as the logged-in browser user gets it (their cookie, from the page itself)."""
        text = self.browser.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch('api/rentals', {credentials: 'same-origin'}).then(r => r.text(), e => String(e)).then(done);"
        )
        return json.loads(text)

    def post_destroy(self, instance_id: int) -> Any:
        return self.browser.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(arguments[0], {method: 'POST', body: new URLSearchParams({confirm: arguments[1]}),"
            " credentials: 'same-origin'}).then(r => done(r.status), e => done(String(e)));",
            f"orphans/gpumarket_default/{instance_id}/destroy",
            str(instance_id),
        )

    def make_label_orphan(self) -> None:
        """An instance labelled for team_b_train's work task (second run) that no task recorded, made through the
        service's API as a script outside Airflow would; and one whose label names no task instance at all."""
        import os

        os.environ["AIRFLOW_CONN_GPUMARKET_DEFAULT"] = self.deployment.env["AIRFLOW_CONN_GPUMARKET_DEFAULT"]
        from airflow_gpumarket import lifecycle
        from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

        hook = GpuMarketHook()
        offers = hook.search_offers({"gpu_name": {"eq": LABEL_ORPHAN_GPU}}, limit=2)
        key = lifecycle.rental_key("team_b_train", self.runs["team_b_train"][1], "work", -1)
        self.label_orphan = int(
            hook.create_instance(offers[0]["id"], image="img", label=lifecycle.make_label(key, time.time() + 7200))[
                "new_contract"
            ]
        )
        nobody = lifecycle.make_label("0123456789ab", time.time() + 7200)
        self.nobodys = int(hook.create_instance(offers[1]["id"], image="img", label=nobody)["new_contract"])
        self.say(f"made instance {self.label_orphan} (team_b_train's label) and {self.nobodys} (no task's label)")

    def check_team_isolation(self) -> None:
        self.login("reader_a")
        self.open_page()
        text = self.page_text()
        data = self.page_json()
        if "team_a_train" not in self.section("Spend, last"):
            raise Failed(f"reader_a's spend does not list team_a_train: {clip(self.section('Spend, last'), 300)}")
        team_b = [i for d in ("team_b_train", "team_b_serve") for i in self.instances_of(d)]
        foreign = [*team_b, *(i for i in self.sim.refresh() if i["id"] in (self.label_orphan, self.nobodys))]
        for instance in foreign:
            for shown in (f"rental-{instance['id']}", str(instance["gpu_name"]), f"${instance['dph_total']:.2f}/h"):
                if shown in self.browser.page_source:
                    raise Failed(f"reader_a's page shows {shown!r} of team b's instance {instance['id']}")
        if data["live"] or set(data["spend"]["per_dag"]) - {"team_a_train"}:
            raise Failed(f"reader_a's JSON shows more than team_a_train: {clip(json.dumps(data), 400)}")
        if "team_b" in text or "team_b" in json.dumps(data):
            raise Failed("reader_a's page or JSON names a team b DAG")
        status = self.post_destroy(self.label_orphan)
        if status != 409:
            raise Failed(f"reader_a's POST to destroy team b's orphan answered {status}, not 409")

    def check_label_orphan(self) -> None:
        from selenium.webdriver.common.by import By

        self.login("editor_b")
        self.open_page()
        row = self.row(self.label_orphan)
        wanted = f"team_b_train / {self.runs['team_b_train'][1]} / work"
        if wanted not in row.text or "from its label" not in row.text:
            raise Failed(f"the label orphan's row does not name {wanted!r} from its label: {row.text!r}")
        if self.browser.find_elements(By.ID, f"rental-{self.nobodys}"):
            raise Failed("editor_b sees the instance no DAG is found for")
        buttons = row.find_elements(By.TAG_NAME, "button")
        if [button.text for button in buttons] != ["Destroy…"]:
            raise Failed(f"editor_b's label orphan row has {[button.text for button in buttons]}, not one Destroy…")
        buttons[0].click()
        question = self.wait_for(lambda: self.browser.find_elements(By.ID, "confirm-destroy"), "the confirmation")[0]
        question.find_element(By.TAG_NAME, "button").click()
        said = f"Instance {self.label_orphan} was destroyed."
        self.wait_for(lambda: said in self.page_text(), repr(said))
        if any(i["id"] == self.label_orphan and not i["destroyed"] for i in self.sim.refresh()):
            raise Failed("the page says destroyed, but the service still runs the label orphan")

    def check_spend_matches_ledger(self) -> None:
        (serving,) = self.alive_of("team_b_serve")
        self.mark_failed("team_b_serve", "serve")
        self.wait("team_b_serve's instance destroyed", 60, lambda: not self.alive_of("team_b_serve"))
        # Its trigger writes the end of its rental on the task's XComs a moment after the destroy, and the page
        # reuses a listing for a few seconds: until then the rental counts as still open.
        serve = f"/dags/team_b_serve/dagRuns/{self.runs['team_b_serve'][0]}/taskInstances/serve/xcomEntries"
        end = f"{serve}/gpumarket_rental_end_{serving['id']}"
        self.wait("the end of team_b_serve's rental recorded", 60, lambda: self.api.call("GET", end, ok404=True))
        from airflow_gpumarket import lifecycle

        self.login("admin")
        self.open_page()
        # (dag_id, run_id) -> what the simulator billed the rentals of that run's renting task. Not team_b_train's
        # second run: the label orphan counts there, costed from its creation (no task saw it boot).
        ledger = {}
        for dag_id, task_id in RENTING_TASKS.items():
            for run_id in self.runs[dag_id]:
                if dag_id == "team_b_train" and run_id == self.runs[dag_id][1]:
                    continue
                key = lifecycle.rental_key(dag_id, run_id, task_id, -1)
                ledger[(dag_id, run_id)] = sum(
                    i["cost"] for i in self.sim.refresh() if (lifecycle.parse_label(i.get("label")) or ("",))[0] == key
                )

        def ended() -> dict | None:
            data = self.page_json()
            if any(row["instance_id"] == serving["id"] for row in data["live"]):
                return None
            spent = {(r["dag_id"], r["run_id"]): r["spend"] for r in data["spend"]["per_run"]}
            return spent if all(run in spent for run in ledger) else None

        page = self.wait("the page's spend once every rental ended", 30, ended)
        off = []
        for run, billed in ledger.items():
            shown = page[run]
            self.say(f"spend of {run[0]} {run[1]}: page ${shown:.4f}, ledger ${billed:.4f}")
            if billed <= 0 or abs(shown - billed) > LEDGER_TOLERANCE * billed:
                off.append(f"{run[0]}/{run[1]}: page ${shown:.4f}, ledger ${billed:.4f}")
        if off:
            raise Failed("spend off the ledger by more than 10 %: " + "; ".join(off) + f"; records: {self.records()}")

    def check_balance_access(self) -> None:
        from selenium.webdriver.common.by import By

        from airflow_gpumarket.hooks.gpumarket import GpuMarketHook  # its connection: make_label_orphan's

        self.login("admin")
        self.open_page()
        rows = self.browser.find_elements(By.ID, "balance-gpumarket_default")
        shown = re.search(r"\$([\d,]+\.\d\d)", rows[0].text) if rows else None
        if shown is None:
            raise Failed(f"the admin's page shows no credit: {clip(self.page_text(), 400)}")
        # The page reads the account at most every 30 s, and a running instance draws the credit down meanwhile.
        now = GpuMarketHook().account().available
        if not 0 <= float(shown.group(1).replace(",", "")) - now < CREDIT_DRIFT:
            raise Failed(f"the page's credit ${shown.group(1)} is not the service's (${now:,.2f} now)")
        if "Runway at that rate" not in self.page_text():
            raise Failed("the admin's page shows no runway")
        self.say(f"the admin sees: {rows[0].text!r}")
        self.login("reader_a")
        self.open_page()
        data = self.page_json()
        if self.browser.find_elements(By.CSS_SELECTOR, "[id^=balance-]") or data["accounts"] is not None:
            raise Failed(f"reader_a sees the account's credit: {clip(json.dumps(data['accounts']), 200)}")
        if "shown to users who may read every DAG" not in self.page_text():
            raise Failed("reader_a's page does not say who may see the account's credit")

    def check_avoided_machines(self) -> None:
        from selenium.webdriver.common.by import By

        from airflow_gpumarket.hooks.gpumarket import GpuMarketHook  # its connection: make_label_orphan's
        from airflow_gpumarket.operators.host_memory_client import ApiServerHostMemory

        memory = ApiServerHostMemory(self.base, GpuMarketHook().settings.api_key, "gpumarket_default")
        memory.remember(AVOIDED_MACHINE, "preflight", detail="gpumarket: preflight failed (expected 2 GPUs, saw 0)")
        self.login("admin")
        self.open_page()
        rows = self.browser.find_elements(By.ID, f"avoided-{AVOIDED_MACHINE}")
        if not rows or "preflight failed (expected 2 GPUs, saw 0)" not in rows[0].text:
            raise Failed(f"the admin's page does not show machine {AVOIDED_MACHINE}: {clip(self.page_text(), 400)}")
        self.say(f"the admin sees: {rows[0].text!r}")
        self.login("reader_a")
        self.open_page()
        if self.browser.find_elements(By.ID, f"avoided-{AVOIDED_MACHINE}") or self.page_json()["avoided_machines"]:
            raise Failed("reader_a sees the machines the account avoids")
        if memory.clear(AVOIDED_MACHINE) != 1:
            raise Failed(f"host memory's route did not forget machine {AVOIDED_MACHINE}")
        self.login("admin")
        self.open_page()
        if self.browser.find_elements(By.ID, f"avoided-{AVOIDED_MACHINE}"):
            raise Failed(f"machine {AVOIDED_MACHINE} is still on the page once forgotten")

    def check_actual_matches_ledger(self) -> None:
        """Each ended rental's actual against the simulator's ledger (``cost``: compute, storage and bandwidth).

        A service posts a day's charges after the day: if they are not all there, the simulator's clock is moved past
        the end of its day once (every rental has ended by now, so no cost changes but the orphan no DAG owns).
        """
        self.login("admin")
        moved = False

        def charged() -> list[dict] | None:
            nonlocal moved
            self.open_page()
            data = self.page_json()
            if data["no_charges"]:
                raise Failed(
                    f"the service gave no charges for {data['no_charges']} (GET /api/v0/charges/ answered 404): "
                    "this simulator has no charges endpoint"
                )
            ended = {i["id"] for i in self.sim.refresh() if i["destroyed"]}
            rows = [r for r in data["spend"]["per_rental"] if r["instance_id"] in ended]
            if rows and all(r["source"] == "charges" for r in rows):
                return rows
            if not moved:
                now = self.sim.get("/_sim/clock")["now"]
                self.sim.post("/_sim/advance", {"seconds": 86400 - now % 86400 + 60})
                moved = True
            return None

        rows = self.wait("every ended rental charged on the page", CHARGES_WAIT, charged, interval=5)
        ledger = {i["id"]: i["cost"] for i in self.sim.refresh()}
        off = []
        for rental in rows:
            instance_id = rental["instance_id"]
            shown = self.cost_cell(f"spend-{instance_id}")
            found = re.match(r"\$([\d,]+\.\d+)", shown)
            if found is None or abs(float(found.group(1).replace(",", "")) - ledger[instance_id]) >= 0.005:
                off.append(f"instance {instance_id}: page {shown}, ledger ${ledger[instance_id]:.4f}")
        self.say(f"{len(rows)} rentals' actuals checked against the ledger")
        if off:
            raise Failed("actual off the ledger by a cent or more: " + "; ".join(off))

    def records(self) -> str:
        """The rental records of the ledger check's task instances (what the page costed), for a failure's message."""
        found = []
        for dag_id, task_id in RENTING_TASKS.items():
            for run_id in self.runs[dag_id]:
                path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries"
                with contextlib.suppress(RuntimeError):
                    for entry in self.api.call("GET", path)["xcom_entries"]:
                        if entry["key"].startswith("gpumarket_rental_") and entry["key"] != "gpumarket_rental_url":
                            value = self.api.call("GET", f"{path}/{entry['key']}", deserialize="true")["value"]
                            found.append(f"{dag_id}/{task_id} {entry['key']}={value}")
        return clip("; ".join(found), 3000)

    def run(self) -> None:
        self.prepare()
        self.browser = new_browser(self.profile)
        self.check("anonymous", self.check_anonymous)
        self.check("menu", self.check_menu)
        self.check("live_rental", self.check_live_rental)
        self.check("spend", self.check_spend)
        self.check("estimate_marked", self.check_estimate_marked)
        self.check("viewer_cannot_destroy", self.check_viewer_cannot_destroy)
        self.check("admin_destroys_orphan", self.check_admin_destroys_orphan)
        self.check("extra_link", self.check_extra_link)
        self.make_label_orphan()
        self.check("team_isolation", self.check_team_isolation)
        self.check("label_orphan", self.check_label_orphan)
        self.check("spend_matches_ledger", self.check_spend_matches_ledger)
        self.check("balance_access", self.check_balance_access)
        self.check("actual_matches_ledger", self.check_actual_matches_ledger)
        self.check("avoided_machines", self.check_avoided_machines)

    def report(self) -> bool:
        passed = 0
        for name, goal in CHECKS.items():
            reason = self.results.get(name, "not run")
            passed += reason is None
            print(f"UI {name}: {'PASS' if reason is None else f'FAIL ({reason})'} (goal: {goal})")
        alive = [i["id"] for i in self.sim.refresh() if not i["destroyed"]]
        print(f"UI alive_total: {len(alive)} {alive or ''}(goal: 0)")
        self.summary = f"UI: {passed}/{len(CHECKS)} checks pass, {len(alive)} instances alive"
        return passed == len(CHECKS) and not alive

    def close(self) -> None:
        if self.browser is not None:
            with contextlib.suppress(Exception):
                self.browser.quit()
        shutil.rmtree(self.profile, ignore_errors=True)
        self.deployment.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--screenshot", type=Path, help="copy the page's screenshot here (the README's)")
    args = parser.parse_args()
    interrupt_on_signals()
    test = UiTest(args.screenshot)
    ok = False
    try:
        test.run()
        ok = True
    except KeyboardInterrupt:
        print("interrupted: counting what is alive and stopping what this script started", flush=True)
    except Exception as exc:  # noqa: BLE001 - report, count and clean up whatever broke
        print(f"ui test could not run: {type(exc).__name__}: {exc}", flush=True)
        traceback.print_exc()
    finally:
        try:
            if test.deployment.sim is not None:
                test.finish()
                ok = test.report() and ok
            shot = test.page_shot
            if shot is not None:
                print(f"screenshots: {test.deployment.home}/*.png")
                if args.screenshot is not None:
                    shutil.copyfile(shot, args.screenshot)
                    print(f"copied to {args.screenshot}")
            print(f"wall-clock time: {time.time() - test.started:.0f} s; Airflow home {test.deployment.home}")
        finally:
            test.close()
        print(test.summary, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
