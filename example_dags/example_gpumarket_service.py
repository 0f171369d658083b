"""A GPU as a service for a task group: a server rented once, mapped tasks sending it shards, then the teardown.

``serve`` rents an instance whose command starts a server and hands it over once the server answers ``GET /``
with the rental's credential. Each ``embed`` task (one per shard) reaches it with ``connect_service("serve")``:
the address is read from the instance, the credential derived from the connection; neither is in XCom. ``stop``
destroys the instance whatever happened to the group, and the instance destroys itself at its lease should even
that never run.

The server here is a stand-in for a model server (vLLM, TGI, an embedding server): a few lines of Python that
answer each text's length. A real one listens on ``$GPUMARKET_SERVICE_PORT`` over TLS with the certificate made on
the instance, and requires ``$GPUMARKET_SERVICE_TOKEN``, e.g. ``vllm serve <model> --port "$GPUMARKET_SERVICE_PORT"
--ssl-certfile "$GPUMARKET_SERVICE_CERT" --ssl-keyfile "$GPUMARKET_SERVICE_KEY" --api-key
"$GPUMARKET_SERVICE_TOKEN"``.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.common.compat.sdk import DAG, task

from airflow_gpumarket.operators.service import GpuMarketServiceOperator
from airflow_gpumarket.operators.teardown import GpuMarketDestroyInstanceOperator

POLL_SECONDS = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))
#: A stand-in model server: refuses a request without the rental's credential, answers each text's length.
SERVER = """python3 - <<'PY'
import http.server, json, os
expected = "Bearer " + os.environ["GPUMARKET_SERVICE_TOKEN"]
class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self, status, doc):
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def allowed(self):
        if self.headers.get("Authorization") == expected:
            return True
        self.answer(401, dict(error="a bearer credential is required"))
        return False
    def do_GET(self):
        if self.allowed():
            self.answer(200, dict(status="ready"))
    def do_POST(self):
        if self.allowed():
            texts = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"[]")
            self.answer(200, dict(lengths=[len(text) for text in texts]))
    def log_message(self, *args):
        pass
import ssl
server = http.server.ThreadingHTTPServer(("0.0.0.0", int(os.environ["GPUMARKET_SERVICE_PORT"])), Handler)
tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
tls.load_cert_chain(os.environ["GPUMARKET_SERVICE_CERT"], os.environ["GPUMARKET_SERVICE_KEY"])
server.socket = tls.wrap_socket(server.socket, server_side=True)
server.serve_forever()
PY
"""
SHARDS = [["a", "bb"], ["ccc"], ["dddd", "eeeee", "f"]]

with DAG(
    dag_id="example_gpumarket_service",
    start_date=datetime(2026, 1, 1),
    schedule=None,
    catchup=False,
    tags=["gpumarket", "example"],
) as dag:
    serve = GpuMarketServiceOperator(
        task_id="serve",
        offer_filters={"num_gpus": {"eq": 1}, "gpu_name": {"eq": "RTX 4090"}},
        image="pytorch/pytorch:latest",
        command=SERVER,
        ready_path="/",
        ready_timeout=timedelta(minutes=15),
        lease=timedelta(hours=2),
        poll_interval=POLL_SECONDS,
    )

    @task(retries=2)
    def embed(texts: list[str]) -> list[int]:
        from airflow_gpumarket.service_client import connect_service

        service = connect_service("serve")
        with service.client() as client:
            return client.post("/embed", json=texts).raise_for_status().json()["lengths"]

    @task
    def gather(lengths: list[list[int]]) -> int:
        return sum(sum(each) for each in lengths)

    stop = GpuMarketDestroyInstanceOperator(task_id="stop", instance_id=serve.output)
    embedded = embed.expand(texts=SHARDS)
    serve >> embedded
    gather(embedded) >> stop.as_teardown(setups=serve)
