"""Expected-cost offer choice: rank offers by what finishing the job on them is expected to cost (pure functions).

For each offer, from the fields a search returns and nothing else:

- boot: provisioning, then the image pull at the offer's ``inet_down`` (Mbps) times ``pull_efficiency``, then
  extraction (the simulator's market model, ``gpumarket_simulator.hosts``, uses the same terms);
- one attempt that succeeds: ``dph_total`` × the expected runtime (× boot + runtime with ``boot_billed``: the
  live service bills compute from ``running`` on, so by default a boot costs only its disk), plus the disk at
  ``storage_cost`` ($/GB/month) over boot and runtime, plus the data moved in and out at ``inet_down_cost`` and
  ``inet_up_cost`` ($/GB);
- the risk of failing, with ``reliability`` read as the simulator's market reads it: an attempt fails to start with
  probability 1 − reliability (its boot is lost), and a running job is lost at (1 − reliability) / (reliability ×
  ``outage_hours``) per hour (uptime, in outages of that mean length), so a long job is lost more often, after it
  billed the time it ran (without a checkpoint its work is lost); the expected cost is that of renting hosts like
  this one until one finishes: the attempt + what a failure bills × p / (1 − p).

Host memory (``avoided``): an offer on a machine that failed recently is skipped, whatever the reason (a GPU
preflight, a boot past ``boot_timeout``, a failed status, a job lost mid-way), until its memory expires or is
cleared by hand (``airflow gpumarket hosts --clear``). An offer whose boot is expected to outlast the model's
``boot_timeout`` is ranked after every offer expected to boot in time (the task would destroy it unbooted), in
price order: the expectation may be wrong, so it is still tried when nothing else is left.

The arguments' checks (``check_*``) are for an operator to call when it is built: they raise
``GpuMarketValidationError`` naming the field. This module imports only the standard library and the provider's
exceptions: it is cheap at DAG parse time.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_gpumarket.exceptions import GpuMarketValidationError

#: The ways an operator may choose among matching offers.
OFFER_CHOICES = ("price", "expected_cost")
#: The month a ``storage_cost`` ($/GB/month) is spread over, as the service counts it.
SECONDS_PER_MONTH = 30 * 86400
#: What is assumed of an offer that shows no download speed, in Mbps (a slow host: the choice stays cautious).
UNKNOWN_INET_DOWN_MBPS = 100.0
#: The most a failure probability is taken to be: an offer with reliability 0 still gets a finite cost.
MAX_FAILURE_PROBABILITY = 0.95
#: The least reliability a loss rate is computed with (as the simulator's market).
MIN_RELIABILITY = 0.05
#: The runtime assumed of a job with no expected_runtime, no max_runtime and no earlier successful run, in seconds.
DEFAULT_RUNTIME_SECONDS = 3600.0
#: Offers the task log lists with their expected costs.
TOP_SHOWN = 5


@dataclass(frozen=True)
class CostModel:
    """What the ranking assumes of the job and of the market (seconds, GB).

    ``image_size_gb``: the compressed size of the job's image. ``transfer_in_gb``/``transfer_out_gb``: data copied to
    and from the instance. ``outage_hours``: the mean length of a host's outage (how often a running job is lost).
    ``boot_billed``: whether compute is billed while the instance boots. ``boot_timeout``: the task's, in seconds
    (None: no limit).
    """

    expected_runtime: float
    image_size_gb: float = 6.0
    disk_gb: float = 32.0
    transfer_in_gb: float = 0.0
    transfer_out_gb: float = 0.0
    provision_seconds: float = 40.0
    pull_efficiency: float = 0.5
    extract_seconds_per_gb: float = 10.0
    outage_hours: float = 2.0
    boot_billed: bool = False
    boot_timeout: float | None = None


@dataclass(frozen=True)
class OfferCost:
    """One offer's expected cost, its parts, and a sentence that tells them (``explain``)."""

    offer: Mapping[str, Any]
    expected: float
    boot_seconds: float
    attempt: float
    compute: float
    disk: float
    transfer: float
    failure_probability: float
    failure: float  # what a failed attempt bills before it is noticed
    avoided_reason: str | None = None
    boot_timeout: float | None = None  # set when the boot is expected to outlast it

    @property
    def offer_id(self) -> Any:
        return self.offer.get("id")

    def explain(self) -> str:
        o = self.offer
        head = (
            f"offer {o.get('id')} (machine {o.get('machine_id')}, {o.get('num_gpus', 1)}x {o.get('gpu_name')}, "
            f"${_num(o.get('dph_total')):.3f}/h, reliability {_num(o.get('reliability'), 1.0):.3f}, "
            f"{_inet_down(o):.0f} Mbps down)"
        )
        if self.avoided_reason is not None:
            return f"{head}: skipped, its machine is in host memory ({self.avoided_reason})"
        if self.boot_timeout is not None:
            return (
                f"{head}: its boot is expected to take {self.boot_seconds / 60:.1f} min, past boot_timeout "
                f"({self.boot_timeout / 60:.1f} min); tried only after every offer expected to boot in time"
            )
        return (
            f"{head}, boot {self.boot_seconds / 60:.1f} min: expected ${self.expected:.4f} = compute "
            f"${self.compute:.4f} + disk ${self.disk:.4f} + transfer ${self.transfer:.4f} "
            f"+ {self.failed_attempts:.2f} failed attempts expected (risk {self.failure_probability:.1%} each) x "
            f"${self.failure:.4f}"
        )

    @property
    def failed_attempts(self) -> float:
        """How many attempts are expected to fail before one finishes, on hosts like this one."""
        return self.failure_probability / (1.0 - self.failure_probability)


def _num(value: Any, default: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return default
    return float(value)


def _inet_down(offer: Mapping[str, Any]) -> float:
    speed = _num(offer.get("inet_down"))
    return speed if speed > 0 else UNKNOWN_INET_DOWN_MBPS


def boot_seconds(offer: Mapping[str, Any], model: CostModel) -> float:
    """Expected seconds from create to running on this offer's host."""
    pull = model.image_size_gb * 8000.0 / (_inet_down(offer) * model.pull_efficiency)
    return model.provision_seconds + pull + model.image_size_gb * model.extract_seconds_per_gb


def image_gb_from_boot(boot: float, inet_down: float, model: CostModel | None = None) -> float:
    """The image size, in GB, that ``boot_seconds`` would expect a host of ``inet_down`` Mbps to take ``boot`` to run
    (0 for a boot no longer than provisioning: the image was already on the host)."""
    model = model or CostModel(expected_runtime=0.0)
    per_gb = 8000.0 / (inet_down * model.pull_efficiency) + model.extract_seconds_per_gb
    return max(0.0, boot - model.provision_seconds) / per_gb


def offer_cost(offer: Mapping[str, Any], model: CostModel, memory: Any = None) -> OfferCost:
    """The expected cost of finishing the job on ``offer`` (see the module docstring).

    ``memory``: host memory's record of the offer's machine (its ``reason``), if any: the offer is skipped.
    """
    hourly = _num(offer.get("dph_total"))
    boot = boot_seconds(offer, model)
    billed = boot + model.expected_runtime
    compute = hourly * (billed if model.boot_billed else model.expected_runtime) / 3600.0
    disk_rate = _num(offer.get("storage_cost")) * model.disk_gb / SECONDS_PER_MONTH
    disk = disk_rate * billed
    transfer = model.transfer_in_gb * _num(offer.get("inet_down_cost")) + model.transfer_out_gb * _num(
        offer.get("inet_up_cost")
    )
    attempt = compute + disk + transfer
    p = min(MAX_FAILURE_PROBABILITY, max(0.0, 1.0 - _num(offer.get("reliability"), 1.0)))
    avoided_reason = None if memory is None else str(getattr(memory, "reason", "failed"))
    lost, ran = _lost_mid_job(1.0 - p, model)
    booted = disk_rate * boot + (hourly * boot / 3600.0 if model.boot_billed else 0.0)
    p_lost = (1.0 - p) * lost
    p = min(MAX_FAILURE_PROBABILITY, p + p_lost)
    failure = booted + (p_lost * (hourly / 3600.0 + disk_rate) * ran / p if p > 0 else 0.0)
    expected = attempt + failure * p / (1.0 - p)
    times_out = model.boot_timeout is not None and boot > model.boot_timeout
    if avoided_reason is not None or times_out:
        expected = math.inf
    return OfferCost(
        offer,
        expected,
        boot,
        attempt,
        compute,
        disk,
        transfer,
        p,
        failure,
        avoided_reason,
        model.boot_timeout if times_out else None,
    )


def _lost_mid_job(reliability: float, model: CostModel) -> tuple[float, float]:
    """(probability that a started job is lost before it ends, the mean seconds it ran when it is)."""
    runtime = model.expected_runtime
    rate = (1.0 - reliability) / (max(reliability, MIN_RELIABILITY) * model.outage_hours * 3600.0)
    x = rate * runtime
    if x < 1e-6:
        return x, runtime / 2.0
    return -math.expm1(-x), 1.0 / rate - runtime / math.expm1(x)


def rank_offers(
    offers: Iterable[Mapping[str, Any]],
    model: CostModel,
    avoided: Mapping[int, Any] | Collection[int] = (),
) -> list[OfferCost]:
    """The offers by expected cost, cheapest first (ties: lower hourly price, then search order); skipped last.

    ``avoided``: host memory as a mapping of machine ids to their records (``host_memory.Memory``), or bare machine
    ids: their offers are skipped.
    """
    costs = []
    for offer in offers:
        machine: Any = offer.get("machine_id")
        memory = None
        if machine in avoided:
            memory = avoided[machine] if isinstance(avoided, Mapping) else _Remembered
        costs.append(offer_cost(offer, model, memory))
    indexed = sorted(enumerate(costs), key=lambda ic: (ic[1].expected, _num(ic[1].offer.get("dph_total")), ic[0]))
    return [cost for _, cost in indexed]


class _Remembered:
    reason = "failed"


def choice_log(ranked: Sequence[OfferCost], top: int = TOP_SHOWN) -> list[str]:
    """The task log's lines: the top offers with their expected costs, and why the chosen one won."""
    if not ranked or ranked[0].avoided_reason is not None:
        return ["No offer can be chosen: every matching machine is in host memory."]
    lines = [f"{i}. {cost.explain()}" for i, cost in enumerate(ranked[:top], 1)]
    if math.isinf(ranked[0].expected):
        lines.append("Every offer's boot is expected to outlast boot_timeout: trying them cheapest first.")
        return lines
    skipped = sum(1 for c in ranked if c.avoided_reason is not None)
    if skipped:
        lines.append(f"{skipped} offer(s) skipped: their machines failed recently (airflow gpumarket hosts)")
    lines.append(why_chosen(ranked))
    return lines


def why_chosen(ranked: Sequence[OfferCost]) -> str:
    """One sentence: why the first offer won over the cheapest one per hour."""
    chosen = ranked[0]
    cheapest = min((c for c in ranked if c.avoided_reason is None), key=lambda c: _num(c.offer.get("dph_total")))
    if cheapest is chosen:
        return (
            f"Chose offer {chosen.offer_id}: the cheapest per hour is also the cheapest expected "
            f"(${chosen.expected:.4f})."
        )
    reasons = []
    if cheapest.boot_timeout is not None:
        reasons.append(
            f"its boot is expected to take {cheapest.boot_seconds / 60:.1f} min at "
            f"{_inet_down(cheapest.offer):.0f} Mbps, past boot_timeout ({cheapest.boot_timeout / 60:.1f} min)"
        )
    elif cheapest.boot_seconds > chosen.boot_seconds * 1.2:
        reasons.append(
            f"its boot takes {cheapest.boot_seconds / 60:.1f} min at {_inet_down(cheapest.offer):.0f} Mbps against "
            f"{chosen.boot_seconds / 60:.1f} min"
        )
    if cheapest.failure_probability > chosen.failure_probability + 0.01:
        reasons.append(
            f"it fails {cheapest.failure_probability:.1%} of the time against {chosen.failure_probability:.1%}"
        )
    if cheapest.transfer > chosen.transfer:
        reasons.append(f"its transfer costs ${cheapest.transfer:.4f} against ${chosen.transfer:.4f}")
    because = "; ".join(reasons) or "its disk and boot cost more than its lower price saves"
    return (
        f"Chose offer {chosen.offer_id} (expected ${chosen.expected:.4f}) over the cheapest per hour, offer "
        f"{cheapest.offer_id} (${_num(cheapest.offer.get('dph_total')):.3f}/h{_expected(cheapest)}): {because}."
    )


def _expected(cost: OfferCost) -> str:
    return "" if math.isinf(cost.expected) else f", expected ${cost.expected:.4f}"


# --- the operator's arguments, checked when it is built ----------------------------------------------------------
def check_offer_choice(value: Any) -> str:
    if value not in OFFER_CHOICES:
        raise GpuMarketValidationError(
            "offer_choice", f"must be one of {', '.join(repr(c) for c in OFFER_CHOICES)}, got {value!r}"
        )
    return str(value)


def _seconds(field: str, value: Any) -> float:
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise GpuMarketValidationError(field, f"must be a timedelta or a number of seconds > 0, got {value!r}")
    return float(value)


def check_expected_runtime(value: Any) -> float | None:
    """``expected_runtime`` in seconds; None means: learn it from the task's earlier successful runs."""
    return None if value is None else _seconds("expected_runtime", value)


def check_image_size_gb(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise GpuMarketValidationError(
            "image_size_gb", f"must be a number of GB > 0 (the compressed image), got {value!r}"
        )
    return float(value)


def check_transfer_gb(value: Any) -> tuple[float, float] | None:
    """``transfer_gb`` as (GB in, GB out): a number is data downloaded; a mapping may name ``in`` and ``out``."""
    if value is None:
        return None
    amounts = value if isinstance(value, Mapping) else {"in": value}
    unknown = set(amounts) - {"in", "out"}
    if unknown:
        raise GpuMarketValidationError(
            "transfer_gb", f"takes the keys 'in' and 'out' (GB each), got {sorted(map(str, unknown))}"
        )
    for key, gb in amounts.items():
        if isinstance(gb, bool) or not isinstance(gb, int | float) or not 0 <= gb < math.inf:
            raise GpuMarketValidationError(
                "transfer_gb", f"{key!r} must be a number of GB >= 0 (the data the job moves), got {gb!r}"
            )
    return float(amounts.get("in", 0.0)), float(amounts.get("out", 0.0))


def check_deadline(value: Any, *, parse_time: bool = False) -> dt.datetime | dt.timedelta | None:
    """``deadline`` in its normal form: a timezone-aware datetime, or a timedelta > 0.

    A string is an ISO 8601 date and time with its timezone (what a template renders to); at parse time a template or
    a callable (which Airflow calls when it renders the field) waits for the task to run. A time already past is no
    error: the task rents on demand.
    """
    if value is None or (parse_time and (callable(value) or (isinstance(value, str) and "{{" in value))):
        return None
    text = value if isinstance(value, str) else None
    if text is not None:
        try:
            value = dt.datetime.fromisoformat(text.strip())
        except ValueError:
            raise GpuMarketValidationError(
                "deadline",
                f"{value!r} is not a date and time: give ISO 8601 with its timezone (for example "
                "'2026-12-02T06:00:00+00:00'), or a template that renders to one",
            ) from None
    if isinstance(value, dt.timedelta):
        _seconds("deadline", value)
        return value
    if not isinstance(value, dt.datetime):
        raise GpuMarketValidationError(
            "deadline",
            "must be a datetime, a timedelta, a template rendering to an ISO 8601 date and time, or a callable "
            f"(of context and jinja_env, called when the task renders its fields) returning one of those; got "
            f"{type(value).__name__}",
        )
    if value.tzinfo is None and text is not None:
        raise GpuMarketValidationError(
            "deadline",
            f"{text!r} has no timezone: end it with one (for example '+00:00'; in a template, "
            "data_interval_end keeps its own through .isoformat())",
        )
    if value.tzinfo is None:
        raise GpuMarketValidationError(
            "deadline", "must be timezone-aware (for example pendulum.datetime(..., tz='UTC'))"
        )
    return value
