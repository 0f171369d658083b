"""The three ways to start the simulator: console script, context manager, pytest fixture; and world files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from gpumarket_simulator import MarketSimulator

REPO = Path(__file__).resolve().parents[2]


def sim_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpumarket_simulator.cli", *args]


def start_cli(*args: str, cwd: Path | None = None) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(sim_command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    assert process.stdout is not None
    return process, process.stdout.readline()


# --- console script -----------------------------------------------------------------------------------------
def test_cli_first_line_has_the_url_and_a_ready_connection():
    process, first = start_cli("--api-key", "k123", "--seed", "3")
    try:
        assert first.startswith("gpumarket-sim listening on http://127.0.0.1:")
        url = first.split()[3]
        port = url.rsplit(":", 1)[1]
        assert f"AIRFLOW_CONN_GPUMARKET_DEFAULT=gpumarket://:k123@127.0.0.1:{port}" in first
        response = requests.get(f"{url}/api/v1/instances/", headers={"Authorization": "Bearer k123"}, timeout=5)
        assert response.status_code == 200  # how fast it starts is a figure of make bench, not a test
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0


def test_cli_stops_on_sigint():
    process, first = start_cli()
    assert "listening on" in first
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=10) == 0


def test_cli_default_key_is_derived_from_the_seed():
    keys = []
    for _ in range(2):
        process, first = start_cli("--seed", "5")
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
        keys.append(first.split("gpumarket://:")[1].split("@")[0])
    assert keys[0] == keys[1] == MarketSimulator(seed=5).api_key


def test_cli_loads_a_world_file(tmp_path):
    world = tmp_path / "world.json"
    world.write_text(json.dumps({"offers": [{"id": 77, "gpu_name": "B200", "dph_total": 5.0, "gpu_ram": 184320}]}))
    process, first = start_cli("--world", str(world), "--api-key", "k")
    try:
        url = first.split()[3]
        offers = requests.post(f"{url}/api/v0/bundles/", json={}, headers={"Authorization": "Bearer k"}).json()
        assert [o["id"] for o in offers["offers"]] == [77]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)


@pytest.mark.parametrize("content", ["{not json", "[]", '{"offerz": []}', '{"offers": [{"id": "x"}]}'])
def test_cli_refuses_a_bad_world_file(tmp_path, content):
    world = tmp_path / "world.json"
    world.write_text(content)
    result = subprocess.run(sim_command("--world", str(world)), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "world" in result.stderr and "Traceback" not in result.stderr


def test_cli_refuses_a_port_in_use():
    with MarketSimulator() as sim:
        result = subprocess.run(sim_command("--port", str(sim.port)), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_cli_credit_option_sets_the_starting_credit():
    process, first = start_cli("--api-key", "k", "--credit", "12.5")
    try:
        url = first.split()[3]
        assert requests.get(f"{url}/_sim/account", timeout=5).json()["credit"] == 12.5
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
    result = subprocess.run(sim_command("--credit", "nan"), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "--credit" in result.stderr


def test_cli_local_runs_onstart_slowly_and_writes_the_airflow_settings(tmp_path):
    env_file = tmp_path.resolve() / "sim.env"
    process, first = start_cli("--local", "--api-key", "k", "--env-file", "sim.env", cwd=tmp_path)
    try:
        url = first.split()[3]
        assert requests.get(f"{url}/_sim/state", timeout=5).json()["speed"] == 10
        written = env_file.read_text()
        assert written == f"export AIRFLOW_CONN_GPUMARKET_DEFAULT='{first.split('=', 1)[1].strip()}'\n"
        assert "rate_limit_scale%22%3A10.0" in written  # --local's speed, as the connection tells the provider
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    details = process.stderr.read() if process.stderr else ""
    assert "speed: 10x" in details and "onstart: executed" in details
    assert "airflow dags test <your_dag_id>" in details
    # The other shell runs `airflow` from the environment the simulator runs in (the tests run in a venv), in any
    # folder: the env file, the Airflow home and its DAGs folder are absolute paths.
    assert f"source {sys.prefix}/bin/activate\n    source {env_file}\n" in details
    assert f"export AIRFLOW_HOME={tmp_path.resolve()}/.airflow-sim " in details
    assert (
        "export AIRFLOW__CORE__DAGS_FOLDER=$AIRFLOW_HOME/dags " in details and 'mkdir -p "$AIRFLOW__CORE__' in details
    )
    assert "export AIRFLOW__CORE__LOAD_EXAMPLES=False " in details


def test_the_documented_recipe_is_the_printed_one(tmp_path):
    process, _ = start_cli("--local", "--env-file", "sim.env", cwd=tmp_path)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 0
    details = process.stderr.read() if process.stderr else ""
    printed = details.split("  To run your own DAG", 1)[1]
    printed = printed.replace(sys.prefix, "/path/to/checkout/.venv").replace(
        str(tmp_path.resolve()), "/path/to/checkout"
    )
    doc = (REPO / "docs" / "simulator.md").read_text().split("### Your own DAG on the simulator", 1)[1]
    documented = doc.split("  To run your own DAG", 1)[1].split("```", 1)[0]
    assert [line.split() for line in printed.splitlines()] == [line.split() for line in documented.splitlines()]


def test_cli_refuses_an_env_file_it_cannot_write(tmp_path):
    missing = tmp_path / "no-such-dir" / "sim.env"
    result = subprocess.run(sim_command("--env-file", str(missing)), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "--env-file" in result.stderr and "Traceback" not in result.stderr


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "gpumarket-sim"
    assert script.exists()
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and "--execute-onstart" in result.stdout


# --- context manager ----------------------------------------------------------------------------------------
def test_context_manager_gives_url_key_and_connection():
    with MarketSimulator(api_key="secret-key") as sim:
        assert sim.url == f"http://127.0.0.1:{sim.port}"
        extra = "%7B%22rate_limit_scale%22%3A60.0%7D"  # {"rate_limit_scale":60.0}
        assert sim.conn_uri == f"gpumarket://:secret-key@127.0.0.1:{sim.port}?__extra__={extra}"
        connection = json.loads(sim.connection_env()["AIRFLOW_CONN_GPUMARKET_DEFAULT"])
        assert connection == {
            "conn_type": "gpumarket",
            "host": sim.url,
            "password": "secret-key",
            "extra": {"rate_limit_scale": 60.0},
        }
        assert requests.get(f"{sim.url}/api/v1/instances/", headers={"Authorization": "Bearer secret-key"}).ok
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{sim.url}/api/v1/instances/", timeout=2)


def test_airflow_reads_the_connection_env():
    from airflow.models.connection import Connection

    with MarketSimulator(api_key="k") as sim:
        connection = Connection(conn_id="x", uri=sim.conn_uri)
        assert (connection.conn_type, connection.host, connection.port, connection.password) == (
            "gpumarket",
            "127.0.0.1",
            sim.port,
            "k",
        )
        assert connection.extra_dejson == {"rate_limit_scale": 60.0}  # a number: a short string warns, unmasked
        from_json = Connection.from_json(sim.connection_env()["AIRFLOW_CONN_GPUMARKET_DEFAULT"], conn_id="y")
        assert from_json.host == sim.url and from_json.password == "k"


@pytest.mark.parametrize(
    ("options", "scale"),
    [
        ({"speed": 10}, 10.0),  # its buckets refill 10x as fast as the live service's
        ({"speed": 10, "rate_limits": False}, 0.0),  # no buckets: nothing to pace
        ({"speed": 10, "profile": "spec"}, 0.0),
        ({"speed": 0}, 0.0),  # a frozen clock refills only on advance: real-time pacing means nothing
    ],
)
def test_connection_carries_the_rate_limit_scale_of_the_simulator(options, scale):
    with MarketSimulator(**options) as sim:
        assert sim.rate_limit_scale == scale
        assert sim.conn_uri.endswith(f"?__extra__=%7B%22rate_limit_scale%22%3A{scale!r}%7D")


def test_airflow_reads_the_printed_connection_without_a_short_secret_warning(tmp_path):
    code = (
        "from airflow.providers.common.compat.sdk import BaseHook; print(BaseHook.get_connection('gpumarket_default'))"
    )
    with MarketSimulator(speed=10) as sim:
        env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW_CONN_GPUMARKET_DEFAULT": sim.conn_uri}
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "too short" not in result.stdout + result.stderr


def test_two_simulators_run_side_by_side():
    with MarketSimulator(api_key="a") as one, MarketSimulator(api_key="b") as two:
        assert one.port != two.port
        assert (
            requests.get(f"{two.url}/api/v1/instances/", headers={"Authorization": "Bearer a"}).status_code == 404
        )  # live: auth_error


def test_world_dict_and_state_dump_round_trip(tmp_path):
    with MarketSimulator(seed=4) as original:
        dump = original.state()
    path = tmp_path / "world.json"
    path.write_text(json.dumps(dump))
    with MarketSimulator(seed=9, world=str(path)) as loaded:
        state = loaded.state()
    for key in (
        "offers",
        "machines",
        "templates",
        "deployments",
        "endpoints",
        "api_keys",
        "cloud_integrations",
    ):
        assert state[key] == dump[key], key
    assert state["tfa"]["totp_secret"] == dump["tfa"]["totp_secret"]


def test_the_documented_world_file_example_loads():
    doc = (REPO / "docs" / "simulator.md").read_text()
    example = doc.split("## World file format", 1)[1].split("```json\n", 1)[1].split("```", 1)[0]
    with MarketSimulator(speed=0, world=json.loads(example)) as sim:
        state = sim.state()
    assert state["now"] == 1767225600
    assert [o["id"] for o in state["offers"]] == [77]
    assert state["templates"][0]["env"] == {"A": "1", "-p 8080:8080": "1"}
    assert [e["id"] for e in state["endpoints"]] == [101, 200]


def test_world_file_offers_create_their_machines():
    world = {"offers": [{"id": 5, "machine_id": 50, "gpu_name": "X", "dph_total": 1.0, "fate": "exited"}]}
    with MarketSimulator(world=world) as sim:
        state = sim.state()
    assert [m["id"] for m in state["machines"] if not m["owned"]] == [50]
    assert [m["owned"] for m in state["machines"]].count(True) == 3  # the account's machines stay
    assert state["offers"][0]["fate"] == "exited"


# --- pytest plugin ------------------------------------------------------------------------------------------
def test_plugin_fixture_sets_the_connection_env(gpumarket_sim):
    assert (
        os.environ["AIRFLOW_CONN_GPUMARKET_DEFAULT"] == gpumarket_sim.connection_env()["AIRFLOW_CONN_GPUMARKET_DEFAULT"]
    )
    assert gpumarket_sim.state()["instances"] == []


def test_plugin_fixture_is_reset_for_each_test_part_one(gpumarket_sim):
    headers = {"Authorization": f"Bearer {gpumarket_sim.api_key}"}
    offers = requests.post(f"{gpumarket_sim.url}/api/v0/bundles/", json={"limit": 1}, headers=headers).json()
    requests.put(f"{gpumarket_sim.url}/api/v0/asks/{offers['offers'][0]['id']}/", json={"image": "u"}, headers=headers)
    assert len(gpumarket_sim.alive_instances()) == 1


def test_plugin_fixture_is_reset_for_each_test_part_two(gpumarket_sim):
    assert gpumarket_sim.alive_instances() == []


@pytest.mark.gpumarket_sim(speed=0, seed=8, api_key="marker-key")
def test_plugin_marker_gives_a_dedicated_simulator(gpumarket_sim, gpumarket_sim_server):
    assert gpumarket_sim is not gpumarket_sim_server
    assert gpumarket_sim.api_key == "marker-key"
    assert gpumarket_sim.state()["seed"] == 8


def test_importing_the_plugin_and_package_is_cheap():
    code = (
        "import sys, gpumarket_simulator.pytest_plugin, gpumarket_simulator as s; "
        "heavy = [m for m in ('fastapi', 'uvicorn', 'starlette', 'airflow') if m in sys.modules]; "
        "print(heavy)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=REPO)
    assert result.stdout.strip() == "[]", result.stderr


def test_the_simulator_serves_without_the_provider():
    """The simulator is a second reading of the spec: it imports nothing from the provider."""
    code = (
        "import sys, requests; sys.modules['airflow_gpumarket'] = None\n"
        "from gpumarket_simulator import MarketSimulator\n"
        "with MarketSimulator(api_key='k') as sim:\n"
        "    response = requests.post(sim.url + '/api/v0/bundles/', json={}, headers={'Authorization': 'Bearer k'})\n"
        "print(response.status_code)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=REPO)
    assert result.stdout.strip() == "200", result.stderr


def test_the_plugin_is_opt_in(tmp_path):
    """A user's pytest gets the fixture when it names the plugin, and nothing otherwise."""
    (tmp_path / "test_user.py").write_text(
        "def test_uses_the_simulator(gpumarket_sim):\n    assert gpumarket_sim.alive_instances() == []\n"
    )

    def pytest_run(*options: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull, *options]
        return subprocess.run([*command, str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=tmp_path)

    assert "fixture 'gpumarket_sim' not found" in pytest_run().stdout
    opted_in = pytest_run("-p", "gpumarket_simulator.pytest_plugin")
    assert opted_in.returncode == 0, opted_in.stdout
