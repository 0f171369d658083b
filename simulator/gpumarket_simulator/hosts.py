"""How the market's hosts differ: download speed and boot time, GPU checks that fail, flaky machines, outbid rates.

A world file's ``market`` key turns this on: a preset name (``healthy``, ``typical``, ``bad``) or an object
``{"preset": name, <any field of HostProfile>: value}``. Without it (or with ``null``) the market is the classic one:
every boot takes 1 to 5 minutes whatever the image, and only an offer's ``fate`` decides whether it fails.

With a profile on, each rental's outcome is drawn when it is created, from a stream of its own:

- its boot: provisioning, then the image pull at the offer's ``inet_down`` (Mbps, as the live offers show it) times
  ``pull_efficiency``, then extraction at ``extract_seconds_per_gb``; a boot bills its disk but no compute, as the
  live service bills (compute from ``running`` on);
- a machine marked ``gpu_check: "fail"`` boots, but its ``nvidia-smi`` answers that no driver is loaded;
- any other machine fails to start with probability ``1 - reliability`` (ends ``exited``, ``unknown`` or
  ``offline``), and drops a running instance at ``loss_rate_per_hour(reliability)``: reliability read as uptime, in
  outages of mean ``outage_hours``. So reliability predicts failures, a flaky machine (low reliability) fails again
  and again, and a long job is lost more often than a short one, after it billed the hours it ran;
- a bid is outbid at a rate that rises as it approaches the machine's floor: ``outbid_per_hour_at_floor`` times
  ``((dph_total - bid) / (dph_total - floor)) ** outbid_shape`` per hour (none at the on-demand price), and it
  stays outbid for ``outbid_seconds``.

The hosts a profile adds are priced by their kind: flaky and GPU-faulty ones in ``price_factor_unreliable`` of the
type's base price, mostly unverified and, unverified, on the slower half of the download speeds; healthy ones in
``price_factor_healthy``, mostly verified. docs/simulator.md names the public source of each default, and says
which figures are the simulator's own.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from gpumarket_simulator.instances import FAILED_STATUSES, Instance
from gpumarket_simulator.offers import Machine, Offer
from gpumarket_simulator.rules import is_number

GPU_CHECKS = ("ok", "fail")
#: A step of a bid instance's schedule: the market's outbid rate takes its machine.
OUTBID = "outbid"
#: What ``nvidia-smi`` prints on a host whose driver does not answer (the real tool's message, exit status 9).
NVIDIA_SMI_NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
NVIDIA_SMI_NO_DRIVER_STATUS = 9
#: The least reliability a loss rate is computed with: a machine of reliability 0 still drops jobs at a finite rate.
MIN_RELIABILITY = 0.05


@dataclass(frozen=True)
class HostProfile:
    """The parameters of a heterogeneous market (see the module docstring and docs/simulator.md)."""

    name: str = "typical"
    #: Range of the offers' download speed, Mbps, drawn log-uniformly.
    inet_down_mbps: tuple[float, float] = (100.0, 2000.0)
    provision_seconds: tuple[float, float] = (20.0, 60.0)
    pull_efficiency: float = 0.5
    extract_seconds_per_gb: float = 10.0
    #: An image's size when ``image_sizes_gb`` does not name it.
    default_image_gb: float = 6.0
    image_sizes_gb: dict[str, float] = field(default_factory=dict)
    gpu_check_failure_share: float = 0.05
    flaky_share: float = 0.10
    reliability_healthy: tuple[float, float] = (0.97, 0.999)
    reliability_flaky: tuple[float, float] = (0.40, 0.80)
    #: A machine whose GPU check fails shows a reliability only a little lower than a healthy one's.
    reliability_gpu_fault: tuple[float, float] = (0.90, 0.98)
    #: Mean length of a host's outage, hours: with reliability read as uptime, how often it drops a running job.
    outage_hours: float = 2.0
    #: Prices of the added offers, as factors of their type's base price per GPU-hour, by the host's kind.
    price_factor_healthy: tuple[float, float] = (0.85, 1.4)
    price_factor_unreliable: tuple[float, float] = (0.75, 1.1)
    #: Shares of the added hosts that are verified, by kind; an unverified host downloads on the slower half.
    verified_share_healthy: float = 0.8
    verified_share_unreliable: float = 0.2
    outbid_per_hour_at_floor: float = 0.5
    outbid_shape: float = 2.0
    outbid_seconds: tuple[float, float] = (300.0, 1800.0)
    #: Offers added to each GPU type of the generated world, with hosts of every kind.
    extra_offers_per_gpu_type: int = 100
    #: Whether compute bills while an instance is ``loading`` (its image pulled), not only once ``running``.
    bill_loading: bool = False

    def image_gb(self, image: str | None) -> float:
        return self.image_sizes_gb.get(image or "", self.default_image_gb)

    def boot_seconds(self, rng: random.Random, image: str | None, offer: Offer) -> tuple[float, float]:
        """(provisioning, total) seconds of a first boot of ``image`` on the offer's host (its ``inet_down``, Mbps)."""
        provisioning = rng.uniform(*self.provision_seconds)
        gb = self.image_gb(image)
        pull = gb * 8000.0 / max(offer.inet_down * self.pull_efficiency, 1e-3)
        return provisioning, provisioning + pull + gb * self.extract_seconds_per_gb

    def loss_rate_per_hour(self, reliability: float) -> float:
        """Running instances lost per hour: reliability read as uptime, in outages of mean ``outage_hours``."""
        # Down 1 - r of the time in outages of mean D hours: an outage every r * D / (1 - r) hours of uptime.
        if reliability >= 1.0:
            return 0.0
        return (1.0 - reliability) / (max(reliability, MIN_RELIABILITY) * self.outage_hours)

    def add_losses(self, rng: random.Random, inst: Instance, now: float, final: str | None) -> None:
        """Add to a boot's schedule the loss of a job mid-way, and a bid's outbid, when they come."""
        if final == "running" and inst.lost_after is not None:
            inst.schedule.append((inst.schedule[-1][0] + inst.lost_after, inst.lost_status))
        price = inst.config.get("price")
        rate = 0.0 if price is None else self.outbid_rate_per_hour(price, inst.offer.dph_total, inst.offer.floor_bid)
        if rate > 0:
            inst.schedule.append((now + rng.expovariate(rate / 3600.0), OUTBID))
            inst.schedule.sort(key=lambda step: step[0])

    def outbid_rate_per_hour(self, bid: float, dph_total: float, floor: float) -> float:
        if bid >= dph_total or dph_total <= floor:
            return 0.0
        closeness = min(1.0, (dph_total - bid) / (dph_total - floor))
        return self.outbid_per_hour_at_floor * closeness**self.outbid_shape


PRESETS: dict[str, HostProfile] = {
    "healthy": HostProfile(
        name="healthy",
        inet_down_mbps=(500.0, 5000.0),
        gpu_check_failure_share=0.01,
        flaky_share=0.03,
        outbid_per_hour_at_floor=0.2,
    ),
    "typical": HostProfile(),
    "bad": HostProfile(
        name="bad",
        inet_down_mbps=(20.0, 1000.0),
        gpu_check_failure_share=0.12,
        flaky_share=0.25,
        reliability_flaky=(0.3, 0.7),
        outbid_per_hour_at_floor=1.5,
    ),
}

_RANGES = (
    "inet_down_mbps",
    "provision_seconds",
    "reliability_healthy",
    "reliability_flaky",
    "reliability_gpu_fault",
    "outbid_seconds",
    "price_factor_healthy",
    "price_factor_unreliable",
)
_SHARES = (
    "gpu_check_failure_share",
    "flaky_share",
    "pull_efficiency",
    "verified_share_healthy",
    "verified_share_unreliable",
)


def parse_profile(value: Any) -> HostProfile | None:
    """Parse a world file's ``market``: null, a preset name, or ``{"preset": name, field: value, ...}``.

    Raises ValueError naming the field otherwise.
    """
    if value is None:
        return None
    if isinstance(value, str):
        value = {"preset": value}
    if not isinstance(value, dict):
        raise ValueError(f"market must be null, a preset name ({', '.join(PRESETS)}) or an object")
    given = dict(value)
    preset = given.pop("preset", "typical")
    if preset not in PRESETS:
        raise ValueError(f"market.preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    known = {f.name for f in fields(HostProfile)} - {"name"}
    unknown = set(given) - known
    if unknown:
        raise ValueError(f"unknown market fields: {', '.join(sorted(unknown))}")
    changes: dict[str, Any] = {}
    for name, v in given.items():
        if name in _RANGES:
            if not (isinstance(v, list) and len(v) == 2 and all(is_number(x) and x > 0 for x in v) and v[0] <= v[1]):
                raise ValueError(f"market.{name} must be [low, high] with 0 < low <= high, got {v!r}")
            changes[name] = (float(v[0]), float(v[1]))
        elif name == "image_sizes_gb":
            if not isinstance(v, dict) or not all(is_number(x) and x > 0 for x in v.values()):
                raise ValueError("market.image_sizes_gb must map image names to sizes in GB > 0")
            changes[name] = {str(k): float(x) for k, x in v.items()}
        elif name == "bill_loading":
            if not isinstance(v, bool):
                raise ValueError(f"market.bill_loading must be true or false, got {v!r}")
            changes[name] = v
        elif name == "extra_offers_per_gpu_type":
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 500:
                raise ValueError(f"market.extra_offers_per_gpu_type must be an integer from 0 to 500, got {v!r}")
            changes[name] = v
        else:
            low = 0.0 if name in _SHARES or name.startswith("outbid") else 1e-9
            if not is_number(v) or v < low or (name in _SHARES and v > 1):
                bound = "from 0 to 1" if name in _SHARES else "a number >= 0"
                raise ValueError(f"market.{name} must be {bound}, got {v!r}")
            changes[name] = float(v)
    for name in ("reliability_healthy", "reliability_flaky", "reliability_gpu_fault"):
        if changes.get(name, (0, 0))[1] > 1:
            raise ValueError(f"market.{name} must lie within (0, 1]")
    return replace(PRESETS[preset], **changes)


def profile_view(profile: HostProfile | None) -> dict[str, Any] | None:
    if profile is None:
        return None
    view = {f.name: getattr(profile, f.name) for f in fields(HostProfile)}
    view["preset"] = view.pop("name")
    return {k: list(v) if isinstance(v, tuple) else v for k, v in view.items()}


def draw_inet_down(rng: random.Random, low: float, high: float, *, verified: bool = True) -> float:
    """A download speed in Mbps, log-uniform in [low, high]; an unverified host's in the slower half (log scale)."""
    top = math.log(high) if verified else (math.log(low) + math.log(high)) / 2
    return round(math.exp(rng.uniform(math.log(low), top)), 1)


@dataclass(frozen=True)
class HostKind:
    """What one generated host is: its reliability and whether its GPU check fails."""

    reliability: float
    gpu_check: str
    flaky: bool

    @property
    def unreliable(self) -> bool:
        return self.flaky or self.gpu_check == "fail"


def draw_host(rng: random.Random, profile: HostProfile) -> HostKind:
    roll = rng.random()
    if roll < profile.gpu_check_failure_share:
        return HostKind(round(rng.uniform(*profile.reliability_gpu_fault), 4), "fail", False)
    if roll < profile.gpu_check_failure_share + profile.flaky_share:
        return HostKind(round(rng.uniform(*profile.reliability_flaky), 4), "ok", True)
    return HostKind(round(rng.uniform(*profile.reliability_healthy), 4), "ok", False)


@dataclass(frozen=True)
class Attempt:
    """One rental's drawn outcome: how it ends after booting, and after how long running it is lost (None: never)."""

    fate: str
    lost_after: float | None = None
    lost_status: str = "offline"


def draw_attempt(rng: random.Random, profile: HostProfile, reliability: float) -> Attempt:
    """Fails to start with probability ``1 - reliability``; else lost after an exponential time running."""
    if rng.random() < 1.0 - reliability:
        return Attempt(rng.choice(FAILED_STATUSES))
    rate = profile.loss_rate_per_hour(reliability)
    if rate <= 0:
        return Attempt("running")
    return Attempt("running", rng.expovariate(rate / 3600.0), rng.choice(FAILED_STATUSES))


#: Where the offers a market profile adds begin: machine ids, offer ids.
EXTRA_MACHINE_BASE, EXTRA_OFFER_BASE = 20_000, 3_500_000


def add_hosts(
    machines: list[Machine],
    offers: list[Offer],
    gpu_types: Sequence[tuple[str, int, float, float]],
    seed: int,
    profile: HostProfile,
) -> None:
    """Give a generated market the profile's download speeds, and add its hosts of every kind to each GPU type.

    ``gpu_types``: (name, gpu_ram in MB, base price per GPU-hour, deep-learning performance per GPU).
    """
    rng = random.Random(f"gpumarket-market-{seed}")
    for offer in offers:
        offer.inet_down = draw_inet_down(rng, *profile.inet_down_mbps, verified=offer.verified)
    hosts = [60_000 + rng.randint(0, 9_999) for _ in range(16)]
    for type_index, (gpu_name, gpu_ram, price, dlperf) in enumerate(gpu_types):
        for slot in range(profile.extra_offers_per_gpu_type):
            i = type_index * 1000 + slot
            kind = draw_host(rng, profile)
            if kind.unreliable:
                factor, verified = rng.uniform(*profile.price_factor_unreliable), profile.verified_share_unreliable
            else:
                factor, verified = rng.uniform(*profile.price_factor_healthy), profile.verified_share_healthy
            is_verified = rng.random() < verified
            num_gpus = rng.choice((1, 1, 1, 2, 4))
            dph = round(price * factor * num_gpus, 4)
            machine = Machine(id=EXTRA_MACHINE_BASE + i, host_id=rng.choice(hosts), disk_gb=2000.0)
            machines.append(machine)
            offers.append(
                Offer(
                    id=EXTRA_OFFER_BASE + i,
                    machine_id=machine.id,
                    host_id=machine.host_id,
                    num_gpus=num_gpus,
                    gpu_name=gpu_name,
                    gpu_ram=float(gpu_ram),
                    dph_total=dph,
                    reliability=kind.reliability,
                    verified=is_verified,
                    direct_port_count=rng.choice((0, 8, 32, 100)),
                    dlperf_per_dphtotal=round(dlperf * num_gpus / dph, 2),
                    inet_up_cost=round(rng.uniform(0.001, 0.02), 4),
                    inet_down_cost=round(rng.uniform(0.001, 0.02), 4),
                    inet_down=draw_inet_down(rng, *profile.inet_down_mbps, verified=is_verified),
                    gpu_check=kind.gpu_check,
                )
            )


def nvidia_smi_script(gpu_name: str, num_gpus: int, works: bool) -> str:
    """A stand-in ``nvidia-smi`` (sh) for ``-L`` and ``--query-gpu=name --format=csv,noheader`` of these GPUs."""
    if not works:
        return f'#!/bin/sh\necho "{NVIDIA_SMI_NO_DRIVER}"\nexit {NVIDIA_SMI_NO_DRIVER_STATUS}\n'
    name = f"NVIDIA {gpu_name}".replace("'", "")
    listing = "\n".join(f"GPU {i}: {name} (UUID: GPU-00000000-0000-0000-0000-{i:012d})" for i in range(num_gpus))
    names = "\n".join(name for _ in range(num_gpus))
    return (
        "#!/bin/sh\n"
        'case "$*" in\n'
        f"  *--query-gpu=name*) printf '%s\\n' '{names}' ;;\n"
        f"  *-L*) printf '%s\\n' '{listing}' ;;\n"
        f"  *) printf '%s\\n' '{listing}' ;;\n"
        "esac\n"
    )
