"""Fault injection: scripted or random error statuses, per-key rate limits, latency, dropped connections."""

from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

OPERATIONS = (
    "search_offers",
    "list_instances_v1",
    "current_user",
    "create_instance",
    "list_instances",
    "get_instance",
    "stop_instance",
    "destroy_instance",
    "change_bid",
    "request_instance_logs",
    "create_volume_listings",
    "create_endpoint",
    "regenerate_backup_codes",
    "delete_deployments",
    "list_pending_price_increases",
    "list_api_keys",
    "list_cloud_integrations",
    "list_charges",
    "list_invoices",
    "gpu_names",
    "instance_filters",
    "copy_direct",
    "cancel_copy_direct",
    "cloud_copy",
    "cancel_cloud_copy",
)
KINDS = ("status", "rate_limit", "latency", "drop")


@dataclass
class Rule:
    spec: dict[str, Any]
    endpoints: frozenset[str]  # empty means every operation
    kind: str
    times: int | None = None
    probability: float | None = None
    # token buckets of a rate_limit rule, per API key: key -> (tokens, real time of the last refill)
    buckets: dict[str, tuple[float, float]] = field(default_factory=dict)

    def applies_to(self, op: str) -> bool:
        return not self.endpoints or op in self.endpoints

    def fires(self, rng: random.Random) -> bool:
        """Consume one use of a times/probability rule; rules with neither always fire."""
        if self.times is not None:
            if self.times <= 0:
                return False
            self.times -= 1
            return True
        if self.probability is not None:
            return rng.random() < self.probability
        return True

    def view(self) -> dict[str, Any]:
        view = dict(self.spec)
        if self.times is not None:
            view["times_left"] = self.times
        return view


@dataclass
class Decision:
    """What the wire layer must do with one request."""

    delay: float = 0.0
    drop_before: bool = False
    drop_after: bool = False
    status: int | None = None
    error: str = ""
    msg: str = ""
    #: Answer ``msg`` as plain text instead of the error object (the live service's 429s).
    text: bool = False
    headers: dict[str, str] = field(default_factory=dict)


def parse_rules(rules: Any) -> list[Rule]:
    """Validate fault rules; raises ValueError with a message naming the bad rule."""
    if not isinstance(rules, list):
        raise ValueError("fault rules must be a list of objects")
    return [_parse_rule(i, spec) for i, spec in enumerate(rules)]


def _number(spec: dict[str, Any], name: str, where: str, *, minimum: float = 0.0) -> float:
    value = spec.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < minimum:
        raise ValueError(f"{where}: {name} must be a number >= {minimum:g}")
    return float(value)


def _parse_rule(index: int, spec: Any) -> Rule:
    where = f"rule {index}"
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: must be an object")
    kind = spec.get("kind")
    if kind not in KINDS:
        raise ValueError(f"{where}: kind must be one of {', '.join(KINDS)}")
    endpoint = spec.get("endpoint", "*")
    names = [endpoint] if isinstance(endpoint, str) else endpoint
    if not isinstance(names, list) or not names or any(n != "*" and n not in OPERATIONS for n in names):
        raise ValueError(f"{where}: endpoint must be '*' or operation names from {', '.join(OPERATIONS)}")
    rule = Rule(spec=dict(spec), endpoints=frozenset() if "*" in names else frozenset(names), kind=kind)
    if "times" in spec and "probability" in spec:
        raise ValueError(f"{where}: give times or probability, not both")
    if "times" in spec:
        times = spec["times"]
        if isinstance(times, bool) or not isinstance(times, int) or times < 0:
            raise ValueError(f"{where}: times must be an integer >= 0")
        rule.times = times
    if "probability" in spec:
        rule.probability = _number(spec, "probability", where)
        if rule.probability > 1:
            raise ValueError(f"{where}: probability must be between 0 and 1")
    if kind == "status":
        status = spec.get("status")
        if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
            raise ValueError(f"{where}: status must be an HTTP error status from 400 to 599")
    if kind == "rate_limit":
        _number(spec, "capacity", where, minimum=1)
        _number(spec, "per_second", where)
    if kind == "latency":
        _number(spec, "seconds", where)
    if "retry_after" in spec and not isinstance(spec["retry_after"], bool):
        _number(spec, "retry_after", where)
    if "reset_after" in spec:
        _number(spec, "reset_after", where)
    if spec.get("body", "json") not in ("json", "text"):
        raise ValueError(f"{where}: body must be json or text")
    if "after" in spec and not isinstance(spec["after"], bool):
        raise ValueError(f"{where}: after must be true or false")
    return rule


class Faults:
    """The current rule list; thread-safe. ``decide`` is called once per API request."""

    def __init__(self, seed: int) -> None:
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._rng = random.Random(f"gpumarket-faults-{seed}")

    @property
    def active(self) -> bool:
        return bool(self._rules)

    def set_rules(self, rules: Any) -> None:
        parsed = parse_rules(rules)
        with self._lock:
            self._rules = parsed

    def clear(self, seed: int | None = None) -> None:
        with self._lock:
            self._rules = []
            if seed is not None:
                self._rng = random.Random(f"gpumarket-faults-{seed}")

    def view(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r.view() for r in self._rules]

    def decide(self, op: str, key: str) -> Decision:
        """Evaluate the rules in order: latency adds up; the first drop, 429 or status that fires wins."""
        decision = Decision()
        with self._lock:
            for rule in self._rules:
                if not rule.applies_to(op):
                    continue
                if rule.kind == "latency":
                    if rule.fires(self._rng):
                        decision.delay += float(rule.spec["seconds"])
                elif decision.status is None and not decision.drop_before and not decision.drop_after:
                    self._decide_one(rule, key, decision)
        return decision

    def _decide_one(self, rule: Rule, key: str, decision: Decision) -> None:
        spec = rule.spec
        if rule.kind == "drop":
            if rule.fires(self._rng):
                if spec.get("after", False):
                    decision.drop_after = True
                else:
                    decision.drop_before = True
        elif rule.kind == "rate_limit":
            wait = self._take_token(rule, key)
            if wait is not None and rule.fires(self._rng):
                decision.status = 429
                decision.error = "rate_limited"
                decision.msg = "Too many requests; slow down"
                if spec.get("body") == "text":
                    decision.text = True
                    decision.msg = "API requests too frequent"
                retry_after = spec.get("retry_after", True)
                if retry_after is True:
                    decision.headers["Retry-After"] = str(max(1, math.ceil(wait)))
                elif retry_after is not False:
                    decision.headers["Retry-After"] = f"{retry_after:g}"
        elif rule.fires(self._rng):
            decision.status = int(spec["status"])
            decision.error = str(spec.get("error", "injected_fault"))
            decision.msg = str(spec.get("msg", f"Injected fault: HTTP {decision.status}"))
            retry_after = spec.get("retry_after")
            if retry_after is True:
                decision.headers["Retry-After"] = "1"
            elif retry_after not in (None, False):
                decision.headers["Retry-After"] = f"{retry_after:g}"
            if "reset_after" in spec:  # X-RateLimit-Reset as epoch seconds, as quota answers carry it
                decision.headers["X-RateLimit-Reset"] = str(int(time.time() + float(spec["reset_after"])))
            if spec.get("body") == "text":
                decision.text = True

    @staticmethod
    def _take_token(rule: Rule, key: str) -> float | None:
        """Take a token from the key's bucket; None when allowed, else the real seconds until one is back."""
        capacity = float(rule.spec["capacity"])
        per_second = float(rule.spec["per_second"])
        now = time.monotonic()
        tokens, last = rule.buckets.get(key, (capacity, now))
        tokens = min(capacity, tokens + (now - last) * per_second)
        if tokens >= 1.0:
            rule.buckets[key] = (tokens - 1.0, now)
            return None
        rule.buckets[key] = (tokens, now)
        return (1.0 - tokens) / per_second if per_second > 0 else 60.0
