"""The provider's metrics (``airflow_gpumarket.metrics``): names, tags, counts at the points where things happen, and
a metric that never raises into a task. Airflow's ``Stats`` is replaced by a recorder; tests/integration/
test_observability.py sends them through a real StatsD client."""

from __future__ import annotations

import pytest

from airflow_gpumarket import metrics


class StatsRecorder:
    """Airflow's ``Stats`` as a list of (kind, name, value, tags)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, object, dict]] = []

    def incr(self, stat, count=1, rate=None, *, tags=None):
        self.sent.append(("incr", stat, count, dict(tags or {})))

    def timing(self, stat, dt, *, tags=None):
        self.sent.append(("timing", stat, dt, dict(tags or {})))

    def names(self) -> list[str]:
        return [name for _, name, _, _ in self.sent]


@pytest.fixture
def stats(monkeypatch) -> StatsRecorder:
    recorder = StatsRecorder()
    monkeypatch.setattr(metrics, "_stats", lambda: recorder)
    return recorder


def test_an_ended_rental_counts_under_its_outcome_with_the_outcome_as_a_tag(stats):
    metrics.rental_ended(metrics.MAX_COST)
    assert stats.sent == [("incr", "gpumarket.rental.ended.max_cost", 1, {"outcome": "max_cost"})]


def test_a_rental_given_up_for_another_counts_a_failover_by_reason(stats):
    metrics.rental_ended(metrics.PREEMPTED, failover=True)
    assert stats.names() == ["gpumarket.rental.ended.preempted", "gpumarket.rental.failover.preempted"]


def test_dollars_are_counted_as_they_are_reserved_and_settled(stats):
    metrics.budget_reserved(0.25)
    metrics.budget_settled(0.0125)
    metrics.budget_settled(None)  # an unsettled reservation: nothing counted
    assert [(n, v) for _, n, v, _ in stats.sent] == [
        ("gpumarket.budget.reserved_dollars", 0.25),
        ("gpumarket.budget.settled_dollars", 0.0125),
    ]


def test_only_a_429_counts_as_rate_limited_named_after_the_operation(stats):
    metrics.answered("get_instance", 200)
    metrics.answered("create_instance", 429)
    assert stats.sent == [("incr", "gpumarket.api.rate_limited.create_instance", 1, {"operation": "create_instance"})]


def test_boot_time_is_from_creation_to_first_seen_running(stats):
    from datetime import timedelta
    from types import SimpleNamespace

    metrics.booted(SimpleNamespace(created_at=1000.0, running_at=1042.5))
    metrics.booted(SimpleNamespace(created_at=1000.0, running_at=None))
    assert stats.sent == [("timing", "gpumarket.rental.boot", timedelta(seconds=42.5), {})]


@pytest.mark.parametrize(
    ("event", "outcome"),
    [
        ({"status": "job_succeeded"}, "succeeded"),
        ({"status": "job_failed", "exit_status": 3}, "job_failed"),
        ({"status": "timeout", "limit": "max_cost"}, "max_cost"),
        ({"status": "timeout", "limit": "max_runtime"}, "timed_out"),
        ({"status": "gone"}, "lost"),
    ],
)
def test_a_watched_jobs_outcome_comes_from_the_event_its_wait_ended_with(event, outcome):
    from airflow_gpumarket.outcome import from_event

    assert metrics.outcome(from_event(event)[0]) == outcome


def test_a_task_sends_its_dag_and_task_as_tags(stats, monkeypatch):
    from types import SimpleNamespace

    import airflow_gpumarket._compat as compat

    ti = SimpleNamespace(dag_id="train", task_id="fit")
    monkeypatch.setattr(compat, "get_current_context", lambda: {"ti": ti}, raising=False)
    metrics.preempted()
    assert stats.sent == [("incr", "gpumarket.rental.preempted", 1, {"dag_id": "train", "task_id": "fit"})]


def test_a_metric_that_fails_never_raises(monkeypatch):
    class Broken:
        def incr(self, *args, **kwargs):
            raise OSError("statsd host unreachable")

    monkeypatch.setattr(metrics, "_stats", lambda: Broken())
    metrics.rental_started(interruptible=True)  # no exception


def test_a_hook_that_meets_a_429_counts_it_once_per_answer(stats, requests_mock, monkeypatch):
    import json

    from airflow_gpumarket.hooks.core import _GpuMarketHookBase
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    conn = {"conn_type": "gpumarket", "host": "https://api.example.com", "password": "k-0123456789abcdef"}
    conn["extra"] = {"retry_min_wait": 0, "retry_max_wait": 0}
    monkeypatch.setenv("AIRFLOW_CONN_GPUMARKET_DEFAULT", json.dumps(conn))
    monkeypatch.setattr(_GpuMarketHookBase, "_pace", lambda self, operation: 0.0)
    requests_mock.get(
        "https://api.example.com/api/v0/instances/7/",
        [{"status_code": 429, "text": "slow down"}] * 2 + [{"json": {"instances": {"id": 7}}}],
    )
    GpuMarketHook().get_instance(7)
    assert stats.names() == ["gpumarket.api.rate_limited.get_instance"] * 2


def test_a_triggerer_sends_through_the_copy_of_stats_it_set_up(monkeypatch):
    """On Airflow 3 the task SDK and the scheduler's side each keep a metrics module; a triggerer sets up only the
    latter, so a trigger's 429s go there rather than to the SDK's unconfigured copy."""
    from importlib.metadata import version

    if version("apache-airflow").startswith("2."):
        pytest.skip("Airflow 2.11 has one metrics module")
    import airflow._shared.observability.metrics.stats as core
    import airflow.sdk._shared.observability.metrics.stats as sdk

    monkeypatch.setattr(sdk, "_factory", None)
    monkeypatch.setattr(core, "_factory", object)
    assert metrics._stats().incr.__module__ == core.__name__
    monkeypatch.setattr(sdk, "_factory", object)  # a task process: the SDK's copy
    assert metrics._stats().incr.__module__ == sdk.__name__
