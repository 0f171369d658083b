"""`make fleet`: many jobs at once on one API key, on a production-shaped Airflow deployment.

The deployment is `make system`'s production shape (tests/system/deployment.py: PostgreSQL, CeleryExecutor with
Redis, two schedulers, two triggerers, two Celery workers, a dag-processor, the api-server) against the simulator's
live profile with its published rate limits on. One run of the `fleet` DAG (bench/fleet_dags/fleet.py) starts
``--deferred`` deferrable RunJobs and ``--sync`` sync ones at once, every one on the same key. No retries: a task
that fails shows.

Printed, a person or a script can read it:

    FLEET deployment: executor=CeleryExecutor database=postgresql schedulers=2 triggerers=2 workers=2
    FLEET tasks: ...            every TI's end state (goal: all success)
    FLEET leaked: N             instances alive after every TI ended (goal: 0)
    FLEET double rentals: N     TIs with two instances alive at one moment (goal: 0)
    FLEET 429: ...              429s the simulator answered, per operation; unrecovered = failed TIs whose log
                                names a 429 (goal: 0)
    FLEET job end -> success:   from the job's last command (its `fleet-end` line) to the TI's end_date
    FLEET: PASS|FAIL ...        the last line

    python -m bench.fleet                          # 200 deferred + 20 sync (make fleet)
    python -m bench.fleet --deferred 20 --sync 4   # a quick look
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import sys
import threading
import time
from datetime import datetime

from tests.system.deployment import PRODUCTION, ROOT, Deployment, Workload, clip, interrupt_on_signals

DAGS_FOLDER = ROOT / "bench" / "fleet_dags"
sys.path.insert(0, str(DAGS_FOLDER))
from fleet_dag import END_MARK, gpu_name  # noqa: E402 - the DAG file's own names, so both sides agree

#: Simulated seconds per real second. 10x, as P1-HA: the create bucket (one per 4.5 s) lets about 2.2 creates a
#: second through, so renting 220 instances takes at least 100 s.
SPEED = 10.0
#: Task slots of each Celery worker: the sync jobs hold one each for their whole run.
WORKER_CONCURRENCY = 16
TIMEOUT = 40 * 60  # seconds from the trigger until the run is given up
FINISHED = {"success", "failed", "skipped", "upstream_failed", "removed"}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def epoch(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() if iso else None


class Fleet:
    def __init__(self, counts: dict[str, int], job_seconds: int) -> None:
        self.counts = counts
        self.job_seconds = job_seconds
        offers = tuple(
            {"id": 800_000 + 10 * (1000 * t + i) + k, "gpu_name": gpu_name(task_id, i), "dph_total": 1.0 + k / 10}
            for t, (task_id, count) in enumerate(counts.items())
            for i in range(count)
            for k in range(2)
        )
        workload = Workload("fleet", DAGS_FOLDER, frozenset({"fleet"}), offers, SPEED, WORKER_CONCURRENCY)
        self.deployment = Deployment(PRODUCTION, workload)
        self.started = time.time()
        self.stop = threading.Event()
        self.run_id = f"fleet-{time.strftime('%H%M%S')}"
        self.tis: list[dict] = []

    def say(self, text: str) -> None:
        print(f"  {time.time() - self.started:6.1f}s  {text}", flush=True)

    def supervise(self) -> None:
        while not self.stop.wait(2.0):
            try:
                self.deployment.supervise(self.say)
            except Exception as exc:  # noqa: BLE001 - a supervisor that died would hide every later death
                self.say(f"supervisor: {type(exc).__name__}: {exc}")

    def task_instances(self) -> list[dict]:
        """Every TI of the run, page by page (the api-server answers at most 100 at a time)."""
        path = f"/dags/fleet/dagRuns/{self.run_id}/taskInstances"
        found: list[dict] = []
        while True:
            page = self.deployment.api.call("GET", path, limit=100, offset=len(found))["task_instances"]
            found += page
            if len(page) < 100:
                return found

    def run(self) -> None:
        os.environ["GPUMARKET_FLEET_DEFERRED"] = str(self.counts["deferred"])
        os.environ["GPUMARKET_FLEET_SYNC"] = str(self.counts["sync"])
        os.environ["GPUMARKET_FLEET_JOB_SECONDS"] = str(self.job_seconds)
        self.deployment.start(self.say)
        self.deployment.wait_ready(self.say)
        threading.Thread(target=self.supervise, daemon=True).start()
        api = self.deployment.api
        api.call("POST", "/dags/fleet/dagRuns", {"logical_date": None, "dag_run_id": self.run_id})
        total = sum(self.counts.values())
        self.say(f"triggered {self.run_id}: {self.counts['deferred']} deferred + {self.counts['sync']} sync jobs")
        deadline = time.time() + TIMEOUT
        shown = ""
        while True:
            self.tis = self.task_instances()
            states = collections.Counter(str(ti.get("state")) for ti in self.tis)
            line = ", ".join(f"{state} {n}" for state, n in sorted(states.items()))
            if line != shown:
                self.say(line)
                shown = line
            if len(self.tis) == total and all(ti.get("state") in FINISHED for ti in self.tis):
                return
            if time.time() > deadline:
                raise TimeoutError(f"the fleet's TIs had not all ended {TIMEOUT} s after the trigger: {line}")
            time.sleep(5)

    def task_log(self, ti: dict) -> str:
        folder = (
            self.deployment.home
            / "logs"
            / "dag_id=fleet"
            / f"run_id={self.run_id}"
            / f"task_id={ti['task_id']}"
            / f"map_index={ti['map_index']}"
        )
        return "".join(p.read_text(errors="replace") for p in sorted(folder.rglob("*")) if p.is_file())

    def report(self) -> bool:
        """The FLEET lines; True when every goal was met."""
        sim = self.deployment.sim
        assert sim is not None
        # A task that failed may leave its destroy to the failure callback, which runs after the TI ended.
        grace = time.time() + 60
        while time.time() < grace and any(not i["destroyed"] for i in sim.refresh()):
            time.sleep(2)
        instances = sim.refresh()
        refused: dict[str, int] = sim.get("/_sim/rate-limits").get("refused", {})
        shape = self.deployment.shape
        print(shape.line().replace("SYS deployment", "FLEET deployment"))

        states = collections.Counter(str(ti.get("state")) for ti in self.tis)
        failed = [ti for ti in self.tis if ti.get("state") != "success"]
        total = sum(self.counts.values())
        print(
            f"FLEET tasks: {total} ({self.counts['deferred']} deferred, {self.counts['sync']} sync, one API key, "
            f"jobs of {self.job_seconds} s): {dict(sorted(states.items()))} (goal: all success)"
        )
        for ti in failed[:5]:
            print(f"  not success: {ti['task_id']}[{ti['map_index']}] {ti.get('state')}")

        alive = [i for i in instances if not i["destroyed"]]
        print(f"FLEET leaked: {len(alive)} alive after every TI ended (goal: 0) {[i['id'] for i in alive] or ''}")

        by_gpu: dict[str, list[dict]] = collections.defaultdict(list)
        for instance in instances:
            by_gpu[instance.get("gpu_name")].append(instance)
        doubles = []
        for name, rented in by_gpu.items():
            spans = sorted((i["created_at"], i["destroyed_at"] or float("inf")) for i in rented)
            if any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:], strict=False)):
                doubles.append(name)
        rerented = sum(1 for rented in by_gpu.values() if len(rented) > 1)
        print(
            f"FLEET double rentals: {len(doubles)} TIs with two instances alive at once (goal: 0); "
            f"{rerented} rented a second time after the first was gone {doubles[:5] or ''}".rstrip()
        )

        unrecovered = [ti for ti in failed if re.search(r"\b429\b|too frequent", self.task_log(ti), re.I)]
        print(
            f"FLEET 429: {sum(refused.values())} answered by the simulator {dict(sorted(refused.items()))}; "
            f"unrecovered (a failed TI whose log names a 429): {len(unrecovered)} (goal: 0)"
        )

        ends = self.job_ends(instances)
        ok_timing = True
        for task_id in self.counts:
            delays = []
            for ti in self.tis:
                if ti["task_id"] != task_id or ti.get("state") != "success":
                    continue
                job_end = ends.get(gpu_name(task_id, ti["map_index"]))
                success = epoch(ti.get("end_date"))
                if job_end is not None and success is not None:
                    delays.append(success - job_end)
            if not delays:
                print(f"FLEET job end -> success ({task_id}): no figures")
                ok_timing = False
                continue
            print(
                f"FLEET job end -> success ({task_id}, {len(delays)} TIs): median {statistics.median(delays):.1f} s, "
                f"p99 {percentile(delays, 0.99):.1f} s, max {max(delays):.1f} s"
            )
        print(f"FLEET wall-clock: {time.time() - self.started:.0f} s")
        restarts = self.deployment.restarts
        print(f"FLEET components restarted after dying on their own: {len(restarts)} {restarts or ''}".rstrip())
        return states.get("success", 0) == total and not alive and not doubles and not unrecovered and ok_timing

    def job_ends(self, instances: list[dict]) -> dict[str, float]:
        """GPU name -> the real epoch second printed by the job's `fleet-end` line (the last instance's)."""
        sim = self.deployment.sim
        assert sim is not None
        ends: dict[str, float] = {}
        for instance in sorted(instances, key=lambda i: i["created_at"]):
            output = sim.get(f"/_sim/instances/{instance['id']}/onstart").get("output") or ""
            found = re.findall(rf"^{END_MARK} (\d+\.\d+)$", output, re.M)
            if found:
                ends[instance["gpu_name"]] = float(found[-1])
        return ends


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deferred", type=int, default=200, help="deferrable RunJobs (default 200)")
    parser.add_argument("--sync", type=int, default=20, help="sync RunJobs, each holding a worker slot (default 20)")
    parser.add_argument("--job-seconds", type=int, default=60, help="how long each job runs (default 60)")
    args = parser.parse_args()
    for name in ("deferred", "sync", "job_seconds"):
        if getattr(args, name) < (1 if name == "job_seconds" else 0) or getattr(args, name) > 900:
            parser.error(f"--{name.replace('_', '-')} must be between 0 and 900 (got {getattr(args, name)})")

    interrupt_on_signals()
    fleet = Fleet({"deferred": args.deferred, "sync": args.sync}, args.job_seconds)
    ok = False
    try:
        fleet.run()
        ok = True
    except KeyboardInterrupt:
        print("interrupted: counting what is alive and stopping what this script started", flush=True)
    except Exception as exc:  # noqa: BLE001 - report, count and clean up whatever broke
        print(f"fleet could not run: {type(exc).__name__}: {clip(str(exc), 600)}", flush=True)
    finally:
        fleet.stop.set()
        try:
            if fleet.deployment.sim is not None:
                ok = fleet.report() and ok
            if not ok:
                print(f"Logs: Airflow home {fleet.deployment.home}")
        finally:
            fleet.deployment.stop()
        print(f"FLEET: {'PASS' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
