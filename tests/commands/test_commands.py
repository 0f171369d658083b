"""``doctor``, ``rentals``, ``orphans`` and ``spend`` against the simulator, and their answers to bad input.

Each runs as ``python -m airflow_gpumarket`` runs it (in this process, for speed); ``test_entry_points.py`` runs them
through Airflow's own CLI and the fallback's interpreter.
"""

from __future__ import annotations

import re
import time

import pytest
from integration.conftest import alive, handed_over_run, task_states

from airflow_gpumarket import lifecycle
from airflow_gpumarket._compat import is_airflow_2

COMMANDS = ("doctor", "rentals", "orphans", "spend")


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


# --- doctor ----------------------------------------------------------------------------------------------------
def test_doctor_checks_the_connection_end_to_end_one_line_each_and_exits_0(sim, run):
    code, out, err = run("doctor")
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[0] == "GPU Market doctor: connection 'gpumarket_default'"
    checks = {line.split()[1]: line for line in lines[1:-1]}
    names = ["connection", "service", "key", "credit", "integrations", "clock", "rate", "versions", "api-server"]
    assert list(checks) == names
    assert checks["connection"].startswith("ok") and sim.url in checks["connection"]
    assert f"the key …{sim.api_key[-4:]} is accepted" in checks["service"]
    assert "default (api), ci-readonly (scoped, team ml-platform)" in checks["key"]
    assert "$100.00 left" in checks["credit"]
    assert "training-data (s3, id 1)" in checks["integrations"]
    assert "ahead of this host's" in checks["clock"]  # the simulator's clock runs 600x
    assert "a list every" in checks["rate"] and "next list slot" in checks["rate"]
    assert "provider 0.1.0, Airflow " in checks["versions"]
    assert lines[-1].startswith("9 checks: 0 failed")
    assert sim.api_key not in out + err


@pytest.fixture
def connection_in_the_database(sim):
    """The simulator's connection as a row of the metadata database (added in the UI or with `airflow connections`)."""
    import json

    from airflow.models.connection import Connection
    from airflow.utils.session import create_session

    (value,) = sim.connection_env().values()
    fields = json.loads(value)
    row = Connection(
        conn_id="gpm_in_the_database",
        conn_type="gpumarket",
        host=fields["host"],
        password=fields["password"],
        extra=json.dumps(fields.get("extra") or {}),
    )
    with create_session() as session:
        session.add(row)
    yield row.conn_id
    with create_session() as session:
        session.query(Connection).filter_by(conn_id=row.conn_id).delete()


def test_rule_a_connection_in_the_metadata_database_is_found_by_the_commands(connection_in_the_database, run):
    for argv in (("doctor",), ("rentals",), ("budgets",), ("spend",)):
        code, out, err = run(*argv, "--conn-id", connection_in_the_database)
        assert code == 0 and "is not defined" not in err, (argv, out, err)


def test_doctor_fails_on_a_wrong_key_with_its_fix_and_skips_what_needs_the_service(connection, run):
    code, out, _ = run("doctor", "--conn-id", connection("wrong_key", password="not-the-key-0000000000000000"))
    assert code == 1
    (service,) = [line for line in out.splitlines() if line.split()[1:2] == ["service"]]
    assert service.startswith("FAIL") and "the key …0000 was refused" in service and "Fix:" in service
    assert "key, credit, integrations, clock: they need the service" in out
    warnings = "1 warning" if is_airflow_2() else "2 warnings"  # no api-server runs here: Airflow 3 warns of it
    assert out.splitlines()[-1].endswith(f"1 failed, {warnings}: service")


def test_doctor_fails_on_a_service_down_with_its_fix(connection, run):
    code, out, _ = run("doctor", "--conn-id", connection("down", host="http://127.0.0.1:9"))
    assert code == 1
    (service,) = [line for line in out.splitlines() if line.split()[1:2] == ["service"]]
    assert service.startswith("FAIL  service      not reachable") and "is gpumarket-sim running?" in service
    assert "the connection could not be opened" in service and "airflow gpumarket doctor" not in service


def test_doctor_says_when_the_hosts_name_does_not_resolve(connection, run):
    code, out, _ = run("doctor", "--conn-id", connection("nowhere", host="https://no-such-host.invalid"))
    assert code == 1
    (service,) = [line for line in out.splitlines() if line.split()[1:2] == ["service"]]
    assert "the host name no-such-host.invalid did not resolve" in service and "doctor" not in service


def test_doctor_fails_when_the_credit_is_spent(sim, run):
    sim.set_credit(0)
    code, out, _ = run("doctor")
    assert code == 1
    (line,) = [line for line in out.splitlines() if line.split()[1:2] == ["credit"]]
    assert line.startswith("FAIL") and "$0.00 left" in line and "add credit in the web console" in line


def test_doctor_says_what_needs_the_api_server_when_none_answers(sim, run):
    if is_airflow_2():
        pytest.skip("Airflow 2 tasks keep the ledger in the metadata database: no api-server is asked")
    code, out, _ = run("doctor")
    (line,) = [line for line in out.splitlines() if line.split()[1:2] == ["api-server"]]
    assert "airflow dags test does not need it" in line


# --- bad input, every command -------------------------------------------------------------------------------
@pytest.mark.parametrize("command", COMMANDS)
def test_an_unknown_connection_is_one_line_and_exit_2(command, sim, run):
    code, out, err = run(command, "--conn-id", "no_such_connection")
    assert (code, out) == (2, "")
    assert one_line(err).startswith("error: connection 'no_such_connection' is not defined. Fix: add it")


@pytest.mark.parametrize("command", ("rentals", "orphans", "spend"))
def test_a_wrong_key_is_one_line_and_exit_1(command, connection, run, sim):
    code, out, err = run(command, "--conn-id", connection("wrong_key", password="not-the-key-0000000000000000"))
    assert (code, out) == (1, "")
    line = one_line(err)
    assert (
        line.startswith("error: connection 'wrong_key': ") and "Check the password of the gpumarket connection" in line
    )
    assert sim.api_key not in line


@pytest.mark.parametrize("command", ("rentals", "orphans", "spend"))
def test_a_service_down_is_one_line_and_exit_1(command, connection, run):
    code, out, err = run(command, "--conn-id", connection("down", host="http://127.0.0.1:9"))
    assert (code, out) == (1, "")
    assert "the connection could not be opened" in one_line(err) and "Fix: check the connection's host" in err


def test_rule_a_connection_that_cannot_be_read_does_not_hide_the_others_orphans(
    example_dag, sim, connection, run, monkeypatch
):
    handed_over_run(example_dag, run_still_running=False)
    down = connection("down", host="http://127.0.0.1:9")
    monkeypatch.setenv("AIRFLOW__GPUMARKET__UI_CONNECTIONS", f"gpumarket_default,{down}")
    code, out, err = run("orphans", "--destroy", "--yes")
    assert code == 1 and alive(sim) == [], out + err
    assert "warning: connection 'down': the service could not be reached" in err and "destroyed" in out
    assert "Not read: 'down'" in out


def test_an_unusable_connection_is_one_line_and_exit_2(connection, run):
    code, _, err = run("doctor", "--conn-id", connection("plain", host="http://example.com"))
    assert code == 2 and "uses plaintext http to a non-loopback host" in one_line(err)


def test_spend_takes_day_or_month_not_both(sim, run):
    code, _, err = run("spend", "--day", "--month")
    assert code == 2 and one_line(err) == "error: give --day or --month, not both."


# --- rentals and orphans --------------------------------------------------------------------------------------
def test_rentals_lists_a_live_rental_with_its_dag_run_task_and_cost(example_dag, sim, run):
    handed = handed_over_run(example_dag, run_still_running=True)
    (instance,) = alive(sim)
    code, out, err = run("rentals")
    assert code == 0, err
    header, row = out.splitlines()[:2]
    assert header.split()[:3] == ["INSTANCE", "STATUS", "GPU"] and "COST SO FAR" in header
    assert row.split()[0] == str(instance["id"]) and "gpm_ui_handover" in row and handed.run_id in row
    assert " rent " in row and ("estimate" in row or "charged" in row)
    assert "1 live rental, " in out and "orphan" not in out
    code, out, _ = run("orphans")
    assert code == 0 and out.startswith("No orphans")
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    GpuMarketHook().destroy_instance(instance["id"])


def test_rentals_leaves_out_instances_rented_by_hand_but_counts_them(sim, run):
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    hook = GpuMarketHook()
    offer = hook.search_offers({"num_gpus": {"gte": 1}})[0]
    made = hook.create_instance(offer["id"], image="img")["new_contract"]
    code, out, _ = run("rentals")
    assert code == 0 and out.splitlines()[0] == "0 live rentals, $0.0000/h together"
    assert "1 other instance(s) of the account carry no label of this provider" in out
    code, out, _ = run("orphans", "--destroy", "--yes")
    assert code == 0 and out.startswith("No orphans") and [i["id"] for i in alive(sim)] == [made]
    hook.destroy_instance(made)


def test_orphans_are_listed_with_why_and_destroyed_only_after_a_yes(example_dag, sim, run, monkeypatch):
    handed_over_run(example_dag, run_still_running=False)
    (instance,) = alive(sim)
    code, out, _ = run("orphans")
    assert code == 0 and "it was handed to its DAG run, which is success" in out
    assert out.splitlines()[-1] == "To destroy them: airflow gpumarket orphans --destroy"
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    code, out, _ = run("orphans", "--destroy")
    assert code == 1 and out.splitlines()[-1] == "Nothing destroyed." and len(alive(sim)) == 1
    asked = []
    monkeypatch.setattr("builtins.input", lambda prompt: asked.append(prompt) or "yes")
    code, out, _ = run("orphans", "--destroy")
    assert code == 0 and f"{instance['id']}: destroyed" in out and alive(sim) == []
    (prompt,) = asked
    billing = re.fullmatch(rf"Destroy 1 instance\(s\) \({instance['id']}\), billing \$([\d.]+)/h\? \[y/N\] ", prompt)
    assert billing and instance["dph_total"] < float(billing[1]) < 1.05 * instance["dph_total"]  # and its 8 GB disk
    code, out, _ = run("orphans", "--destroy", "--yes")
    assert code == 0 and out.startswith("No orphans")


def test_rule_an_orphan_destroyed_from_the_command_line_is_settled_at_what_the_service_charged(example_dag, sim, run):
    from airflow import settings
    from integration.test_gpu_rentals_page import xcoms_of

    from airflow_gpumarket import ledger
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
    from airflow_gpumarket.ui import records

    handed = handed_over_run(example_dag, run_still_running=False)
    (instance,) = alive(sim)
    hook = GpuMarketHook()
    hook.stop_instance(instance["id"])
    sim.advance(3 * 3600)  # stopped for three hours, then forgotten: its disk billed, its compute did not
    code, _, _ = run("orphans", "--destroy", "--yes")
    assert code == 0 and alive(sim) == []
    # The simulator's own time: this hook learnt the service's before the advance (a clock a user's never jumps).
    charges = [c for c in hook.charges(0, sim.now() + 60) if c.instance_id == instance["id"]]
    charged = sum(c.amount for c in charges)
    (entry,) = [e for e in ledger.entries(settings.engine, since=0) if e["instance_id"] == instance["id"]]
    # within 1 %, or the $0.0001 the ledger rounds a cost up to (over 1 % of a cost this small)
    assert charged > 0 and entry["cost"] == pytest.approx(charged, rel=0.01, abs=0.0001), (entry, charged)
    end = xcoms_of(handed, "rent")[records.end_key(instance["id"])]  # on its task's records, Airflow 2.11 too
    assert end["ended_by"] == "airflow gpumarket orphans"


def test_orphans_without_a_terminal_to_answer_destroy_nothing(example_dag, sim, run, monkeypatch):
    handed_over_run(example_dag, run_still_running=False)

    def no_terminal(prompt):
        raise EOFError

    monkeypatch.setattr("builtins.input", no_terminal)
    code, out, _ = run("orphans", "--destroy")
    assert code == 1 and "Nothing destroyed." in out and len(alive(sim)) == 1
    code, out, _ = run("orphans", "--destroy", "--yes")
    assert code == 0 and alive(sim) == []


def test_orphans_by_an_expired_lease_and_one_gone_before_the_destroy(sim, run, monkeypatch):
    """An instance gone between the listing and the confirmation is left alone: the destroy decides afresh."""
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    hook = GpuMarketHook()
    first, second = (o["id"] for o in hook.search_offers({"num_gpus": {"gte": 1}})[:2])
    label = lifecycle.make_label(lifecycle.rental_key("gone_dag", "run", "task", -1), time.time() - 60)
    leased = [hook.create_instance(offer, image="img", label=label)["new_contract"] for offer in (first, second)]
    code, out, _ = run("orphans")
    assert code == 0 and out.count("its lease expired at") == 2

    def destroy_one_then_yes(prompt):
        hook.destroy_instance(leased[0])
        return "y"

    monkeypatch.setattr("builtins.input", destroy_one_then_yes)
    code, out, _ = run("orphans", "--destroy")
    assert code == 0 and alive(sim) == []
    assert f"{leased[0]}: no longer an orphan (or gone): left alone" in out and f"{leased[1]}: destroyed" in out


# --- spend --------------------------------------------------------------------------------------------------
def test_spend_reports_the_days_charges_per_dag_and_what_no_task_recorded(example_dag, sim, run):
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    run_ = example_dag("gpm_ui_job").test()
    assert run_.state == "success", task_states(run_)
    hook = GpuMarketHook()
    by_hand = hook.create_instance(hook.search_offers({"num_gpus": {"gte": 1}})[0]["id"], image="img")
    sim.advance(600)
    hook.destroy_instance(by_hand["new_contract"])
    code, out, err = run("spend")
    assert code == 0, err
    assert out.startswith("GPU Market spend from ") and " 00:00 UTC to " in out.splitlines()[0]
    assert f"instance {by_hand['new_contract']}" in out and "Leaked-looking" in out
    assert "These are the service's charges (actual, not estimates)" in out
    code, month, _ = run("spend", "--month")
    assert code == 0 and "-01 00:00 UTC to " in month.splitlines()[0]


def test_spend_says_whose_day_it_reports_when_the_services_clock_is_not_this_hosts(sim, run):
    sim.set_speed(0)  # frozen (the next test's reset restores it): only advance moves it
    code, out, _ = run("spend")
    assert code == 0 and "clock reads" not in out  # the two clocks agree: nothing to say
    sim.advance(30 * 3600)  # the simulator's clock, ahead by more than a day
    code, out, _ = run("spend")
    assert code == 0, out
    (line,) = [line for line in out.splitlines() if line.startswith("The service's clock reads")]
    assert " h ahead of this host's: the day above is the service's" in line


def test_spend_on_a_service_without_charges_says_so_in_one_line(sim, run, monkeypatch):
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    def no_charges(self, start, end, **kwargs):
        from airflow_gpumarket.exceptions import GpuMarketNotFoundError

        raise GpuMarketNotFoundError("charges: this service has no GET /api/v0/charges/ (HTTP 404).")

    monkeypatch.setattr(GpuMarketHook, "charges", no_charges)
    code, out, err = run("spend")
    assert (code, out) == (1, "") and "the service has no charges endpoint" in one_line(err)


# --- hosts ----------------------------------------------------------------------------------------------------
def test_hosts_lists_the_avoided_machines_and_forgets_them_by_hand(sim, run, host_memory_of_this_test_alone):
    from types import SimpleNamespace

    hook = SimpleNamespace(settings=SimpleNamespace(api_key=sim.api_key))
    hosts = host_memory_of_this_test_alone(hook, "gpumarket_default")  # as the command reaches it
    hosts.remember(11, "preflight", "expected 1 GPUs, listed 0")
    hosts.remember(12, "offline")
    code, out, err = run("hosts")
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split()[:3] == ["MACHINE", "REASON", "FAILURES"] and [r.split()[:2] for r in rows] == [
        ["11", "preflight"],
        ["12", "offline"],
    ]
    assert run("hosts", "--clear", "11")[1].startswith("Forgot 1 machine:")
    assert run("hosts", "--clear-all")[1].startswith("Forgot 1 machine:")
    assert run("hosts")[1].startswith("No machine is avoided")
    code, _, err = run("hosts", "--clear", "11", "--clear-all")
    assert code == 2 and "not both" in err


# --- after the bad-input tests: on Airflow 2.11 a dag.test() leaves log handlers on a closed capture ---
def test_doctor_counts_todays_charges_apart_from_the_burn_of_the_full_days_before(example_dag, sim, run):
    done = example_dag("gpm_ui_job").test()
    assert done.state == "success", task_states(done)
    code, out, _ = run("doctor")
    (line,) = [line for line in out.splitlines() if line.split()[1:2] == ["credit"]]
    assert "nothing charged in the 7 full UTC days before today" in line
    assert re.search(r"\$0\.\d{4} charged today so far, not counted until the day is over", line), line


def test_a_stopped_rental_is_shown_billing_its_disk_alone_not_its_compute_rate(example_dag, sim, run):
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
    from airflow_gpumarket.ui import sources

    handed_over_run(example_dag, run_still_running=True)
    (instance,) = alive(sim)
    code, out, _ = run("rentals")
    (running,) = [line for line in out.splitlines() if line.startswith(str(instance["id"]))]
    hook = GpuMarketHook()
    hook.stop_instance(instance["id"])
    sim.advance(3600)  # an hour stopped: its disk bills, its compute does not
    code, out, err = run("rentals")
    assert code == 0, err
    (stopped,) = [line for line in out.splitlines() if line.startswith(str(instance["id"]))]
    gathered = sources.gather(0, time.time(), ["gpumarket_default"])
    (row,) = [r for r in gathered.live if r.instance_id == instance["id"]]
    assert row.status == "stopped" and row.billing_now is not None and row.billing_now < row.hourly_price
    assert f"{row.billing_now:.4f} disk" in stopped and f"{row.hourly_price:.4f}" not in stopped
    assert f"${row.billing_now:.4f}/h together" in out
    assert re.search(r"\$\d+\.\d{4} charged", stopped)  # the service's charges: no compute while it stopped
    assert running != stopped
    hook.destroy_instance(instance["id"])
