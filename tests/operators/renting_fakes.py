"""A fake hook for the renting operators' flows, and helpers to drive them without a server.

Each instance has a script of statuses that its successive reads return; ``GONE`` means the read and the list agree
it no longer exists; ``DONE`` is a job that exited 0 and stopped its instance (the job wrapper's way when the task
reads the log), its log ending in status 0.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from fake_flows import FlowsOverMethods

from airflow_gpumarket import lifecycle, outcome
from airflow_gpumarket.exceptions import GpuMarketCreateRefusedError, GpuMarketServerError
from airflow_gpumarket.lifecycle import task_key
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

GONE = "gone"
DONE = "done"
EXIT_0 = "gpumarket: job exited with status 0\n"


class FakeHook(FlowsOverMethods):
    """Offers 1..n; instances 1001, 1002, ... whose reads follow ``scripts[offer_id]`` (the last entry repeats)."""

    def __init__(self, scripts: dict[int, list], *, destroy_fails: bool = False) -> None:
        self.scripts = scripts
        self.instances: dict[int, dict] = {}
        self.reads: dict[int, list] = {}
        self.destroyed: list[int] = []
        self.labels: list[tuple[int, str]] = []
        self.destroy_fails = destroy_fails
        self.settings = SimpleNamespace(base_url="https://api.example.com")
        self.log_text = ""  # what every logs read answers
        self.log_reads: list[tuple[int, bool]] = []  # (instance id, daemon log)

    def search_offers(self, filters, *, offer_type="ondemand", order=None, limit=None, extra_filter_fields=()):
        return [{"id": offer_id, "dph_total": 0.5, "gpu_name": "RTX 4090"} for offer_id in self.scripts]

    def create_instance(self, offer_id, **body):
        instance_id = 1000 + len(self.instances) + 1
        self.instances[instance_id] = {"id": instance_id, "offer_id": offer_id, "label": body.get("label")}
        self.reads[instance_id] = list(self.scripts[offer_id])
        return {"success": True, "new_contract": instance_id}

    def _status(self, instance_id):
        script = self.reads[instance_id]
        status = script.pop(0) if len(script) > 1 else script[0]
        if status == DONE:
            if not self.log_text.endswith(EXIT_0):
                self.log_text += EXIT_0
            return "stopped"
        return status

    def find_instance(self, instance_id):
        if instance_id in self.destroyed:
            return None
        status = self._status(instance_id)
        return None if status == GONE else {**self.instances[instance_id], "actual_status": status}

    def list_instances(self, *, label=None, ids=None):
        alive = [i for i in self.instances.values() if i["id"] not in self.destroyed]
        return [i for i in alive if label is None or i["label"] == label]

    def label_instance(self, instance_id, label):
        self.labels.append((instance_id, label))
        self.instances[instance_id]["label"] = label
        return {"success": True}

    def destroy_instance(self, instance_id):
        if self.destroy_fails:
            raise GpuMarketServerError("destroy_instance: HTTP 503 after retries", status_code=503)
        already = instance_id in self.destroyed
        self.destroyed.append(instance_id)
        return {"success": True, "already_gone": already}

    def get_instance_logs(self, instance_id, *, tail=None, daemon_logs=None, retry=True, key_digests=()):
        self.log_reads.append((instance_id, bool(daemon_logs)))
        return self.log_text

    def alive(self) -> list[int]:
        return [i for i in self.instances if i not in self.destroyed]


def ctx(try_number: int = 1) -> dict:
    ti = SimpleNamespace(try_number=try_number, map_index=-1, start_date=datetime.now(UTC))
    return {"run_id": "run-1", "ti": ti}


def job(hook: FakeHook, **kwargs) -> GpuMarketRunJobOperator:
    kwargs.setdefault("command", "python train.py")
    kwargs.setdefault("poll_interval", 0.001)
    op = GpuMarketRunJobOperator(task_id="job", offer_filters={"num_gpus": {"gte": 1}}, image="img", **kwargs)
    op.__dict__["hook"] = hook  # the cached_property, replaced
    return op


class Clock:
    """The operator module's clock: ``sleep`` moves time on at once (labels hold whole epoch seconds)."""

    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def use_clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The renting modules' clock (the operator's, its session's, its preemptions'): their sleeps move it at once."""
    from airflow_gpumarket.operators import preemption, renting, session

    clock = Clock()
    for module in (renting, session, preemption):
        monkeypatch.setattr(module, "time", clock)
    return clock


def earlier_try_left(hook: FakeHook, op, status: str, log_text: str) -> None:
    """Instance 1001, of try 1 whose worker died, on the last offer: in ``status``, its log ``log_text``."""
    hook.create_instance(max(hook.scripts), label=lifecycle.make_label(task_key(op, ctx()), time.time() + 600))
    hook.instances[1001]["actual_status"] = status
    hook.log_text = log_text


def fired(deferred: pytest.ExceptionInfo, kind: outcome.EventKind, **facts) -> dict:
    """The event the deferred task's trigger would send (it carries the rental back, as the trigger does)."""
    trigger = deferred.value.trigger
    return {"status": kind.value, "instance_id": trigger.instance_id, "resume": trigger.rental, **facts}


class BidMarketHook(FakeHook):
    """Bid offers (min_bid 0.2); a create on offer 1 is refused: the machine's minimum rose above the bid since the
    search, and the service made the instance stopped. The hook destroyed it (``destroy_worked``) or could not."""

    def __init__(self, scripts: dict[int, list], *, destroy_worked: bool) -> None:
        super().__init__(scripts)
        self.destroy_worked = destroy_worked

    def search_offers(self, filters, *, offer_type="ondemand", order=None, limit=None, extra_filter_fields=()):
        offers = super().search_offers(filters, offer_type=offer_type, order=order, limit=limit)
        return [{**o, "min_bid": 0.2, "machine_id": 500 + o["id"]} for o in offers]

    def create_instance(self, offer_id, **body):
        made = super().create_instance(offer_id, **body)
        if offer_id != 1:
            return made
        if self.destroy_worked:
            self.destroyed.append(made["new_contract"])
        raise GpuMarketCreateRefusedError(
            f"create_instance failed: the service answered success=false, yet made instance {made['new_contract']}",
            new_contract=made["new_contract"],
            destroyed=self.destroy_worked,
            operation="create_instance",
        )


class PreemptionsOfASession:
    """A try's answer to a preemption as its operator gets it: ``RentalSession.after_preemption`` over an event."""

    def __init__(self, hook, log, **kwargs) -> None:
        from airflow_gpumarket.operators.session import RentalSession
        from airflow_gpumarket.operators.spec import RentalSpec

        op = job(hook, interruptible=True, **kwargs)
        self.session = RentalSession(hook, log, RentalSpec.of(op), ctx(1), task=op)

    def after(self, rental, event):
        from airflow_gpumarket.outcome import from_event

        self.session.attempts = rental.attempts
        self.session._prepare()  # as rent and resume do first: its Preemptions made
        return self.session.after_preemption(rental, from_event(event)[0])
