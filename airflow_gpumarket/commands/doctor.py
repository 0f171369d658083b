"""``airflow gpumarket doctor``: a connection checked end to end, one line per check, each failure with its fix."""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from airflow_gpumarket import __version__, credit, pacing
from airflow_gpumarket.commands.common import EXIT_FAILED, EXIT_OK, FIX_KEY, FIX_REACH, command, hook, key_hint
from airflow_gpumarket.exceptions import (
    GpuMarketAuthError,
    GpuMarketError,
    GpuMarketNotFoundError,
    GpuMarketTransportError,
)
from airflow_gpumarket.hooks.core import slot_seconds

#: A doctor answers within seconds: each call is tried at most this many more times, this many seconds apart at most.
DOCTOR_RETRIES = 1
DOCTOR_MAX_WAIT_SECONDS = 2.0
#: A clock offset to the service beyond this is worth a warning (the Date header has whole seconds).
CLOCK_TOLERANCE_SECONDS = 5.0
#: A credit that lasts fewer days than this at the recent burn rate is worth a warning.
LOW_RUNWAY_DAYS = 3.0
#: The budgets shown in the rate-limit line, as (what, operation).
PACED = (("list", "list_instances"), ("create", "create_instance"), ("destroy", "destroy_instance"))

OK, WARN, FAIL = "ok", "warn", "FAIL"


@dataclass(frozen=True)
class Check:
    """One check's outcome. A failure of a ``needed`` check (the provider cannot work without it) fails the doctor."""

    name: str
    status: str
    detail: str
    fix: str | None = None
    needed: bool = True

    @property
    def fails(self) -> bool:
        return self.status == FAIL and self.needed

    def line(self) -> str:
        fix = f". Fix: {self.fix}" if self.fix and self.status != OK else ""
        return f"{self.status:<5} {self.name:<12} {self.detail.rstrip('.')}{fix}"


@command
def doctor(args: Any) -> int:
    """Run the checks on ``args.conn_id`` and print one line each; non-zero when a needed one failed."""
    checked = hook(args.conn_id)
    print(f"GPU Market doctor: connection {args.conn_id!r}")
    first = connection_check(checked.settings)  # the connection as it is, before the doctor's own retry policy
    # A person waits for the answer: a service that needs retries to answer is itself a finding.
    retry = dataclasses.replace(
        checked.settings.retry,
        max_retries=min(checked.settings.retry.max_retries, DOCTOR_RETRIES),
        max_wait=min(checked.settings.retry.max_wait, DOCTOR_MAX_WAIT_SECONDS),
    )
    checked.settings = dataclasses.replace(checked.settings, retry=retry)
    checks = []
    for check in checks_of(checked, first):
        print(check.line(), flush=True)
        checks.append(check)
    failed = [c.name for c in checks if c.fails]
    warned = sum(c.status == WARN for c in checks)
    summary = f"{len(checks)} checks: {len(failed)} failed, {warned} warning{'' if warned == 1 else 's'}"
    print(f"{summary}{': ' + ', '.join(failed) if failed else ''}")
    return EXIT_FAILED if failed else EXIT_OK


def checks_of(checked: Any, connection: Check) -> Iterator[Check]:
    """Each check in turn; those that need the service are skipped once it cannot be reached or refuses the key."""
    yield connection
    service = service_check(checked)
    yield service
    if service.status == FAIL:
        yield Check("skipped", WARN, "key, credit, integrations, clock: they need the service", needed=False)
    else:
        yield key_check(checked)
        yield credit_check(checked)
        yield integrations_check(checked)
        yield clock_check(checked)
    yield rate_limit_check(checked.settings)
    yield versions_check()
    yield api_server_check(checked)


def connection_check(settings: Any) -> Check:
    """The base URL and how the key travels: TLS with verified certificates, or plain http to a loopback host."""
    url = settings.base_url
    budget = f"timeout {settings.timeout:g} s, {settings.retry.max_retries} retries"
    if url.startswith("http://"):
        detail = f"{url}: plain http, which the provider allows to a loopback host only (the simulator); {budget}"
        return Check("connection", OK, detail)
    if isinstance(settings.verify, str):
        if not os.path.isfile(settings.verify):
            fix = "set the connection's extra ca_bundle to an existing file, or remove it to use the system's."
            return Check("connection", FAIL, f"{url}: the CA bundle {settings.verify} does not exist", fix)
        return Check("connection", OK, f"{url}: TLS, certificates verified against {settings.verify}; {budget}")
    return Check("connection", OK, f"{url}: TLS, certificates verified against the system's CA store; {budget}")


def service_check(checked: Any) -> Check:
    """One authenticated read: the service answers, and accepts the key."""
    key = key_hint(checked.settings.api_key)
    started = time.monotonic()
    try:
        account = checked.account()
        who = account.email or account.username or (f"user {account.user_id}" if account.user_id else "the account")
    except GpuMarketNotFoundError:  # a server that follows the spec only: the instance list says as much
        ok, message = checked.test_connection()
        if not ok:
            return Check("service", FAIL, message, "check the connection's host and key.")
        who = "a server without the account endpoint (one that follows the spec only)"
    except GpuMarketAuthError as exc:
        return Check("service", FAIL, f"the key {key} was refused: {exc}", FIX_KEY)
    except GpuMarketTransportError as exc:
        return Check("service", FAIL, f"not reachable: {exc.detail}", FIX_REACH)
    except GpuMarketError as exc:
        return Check("service", FAIL, f"answered with an error: {exc}", "try again later, or ask the service's status.")
    took = (time.monotonic() - started) * 1000
    return Check("service", OK, f"answered in {took:.0f} ms; the key {key} is accepted, for {who}")


def key_check(checked: Any) -> Check:
    """What the service says of the account's keys (it shows no key's value, nor which one is this)."""
    try:
        keys = checked.list_api_keys()
    except (GpuMarketAuthError, GpuMarketNotFoundError) as exc:
        detail = f"valid, but the service does not list the account's keys to it ({exc})"
        return Check("key", WARN, detail, "a scoped key may be limited: see the web console's API keys page.", False)
    except GpuMarketError as exc:
        return Check("key", WARN, f"valid; the keys listing failed: {exc}", None, False)
    described = ", ".join(_key_text(k) for k in keys) or "none listed"
    detail = (
        f"valid; the account's {len(keys)} active key{'' if len(keys) == 1 else 's'}: {described}. The listing "
        "hides which one this is and what each may do"
    )
    return Check("key", OK, detail)


def _key_text(key: Any) -> str:
    if not isinstance(key, dict):
        return "?"
    team = f", team {key['team_name']}" if key.get("team_name") else ""
    return f"{key.get('name') or '(no name)'} ({key.get('key_type') or 'unknown type'}{team})"


def credit_check(checked: Any) -> Check:
    """The credit left, and how long it lasts at the last days' burn (both on the service's clock)."""
    try:
        available = checked.account().available
    except GpuMarketNotFoundError:
        return Check("credit", WARN, "unknown: the service has no account endpoint", None, False)
    except GpuMarketError as exc:
        return Check("credit", WARN, f"could not be read: {exc}", None, False)
    if available is None:
        return Check("credit", WARN, "unknown: the service's account answer has no credit", None, False)
    now = checked.service_now()
    try:
        charges = checked.charges(credit.burn_window(now)[0], now)
        daily = credit.burn_per_day(charges, now)
        days = credit.runway(available, daily)
        burn = (
            credit.NO_BURN
            if daily <= 0
            else f"about {days:.1f} days at ${daily:,.2f}/day (the last {credit.BURN_DAYS} full days' charges)"
        )
        if (today := credit.charged_today(charges, now)) > 0:
            burn += f"; ${today:,.4f} charged today so far, not counted until the day is over"
    except GpuMarketError as exc:
        days, burn = float("inf"), f"runway unknown: the charges could not be read ({exc})"
    detail = f"${available:,.2f} left; {burn}"
    if available <= 0:
        return Check("credit", FAIL, detail, "add credit in the web console: the service refuses rentals at $0.")
    if days < LOW_RUNWAY_DAYS:
        return Check("credit", WARN, detail, "add credit before it runs out: jobs stop at $0.", False)
    return Check("credit", OK, detail)


def integrations_check(checked: Any) -> Check:
    """The cloud integrations by name: what ``cloud_integration=`` and the durable-data copies may name."""
    try:
        found = checked.list_cloud_integrations()
    except GpuMarketError as exc:
        return Check("integrations", WARN, f"could not be listed: {exc}", None, False)
    names = [f"{i.get('name')} ({i.get('cloud_type')}, id {i.get('id')})" for i in found if isinstance(i, dict)]
    if not names:
        fix = "add one in the web console (cloud integrations) to copy data to and from your storage."
        return Check("integrations", WARN, "none: durable data and cloud copies cannot be used", fix, False)
    return Check("integrations", OK, ", ".join(names))


def clock_check(checked: Any) -> Check:
    """The service's clock against this host's, from the Date header of its latest answer."""
    offset = checked.service_clock_offset
    if offset == 0.0:  # never measured: a measured offset is never exactly 0 (the header has whole seconds)
        return Check("clock", WARN, "unknown: the service's answers carry no Date header", None, False)
    ahead = "ahead of" if offset > 0 else "behind"
    detail = f"the service's clock is {abs(offset):.1f} s {ahead} this host's"
    if abs(offset) <= CLOCK_TOLERANCE_SECONDS:
        return Check("clock", OK, f"{detail}; costs are counted on the service's clock")
    fix = (
        "sync this host's clock (NTP): costs are counted on the service's clock, label leases on this host's. "
        "The simulator's clock runs --speed times faster, so it is expected there."
    )
    return Check("clock", WARN, detail, fix, False)


def rate_limit_check(settings: Any) -> Check:
    """What the connection's pacing allows this machine, and how much of it other processes use now."""
    scale = settings.rate_limit_scale
    if not scale:
        detail = "rate_limit_scale 0: nothing is paced"
        if settings.base_url.startswith("http://"):  # plain http is allowed to a loopback host only
            return Check("rate limits", OK, f"{detail} (fine for a server without limits)")
        fix = "remove the connection's extra rate_limit_scale (1 paces to the live service's published budgets)."
        return Check("rate limits", WARN, f"{detail}: the live service answers 429 and adds penalties", fix, False)
    spacing = ", ".join(f"a {what} every {slot_seconds(op, scale):.2f} s" for what, op in PACED)
    pacer = pacing.SharedPacer(settings.base_url, settings.api_key, "list_instances")
    shared = (
        f"shared by this machine's processes in {pacing.pacing_dir()}"
        if pacer.shared and _writable(pacing.pacing_dir())
        else "paced by each process alone"
    )
    busy = pacer.free_in()
    headroom = "the next list slot is free now" if busy <= 0 else f"the next list slot is free in {busy:.1f} s"
    detail = f"published budgets x {scale:g}: {spacing}; {shared}; {headroom}"
    if "alone" in shared:
        fix = f"make {pacing.pacing_dir()} writable, or point {pacing.PACING_DIR_ENV} at a writable folder."
        return Check("rate limits", WARN, detail, fix, False)
    return Check("rate limits", OK, detail)


def _writable(folder: Any) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK)


def versions_check() -> Check:
    """The provider's, Airflow's and Python's versions in this process."""
    from airflow import __version__ as airflow_version

    detail = (
        f"provider {__version__}, Airflow {airflow_version}, Python {platform.python_version()} (this process; "
        "every Airflow process that runs, waits for or shows GPU tasks needs the same provider version)"
    )
    return Check("versions", OK, detail)


def api_server_check(checked: Any) -> Check:
    """The api-server's provider and Airflow versions, read through the budget ledger's signed route (Airflow 3)."""
    from airflow_gpumarket._compat import is_airflow_2

    if is_airflow_2():
        return Check("api-server", OK, "Airflow 2: tasks keep the budget ledger in the metadata database", needed=False)
    from airflow_gpumarket.operators.budget import api_server_ledger

    server = api_server_ledger(checked)
    try:
        seen = server.versions(checked.gpumarket_conn_id)
    except Exception as exc:  # noqa: BLE001 - any failure is the finding
        return Check(
            "api-server",
            WARN,
            f"not reached at {server.url} ({exc}); deployed Airflow 3 tasks reach the budget ledger and host memory "
            "through it, airflow dags test does not need it",
            "install the provider on the api-server, and set [gpumarket] ledger_url when tasks reach it elsewhere",
            needed=False,
        )
    provider, airflow = seen.get("provider"), seen.get("airflow")
    detail = f"provider {provider}, Airflow {airflow} (at {server.url})"
    if provider != __version__:
        return Check(
            "api-server",
            WARN,
            f"{detail}: not this process's provider {__version__}",
            "install the same provider version on the api-server, workers, triggerers and schedulers",
            needed=False,
        )
    return Check("api-server", OK, detail, needed=False)
