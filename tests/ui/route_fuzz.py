"""Fuzzing the provider's signed api-server routes: generated bodies and headers, signed and not, on any target.

Used by tests/ui/test_route_fuzz.py (the app in-process, on SQLite) and by tests/system/test_route_fuzz.py (the real
api-server of make system, on PostgreSQL). Each example is one POST; whatever it holds, the answer is never a 5xx,
a request not signed for its route with the connection's key answers 401 (413 when its body is too large), and an
answer of 4xx leaves every ledger and host memory row as it was (so the budgets' sums too). Examples are derived
from a fixed seed, so a run is repeatable.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from airflow_gpumarket import host_memory, ledger, signing


def valid_bodies(conn_id: str) -> dict[str, dict[str, Any]]:
    """One well-formed body for each signed route."""
    task_try = {"conn_id": conn_id, "dag_id": "fuzzed", "run_id": "r1", "task_id": "job", "map_index": 0,
                "try_number": 1}  # fmt: skip
    return {
        "/ledger/reserve": {
            **task_try,
            "attempt": 1,
            "worst": 0.1,
            "seconds": 60.0,
            "hourly": 0.1,
            "available": None,
            "team": None,
            "started": None,
        },  # fmt: skip
        "/ledger/attempts": task_try,
        "/ledger/attach": {"conn_id": conn_id, "id": 1, "instance_id": 5},
        "/ledger/settle": {"conn_id": conn_id, "id": 1, "instance_id": None, "ended": None, "cost": None},
        "/ledger/version": {"conn_id": conn_id},
        "/ledger/entries": {"conn_id": conn_id, "since": 0},
        "/hosts/remember": {
            "conn_id": conn_id,
            "machine_id": 7,
            "reason": "preflight",
            "detail": "x",
            "ttl_seconds": 60,
        },  # fmt: skip
        "/hosts/avoided": {"conn_id": conn_id},
        "/hosts/clear": {"conn_id": conn_id, "machine_id": 7},
        "/history/learned": {"conn_id": conn_id, "dag_id": "fuzzed", "task_id": "job", "image": "img:1"},
    }


ROUTES = tuple(valid_bodies("c"))

_EDGE_INTS = [0, -1, 1, 2**31 - 1, 2**31, -(2**31) - 1, 2**63 - 1, 2**63, -(2**63) - 1, 10**20, 10**400]
_EDGE_FLOATS = [float("nan"), float("inf"), float("-inf"), -0.0, 1e308, 5e-324, 1e9 + 1, 1e11 + 1]
_EDGE_TEXTS = ["", " ", "\x00", "a\x00b", "\ud800", "x\udfffy", "x" * 250, "x" * 251, "x" * 1001, "²", "fuzzed"]

#: Every edge value, whatever a field's kind: each is sent in each field of each route (``edge_requests``).
EDGES: list[Any] = [None, True, False, [], {}, [1], {"a": 1}, *_EDGE_INTS, *_EDGE_FLOATS, *_EDGE_TEXTS]

_ints = st.one_of(st.sampled_from(_EDGE_INTS), st.integers())
_floats = st.one_of(st.sampled_from(_EDGE_FLOATS), st.floats(allow_nan=True, allow_infinity=True))
_texts = st.one_of(st.sampled_from(_EDGE_TEXTS), st.text(max_size=20))
_scalars = st.one_of(st.none(), st.booleans(), _ints, _floats, _texts)
_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip
_header_text = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=80)


@st.composite
def _body(draw: Any, route: str, conn_id: str) -> bytes:
    """A body for ``route``: its valid one with a field changed, dropped or added, or something else entirely."""
    valid = valid_bodies(conn_id)[route]
    others = ["drop", "add", "object", "not_object", "bytes", "nested", "valid"]
    kind = draw(st.one_of(st.just("change"), st.sampled_from(others)))  # half the bodies change one field
    body: Any = dict(valid)
    if kind == "change":
        name = draw(st.sampled_from(sorted(valid)))
        body[name] = draw(_like(valid[name]))
    elif kind == "drop":
        body.pop(draw(st.sampled_from(sorted(valid))))
    elif kind == "add":
        body[draw(_texts)] = draw(_values)
    elif kind == "object":
        body = draw(st.dictionaries(st.text(max_size=10), _values, max_size=6))
    elif kind == "not_object":
        body = draw(_values)
    elif kind == "bytes":
        return draw(st.binary(max_size=200))
    elif kind == "nested":
        return b"[" * draw(st.sampled_from([1000, 10_000, 100_000]))
    return json.dumps(body, sort_keys=True).encode()  # NaN and Infinity written as Python writes them


def _like(value: Any) -> Any:
    """Values for a field whose valid value is ``value``: mostly of its kind (edge values first), else anything."""
    kind = {bool: st.booleans(), int: _ints, float: _floats, str: _texts}.get(type(value), _values)
    return st.one_of(kind, _values)


@dataclass(frozen=True)
class Sent:
    """One generated request, and whether it is signed for its route by the holder of the connection's key."""

    route: str
    content: bytes
    headers: dict[str, bytes]
    signed: bool


@st.composite
def requests_to(draw: Any, route: str, key: str, conn_id: str, other_conn_id: str) -> Sent:
    """A request to ``route``: signed properly, signed wrongly in one way, or with headers of any text."""
    content = draw(_body(route, conn_id))
    wrongs = ["other_route", "other_key", "other_conn", "stale", "garbage", "missing"]
    how = draw(st.one_of(st.just("signed"), st.sampled_from(wrongs)))  # half are signed as a task signs
    stamp = time.time() - (3600 if how == "stale" else 0)
    parts = {"conn_id": other_conn_id if how == "other_conn" else conn_id, "timestamp": str(int(stamp)),
             "nonce": secrets.token_hex(16)}  # fmt: skip
    signed_for = draw(st.sampled_from([r for r in ROUTES if r != route])) if how == "other_route" else route
    mac = signing.signature(
        key + "x" if how == "other_key" else key, method="POST", route=signed_for, body=content, **parts
    )
    headers = _encoded(signing.headers(signature=mac, **parts))
    signed_headers = sorted(signing.headers(signature=mac, **parts))
    if how == "garbage":
        headers[draw(st.sampled_from(signed_headers))] = draw(_header_text).encode()
    elif how == "missing":
        del headers[draw(st.sampled_from(signed_headers))]
    return Sent(route, content, headers, signed=how == "signed")


def _encoded(headers: dict[str, str]) -> dict[str, bytes]:
    return {"Content-Type": b"application/json", **{name: value.encode() for name, value in headers.items()}}


def signed(route: str, body: dict[str, Any], *, key: str, conn_id: str) -> Sent:
    """``body`` (written as Python's json writes it) to ``route``, signed as a task signs it."""
    content = json.dumps(body, sort_keys=True).encode()
    parts = {"conn_id": conn_id, "timestamp": str(int(time.time())), "nonce": secrets.token_hex(16)}
    mac = signing.signature(key, method="POST", route=route, body=content, **parts)
    return Sent(route, content, _encoded(signing.headers(signature=mac, **parts)), signed=True)


def edge_requests(route: str, *, key: str, conn_id: str) -> list[Sent]:
    """Signed requests to ``route`` whose valid body has one field set to each of ``EDGES``, or dropped."""
    valid = valid_bodies(conn_id)[route]
    bodies = [{**valid, name: edge} for name in sorted(valid) for edge in EDGES]
    bodies += [{k: v for k, v in valid.items() if k != name} for name in valid]
    bodies += [{**valid, name: edge} for name in _EDGE_TEXTS for edge in (float("nan"), "\ud800")]
    return [signed(route, body, key=key, conn_id=conn_id) for body in bodies]


@dataclass(frozen=True)
class Target:
    """Where the requests go: ``post`` answers a request's status; ``engine`` is the database the routes write, where
    the connection ``conn_id`` (of API key ``key``) owns the rows a request could write."""

    post: Callable[[Sent], int]
    engine: Any
    conn_id: str
    key: str

    def rows(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """The connection's ledger reservations and its account's host memory: what a refused request must leave."""
        r, h = ledger.RESERVATIONS, host_memory.HOSTS
        ledger.ensure_tables(self.engine)
        host_memory.ensure_table(self.engine)
        with self.engine.begin() as conn:
            reservations = conn.execute(select(r).where(r.c.conn_id == self.conn_id).order_by(r.c.id))
            account = host_memory.account_of(self.key)
            hosts = conn.execute(select(h).where(h.c.account == account).order_by(h.c.machine_id))
            return [tuple(row) for row in reservations], [tuple(row) for row in hosts]


def fuzz(target: Target, route: str, *, other_conn_id: str, examples: int) -> dict[int, int]:
    """Send ``examples`` generated requests to ``route``; the statuses seen, counted. Fails on the first answer that
    breaks a rule of this module. ``other_conn_id`` is a connection whose key is not the target's."""
    seen: dict[int, int] = {}

    @settings(
        max_examples=examples, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(sent=requests_to(route, target.key, target.conn_id, other_conn_id))
    def one(sent: Sent) -> None:
        status = check(target, sent)
        seen[status] = seen.get(status, 0) + 1

    one()
    return seen


def check(target: Target, sent: Sent) -> int:
    """The status the target answers ``sent``, once it is checked against this module's rules."""
    before = target.rows()
    status = target.post(sent)
    assert status < 500, f"{sent.route} answered {status} to {sent}"
    if not sent.signed:
        assert status in (401, 413), f"{sent.route} answered {status} to a request not signed for it: {sent}"
    if status >= 400:
        assert target.rows() == before, f"{sent.route} answered {status} but changed rows: {sent}"
    return status
