"""The default world, generated from a seed, and the JSON world file that can replace parts of it."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

from gpumarket_simulator.bidding import parse_drift
from gpumarket_simulator.billing import DEFAULT_CREDIT
from gpumarket_simulator.errors import ApiError
from gpumarket_simulator.hosts import GPU_CHECKS, HostProfile, add_hosts, draw_inet_down, parse_profile
from gpumarket_simulator.instance_rules import parse_template_env
from gpumarket_simulator.instances import FATES
from gpumarket_simulator.offers import DEFAULT_INET_COST_PER_GB, DEFAULT_INET_DOWN_MBPS, Machine, Offer
from gpumarket_simulator.rules import is_number
from gpumarket_simulator.serverless import ENDPOINT_DEFAULTS
from gpumarket_simulator.world import World

DEFAULT_LIST_LIMIT = 50
#: Disk price of the simulated market, in dollars per GB per 30-day month.
DEFAULT_DISK_PRICE_PER_GB_MONTH = 0.10

# name, gpu_ram (MB), price per GPU-hour of the cheapest host, deep-learning performance per GPU
GPU_TYPES = (
    ("RTX 3090", 24576, 0.18, 22.0),
    ("RTX 4090", 24564, 0.34, 40.0),
    ("L40S", 46068, 0.72, 48.0),
    ("A100 SXM4", 81920, 1.05, 70.0),
    ("H100 SXM", 81559, 2.05, 110.0),
)
OWNED_MACHINES = ((9001, True, 500.0), (9002, True, 1000.0), (9003, False, 2000.0))

#: Collections a world file may replace, and keys of a ``GET /_sim/state`` dump that a world file ignores.
WORLD_FILE_KEYS = frozenset(
    {
        "start_time",
        "user_id",
        "disk_price_per_gb_month",
        "list_limit",
        "bid_drift",
        "market",
        "credit",
        "machines",
        "offers",
        "templates",
        "deployments",
        "endpoints",
        "pending_price_increases",
        "api_keys",
        "cloud_integrations",
        "tfa",
    }
)
STATE_ONLY_KEYS = frozenset(
    {
        "now",
        "seed",
        "speed",
        "instances",
        "requests",
        "volume_asks",
        "faults",
        "internal_errors",
        "copies",
        "copy_settings",
        "data_dir",
        "account",
    }
)


#: What a bucket of the default world holds to begin with, by integration name: a tiny dataset for the staged-data
#: example (``example_gpumarket_staged_data``), so it runs as it is.
SAMPLE_BUCKET_FILES: dict[str, dict[str, bytes]] = {
    "training-data": {
        "datasets/mnist/train.csv": b"label,pixels\n5,0 0 3 18 18\n0,0 0 0 0 51\n4,0 0 0 0 0\n",
        "datasets/mnist/test.csv": b"label,pixels\n7,0 0 0 84 185\n2,0 0 116 125 171\n",
    }
}


def template_hash(name: str) -> str:
    """Template ids are derived from the name alone, so they are the same whatever the seed."""
    return hashlib.sha256(f"gpumarket-template:{name}".encode()).hexdigest()[:32]


def build_world(seed: int, start_time: float, overrides: dict[str, Any] | None = None) -> World:
    if overrides and "start_time" in overrides:
        start_time = _read_overrides({"start_time": overrides["start_time"]}, start_time)["start_time"]
    parts = _generate(seed, start_time)
    if overrides:
        changes = _read_overrides(overrides, start_time)
        endpoints = parts.pop("endpoints")
        deployment_endpoints = changes.pop(
            "deployment_endpoints", [e for e in endpoints if e["deployment_id"] is not None]
        )
        standalone = changes.pop("standalone_endpoints", [e for e in endpoints if e["deployment_id"] is None])
        parts.update(changes)
        parts["endpoints"] = deployment_endpoints + standalone
        if "offers" in changes and "machines" not in changes:
            # The generated offers are gone, and so are their machines; the account's own machines stay.
            parts["machines"] = [m for m in parts["machines"] if m.owned]
        # Offers may name machines the file does not list: those are created online and not owned.
        machines = {m.id: m for m in parts["machines"]}
        for offer in parts["offers"]:
            machines.setdefault(offer.machine_id, Machine(id=offer.machine_id, host_id=offer.host_id))
        parts["machines"] = list(machines.values())
        if parts["market"] is not None and "offers" not in changes:
            add_hosts(parts["machines"], parts["offers"], GPU_TYPES, seed, parts["market"])
    return World(seed=seed, **parts)


def load_world_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read world file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"world file {path} must hold a JSON object")
    _read_overrides(data, 0.0)  # fail at start-up, not at the first reset
    return data


# --- generation ---------------------------------------------------------------------------------------------
def _generate(seed: int, start_time: float) -> dict[str, Any]:
    rng = random.Random(f"gpumarket-world-{seed}")
    user_id = rng.randint(100_000, 999_999)
    hosts = [60_000 + rng.randint(0, 9_999) for _ in range(8)]
    machines: list[Machine] = []
    offers: list[Offer] = []
    for type_index, (gpu_name, gpu_ram, price, dlperf) in enumerate(GPU_TYPES):
        for slot in range(6):
            i = type_index * 6 + slot
            num_gpus, factor, reliability, verified, listed, fate = _slot(rng, slot, type_index)
            host_id = rng.choice(hosts)
            machine = Machine(
                id=11_000 + i * 7 + rng.randint(0, 6),
                host_id=host_id,
                public_ip=f"{rng.choice(('198.51.100', '203.0.113'))}.{rng.randint(2, 254)}",
                disk_gb=float(rng.choice((500, 1000, 2000, 4000))),
            )
            machines.append(machine)
            dph = round(price * factor * num_gpus, 4)
            offers.append(
                Offer(
                    id=3_100_000 + i * 100 + rng.randint(0, 99),
                    machine_id=machine.id,
                    host_id=host_id,
                    num_gpus=num_gpus,
                    gpu_name=gpu_name,
                    gpu_ram=float(gpu_ram),
                    dph_total=dph,
                    reliability=round(reliability, 4),
                    verified=verified,
                    direct_port_count=rng.choice((16, 32, 64, 100)) if slot == 0 else rng.choice((0, 8, 32, 100)),
                    dlperf_per_dphtotal=round(dlperf * num_gpus * rng.uniform(0.9, 1.05) / dph, 2),
                    listed=listed,
                    fate=fate,
                )
            )
    machines += [
        Machine(
            id=mid,
            host_id=user_id,
            online=online,
            owned=True,
            public_ip=f"192.0.2.{mid - 9000}",
            disk_gb=disk,
        )
        for mid, online, disk in OWNED_MACHINES
    ]
    # Bandwidth prices draw from their own stream, so adding them changed no other part of the world.
    inet = random.Random(f"gpumarket-inet-{seed}")
    for offer in offers:
        offer.inet_up_cost = round(inet.uniform(0.001, 0.02), 4)
        offer.inet_down_cost = round(inet.uniform(0.001, 0.02), 4)
    speeds = random.Random(f"gpumarket-inet-down-{seed}")
    for offer in offers:
        offer.inet_down = draw_inet_down(speeds, *HostProfile().inet_down_mbps)
    parts: dict[str, Any] = {
        "start_time": start_time,
        "user_id": user_id,
        "machines": machines,
        "offers": offers,
        "templates": _default_templates(rng),
        "list_limit": DEFAULT_LIST_LIMIT,
        "disk_price_per_gb_month": DEFAULT_DISK_PRICE_PER_GB_MONTH,
        "bid_drift": None,
        "market": None,
        "credit": DEFAULT_CREDIT,
        "api_keys": [
            _api_key(1, user_id, "api", "default", None, None, None),
            _api_key(2, user_id, "scoped", "ci-readonly", 31, "ml-platform", False),
        ],
        "cloud_integrations": [  # their buckets begin empty but for SAMPLE_BUCKET_FILES
            {"id": 1, "cloud_type": "s3", "name": "training-data"},
            {"id": 2, "cloud_type": "gdrive", "name": "shared-models"},
            {"id": 3, "cloud_type": "backblaze", "name": "checkpoints"},
        ],
        "tfa": _default_tfa(rng),
    }
    parts["deployments"], parts["endpoints"] = _default_serverless(start_time)
    parts["pending_price_increases"] = _default_pending(rng, start_time, hosts)
    return parts


def _slot(rng: random.Random, slot: int, type_index: int) -> tuple[int, float, float, bool, bool, str]:
    """(num_gpus, price factor, reliability, verified, listed, fate) of one of the six offers of a GPU type.

    Slot 0 is the cheapest rentable offer of its type and always boots, so a default demo works. Slot 3 is the
    failing host: low reliability, unverified, priced above slot 0, and its instances end in exited, unknown
    or offline (by GPU type). Slot 4 is cheap but not rentable.
    """
    if slot == 0:
        return 1, 1.0, rng.uniform(0.985, 0.999), True, True, "running"
    if slot == 1:
        return 1, rng.uniform(1.05, 1.25), rng.uniform(0.95, 0.99), True, True, "running"
    if slot == 2:
        return (
            rng.choice((2, 4)),
            rng.uniform(1.0, 1.3),
            rng.uniform(0.93, 0.99),
            rng.random() < 0.5,
            True,
            "running",
        )
    if slot == 3:
        return 1, rng.uniform(1.1, 1.3), rng.uniform(0.55, 0.85), False, True, FATES[1 + type_index % 3]
    if slot == 4:
        return 1, 0.9, rng.uniform(0.96, 0.99), True, False, "running"
    return 8, rng.uniform(1.0, 1.2), rng.uniform(0.96, 0.995), True, True, "running"


def _api_key(
    key_id: int, user_id: int, key_type: str, name: str, team_id: int | None, team: str | None, owner: Any
) -> dict[str, Any]:
    return {
        "id": key_id,
        "user_id": user_id,
        "key": None,
        "key_type": key_type,
        "name": name,
        "team_id": team_id,
        "team_name": team,
        "team_owner": owner,
    }


def _default_templates(rng: random.Random) -> list[dict[str, Any]]:
    return [
        {
            "hash_id": template_hash("pytorch-jupyter"),
            "name": "pytorch-jupyter",
            "image": "pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime",
            # Templates store env in the flag-string form (spec, rule 1); it is parsed once, here.
            "env": parse_template_env("-e JUPYTER_DIR=/ -e DATA_DIR=/workspace -p 8080:8080"),
            "runtype": "jupyter_direct",
            "onstart": "echo template onstart ran",
            "disk": 32,
            "volume_info": {"volume_id": 77, "mount_path": "/data"},
        },
        {
            "hash_id": template_hash("private-trainer"),
            "name": "private-trainer",
            "image": "registry.example.com/team/trainer:1.4",
            "env": {"MODE": "train", "EPOCHS": "3"},
            "runtype": "ssh_direct",
            "onstart": "echo trainer ready",
            "disk": 50,
            "docker_login_repo": "registry.example.com",
            "docker_login_user": "ci-bot",
            "docker_login_pass": f"tok-{rng.getrandbits(64):016x}",
            "volume_info": {"volume_id": 88, "mount_path": "/checkpoints"},
        },
        {
            "hash_id": template_hash("cuda-ssh"),
            "name": "cuda-ssh",
            "image": "nvidia/cuda:12.4.1-runtime-ubuntu22.04",
            "env": {},
            "runtype": "ssh",
            "disk": 16,
        },
        {
            "hash_id": template_hash("vllm-args"),
            "name": "vllm-args",
            "image": "vllm/vllm-openai:latest",
            "env": {"-p 8000:8000": "1", "HF_HOME": "/workspace/hf"},
            "runtype": "args",
            "args_str": "--model facebook/opt-125m",
            "disk": 40,
        },
    ]


def _default_tfa(rng: random.Random) -> dict[str, Any]:
    return {
        "totp_secret": base64.b32encode(rng.getrandbits(160).to_bytes(20, "big")).decode().rstrip("="),
        "methods": [{"id": 1, "method": "totp"}, {"id": 2, "method": "sms"}, {"id": 3, "method": "email"}],
        "code": f"{rng.randrange(10**6):06d}",
        "tfa_secret": f"{rng.getrandbits(128):032x}",
        "backup_codes": [f"{rng.getrandbits(40):010x}" for _ in range(10)],
    }


def _default_serverless(start_time: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    deployments: list[dict[str, Any]] = []
    endpoints: list[dict[str, Any]] = []
    worker_id = 500
    for deployment_id, (name, tag) in enumerate((("llm-serve", "v1"), ("llm-serve", "v2"), ("embedder", "prod")), 1):
        endpoint_id = 100 + deployment_id
        endpoints.append(
            {
                "id": endpoint_id,
                **ENDPOINT_DEFAULTS,
                "endpoint_name": f"{name}-{tag}",
                "deployment_id": deployment_id,
                "deleted": False,
                "created_at": start_time - 86400,
            }
        )
        workers = []
        for _ in range(2):
            worker_id += 1
            workers.append({"id": worker_id, "endpoint_id": endpoint_id, "deleted": False})
        deployments.append(
            {
                "id": deployment_id,
                "name": name,
                "tag": tag,
                "deleted": False,
                "deleted_at": None,
                "endpoint_ids": [endpoint_id],
                "workers": workers,
            }
        )
    return deployments, endpoints


def _default_pending(rng: random.Random, start_time: float, hosts: list[int]) -> list[dict[str, Any]]:
    records = []
    for k in range(1, 4):
        old_gpu = round(rng.uniform(0.00005, 0.0008), 8)
        old_disk = round(rng.uniform(0.0000001, 0.000002), 10)
        end = start_time + rng.uniform(1, 30) * 86400
        records.append(
            {
                "pending_price_increase_id": k,
                "contract_id": 7_000_000 + k,
                "host_id": rng.choice(hosts),
                "new_gpu_costpersec": round(old_gpu * rng.uniform(1.05, 1.5), 8),
                "new_disk_ram_costpersec": round(old_disk * rng.uniform(1.0, 1.3), 10),
                "old_gpu_costpersec": old_gpu,
                "old_disk_ram_costpersec": old_disk,
                "contract_end_date": round(end, 3),
                "ask_end_date": round(end + rng.uniform(0, 30) * 86400, 3),
                "created_at": round(start_time - rng.uniform(0, 86400), 3),
            }
        )
    return records


# --- world file ---------------------------------------------------------------------------------------------
def _read_overrides(data: dict[str, Any], start_time: float) -> dict[str, Any]:
    unknown = set(data) - WORLD_FILE_KEYS - STATE_ONLY_KEYS
    if unknown:
        raise ValueError(f"unknown world file keys: {', '.join(sorted(unknown))}")
    try:
        return _convert(data, start_time)
    except (KeyError, TypeError, ValueError, ApiError) as exc:
        detail = exc.msg if isinstance(exc, ApiError) else f"{type(exc).__name__}: {exc}"
        raise ValueError(f"invalid world file: {detail}") from None


def _endpoint(e: dict[str, Any], deployment_id: int | None, start_time: float) -> dict[str, Any]:
    endpoint_id = int(e["id"])
    given = {k: v for k, v in e.items() if k not in ("id", "deployment_id", "deleted")}
    return {
        "id": endpoint_id,
        **ENDPOINT_DEFAULTS,
        "endpoint_name": f"endpoint-{endpoint_id}",
        "created_at": start_time,
        **given,
        "deployment_id": deployment_id,
        "deleted": bool(e.get("deleted", False)),
    }


def _competing_bid(offer: dict[str, Any]) -> float | None:
    price = offer.get("competing_bid")
    if price is not None and (not is_number(price) or price <= 0):
        raise ValueError(f"offer {offer.get('id')}: competing_bid must be a number of $/h > 0 or null")
    return None if price is None else float(price)


def _convert(data: dict[str, Any], start_time: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("start_time", "disk_price_per_gb_month"):
        if key in data:
            out[key] = float(data[key])
    for key in ("user_id", "list_limit"):
        if key in data:
            out[key] = int(data[key])
    if "bid_drift" in data:
        out["bid_drift"] = parse_drift(data["bid_drift"])
    if "market" in data:
        out["market"] = parse_profile(data["market"])
    if "credit" in data:
        if not is_number(data["credit"]):
            raise ValueError(f"credit must be a finite number of dollars, got {data['credit']!r}")
        out["credit"] = float(data["credit"])
    machines: dict[int, Machine] = {}
    if "machines" in data:
        for m in data["machines"]:
            machine = Machine(
                id=int(m["id"]),
                host_id=int(m.get("host_id", 60_000)),
                online=bool(m.get("online", True)),
                owned=bool(m.get("owned", False)),
                public_ip=str(m.get("public_ip", "198.51.100.1")),
                disk_gb=float(m.get("disk_gb", 1000.0)),
            )
            machines[machine.id] = machine
        out["machines"] = list(machines.values())
    if "offers" in data:
        offers = []
        for o in data["offers"]:
            fate = o.get("fate", "running")
            if fate not in FATES:
                raise ValueError(f"offer {o.get('id')}: fate must be one of {', '.join(FATES)}")
            gpu_check = o.get("gpu_check", "ok")
            if gpu_check not in GPU_CHECKS:
                raise ValueError(f"offer {o.get('id')}: gpu_check must be one of {', '.join(GPU_CHECKS)}")
            inet_down = o.get("inet_down", DEFAULT_INET_DOWN_MBPS)
            if not is_number(inet_down) or inet_down <= 0:
                raise ValueError(f"offer {o.get('id')}: inet_down must be a number of Mbps > 0, got {inet_down!r}")
            offer_id = int(o["id"])
            machine_id = int(o.get("machine_id", offer_id))
            offers.append(
                Offer(
                    id=offer_id,
                    machine_id=machine_id,
                    host_id=int(o.get("host_id", 60_000)),
                    num_gpus=int(o.get("num_gpus", 1)),
                    gpu_name=str(o["gpu_name"]),
                    gpu_ram=float(o.get("gpu_ram", 24576)),
                    dph_total=float(o["dph_total"]),
                    reliability=float(o.get("reliability", 0.99)),
                    verified=bool(o.get("verified", True)),
                    direct_port_count=int(o.get("direct_port_count", 32)),
                    dlperf_per_dphtotal=float(o.get("dlperf_per_dphtotal", 100.0)),
                    listed=bool(o.get("rentable", True)) or o.get("rented_by") is not None,
                    fate=fate,
                    rented_by="other" if o.get("rented_by") is not None else None,
                    competing_bid=_competing_bid(o),
                    inet_up_cost=float(o.get("inet_up_cost", DEFAULT_INET_COST_PER_GB)),
                    inet_down_cost=float(o.get("inet_down_cost", DEFAULT_INET_COST_PER_GB)),
                    inet_down=float(inet_down),
                    gpu_check=gpu_check,
                )
            )
        out["offers"] = offers
    if "templates" in data:
        templates = []
        for t in data["templates"]:
            template = dict(t)
            template["hash_id"] = str(t["hash_id"])
            template["env"] = parse_template_env(t.get("env"))
            templates.append(template)
        out["templates"] = templates
    if "deployments" in data:
        deployments, endpoints = [], []
        next_worker = 1
        for d_index, d in enumerate(data["deployments"], 1):
            deployment_id = int(d.get("id", d_index))
            endpoint_ids = []
            for e in d.get("endpoints", []):
                endpoints.append(_endpoint(e, deployment_id, start_time))
                endpoint_ids.append(endpoints[-1]["id"])
            workers = []
            for w in d.get("workers", []):
                worker_id = int(w.get("id", next_worker))
                next_worker = worker_id + 1
                workers.append(
                    {
                        "id": worker_id,
                        "endpoint_id": w.get("endpoint_id"),
                        "deleted": bool(w.get("deleted", False)),
                    }
                )
            deployments.append(
                {
                    "id": deployment_id,
                    "name": str(d["name"]),
                    "tag": d.get("tag"),
                    "deleted": bool(d.get("deleted", False)),
                    "deleted_at": d.get("deleted_at"),
                    "endpoint_ids": endpoint_ids,
                    "workers": workers,
                }
            )
        out["deployments"] = deployments
        out["deployment_endpoints"] = endpoints
    if "endpoints" in data:
        out["standalone_endpoints"] = [
            _endpoint(e, None, start_time) for e in data["endpoints"] if e.get("deployment_id") is None
        ]
    if "pending_price_increases" in data:
        out["pending_price_increases"] = [dict(p) for p in data["pending_price_increases"]]
        for p in out["pending_price_increases"]:
            int(p["pending_price_increase_id"])
    for key in ("api_keys", "cloud_integrations"):
        if key in data:
            out[key] = [{**dict(r), "id": int(r["id"])} for r in data[key]]
            if key == "api_keys":
                for record in out[key]:
                    record["key"] = None
    if "tfa" in data:
        tfa = dict(data["tfa"])
        base64.b32decode(tfa["totp_secret"].upper() + "=" * (-len(tfa["totp_secret"]) % 8))
        tfa.setdefault(
            "methods", [{"id": 1, "method": "totp"}, {"id": 2, "method": "sms"}, {"id": 3, "method": "email"}]
        )
        tfa.setdefault("code", "000000")
        tfa.setdefault("tfa_secret", "0" * 32)
        tfa["backup_codes"] = [str(c) for c in tfa.get("backup_codes", [])]
        tfa.pop("totp_code", None)
        out["tfa"] = tfa
    return out
