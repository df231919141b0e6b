"""`python -m bench.temporal_features`: the Temporal server's CPU per workflow for what the
engine's job workflow adds to the bare five-stage shape, one feature at a time.

The throughput figure measures the Temporal server at about 1.2 times its CPU per same-shape
workflow for an engine job. This splits that: the same-shape workflow (`bench/bare_workflows.py`)
is run on a fresh dev server (the engine's settings: fairness on, one partition) as variants
that each add one of the engine's Temporal-side features to the one before:

- `shape`: the bare five-stage shape, started by a client loop;
- `+start SAs`: started with the relay's three keyword search attributes (JobId, JobType,
  LifecycleStatus);
- `+priority/fairness`: and with the relay's priority key and a fairness key (16 users);
- `+patch marker`: and a `workflow.patched()` call first (the marker and the upsert of
  TemporalChangeVersion every five-stage run records);
- `+final upsert`: and the upsert of LifecycleStatus with the run's last commands.

The variants' order rotates per round; the median round is printed, in ms of the server's CPU
(utime + stime of its process) per workflow. Nothing of the engine runs: no PostgreSQL, no
relay, no stage code.

    .venv/bin/python -m bench.temporal_features --workflows 300 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from temporalio import workflow
from temporalio.client import Client
from temporalio.common import Priority, SearchAttributePair, TypedSearchAttributes
from temporalio.worker import Worker

from bench.bare_workflows import SHAPE_ACTIVITIES, ShapeWorkflow
from engine.search_attributes import JOB_ID, JOB_TYPE, LIFECYCLE_STATUS

FEATURES_WORKFLOW = "BenchFeaturesWorkflow"
PATCH = "bench-feature-patch"


@dataclass(frozen=True)
class Features:
    patch: bool = False
    upsert_end: bool = False


@workflow.defn(name=FEATURES_WORKFLOW, sandboxed=False)
class FeaturesWorkflow:
    """The same-shape workflow, with the patch call and the final upsert when asked."""

    @workflow.run
    async def run(self, job_id: str, features: Features) -> str:
        if features.patch:
            workflow.patched(PATCH)
        out = await ShapeWorkflow().run(job_id)
        if features.upsert_end:
            workflow.upsert_search_attributes([LIFECYCLE_STATUS.value_set("succeeded")])
        return out


@dataclass(frozen=True)
class Variant:
    search_attributes: bool
    priority: bool
    features: Features


VARIANTS: dict[str, Variant] = {
    "shape": Variant(False, False, Features()),
    "+start SAs": Variant(True, False, Features()),
    "+priority/fairness": Variant(True, True, Features()),
    "+patch marker": Variant(True, True, Features(patch=True)),
    "+final upsert": Variant(True, True, Features(patch=True, upsert_end=True)),
}


def start_options(v: Variant, job_id: str, i: int) -> dict[str, Any]:
    """What the client passes to `start_workflow` beside the workflow and its id."""
    kw: dict[str, Any] = {}
    if v.search_attributes:
        kw["search_attributes"] = TypedSearchAttributes(
            [
                SearchAttributePair(JOB_ID, job_id),
                SearchAttributePair(JOB_TYPE, "synthetic"),
                SearchAttributePair(LIFECYCLE_STATUS, "queued"),
            ]
        )
    if v.priority:
        kw["priority"] = Priority(
            priority_key=3, fairness_key=f"user-{i % 16}", fairness_weight=1.0
        )
    return kw


def worker(client: Client, task_queue: str) -> Worker:
    """The engine worker's concurrency settings (runtime/worker.py) for the variants."""
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[FeaturesWorkflow],
        activities=list(SHAPE_ACTIVITIES),
        max_concurrent_activities=2,
        max_concurrent_local_activities=200,
        max_concurrent_workflow_tasks=100,
    )


async def run_variant(client: Client, task_queue: str, name: str, n: int) -> list[str]:
    """`n` workflows of variant `name`, 32 at a time, each awaited; their ids."""
    v = VARIANTS[name]
    sem = asyncio.Semaphore(32)
    ids: list[str] = []

    async def one(i: int) -> None:
        async with sem:
            job_id = str(uuid.uuid4())
            wid = f"bench-features-{job_id}"
            ids.append(wid)
            await client.execute_workflow(
                FeaturesWorkflow.run,
                args=[job_id, v.features],
                id=wid,
                task_queue=task_queue,
                **start_options(v, job_id, i),
            )

    await asyncio.gather(*(one(i) for i in range(n)))
    return ids


def process_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(address: str, server_pid: int, n: int, rounds: int) -> dict[str, list[float]]:
    client = await Client.connect(address)
    queue = f"bench-features-{uuid.uuid4().hex[:8]}"
    out: dict[str, list[float]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    async with worker(client, queue):
        await run_variant(client, queue, names[-1], min(n, 100))  # warm-up
        for r in range(rounds):
            for k in range(len(names)):
                name = names[(r + k) % len(names)]
                cpu0 = process_cpu_s(server_pid)
                await run_variant(client, queue, name, n)
                out[name].append((process_cpu_s(server_pid) - cpu0) / n)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    from runtime.embedded import free_port, start_temporal

    p = argparse.ArgumentParser(prog="python -m bench.temporal_features")
    p.add_argument("--workflows", type=int, default=300, help="workflows per variant and round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    server = start_temporal(port=free_port(), ui_port=None, db_file=None)
    try:
        res = asyncio.run(measure(server.address, server.process.pid, args.workflows, args.rounds))
    finally:
        server.stop()
    base = statistics.median(res["shape"])
    print("| variant | Temporal server CPU ms per workflow (median) | ÷ shape | per round |")
    print("|---|---:|---:|---|")
    for name, v in res.items():
        m = statistics.median(v)
        rounds = ", ".join(f"{1e3 * x:.2f}" for x in v)
        print(f"| {name} | {1e3 * m:.2f} | {m / base:.2f} | {rounds} |")


if __name__ == "__main__":
    main()
