"""The Temporal baseline: a bare workflow with one no-op regular activity, and its worker.

`python -m bench.baseline worker --address A --task-queue Q` runs the worker with the same
settings as the engine's `ai-interactive` worker (runtime/worker.py): max_concurrent_activities =
AI_INTERACTIVE_CONCURRENCY, 200 local activities, 100 workflow tasks, the sandboxed runner with
this package passed through (as the engine passes its own workflow modules through). The client
side (a plain start loop, direct start latency) is in `bench/figures.py`.

This module is also the workflow's module, which the sandbox imports: keep its top-level imports
to the standard library and temporalio.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from datetime import timedelta

from temporalio import activity, workflow

from bench.teardown import hard_exit

NOOP_WORKFLOW = "BenchNoopWorkflow"
NOOP_ACTIVITY = "bench_noop"


@activity.defn(name=NOOP_ACTIVITY)
async def noop() -> None:
    return None


@workflow.defn(name=NOOP_WORKFLOW)
class NoopWorkflow:
    @workflow.run
    async def run(self) -> None:
        await workflow.execute_activity(NOOP_ACTIVITY, start_to_close_timeout=timedelta(seconds=30))


async def run_worker(args: argparse.Namespace) -> None:
    from temporalio.client import Client
    from temporalio.worker import Worker
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    client = await Client.connect(args.address, namespace=args.namespace)
    worker = Worker(
        client,
        task_queue=args.task_queue,
        workflows=[NoopWorkflow],
        activities=[noop],
        max_concurrent_activities=args.max_concurrent_activities,
        max_concurrent_local_activities=args.max_concurrent_local_activities,
        max_concurrent_workflow_tasks=args.max_concurrent_workflow_tasks,
        workflow_runner=SandboxedWorkflowRunner(
            restrictions=SandboxRestrictions.default.with_passthrough_modules("bench")
        ),
    )
    async with worker:
        print(f"baseline worker polling {args.task_queue}", file=sys.stderr, flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.baseline")
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="run the baseline worker until SIGTERM")
    w.add_argument("--address", required=True)
    w.add_argument("--namespace", default="default")
    w.add_argument("--task-queue", required=True)
    w.add_argument("--max-concurrent-activities", type=int, default=2)
    w.add_argument("--max-concurrent-local-activities", type=int, default=200)
    w.add_argument("--max-concurrent-workflow-tasks", type=int, default=100)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(run_worker(args))
    hard_exit(0)


if __name__ == "__main__":
    main()
