"""The provider's signed routes fuzzed against the deployment's real api-server, on PostgreSQL (tests/ui/route_fuzz.py):
what SQLite lets through (NUL in strings, integers past a column's type) is refused here as everywhere, with a 4xx.

The requests name connections of their own, defined in the deployment's database as an operator would: the routes
write only their rows, so the scenarios running beside them are not disturbed, and the rows are checked alone.
"""

from __future__ import annotations

import secrets
import subprocess

import pytest
import requests
from sqlalchemy import create_engine
from ui.route_fuzz import ROUTES, Sent, Target, check, edge_requests, fuzz

from .deployment import BIN
from .scenario import SystemDeployment

pytestmark = pytest.mark.system

CONN = "gpumarket_fuzz"
HTTP_CONN = "http_fuzz"
#: Generated requests per route and other connection: ten routes, two others.
EXAMPLES = 40


@pytest.fixture(scope="module")
def target(deployment: SystemDeployment):
    key = secrets.token_hex(16)
    for conn_id, kind in ((CONN, "gpumarket"), (HTTP_CONN, "http")):
        command = [str(BIN / "airflow"), "connections", "add", conn_id, "--conn-type", kind, "--conn-password", key,
                   "--conn-host", "http://127.0.0.1:9"]  # fmt: skip
        added = subprocess.run(command, env=deployment.env, capture_output=True, text=True, timeout=120, check=False)
        assert added.returncode == 0, added.stdout + added.stderr
    session = requests.Session()
    app = f"{deployment.api.base}/gpumarket"

    def post(sent: Sent) -> int:
        return session.post(app + sent.route, data=sent.content, headers=sent.headers, timeout=60).status_code

    engine = create_engine(deployment.postgres.url)
    yield Target(post, engine, CONN, key)
    engine.dispose()


def test_route_fuzz(target: Target):
    """Every route: each edge value in each field, then generated requests; no 5xx, no row written by a 4xx."""
    statuses: dict[int, int] = {}
    for route in ROUTES:
        for sent in edge_requests(route, key=target.key, conn_id=target.conn_id):
            status = check(target, sent)
            statuses[status] = statuses.get(status, 0) + 1
        for other in (HTTP_CONN, "gpumarket_nowhere"):
            for status, count in fuzz(target, route, other_conn_id=other, examples=EXAMPLES).items():
                statuses[status] = statuses.get(status, 0) + count
    print(f"SYS route fuzz: {sum(statuses.values())} requests, statuses {dict(sorted(statuses.items()))}")
    assert not any(status >= 500 for status in statuses)
