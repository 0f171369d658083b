"""The official CLI ``vastai==1.9.1``, unmodified, against ``gpumarket-sim --profile live``.

The live profile claims to behave like the live service. The official CLI is the strictest client of the live
service there is, so it is the judge: every test runs real ``vastai`` commands and then checks the outcome on the
simulator's admin surface, not only the CLI's exit status (the CLI exits 0 on HTTP errors: it prints
``Failed with error <status>: <msg>`` on stderr, or ``{"error": true, ...}`` with ``--raw``).

What vastai 1.9.1 sends (captured on the wire) and which response fields it reads:

- every invocation, at import: ``GET $VAST_URL/api/v0/gpu_names/unique/`` without a key (``--url`` is ignored for
  it; reads ``gpu_names``); the first command of a fresh HOME: ``GET /api/v0/users/current`` (a JSON object).
- ``search offers [-o F]``: ``POST /api/v0/bundles/`` with ``{"verified": {"eq": true}, "external": {"eq": false},
  "rentable": {"eq": true}, "order": [["score", "desc"]], "type": "on-demand", "allocated_storage": 5.0}``
  (``-o dph_total``: ``[["dph_total", "asc"]]``); reads ``offers``; Content-Type must be exactly
  ``application/json``.
- ``create instance ID --image I --disk D``: ``PUT /api/v0/asks/ID/`` with ``client_id: "me"``, a float
  ``disk``, explicit nulls, ``runtype: "ssh"``, env ``{"K": "V", "-p N:N": "1"}``; prints the answer.
- ``show instances --raw``: ``GET /api/v1/instances/?select_filters={}&order_by=[{"col": "id", "dir": "asc"}]
  &limit=25``, following ``next_token``; reads ``instances`` and, per row, ``start_date`` (a number) and
  ``extra_env`` (a list of [name, value] pairs): a missing or null one crashes the CLI. The table form adds
  ``select_cols`` and first calls ``GET /api/v0/instances/filters/``.
- ``show instance ID``: ``GET /api/v0/instances/ID/?owner=me``; reads ``instances``, then ``start_date`` and
  ``extra_env`` as above.
- ``label instance ID L``: ``PUT /api/v0/instances/ID/`` ``{"label": L}``; ``stop instance ID``: the same path with
  ``{"state": "stopped"}``; ``destroy instance ID``: asks ``[y/N]`` on stdin unless ``-y``, then
  ``DELETE /api/v0/instances/ID/`` with body ``{}``; all three read ``success`` (and ``msg``).
- ``show api-keys``: ``GET /api/v0/auth/apikeys/``; ``show connections``: ``GET /api/v0/users/cloud_integrations/``
  (a bare list); ``show pending-price-increases``: ``GET /api/v0/instances/pending-price-increases/`` (an object
  with ``pending_price_increases``).
- ``copy SRC:PATH DST:PATH`` (``SRC`` a number or ``C.<id>``): ``PUT /api/v0/commands/copy_direct/`` with
  ``{"client_id": "me", "src_id": "123" or "C.123", "dst_id": ..., "src_path", "dst_path"}`` (ids as strings);
  reads ``success`` and ``msg``. ``local:`` or a path without an id goes to ``PUT /api/v0/commands/rsync/``
  (not simulated).
- ``cloud copy --src S --dst D --instance I --connection C --transfer T``: ``POST /api/v0/commands/rclone/`` with
  ``{"src", "dst", "instance_id": "I", "selected": "C", "transfer": T, "flags": []}`` (strings; ``--transfer``
  defaults to ``"Instance to Cloud"``); only checks that the answer is truthy.
- ``cancel copy DST``: ``DELETE /api/v0/commands/copy_direct/``; ``cancel sync DST``: ``DELETE
  /api/v0/commands/rclone/``; both with ``{"client_id": "me", "dst_id": "DST"}``, reading ``success``/``msg``.
- ``show invoices-v1 --charges`` (``--invoices``): ``GET /api/v0/charges/`` (``GET /api/v1/invoices/``) with
  ``select_filters={"day" ("when"): {"gte": S, "lte": E}}`` (``-s``/``-e``, else the 7 days before the *real*
  clock), ``-ct T...`` adding ``"type": {"in": [...]}`` (``-it`` a ``service`` filter), ``latest_first``, ``limit``
  (at most 100; default 20), ``after_token``, for charges ``format``; reads ``results``, ``count``, ``total`` and
  ``next_token`` (the table form then asks on stdin for the next page; ``--raw`` prints one page). Every item and
  every nested one in ``items`` needs ``start``, ``end``, ``amount``, ``type``, ``source`` (a charge's is split on
  "-": ``instance-ID``), ``metadata`` and ``items``; an invoice's ``metadata`` needs ``invoice_id``; a zero amount
  is left out; an invoice's amount is shown negated (a credit put in is sent negative).
- ``show user``: ``GET /api/v0/users/current``; drops ``api_key``, prints ``credit`` as ``{:0.2f}``.

The full catalogue (query strings, bodies, retries on 429/502/503/504, error handling, exit statuses) was handed
to the simulator; this module keeps the summary above next to the checks that depend on it.
"""

from __future__ import annotations

import time
from typing import Any

from .conftest import Cli, CliResult, LiveSim

IMAGE = "ubuntu:22.04"
STOPPED = ("stopped", "exited")


# --- checks shared by every test --------------------------------------------------------------------------------
def assert_succeeded(result: CliResult, *, sends_requests: bool = True) -> None:
    """Exit 0, no traceback, no CLI error line, and every request the simulator logged was answered below 400."""
    assert result.returncode == 0, result.describe()
    assert "Traceback" not in result.stderr, result.describe()
    assert "Failed with error" not in result.stderr, result.describe()
    assert '"error": true' not in result.stderr, result.describe()
    failed = [r for r in result.requests if r["status"] >= 400 or r.get("dropped")]
    assert not failed, f"the simulator answered with errors\n{result.describe()}"
    if sends_requests:
        assert result.requests, f"the simulator logged no request\n{result.describe()}"


def assert_sent(result: CliResult, method: str, path: str) -> None:
    assert (method, path) in [(m, p) for m, p, _ in result.sent()], f"no {method} {path}\n{result.describe()}"


def assert_simulator_healthy(sim: LiveSim) -> None:
    state = sim.state()
    assert state["internal_errors"] == 0, f"the simulator logged internal errors:\n{sim.stderr_text()}"
    assert "Traceback" not in sim.stderr_text(), sim.stderr_text()


def offers_by_id(sim: LiveSim) -> dict[int, dict[str, Any]]:
    return {offer["id"]: offer for offer in sim.state()["offers"]}


def free_offer_id(sim: LiveSim) -> int:
    """A rentable, not yet rented offer whose instances boot normally, the cheapest first."""
    candidates = [
        offer
        for offer in sim.state()["offers"]
        if offer["rentable"] and offer["rented_by"] is None and offer["fate"] == "running"
    ]
    assert candidates, "the simulator's world has no free offer"
    return min(candidates, key=lambda offer: (offer["dph_total"], offer["id"]))["id"]


def rent(cli: Cli, sim: LiveSim, *extra: str) -> int:
    """``vastai create instance`` on the cheapest free offer; returns the new instance id once it runs."""
    offer_id = free_offer_id(sim)
    result = cli("create", "instance", str(offer_id), "--image", IMAGE, "--disk", "20", *extra, "--raw")
    assert_succeeded(result)
    assert_sent(result, "PUT", f"/api/v0/asks/{offer_id}/")
    answer = result.json()
    assert answer.get("success") is True, result.describe()
    assert isinstance(answer.get("new_contract"), int), result.describe()
    sim.wait_for_status(answer["new_contract"], "running")
    return answer["new_contract"]


# --- global behaviour -------------------------------------------------------------------------------------------
def test_official_cli_checks_the_current_user_once_per_home_and_fetches_gpu_names(cli: Cli, live_sim: LiveSim):
    first = cli("show", "connections", "--raw")
    assert_succeeded(first)
    assert ("GET", "/api/v0/gpu_names/unique/", 200) in first.sent(), first.describe()
    account_calls = [(r["method"], r["path"], r["status"]) for r in first.requests if r["key"] == "account"]
    assert account_calls[0] == ("GET", "/api/v0/users/current", 200), first.describe()
    # The CLI caches what it learnt under the throw-away HOME (never the user's): no second current-user call.
    assert (cli.config_dir / "vastai" / "vast_role").read_text() in ("client", "host")
    second = cli("show", "connections", "--raw")
    assert_succeeded(second)
    assert ("GET", "/api/v0/users/current") not in [(m, p) for m, p, _ in second.sent()], second.describe()
    assert_simulator_healthy(live_sim)


def test_official_cli_uses_the_api_key_saved_by_set_api_key(cli: Cli, live_sim: LiveSim):
    saved = cli("set", "api-key", live_sim.api_key, with_key=False)
    assert_succeeded(saved, sends_requests=False)
    assert (cli.config_dir / "vastai" / "vast_api_key").read_text() == live_sim.api_key
    result = cli("show", "connections", "--raw", with_key=False)
    assert_succeeded(result)
    assert_sent(result, "GET", "/api/v0/users/cloud_integrations/")
    assert {r["key"] for r in result.requests if r["path"] != "/api/v0/gpu_names/unique/"} == {"account"}
    assert_simulator_healthy(live_sim)


# --- search offers ----------------------------------------------------------------------------------------------
def test_official_cli_search_offers_default_query_lists_offers(cli: Cli, live_sim: LiveSim):
    result = cli("search", "offers", "--raw")
    assert_succeeded(result)
    assert_sent(result, "POST", "/api/v0/bundles/")
    offers = result.json()
    assert isinstance(offers, list) and offers, result.describe()
    world = offers_by_id(live_sim)
    # The default query is verified=true rentable=true external=false: every such offer, no other.
    expected = {
        oid
        for oid, offer in world.items()
        if offer["verified"] and offer["rentable"] and not offer.get("external", False)
    }
    assert {offer["id"] for offer in offers} == expected
    for offer in offers:
        assert offer["dph_total"] == world[offer["id"]]["dph_total"]
        assert offer["gpu_name"] == world[offer["id"]]["gpu_name"]
    assert_simulator_healthy(live_sim)


def test_official_cli_search_offers_table_shows_every_offer_id(cli: Cli, live_sim: LiveSim):
    result = cli("search", "offers")
    assert_succeeded(result)
    world = offers_by_id(live_sim)
    for oid, offer in world.items():
        if offer["verified"] and offer["rentable"] and not offer.get("external", False):
            assert str(oid) in result.stdout, result.describe()
    assert "invalid return Content-Type" not in result.stdout, result.describe()
    assert_simulator_healthy(live_sim)


def test_official_cli_search_offers_ordered_by_dph_total_lists_cheapest_first(cli: Cli, live_sim: LiveSim):
    ascending = cli("search", "offers", "-o", "dph_total", "--raw")
    assert_succeeded(ascending)
    prices = [offer["dph_total"] for offer in ascending.json()]
    assert prices and prices == sorted(prices), ascending.describe()

    descending = cli("search", "offers", "-o", "dph_total-", "--raw")
    assert_succeeded(descending)
    prices_desc = [offer["dph_total"] for offer in descending.json()]
    assert prices_desc == sorted(prices, reverse=True), descending.describe()
    assert {o["id"] for o in descending.json()} == {o["id"] for o in ascending.json()}
    assert_simulator_healthy(live_sim)


# --- create instance --------------------------------------------------------------------------------------------
def test_official_cli_create_instance_rents_an_offer_from_the_search(cli: Cli, live_sim: LiveSim):
    search = cli("search", "offers", "-o", "dph_total", "--raw")
    assert_succeeded(search)
    world = offers_by_id(live_sim)
    offer_id = next(o["id"] for o in search.json() if world[o["id"]]["fate"] == "running")

    result = cli("create", "instance", str(offer_id), "--image", IMAGE, "--disk", "20", "--raw")
    assert_succeeded(result)
    assert_sent(result, "PUT", f"/api/v0/asks/{offer_id}/")
    answer = result.json()
    assert answer.get("success") is True, result.describe()
    instance_id = answer["new_contract"]

    instance = live_sim.instance(instance_id)
    assert instance["offer_id"] == offer_id
    assert instance["image"] == IMAGE
    assert instance["disk_space"] == 20
    assert not instance["destroyed"]
    assert offers_by_id(live_sim)[offer_id]["rented_by"] == instance_id
    assert live_sim.alive_ids() == [instance_id]
    live_sim.wait_for_status(instance_id, "running")
    assert_simulator_healthy(live_sim)


def test_official_cli_create_instance_passes_onstart_env_and_label(cli: Cli, live_sim: LiveSim):
    instance_id = rent(
        cli,
        live_sim,
        "--onstart-cmd",
        "echo hello from the cli",
        "--env",
        "-e FOO=bar -p 8080:8080",
        "--label",
        "made-by-cli",
    )
    instance = live_sim.instance(instance_id)
    assert instance["label"] == "made-by-cli"
    assert instance["onstart"] == "echo hello from the cli"
    assert instance["env"]["FOO"] == "bar"
    assert_simulator_healthy(live_sim)


# --- show instances / show instance -----------------------------------------------------------------------------
def test_official_cli_show_instances_raw_lists_the_instance(cli: Cli, live_sim: LiveSim):
    instance_id = rent(cli, live_sim, "--env", "-e FOO=bar", "--label", "listed")
    result = cli("show", "instances", "--raw")
    assert_succeeded(result)
    assert_sent(result, "GET", "/api/v1/instances/")
    rows = result.json()
    assert [row["id"] for row in rows] == [instance_id], result.describe()
    row = rows[0]
    assert row["actual_status"] == "running"
    assert row["label"] == "listed"
    assert row["extra_env"].get("FOO") == "bar"  # the CLI turns the [[name, value], ...] pairs into an object
    assert isinstance(row["start_date"], int | float)
    assert_simulator_healthy(live_sim)


def test_official_cli_show_instances_table_lists_the_instance(cli: Cli, live_sim: LiveSim):
    instance_id = rent(cli, live_sim)
    result = cli("show", "instances", "--no-color")
    assert_succeeded(result)
    assert_sent(result, "GET", "/api/v0/instances/filters/")
    assert_sent(result, "GET", "/api/v1/instances/")
    assert str(instance_id) in result.stdout, result.describe()
    assert "running" in result.stdout, result.describe()
    assert "Total: 1 instances" in result.stdout, result.describe()
    assert_simulator_healthy(live_sim)


def test_official_cli_show_instance_reads_one_instance(cli: Cli, live_sim: LiveSim):
    instance_id = rent(cli, live_sim, "--env", "-e FOO=bar", "--label", "single")
    raw = cli("show", "instance", str(instance_id), "--raw")
    assert_succeeded(raw)
    assert_sent(raw, "GET", f"/api/v0/instances/{instance_id}/")
    row = raw.json()
    assert row["id"] == instance_id, raw.describe()
    assert row["actual_status"] == "running"
    assert row["label"] == "single"
    assert row["extra_env"].get("FOO") == "bar"

    table = cli("show", "instance", str(instance_id))
    assert_succeeded(table)
    assert str(instance_id) in table.stdout and "running" in table.stdout, table.describe()
    assert_simulator_healthy(live_sim)


def test_official_cli_logs_requests_and_prints_the_uploaded_log(cli: Cli, live_sim: LiveSim):
    instance_id = rent(cli, live_sim)
    result = cli("logs", str(instance_id), "--tail", "5")
    assert_succeeded(result)
    assert_sent(result, "PUT", f"/api/v0/instances/request_logs/{instance_id}/")
    assert "container started from image" in result.stdout, result.describe()
    fetches = [r for r in live_sim.request_log() if r["op"] == "fetch_log_upload"]
    assert fetches and all(r["key"] == "none" for r in fetches)  # the storage URL never sees a key

    daemon = cli("logs", str(instance_id), "--daemon-logs")
    assert_succeeded(daemon)
    assert f"instance {instance_id} created" in daemon.stdout, daemon.describe()
    assert_simulator_healthy(live_sim)


# --- bids ------------------------------------------------------------------------------------------------------
def test_official_cli_create_instance_with_bid_price_rents_an_interruptible_instance(cli: Cli, live_sim: LiveSim):
    instance_id = rent(cli, live_sim, "--bid_price", "5.0")
    instance = live_sim.instance(instance_id)
    assert instance["bid_price"] == 5.0 and instance["is_bid"] is True
    assert_simulator_healthy(live_sim)


def test_official_cli_change_bid_changes_the_bid_of_an_interruptible_instance(cli: Cli, live_sim: LiveSim):
    instance_id = rent(cli, live_sim, "--bid_price", "5.0")
    result = cli("change", "bid", str(instance_id), "--price", "6.5")
    assert_succeeded(result)
    assert_sent(result, "PUT", f"/api/v0/instances/bid_price/{instance_id}/")
    assert "bid price changed" in result.stdout, result.describe()
    assert live_sim.instance(instance_id)["bid_price"] == 6.5
    assert_simulator_healthy(live_sim)


def test_official_cli_change_bid_of_an_on_demand_instance_fails(cli: Cli, live_sim: LiveSim):
    instance_id = rent(cli, live_sim)
    result = cli("change", "bid", str(instance_id), "--price", "6.5")
    # The client prints the service's error and exits 0.
    assert "Failed with error 400: Can't change price of on-demand contract." in result.stderr, result.describe()
    assert live_sim.instance(instance_id)["bid_price"] is None
    assert_simulator_healthy(live_sim)


# --- label / stop / destroy -------------------------------------------------------------------------------------
def test_official_cli_label_instance_changes_the_label(cli: Cli, live_sim: LiveSim):
    instance_id = rent(cli, live_sim)
    result = cli("label", "instance", str(instance_id), "relabelled-by-cli")
    assert_succeeded(result)
    assert_sent(result, "PUT", f"/api/v0/instances/{instance_id}/")
    assert f"label for {instance_id} set to relabelled-by-cli." in result.stdout, result.describe()
    assert live_sim.instance(instance_id)["label"] == "relabelled-by-cli"
    assert live_sim.instance(instance_id)["actual_status"] == "running"  # a label is not a state change

    shown = cli("show", "instance", str(instance_id), "--raw")
    assert_succeeded(shown)
    assert shown.json()["label"] == "relabelled-by-cli"
    assert_simulator_healthy(live_sim)


def test_official_cli_stop_instance_stops_it(cli: Cli, live_sim: LiveSim):
    instance_id = rent(cli, live_sim)
    result = cli("stop", "instance", str(instance_id))
    assert_succeeded(result)
    assert_sent(result, "PUT", f"/api/v0/instances/{instance_id}/")
    assert f"stopping instance {instance_id}." in result.stdout, result.describe()
    # The live service reports a stopped container as "exited" (intended "stopped"); the spec says "stopped".
    instance = live_sim.wait_for_status(instance_id, *STOPPED)
    assert instance["intended_status"] == "stopped"
    assert live_sim.alive_ids() == [instance_id]  # stopped, not destroyed

    shown = cli("show", "instance", str(instance_id), "--raw")
    assert_succeeded(shown)
    assert shown.json()["actual_status"] in STOPPED, shown.describe()
    assert shown.json()["intended_status"] == "stopped", shown.describe()
    assert_simulator_healthy(live_sim)


def test_official_cli_destroy_instance_with_yes_destroys_it(cli: Cli, live_sim: LiveSim):
    instance_id = rent(cli, live_sim)
    result = cli("destroy", "instance", str(instance_id), "-y")
    assert_succeeded(result)
    assert_sent(result, "DELETE", f"/api/v0/instances/{instance_id}/")
    assert f"destroying instance {instance_id}." in result.stdout, result.describe()
    assert live_sim.alive_ids() == []
    assert live_sim.instance(instance_id)["destroyed"]

    listed = cli("show", "instances", "--raw")
    assert_succeeded(listed)
    assert listed.json() == []
    assert_simulator_healthy(live_sim)


def test_official_cli_destroy_instance_prompt_aborts_on_no_and_destroys_on_yes(cli: Cli, live_sim: LiveSim):
    instance_id = rent(cli, live_sim)
    refused = cli("destroy", "instance", str(instance_id), stdin="n\n")
    assert_succeeded(refused, sends_requests=False)
    assert "Aborted." in refused.stdout, refused.describe()
    assert ("DELETE", f"/api/v0/instances/{instance_id}/") not in [(m, p) for m, p, _ in refused.sent()]
    assert live_sim.alive_ids() == [instance_id]

    confirmed = cli("destroy", "instance", str(instance_id), stdin="y\n")
    assert_succeeded(confirmed)
    assert_sent(confirmed, "DELETE", f"/api/v0/instances/{instance_id}/")
    assert live_sim.alive_ids() == []
    assert_simulator_healthy(live_sim)


# --- account listings -------------------------------------------------------------------------------------------
def test_official_cli_show_api_keys_lists_the_account_keys(cli: Cli, live_sim: LiveSim):
    raw = cli("show", "api-keys", "--raw")
    assert_succeeded(raw)
    assert_sent(raw, "GET", "/api/v0/auth/apikeys/")
    envelope = raw.json()
    assert isinstance(envelope, dict) and isinstance(envelope.get("apikeys"), list), raw.describe()
    names = {key["name"] for key in live_sim.state()["api_keys"]}
    assert names and {key["name"] for key in envelope["apikeys"]} == names

    printed = cli("show", "api-keys")
    assert_succeeded(printed)
    for name in names:
        assert name in printed.stdout, printed.describe()
    assert_simulator_healthy(live_sim)


def test_official_cli_show_connections_lists_cloud_integrations(cli: Cli, live_sim: LiveSim):
    raw = cli("show", "connections", "--raw")
    assert_succeeded(raw)
    assert_sent(raw, "GET", "/api/v0/users/cloud_integrations/")
    rows = raw.json()
    assert isinstance(rows, list), raw.describe()
    expected = {(c["id"], c["name"], c["cloud_type"]) for c in live_sim.state()["cloud_integrations"]}
    assert expected and {(r["id"], r["name"], r["cloud_type"]) for r in rows} == expected

    table = cli("show", "connections")
    assert_succeeded(table)
    for _, name, cloud_type in expected:
        assert name in table.stdout and cloud_type in table.stdout, table.describe()
    assert_simulator_healthy(live_sim)


def test_official_cli_show_pending_price_increases_lists_them(cli: Cli, live_sim: LiveSim):
    raw = cli("show", "pending-price-increases", "--raw")
    assert_succeeded(raw)
    assert_sent(raw, "GET", "/api/v0/instances/pending-price-increases/")
    envelope = raw.json()
    assert isinstance(envelope, dict), raw.describe()
    pending = live_sim.state()["pending_price_increases"]
    expected = {(p["pending_price_increase_id"], p["contract_id"]) for p in pending}
    listed = {(p["pending_price_increase_id"], p["contract_id"]) for p in envelope["pending_price_increases"]}
    assert expected and listed == expected

    table = cli("show", "pending-price-increases")
    assert_succeeded(table)
    assert "No pending price increases." not in table.stdout, table.describe()
    for _, contract_id in expected:
        assert str(contract_id) in table.stdout, table.describe()
    assert_simulator_healthy(live_sim)


# --- copies (issue 35) ------------------------------------------------------------------------------------------
COPY_DEADLINE_SECONDS = 20.0


def put_file(sim: LiveSim, where: str, ident: int, path: str, data: bytes) -> None:
    response = sim.session.put(f"{sim.url}/_sim/{where}/{ident}/files/{path}", data=data, timeout=10)
    assert response.status_code == 200, response.text


def wait_for_copies(sim: LiveSim, *states: str) -> list[dict[str, Any]]:
    """Poll ``GET /_sim/copies`` until every copy is in one of ``states``."""
    deadline = time.monotonic() + COPY_DEADLINE_SECONDS
    while True:
        copies = sim.admin("GET", "/copies")["copies"]
        if copies and all(c["state"] in states for c in copies):
            return copies
        assert time.monotonic() < deadline, f"copies not {states} after {COPY_DEADLINE_SECONDS} s: {copies}"
        time.sleep(0.05)


def empty_bucket(sim: LiveSim) -> int:
    """A cloud integration whose bucket begins empty (the default world's first one holds a sample dataset)."""
    return next(c["id"] for c in sim.state()["cloud_integrations"] if not files_of(sim, "buckets", c["id"]))


def files_of(sim: LiveSim, where: str, ident: int) -> dict[str, int]:
    return {f["path"]: f["size"] for f in sim.admin("GET", f"/{where}/{ident}")["files"]}


def test_official_cli_copy_between_instances_arrives_on_the_destination_disk(cli: Cli, live_sim: LiveSim):
    src, dst = rent(cli, live_sim), rent(cli, live_sim)
    put_file(live_sim, "disks", src, "workspace/out/model.pt", b"weights")
    result = cli("copy", f"{src}:/workspace/out/", f"C.{dst}:/workspace/in/")
    assert_succeeded(result)
    assert_sent(result, "PUT", "/api/v0/commands/copy_direct/")
    assert "Remote to Remote copy initiated" in result.stdout, result.describe()
    wait_for_copies(live_sim, "finished")
    assert files_of(live_sim, "disks", dst) == {"workspace/in/model.pt": 7}
    assert_simulator_healthy(live_sim)


def test_official_cli_cloud_copy_to_and_from_the_bucket(cli: Cli, live_sim: LiveSim):
    instance_id = rent(cli, live_sim)
    connection = empty_bucket(live_sim)
    put_file(live_sim, "disks", instance_id, "ckpt/step-1.bin", b"12345")
    args = ("--instance", str(instance_id), "--connection", str(connection))
    up = cli("cloud", "copy", "--src", "/ckpt", "--dst", "runs/r1", *args, "--transfer", "Instance To Cloud")
    assert_succeeded(up)
    assert_sent(up, "POST", "/api/v0/commands/rclone/")
    wait_for_copies(live_sim, "finished")
    assert files_of(live_sim, "buckets", connection) == {"runs/r1/step-1.bin": 5}
    down = cli("cloud", "copy", "--src", "runs/r1", "--dst", "/restore", *args, "--transfer", "Cloud To Instance")
    assert_succeeded(down)
    wait_for_copies(live_sim, "finished")
    assert files_of(live_sim, "disks", instance_id)["restore/step-1.bin"] == 5
    deadline = time.monotonic() + COPY_DEADLINE_SECONDS  # the status bar is ~30 simulated seconds late
    while live_sim.instance(instance_id)["status_msg"] != "Cloud Copy Operation Finished":
        assert time.monotonic() < deadline, live_sim.instance(instance_id)["status_msg"]
        time.sleep(0.05)
    assert_simulator_healthy(live_sim)


def test_official_cli_cancel_copy_and_cancel_sync_cancel_running_copies(cli: Cli, live_sim: LiveSim):
    src, dst = rent(cli, live_sim), rent(cli, live_sim)
    live_sim.admin("PUT", "/copy-settings", {"bytes_per_second": 0.05})  # 1 KB takes ~33 s at 600x
    put_file(live_sim, "disks", src, "big.bin", b"x" * 1000)
    assert_succeeded(cli("copy", f"{src}:/big.bin", f"{dst}:/big.bin"))
    connection = empty_bucket(live_sim)
    cloud = cli(
        "cloud", "copy", "--src", "/big.bin", "--dst", "big.bin", "--instance", str(src), "--connection",
        str(connection), "--transfer", "Instance To Cloud",
    )  # fmt: skip
    assert_succeeded(cloud)
    cancel_copy = cli("cancel", "copy", str(dst))
    assert_succeeded(cancel_copy)
    assert_sent(cancel_copy, "DELETE", "/api/v0/commands/copy_direct/")
    cancel_sync = cli("cancel", "sync", str(src))
    assert_succeeded(cancel_sync)
    assert_sent(cancel_sync, "DELETE", "/api/v0/commands/rclone/")
    copies = wait_for_copies(live_sim, "cancelled")
    assert [c["kind"] for c in copies] == ["copy_direct", "rclone"]
    assert files_of(live_sim, "disks", dst) == {} and files_of(live_sim, "buckets", connection) == {}
    assert_simulator_healthy(live_sim)


# --- billing: charges, invoices, the current user ---------------------------------------------------------------
DAY = 86_400


def hold_still(sim: LiveSim) -> tuple[str, str]:
    """Freeze the clock and turn the rate limits off, so figures hold between calls; ``-s``/``-e`` of every day so far.

    The CLI's own default window ends at the real clock, which the simulated one (600x) runs ahead of.
    """
    sim.admin("PUT", "/rate-limits", {"enabled": False})
    now = sim.admin("PUT", "/speed", {"speed": 0})["now"]
    first_day = int(sim.state()["start_time"]) // DAY * DAY
    return str(first_day), str(int(now) + 1)


def test_official_cli_show_invoices_v1_charges_shows_each_instance_day_of_the_ledger(cli: Cli, live_sim: LiveSim):
    instance_id = rent(cli, live_sim)
    start, end = hold_still(live_sim)
    days = live_sim.instance(instance_id)["ledger_days"]
    raw = cli("show", "invoices-v1", "--charges", "-s", start, "-e", end, "--raw")
    assert_succeeded(raw)
    assert_sent(raw, "GET", "/api/v0/charges/")
    answer = raw.json()
    assert answer["count"] == answer["total"] == len(days) and answer["next_token"] is None, raw.describe()
    listed = [(c["source"], c["day"], c["amount"]) for c in answer["results"]]
    assert listed == [(f"instance-{instance_id}", d["day"], d["cost"]) for d in days], raw.describe()
    assert [i["type"] for i in answer["results"][0]["items"]] == ["gpu", "storage", "bandwidth"]

    table = cli("show", "invoices-v1", "--charges", "-s", start, "-e", end, "--no-color")
    assert_succeeded(table)
    assert "Instance" in table.stdout and str(instance_id) in table.stdout, table.describe()
    for day in days:
        assert f"${day['cost']:.3f}" in table.stdout, table.describe()
    assert f"Showing {len(days)} of {len(days)} results" in table.stdout, table.describe()

    typed = cli("show", "invoices-v1", "--charges", "-ct", "instance", "-s", start, "-e", end, "--raw")
    assert_succeeded(typed)
    assert typed.json()["results"] == answer["results"], typed.describe()
    tree = cli("show", "invoices-v1", "--charges", "-ct", "i", "-s", start, "-e", end, "-f", "tree", "--verbose")
    assert_succeeded(tree)
    assert "gpu" in tree.stdout and "storage" in tree.stdout, tree.describe()
    assert_simulator_healthy(live_sim)


def test_official_cli_show_invoices_v1_invoices_shows_the_credit_put_in(cli: Cli, live_sim: LiveSim):
    start, end = hold_still(live_sim)
    live_sim.admin("POST", "/account", {"top_up": 25})
    raw = cli("show", "invoices-v1", "--invoices", "-s", start, "-e", end, "--raw")
    assert_succeeded(raw)
    assert_sent(raw, "GET", "/api/v1/invoices/")
    results = raw.json()["results"]
    assert [(i["type"], i["amount"], i["metadata"]["invoice_id"]) for i in results] == [
        ("credit", -100.0, 1),
        ("credit", -25.0, 2),
    ], raw.describe()

    table = cli("show", "invoices-v1", "--invoices", "-s", start, "-e", end, "--no-color")
    assert_succeeded(table)
    for shown in ("$100.00", "$25.00", "Credit", "Signup", "Admin"):
        assert shown in table.stdout, table.describe()
    assert "-$" not in table.stdout, table.describe()  # credit put in shows as a positive figure
    assert_simulator_healthy(live_sim)


def test_official_cli_show_user_shows_the_credit_and_balance_left(cli: Cli, live_sim: LiveSim):
    rent(cli, live_sim)
    hold_still(live_sim)
    credit = live_sim.admin("GET", "/account")["credit"]
    assert 0 < credit < 100
    raw = cli("show", "user", "--raw")
    assert_succeeded(raw)
    assert_sent(raw, "GET", "/api/v0/users/current")
    user = raw.json()
    assert user["credit"] == user["balance"] == credit, raw.describe()
    assert "api_key" not in user and live_sim.api_key not in raw.stdout, raw.describe()

    table = cli("show", "user")
    assert_succeeded(table)
    assert f"{credit:0.2f}" in table.stdout and live_sim.api_key not in table.stdout, table.describe()
    assert_simulator_healthy(live_sim)
