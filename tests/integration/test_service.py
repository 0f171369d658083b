"""A rented GPU as a service against the simulator: the server really runs on the instance's mapped port.

The example DAG's stand-in server listens on ``$GPUMARKET_SERVICE_PORT`` and refuses a request without the rental's
credential; the tests reach it as a downstream task does, through ``connect_service``.
"""

from __future__ import annotations

import json
import shutil
import time
from types import SimpleNamespace

import httpx
import pytest

from airflow_gpumarket import services
from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
from airflow_gpumarket.operators.failures import GpuMarketJobFailed, GpuMarketServiceGone
from airflow_gpumarket.operators.service import GpuMarketServiceOperator
from airflow_gpumarket.operators.teardown import GpuMarketDestroyInstanceOperator
from airflow_gpumarket.service_client import connect_service

from .conftest import POLL, alive
from .test_interruptible import run_to_the_end
from .test_money_safety import context, healthy_market  # noqa: F401 (an autouse fixture)

FILTERS = {"num_gpus": {"gte": 1}}
#: The instance makes the rental's certificate with openssl, as on the live service's images.
pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the service's certificate")


@pytest.fixture(scope="module")
def server() -> str:
    """The example DAG's server."""
    import runpy
    from pathlib import Path

    example = Path(__file__).parents[2] / "example_dags" / "example_gpumarket_service.py"
    return runpy.run_path(str(example))["SERVER"]


@pytest.fixture(autouse=True)
def own_host_memory(host_memory_of_this_test_alone):
    """A machine a test here remembers is never skipped by another test."""
    return host_memory_of_this_test_alone


def serve(command: str, **kwargs) -> GpuMarketServiceOperator:
    kwargs.setdefault("deferrable", False)
    kwargs.setdefault("offer_filters", FILTERS)
    return GpuMarketServiceOperator(task_id="serve", image="img", command=command, poll_interval=POLL, **kwargs)


def downstream(handed: dict, pushed: dict | None = None) -> dict:
    """A downstream task's context: its ti pulls what the setup task returned, and keeps what it pushes."""
    pulls, pushed = {"serve": handed}, {} if pushed is None else pushed
    ti = SimpleNamespace(
        xcom_pull=lambda task_ids: pulls.get(task_ids), xcom_push=lambda key, value: pushed.update({key: value})
    )
    return {"run_id": "run-1", "ti": ti}


def token_of(handed: dict) -> str:
    return services.token(GpuMarketHook().settings.api_key, handed["label"])


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_rule_a_service_is_handed_over_once_it_answers_and_its_tasks_reach_it_with_the_rentals_credential(
    sim, server, deferrable, task_log
):
    handed = run_to_the_end(serve(server, deferrable=deferrable))
    assert handed["actual_status"] == "running" and handed["conn_id"] == "gpumarket_default"
    (instance,) = alive(sim)
    (mapped,) = instance["ports"].values()  # the identity port, under the port picked
    assert handed["base_url"] == f"https://127.0.0.1:{mapped[0]['HostPort']}"
    pushed: dict = {}
    service = connect_service("serve", context=downstream(handed, pushed))
    assert service.base_url == handed["base_url"] and service.base_url.startswith("https://127.0.0.1:")
    (used,) = pushed.items()  # the GPU rentals page lists the tasks that used the service
    assert (
        used[0] == f"gpumarket_service_use_{handed['instance_id']}" and used[1]["instance_id"] == handed["instance_id"]
    )
    with service.client() as client:
        assert client.post("/embed", json=["ab", "c"]).json() == {"lengths": [2, 1]}
    pinned = service.ssl_context()
    assert httpx.post(f"{service.base_url}/embed", json=["ab"], verify=pinned).status_code == 401  # no credential
    wrong = {"Authorization": "Bearer " + services.token("another key", handed["label"])}
    assert httpx.post(f"{service.base_url}/embed", json=["ab"], headers=wrong, verify=pinned).status_code == 401
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):  # any other certificate: refused
        httpx.post(f"{service.base_url}/embed", json=["ab"], headers=service.headers)
    with pytest.raises(httpx.TransportError):  # never in clear
        httpx.post(service.base_url.replace("https", "http"), json=["ab"], headers=service.headers)
    credential = token_of(handed)
    assert credential not in json.dumps(handed) and credential not in task_log() and credential not in repr(service)
    GpuMarketDestroyInstanceOperator(task_id="stop", instance_id=handed).execute(context())
    assert alive(sim) == []
    with pytest.raises(GpuMarketServiceGone, match=f"instance {handed['instance_id']}"):
        connect_service("serve", context=downstream(handed))


def deferred_to(op: GpuMarketServiceOperator) -> tuple:
    """The task's deferral, and its trigger as another triggerer would rebuild it from its row."""
    from importlib import import_module

    from airflow_gpumarket._compat import TaskDeferred

    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context())
    path, kwargs = deferred.value.trigger.serialize()
    module, _, name = path.rpartition(".")
    return deferred.value, getattr(import_module(module), name)(**kwargs)


def first_event(trigger) -> dict:
    import asyncio

    async def first() -> dict:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(first())


@pytest.mark.parametrize(("ready_path", "seen"), [("/", "GET / answered 200"), (None, "it accepted a TLS connect")])
def test_rule_a_deferred_service_is_probed_in_the_triggerer_and_the_resumed_task_probes_nothing(
    sim, server, monkeypatch, ready_path, seen
):
    from airflow_gpumarket import service_probe

    op = serve(server, deferrable=True, ready_path=ready_path)
    deferred, trigger = deferred_to(op)
    event = first_event(trigger)
    assert event["probe"]["ready"] is True and event["probe"]["seen"] == seen and event["probe"]["certificate"]
    probes: list = []
    monkeypatch.setattr(service_probe, "probe", lambda effect: probes.append(effect) or (True, "probed"))
    handed = getattr(op, deferred.method_name)(context(), event)
    assert probes == [] and handed["certificate"] == event["probe"]["certificate"]
    with connect_service("serve", context=downstream(handed)).client() as client:
        assert client.post("/embed", json=["abc"]).json() == {"lengths": [3]}
    GpuMarketDestroyInstanceOperator(task_id="stop", instance_id=handed).execute(context())
    assert alive(sim) == []


def test_rule_a_deferred_service_that_never_answers_fails_over_from_the_triggerers_verdict(sim, own_host_memory):
    from airflow_gpumarket.operators.failures import GpuMarketNoWorkingOffer

    op = serve("sleep 600", deferrable=True, ready_timeout=60, max_offer_attempts=1)
    deferred, trigger = deferred_to(op)
    event = first_event(trigger)
    assert event["probe"]["ready"] is False and "GET / got no answer" in event["probe"]["seen"]
    with pytest.raises(GpuMarketNoWorkingOffer, match="did not become ready"):
        getattr(op, deferred.method_name)(context(), event)
    (instance,) = sim.state()["instances"]
    assert (
        alive(sim) == []
        and own_host_memory(GpuMarketHook(), "gpumarket_default").avoided()[instance["machine_id"]].reason
        == "not_ready"
    )


def test_rule_a_deferred_service_task_marked_failed_while_probed_is_destroyed_by_its_trigger(sim, monkeypatch):
    import asyncio

    from airflow_gpumarket.triggers import instances as trigger_module

    _, trigger = deferred_to(serve("sleep 600", deferrable=True))
    trigger.task_instance = SimpleNamespace(dag_id="d", run_id="r", task_id="serve", map_index=-1, try_number=1)
    monkeypatch.setattr(trigger_module, "_task_instance_now", lambda ti: ("failed", None, None))

    async def probed_then_killed() -> None:
        run = asyncio.ensure_future(first_event_async(trigger))
        for _ in range(1500):  # until the instance runs and the trigger probes its server
            if trigger._current and trigger._current.running_at and not run.done():
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        assert not run.done(), "the trigger fired before its server answered"
        run.cancel()
        await trigger.on_kill()

    asyncio.run(probed_then_killed())
    assert alive(sim) == []


async def first_event_async(trigger) -> dict:
    async for event in trigger.run():
        return event.payload
    raise AssertionError("the trigger ended without an event")


def test_rule_a_request_to_a_service_whose_host_vanished_fails_as_service_gone(sim, server):
    import asyncio

    handed = serve(server).execute(context())
    service = connect_service("serve", context=downstream(handed))
    with service.client() as client:
        assert client.post("/embed", json=["x"]).status_code == 200
    sim.force_status(handed["instance_id"], "offline")  # the host vanished under the group: its server ends
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the simulator ends the instance's processes as it applies the status
        try:
            httpx.get(service.base_url, timeout=1, verify=service.ssl_context())
        except httpx.TransportError:
            break
        time.sleep(0.05)
    with service.client() as client, pytest.raises(GpuMarketServiceGone, match="it is 'offline'"):
        client.post("/embed", json=["x"])

    async def post() -> None:
        async with service.async_client() as client:
            await client.post("/embed", json=["x"])

    with pytest.raises(GpuMarketServiceGone):
        asyncio.run(post())
    GpuMarketDestroyInstanceOperator(task_id="stop", instance_id=handed).execute(context())
    assert alive(sim) == []


def test_rule_a_service_searches_only_offers_with_a_direct_port():
    op = serve("true", offer_filters={"num_gpus": {"eq": 1}})
    assert op.offer_filters == {"num_gpus": {"eq": 1}, "direct_port_count": {"gte": 1}}
    own = serve("true", offer_filters={"direct_port_count": {"gte": 4}})
    assert own.offer_filters == {"direct_port_count": {"gte": 4}}


def test_rule_a_server_that_never_answers_fails_over_and_its_host_is_remembered(sim, tmp_path, server, own_host_memory):
    flag = tmp_path / "first-rental-seen"
    # The first rental's server never listens; the next one's does (the simulator's hosts share this machine's disk).
    command = f"if [ -e {flag} ]; then {server}\nelse touch {flag}; sleep 600; fi"
    sim.set_speed(60)  # the instance's own work (its certificate, the probes) is in real time: 600x would inflate it
    handed = serve(command, ready_timeout=30, max_offer_attempts=2).execute(context())
    first, second = sorted(sim.state()["instances"], key=lambda i: i["id"])
    assert handed["instance_id"] == second["id"] and first["destroyed_at"] is not None
    billed = [c for c in GpuMarketHook().charges(0, sim.now() + 60) if c.instance_id == first["id"]]
    compute = sum(item.end - item.start for c in billed for item in c.items if item.type == "gpu")
    assert 0 < compute < 120, compute  # ready_timeout (30 s) and the polls around it, on the service's clock
    remembered = own_host_memory(GpuMarketHook(), "gpumarket_default").avoided()
    assert list(remembered) == [first["machine_id"]] and remembered[first["machine_id"]].reason == "not_ready"
    GpuMarketDestroyInstanceOperator(task_id="stop", instance_id=handed).execute(context())
    assert alive(sim) == []


def test_rule_a_server_that_exits_before_it_answers_fails_the_task_and_rents_nothing_more(sim):
    with pytest.raises(GpuMarketJobFailed, match="exited before") as failed:
        serve("echo 'no model here'; exit 3", max_offer_attempts=3).execute(context())
    ran = [i for i in sim.state()["instances"] if "no model here" in sim.onstart_result(i["id"])["output"]]
    assert failed.value.exit_status == 3 and len(ran) == 1 and alive(sim) == []


def test_rule_a_service_whose_teardown_never_runs_ends_itself_at_its_lease(sim, server):
    handed = serve(server, lease=2).execute(context())  # seconds of the instance's own clock
    assert [i["id"] for i in alive(sim)] == [handed["instance_id"]]
    deadline = time.monotonic() + 30
    while alive(sim) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive(sim) == []
    output = sim.onstart_result(handed["instance_id"])["output"]
    assert "gpumarket: the service's lease of 2 s ended" in output


def test_rule_wait_for_running_false_is_refused_for_a_service():
    from airflow_gpumarket.exceptions import GpuMarketValidationError

    with pytest.raises(GpuMarketValidationError, match="wait_for_running"):
        serve("true", wait_for_running=False)


def test_rule_a_service_task_killed_while_its_server_is_probed_destroys_it_and_rents_nothing_more(sim, own_host_memory):
    import threading

    from airflow_gpumarket._compat import AirflowException

    op = serve("sleep 600", ready_timeout=3600, max_offer_attempts=3)  # never answers: the probe goes on

    def kill_once_running() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if any(i.get("actual_status") == "running" for i in alive(sim)):
                op.on_kill()  # SIGTERM's handler: a task marked failed, or its execution_timeout
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_once_running)
    killer.start()
    with pytest.raises(AirflowException, match="killed"):
        op.execute(context())
    killer.join()
    assert len(sim.state()["instances"]) == 1 and alive(sim) == []
    assert own_host_memory(GpuMarketHook(), "gpumarket_default").avoided() == {}  # a kill is not the host's failure
