"""Host memory: failed machines kept per account with a time to live, safe when many tasks remember at once."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import create_engine

from airflow_gpumarket import host_memory
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.operators.host_memory_client import DirectHostMemory

NOW = 1_800_000_000.0
ACCOUNT = host_memory.account_of("key-a")


@pytest.fixture
def engine(tmp_path):
    return create_engine(f"sqlite:///{tmp_path}/airflow.db")


def test_a_remembered_machine_is_avoided_until_its_time_to_live_ends(engine):
    host_memory.remember(engine, ACCOUNT, 11, "preflight", now=NOW, ttl=3600, detail="expected 2 GPUs, listed 0")
    (memory,) = host_memory.avoided(engine, ACCOUNT, now=NOW + 3599).values()
    assert (memory.machine_id, memory.reason, memory.detail, memory.failures) == (
        11,
        "preflight",
        "expected 2 GPUs, listed 0",
        1,
    )
    assert host_memory.avoided(engine, ACCOUNT, now=NOW + 3600) == {}


def test_the_default_time_to_live_is_a_day(engine):
    memory = host_memory.remember(engine, ACCOUNT, 11, "offline", now=NOW)
    assert memory.expires_at - NOW == 24 * 3600


def test_a_machine_that_fails_again_counts_its_failures_and_keeps_the_later_expiry(engine):
    host_memory.remember(engine, ACCOUNT, 11, "exited", now=NOW, ttl=7200)
    again = host_memory.remember(engine, ACCOUNT, 11, "lost", now=NOW + 60, ttl=60)
    assert (again.failures, again.reason, again.expires_at, again.remembered_at) == (2, "lost", NOW + 7200, NOW)


def test_a_machine_remembered_after_its_memory_expired_starts_afresh(engine):
    host_memory.remember(engine, ACCOUNT, 11, "exited", now=NOW, ttl=60)
    again = host_memory.remember(engine, ACCOUNT, 11, "unknown", now=NOW + 120, ttl=60)
    assert (again.failures, again.remembered_at) == (1, NOW + 120)


def test_each_account_has_its_own_memory(engine):
    host_memory.remember(engine, ACCOUNT, 11, "exited", now=NOW)
    assert host_memory.avoided(engine, host_memory.account_of("key-b"), now=NOW) == {}


def test_the_account_is_a_digest_never_the_key():
    assert "key-a" not in ACCOUNT and ACCOUNT == host_memory.account_of("key-a") != host_memory.account_of("key-b")


def test_many_tasks_remembering_at_once_lose_no_failure(engine):
    machines = [21, 22, 23]
    barrier = threading.Barrier(12)
    errors: list[BaseException] = []

    def remember(i: int) -> None:
        barrier.wait()
        try:
            host_memory.remember(engine, ACCOUNT, machines[i % 3], "boot_timeout", now=NOW)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=remember, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    found = host_memory.avoided(engine, ACCOUNT, now=NOW)
    assert sorted(found) == machines and all(m.failures == 4 for m in found.values())


def test_clear_forgets_one_machine_or_all_of_the_accounts(engine):
    for machine in (11, 12, 13):
        host_memory.remember(engine, ACCOUNT, machine, "exited", now=NOW)
    other = host_memory.account_of("key-b")
    host_memory.remember(engine, other, 11, "exited", now=NOW)
    assert host_memory.clear(engine, ACCOUNT, 12) == 1
    assert sorted(host_memory.avoided(engine, ACCOUNT, now=NOW)) == [11, 13]
    assert host_memory.clear(engine, ACCOUNT) == 2
    assert host_memory.avoided(engine, ACCOUNT, now=NOW) == {} and list(
        host_memory.avoided(engine, other, now=NOW)
    ) == [11]


@pytest.mark.parametrize(
    ("machine_id", "reason", "ttl", "field"),
    [
        ("11", "exited", 60, "machine_id"),
        (True, "exited", 60, "machine_id"),
        (0, "exited", 60, "machine_id"),
        (11, "slow", 60, "reason"),
        (11, "exited", 0, "ttl_seconds"),
        (11, "exited", -5, "ttl_seconds"),
        (11, "exited", float("inf"), "ttl_seconds"),
    ],
)
def test_bad_input_is_refused_naming_the_field(engine, machine_id, reason, ttl, field):
    with pytest.raises(GpuMarketValidationError) as caught:
        host_memory.remember(engine, ACCOUNT, machine_id, reason, now=NOW, ttl=ttl)
    assert caught.value.field == field


def test_the_direct_client_reads_its_injected_clock(engine):
    clock = [NOW]
    memory = DirectHostMemory(engine, "key-a", clock=lambda: clock[0])
    memory.remember(11, "preflight", ttl=100)
    assert list(memory.avoided()) == [11]
    clock[0] += 100
    assert memory.avoided() == {}
