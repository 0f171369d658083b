"""The live acceptance run: one rental (two with a cloud integration) through the provider's own operator and hook.

Each assumption of ``docs/reference/live-service.md`` that one short run can observe is checked once and reported
in one line: ``LIVE held: ...``, ``LIVE differs: ... (seen: ...)`` or ``LIVE skipped: ... (why)``. Only those the
provider cannot work without are ``critical``: one that differs fails the run; the others are findings.
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from airflow_gpumarket import api, budgets, lifecycle
from airflow_gpumarket.exceptions import GpuMarketAuthError, GpuMarketError, GpuMarketNotFoundError

#: The variables the run reads; only the connection is required.
CONN_VARIABLE = "GPUMARKET_LIVE_CONN"
CAP_VARIABLE = "GPUMARKET_LIVE_MAX_SPEND"
INTEGRATION_VARIABLE = "GPUMARKET_LIVE_INTEGRATION"
FILTERS_VARIABLE = "GPUMARKET_LIVE_OFFER_FILTERS"
IMAGE_VARIABLE = "GPUMARKET_LIVE_IMAGE"
POLL_VARIABLE = "GPUMARKET_LIVE_POLL_INTERVAL"

#: The spend cap in dollars when ``GPUMARKET_LIVE_MAX_SPEND`` is not set.
DEFAULT_MAX_SPEND = 0.10
DEFAULT_FILTERS: dict[str, Any] = {"num_gpus": {"eq": 1}}
#: A small image that has python3 (the job wrapper's first choice) and pulls quickly.
DEFAULT_IMAGE = "python:3.12-slim"
DISK_GB = 10.0

#: The run's time bound, per rental: the boot, the job, the copies when an integration is named, and the destroy.
BOOT_TIMEOUT_SECONDS = 5 * 60
JOB_RUNTIME_SECONDS = 2 * 60
STAGING_TIMEOUT_SECONDS = 3 * 60
#: The destroy's share of the bound: the end-of-run sweep waits this long for destroyed instances to leave the list
#: before it counts them as alive.
DESTROY_MARGIN_SECONDS = 2 * 60

#: The Airflow connections the run defines from ``GPUMARKET_LIVE_CONN``: as given, and with a wrong key.
CONN_ID = "gpumarket_live"
WRONG_KEY_CONN_ID = "gpumarket_live_wrong_key"
#: The DAG id the run's rentals are labelled under (``lifecycle.rental_key``); each run has its own run id.
DAG_ID = "gpumarket_live_check"
JOB_TASK, READ_BACK_TASK = "job", "read_back"


class SpendCapRefused(Exception):
    """The run may not start: no usable spend cap, or the rental's worst case is above it. Nothing was rented."""


class _Stopped(Exception):
    """A critical assumption did not hold and the run cannot go on; the report says which."""


@dataclass(frozen=True)
class Assumption:
    """One assumption of ``docs/reference/live-service.md`` the run checks; ``critical``: the provider needs it."""

    id: str
    text: str
    critical: bool = False


#: Every assumption the run reports on, in report order; the docs' "live acceptance run" section lists the same ids.
ASSUMPTIONS = (
    Assumption("auth", "the connection's key is accepted", critical=True),
    Assumption("wrong-key", "a wrong key answers an auth error, never 'not found'", critical=True),
    Assumption("search", "a search answers priced offers, cheapest first", critical=True),
    Assumption("create", "the create answers the new instance's id, which carries the task's label", critical=True),
    Assumption("job-status", "the job wrapper's exit status reaches the task", critical=True),
    Assumption("job-log", "the container's log holds the job's output, read through the logs endpoint", critical=True),
    Assumption("destroy", "a destroy ends the instance: nothing with the run's labels is left alive", critical=True),
    Assumption("destroy-again", "a destroy of a destroyed instance answers 404 no_such_instance (already gone)"),
    Assumption("read-gone", "a read of a destroyed instance answers 'not found' ({\"instances\": null})"),
    Assumption("list-v1", "instances are listed by the paged GET /api/v1/instances/"),
    Assumption("list-v0-gone", "GET /api/v0/instances/ answers 410 deprecated_endpoint"),
    Assumption("container-id", "the job finds its instance's id in CONTAINER_ID"),
    Assumption("account", "GET /api/v0/users/current answers the account's credit"),
    Assumption("charges", "GET /api/v0/charges/ answers, with a charge for the rental (source instance-<id>)"),
    Assumption("invoices", "GET /api/v1/invoices/ answers"),
    Assumption("cloud-copy", "a file copied out to the cloud integration and back is unchanged"),
)
_BY_ID = {assumption.id: assumption for assumption in ASSUMPTIONS}


@dataclass
class Result:
    held: bool | None  # None: not checked
    seen: str = ""


@dataclass
class Report:
    """What the run saw, one result per assumption."""

    results: dict[str, Result] = field(default_factory=dict)
    #: What the run said along the way (its worst case and cap, the sweep's count), printed before the lines.
    notes: list[str] = field(default_factory=list)

    def held(self, assumption_id: str, seen: str = "") -> None:
        self.results[_BY_ID[assumption_id].id] = Result(True, seen)

    def differs(self, assumption_id: str, seen: str) -> None:
        self.results[_BY_ID[assumption_id].id] = Result(False, seen)

    def skipped(self, assumption_id: str, why: str) -> None:
        self.results.setdefault(_BY_ID[assumption_id].id, Result(None, why))

    def check(self, assumption_id: str, held: bool, seen: str) -> None:
        self.results[_BY_ID[assumption_id].id] = Result(held, seen)

    def line(self, assumption: Assumption) -> str:
        result = self.results.get(assumption.id, Result(None, "not reached"))
        if result.held is None:
            return f"LIVE skipped: {assumption.text} ({result.seen})"
        if result.held:
            return f"LIVE held: {assumption.text}" + (f" (seen: {result.seen})" if result.seen else "")
        return f"LIVE differs: {assumption.text} (seen: {result.seen})"

    def lines(self) -> list[str]:
        return [self.line(assumption) for assumption in ASSUMPTIONS]


@dataclass(frozen=True)
class Settings:
    """The run's settings, read from the environment."""

    conn: str = field(repr=False)  # it holds the API key: a traceback shows the settings, never the key
    max_spend: float
    integration: str | None
    filters: Mapping[str, Any]
    image: str
    poll_interval: float

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        """The settings; raises ``SpendCapRefused`` when the cap is not a positive number of dollars."""
        raw_cap = env.get(CAP_VARIABLE)
        cap = DEFAULT_MAX_SPEND if raw_cap is None else _dollars(raw_cap)
        if cap is None:
            raise SpendCapRefused(
                f"{CAP_VARIABLE}={raw_cap!r} is not a spend cap: give a positive number of dollars (unset: "
                f"${DEFAULT_MAX_SPEND:.2f}). Nothing was rented."
            )
        try:
            filters = json.loads(env[FILTERS_VARIABLE]) if env.get(FILTERS_VARIABLE) else DEFAULT_FILTERS
        except ValueError as exc:
            raise ValueError(
                f"{FILTERS_VARIABLE} is not JSON ({exc}); give filters such as {json.dumps(DEFAULT_FILTERS)}"
            ) from None
        return cls(
            conn=env[CONN_VARIABLE],
            max_spend=cap,
            integration=env.get(INTEGRATION_VARIABLE) or None,
            filters=filters,
            image=env.get(IMAGE_VARIABLE) or DEFAULT_IMAGE,
            poll_interval=float(env.get(POLL_VARIABLE) or api.POLL_INTERVAL_SECONDS),
        )

    @property
    def rentals(self) -> int:
        """Rentals made one after the other: the job, and the read-back when an integration is named."""
        return 2 if self.integration else 1

    @property
    def rental_seconds(self) -> float:
        staging = STAGING_TIMEOUT_SECONDS if self.integration else 0
        return BOOT_TIMEOUT_SECONDS + JOB_RUNTIME_SECONDS + staging + DESTROY_MARGIN_SECONDS

    @property
    def time_bound(self) -> float:
        """The longest the run may bill: its rentals, one after the other, each to its own bound."""
        return self.rentals * self.rental_seconds


def _dollars(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def worst_case(settings: Settings, offer: Mapping[str, Any]) -> budgets.WorstCase:
    """The most the run may cost on ``offer``'s price and disk over its whole time bound."""
    return budgets.worst_case(
        hourly_price=offer["dph_total"],
        seconds=settings.time_bound,
        disk_gb=DISK_GB,
        storage_price_per_gb_month=offer.get("storage_cost"),
    )


def refuse_above_cap(settings: Settings, offer: Mapping[str, Any]) -> budgets.WorstCase:
    """The run's worst case on ``offer``; raises ``SpendCapRefused`` when it is above the cap."""
    worst = worst_case(settings, offer)
    if worst.amount > settings.max_spend:
        raise SpendCapRefused(
            f"The cheapest matching offer ({offer.get('id')}) may cost {worst.describe()} over this run's "
            f"{settings.rentals} rental(s), above {CAP_VARIABLE}=${settings.max_spend:g}. Nothing was rented; "
            f"raise the cap or narrow {FILTERS_VARIABLE} to cheaper offers."
        )
    return worst


# --- connections --------------------------------------------------------------------------------------------


def airflow_connections(conn: str) -> dict[str, str]:
    """The environment variables that define the run's two connections: as given, and with a wrong key."""
    wrong_key = "live-check-wrong-key-" + secrets.token_hex(8)
    if conn.lstrip().startswith("{"):
        try:
            document = json.loads(conn)
        except ValueError:
            raise ValueError(f"{CONN_VARIABLE} starts with '{{' but is not JSON; give a JSON object or a URI") from None
        wrong = json.dumps({**document, "password": wrong_key})
    else:
        parts = urlsplit(conn)
        netloc = parts.netloc.rpartition("@")[2]
        login = parts.netloc.rpartition("@")[0].partition(":")[0]
        wrong = urlunsplit(parts._replace(netloc=f"{login}:{wrong_key}@{netloc}"))
    return {f"AIRFLOW_CONN_{CONN_ID.upper()}": conn, f"AIRFLOW_CONN_{WRONG_KEY_CONN_ID.upper()}": wrong}


# --- the run --------------------------------------------------------------------------------------------------


class _Lines(logging.Handler):
    """Keeps the messages an operator logs: the task log as a user reads it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def _task_log(operator: Any) -> Iterator[_Lines]:
    """The operator's task log, kept: it logs to a standard logger the run hands it.

    Airflow 3.3 keeps an operator's logger in ``_cached_logger``, Airflow 2 in ``_log``.
    """
    lines, logger = _Lines(), logging.getLogger(f"gpumarket.live_check.{operator.task_id}")
    logger.setLevel(logging.INFO)
    logger.addHandler(lines)
    operator._cached_logger = operator._log = logger
    try:
        yield lines
    finally:
        logger.removeHandler(lines)


@dataclass
class Run:
    """One acceptance run: what it rented and saw. ``execute`` checks everything, destroying all in the end."""

    settings: Settings
    report: Report = field(default_factory=Report)
    run_id: str = field(default_factory=lambda: f"live_{time.strftime('%Y%m%dT%H%M%S')}_{secrets.token_hex(3)}")
    token: str = field(default_factory=lambda: secrets.token_hex(8))
    instance_ids: list[int] = field(default_factory=list)
    started: float = 0.0

    @property
    def keys(self) -> list[str]:
        """The label keys of the run's rentals (``lifecycle.rental_key``): the sweep finds what they left by them."""
        return [lifecycle.rental_key(DAG_ID, self.run_id, task, -1) for task in (JOB_TASK, READ_BACK_TASK)]

    def execute(self) -> Report:
        from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

        hook = GpuMarketHook(CONN_ID)
        self.started = time.time()
        try:
            offer = self._auth_and_search(hook)
            worst = refuse_above_cap(self.settings, offer)
            self.report.notes.append(
                f"live-check: run {self.run_id}: at most {self.settings.rentals} rental(s) of "
                f"{offer.get('gpu_name')} at ${offer['dph_total']}/h; worst case {worst.describe()}, "
                f"cap ${self.settings.max_spend:g}"
            )
            self._account(hook)
            self._job(offer)
            if self.settings.integration:
                self._read_back(offer)
            else:
                self.report.skipped("cloud-copy", f"no {INTEGRATION_VARIABLE} named")
        except _Stopped as exc:
            self.report.notes.append(f"live-check: stopped: {exc}")
        finally:
            self._sweep(hook)
        self._after_destroy(hook)
        self._money(hook)
        return self.report

    def _auth_and_search(self, hook: Any) -> Mapping[str, Any]:
        from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

        works, sentence = hook.test_connection()
        self.report.check("auth", works, "" if works else sentence)
        if not works:
            raise _Stopped(f"{CONN_VARIABLE}: {sentence}")
        try:
            GpuMarketHook(WRONG_KEY_CONN_ID).list_instances()
            self.report.differs("wrong-key", "a wrong key listed the instances")
        except GpuMarketAuthError as exc:
            self.report.held("wrong-key", f"HTTP {exc.status_code}")
        except GpuMarketError as exc:
            self.report.differs("wrong-key", f"{type(exc).__name__}, HTTP {exc.status_code}")
        # The hook's own record of which list it uses, and one unretried request: no second client for them.
        self.report.check("list-v1", hook._list_v1, "v1 list" if hook._list_v1 else "fell back to the v0 list")
        try:
            hook._send("live_check", "GET", api.PATH_INSTANCES)
            self.report.differs("list-v0-gone", "it still answers 200")
        except GpuMarketError as exc:
            self.report.check("list-v0-gone", exc.status_code == 410, f"HTTP {exc.status_code}")
        try:
            offers = hook.search_offers(self.settings.filters, order=[["dph_total", "asc"]], limit=10)
        except GpuMarketError as exc:
            self.report.differs("search", f"{type(exc).__name__}: {_short(exc)}")
            raise _Stopped(f"the search failed: {_short(exc)}") from None
        priced = [o for o in offers if api.is_positive_number(o.get("dph_total")) and o.get("rentable") is not False]
        prices = [o["dph_total"] for o in priced]
        cheapest_first = prices == sorted(prices)
        self.report.check(
            "search",
            bool(priced) and cheapest_first,
            f"{len(offers)} offer(s), {len(priced)} priced"
            + (f", cheapest ${prices[0]}/h" if prices else "")
            + ("" if cheapest_first else ", not in price order"),
        )
        if not priced:
            raise _Stopped(f"no rentable priced offer matches {FILTERS_VARIABLE}={json.dumps(self.settings.filters)}")
        return priced[0]

    def _account(self, hook: Any) -> None:
        try:
            account = hook.account()
        except GpuMarketError as exc:
            self.report.differs("account", f"{type(exc).__name__}, HTTP {exc.status_code}")
            return
        self.report.check(
            "account",
            account.credit is not None,
            "credit sent" if account.credit is not None else "no credit, balance only",
        )

    def _operator(self, task_id: str, offer: Mapping[str, Any], command: str, **staging: Any) -> Any:
        from airflow.providers.common.compat.sdk import DAG

        from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

        return GpuMarketRunJobOperator(
            task_id=task_id,
            dag=DAG(DAG_ID, schedule=None),  # its id is in the rental's label key, which the sweep looks for
            gpumarket_conn_id=CONN_ID,
            command=command,
            # The offer whose worst case was checked, at no higher price: taken or dearer by now, nothing is rented.
            offer_id=int(offer["id"]),
            max_dph=offer["dph_total"],
            image=self.settings.image,
            disk=DISK_GB,
            boot_timeout=BOOT_TIMEOUT_SECONDS,
            max_runtime=JOB_RUNTIME_SECONDS,
            staging_timeout=STAGING_TIMEOUT_SECONDS,
            max_cost=self.settings.max_spend / self.settings.rentals,
            poll_interval=self.settings.poll_interval,
            log_interval=self.settings.poll_interval,
            keepalive=None,
            deferrable=False,
            durable=False,
            **staging,
        )

    def _execute(self, operator: Any) -> tuple[dict[str, Any] | None, list[str], Exception | None]:
        """Run one task as ``dag.test()`` would run it in a worker: its summary, its log, and its failure."""
        with _task_log(operator) as lines:
            try:
                summary = operator.execute({"run_id": self.run_id, "ti": None})
                return summary, lines.messages, None
            except Exception as exc:  # noqa: BLE001 - reported; the sweep destroys what it left
                return None, lines.messages, exc
            finally:
                ids = [int(m.split()[2]) for m in lines.messages if m.startswith("Created instance ")]
                self.instance_ids.extend(ids)

    def _job(self, offer: Mapping[str, Any]) -> None:
        out_dir = "/workspace/live-check/out"
        command = (
            f'echo "live-check token {self.token}"; echo "live-check container-id ${{CONTAINER_ID:-none}}"; '
            # GPUMARKET_INSTANCE_ROOT is empty on the live service; the simulator sets it to the instance's disk.
            f'out="$GPUMARKET_INSTANCE_ROOT{out_dir}"; mkdir -p "$out" && echo {self.token} > "$out/probe.txt"'
        )
        staging = {}
        if self.settings.integration:
            staging = {"cloud_integration": self.settings.integration, "outputs": {out_dir: self._cloud_dir}}
        operator = self._operator(JOB_TASK, offer, command, **staging)
        summary, messages, failure = self._execute(operator)
        text = "\n".join(messages)
        if not self.instance_ids:
            self.report.differs("create", f"no instance was made ({_short(failure)})")
            raise _Stopped(f"the job's rental failed: {_short(failure)}")
        instance_id = self.instance_ids[0]
        parsed = lifecycle.parse_label((summary or {}).get("label"))
        labelled = summary is None or (parsed is not None and parsed[0] == self.keys[0])
        seen = f"instance {instance_id}" + ("" if labelled else f", labelled {(summary or {}).get('label')!r}")
        self.report.check("create", labelled, seen)
        status = (summary or {}).get("job_status")
        self.report.check(
            "job-status", status == "succeeded", f"job {status}" if summary else f"task failed: {_short(failure)}"
        )
        token_line = f"live-check token {self.token}"
        self.report.check(
            "job-log",
            token_line in text,
            "the job's line reached the task log" if token_line in text else "the job's line is not in the task log",
        )
        container = f"live-check container-id {instance_id}"
        seen = next((m for m in messages if "live-check container-id" in m), "no line")
        self.report.check("container-id", container in text, seen.rpartition("] ")[2])
        if self.settings.integration and summary is None:
            self.report.differs("cloud-copy", f"the copy out failed: {_short(failure)}")

    @property
    def _cloud_dir(self) -> str:
        return f"gpumarket-live-check/{self.run_id}"

    def _read_back(self, offer: Mapping[str, Any]) -> None:
        if "cloud-copy" in self.report.results:
            return  # the copy out failed already
        in_dir = "/workspace/live-check/in"
        command = (
            f'test "$(cat "$GPUMARKET_INSTANCE_ROOT{in_dir}/probe.txt")" = {self.token} '
            f'&& echo "live-check read back {self.token}"'
        )
        operator = self._operator(
            READ_BACK_TASK,
            offer,
            command,
            cloud_integration=self.settings.integration,
            inputs={in_dir: self._cloud_dir},
        )
        summary, messages, failure = self._execute(operator)
        back = f"live-check read back {self.token}" in "\n".join(messages)
        seen = f"out to and back from {self.settings.integration}:{self._cloud_dir}/probe.txt"
        self.report.check("cloud-copy", summary is not None and back, seen if back else f"{_short(failure)}")

    def _sweep(self, hook: Any) -> None:
        """Destroy every instance the run made, then count what still carries its labels, for a bounded time."""
        destroy_failures = []
        for instance_id in dict.fromkeys(self.instance_ids):
            try:
                hook.destroy_instance(instance_id)
            except GpuMarketError as exc:
                destroy_failures.append(f"destroy of {instance_id}: {_short(exc)}")
        deadline = time.time() + DESTROY_MARGIN_SECONDS
        while True:
            try:
                listed = hook.list_instances()
            except GpuMarketError as exc:
                self.report.differs("destroy", f"the sweep could not list the instances: {_short(exc)}")
                return
            left = [i for key in self.keys for i in lifecycle.rentals_of(listed, key)]
            self.instance_ids.extend(int(i["id"]) for i in left if int(i["id"]) not in self.instance_ids)
            for instance in left:
                try:
                    hook.destroy_instance(int(instance["id"]))
                except GpuMarketError as exc:
                    destroy_failures.append(f"destroy of {instance['id']}: {_short(exc)}")
            if not left or time.time() > deadline:
                break
            time.sleep(max(self.settings.poll_interval, 1.0))
        seen = f"{len(left)} left alive of {len(set(self.instance_ids))} rented"
        self.report.check("destroy", not left and not destroy_failures, "; ".join([seen, *destroy_failures]))
        self.report.notes.append(f"live-check: sweep by label: {seen}")

    def _after_destroy(self, hook: Any) -> None:
        if not self.instance_ids:
            for assumption_id in ("destroy-again", "read-gone"):
                self.report.skipped(assumption_id, "nothing was rented")
            return
        instance_id = self.instance_ids[0]
        try:
            again = hook.destroy_instance(instance_id)
            gone = bool(again.get("already_gone"))
            self.report.check("destroy-again", gone, "404, already gone" if gone else f"answered {_short(again)}")
        except GpuMarketError as exc:
            self.report.differs("destroy-again", f"{type(exc).__name__}, HTTP {exc.status_code}")
        try:
            instance = hook.get_instance(instance_id)
            self.report.differs("read-gone", f"status {instance.get('actual_status')!r}")
        except GpuMarketNotFoundError as exc:
            null = exc.status_code == 200  # the live service's {"instances": null}
            self.report.check("read-gone", null, "HTTP 200, null" if null else f"HTTP {exc.status_code}")
        except GpuMarketError as exc:
            self.report.differs("read-gone", f"{type(exc).__name__}, HTTP {exc.status_code}")

    def _money(self, hook: Any) -> None:
        start, end = self.started - 86400, time.time() + 86400  # days, on either side of any clock offset
        try:
            charges = hook.charges(start, end)
            ours = [c for c in charges if c.instance_id in self.instance_ids]
            total = sum(c.amount for c in ours)
            seen = f"{len(charges)} charge(s), {len(ours)} for this run's instance(s), ${total:.4f}"
            self.report.check("charges", bool(ours) or not self.instance_ids, seen)
        except GpuMarketError as exc:
            self.report.differs("charges", f"{type(exc).__name__}, HTTP {exc.status_code}")
        try:
            invoices = hook.invoices(start, end)
            self.report.held("invoices", f"{len(invoices)} invoice(s)")
        except GpuMarketError as exc:
            self.report.differs("invoices", f"{type(exc).__name__}, HTTP {exc.status_code}")


def _short(value: Any, limit: int = 160) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
