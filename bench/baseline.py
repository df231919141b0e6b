"""The Temporal baselines' worker: `python -m bench.baseline worker --shape one|five --address A
--task-queue Q` runs one of the bare workflows of `bench/bare_workflows.py` (`one`: a no-op
regular activity; `five`: the engine's stage shape, four local activities and one regular one)
with the same settings as the engine's `ai-interactive` worker (runtime/worker.py):
max_concurrent_activities = AI_INTERACTIVE_CONCURRENCY, 200 local activities, 100 workflow tasks,
the sandboxed runner with the workflow's module re-imported in each run's sandbox (the engine
passes only its pure `engine` package and pydantic through, which a bare workflow does not
import). The task queue has the dev server's one partition, as the engine's has. The client side
(a plain start loop, direct start latency) is in `bench/figures.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bench.bare_workflows import (
    NOOP_ACTIVITY,
    NOOP_WORKFLOW,
    SHAPE_ACTIVITIES,
    SHAPE_WORKFLOW,
    NoopWorkflow,
    ShapeWorkflow,
    noop,
)
from bench.teardown import hard_exit

if TYPE_CHECKING:
    from temporalio.client import Client
    from temporalio.worker import Worker

__all__ = [
    "NOOP_ACTIVITY",
    "NOOP_WORKFLOW",
    "SHAPES",
    "SHAPE_WORKFLOW",
    "build_worker",
    "main",
    "run_worker",
]

# --shape: the workflow class and the activities the worker registers.
SHAPES: dict[str, tuple[type, Sequence[Any]]] = {
    "one": (NoopWorkflow, [noop]),
    "five": (ShapeWorkflow, list(SHAPE_ACTIVITIES)),
}


def build_worker(
    client: Client,
    *,
    shape: str,
    task_queue: str,
    max_concurrent_activities: int = 2,
    max_concurrent_local_activities: int = 200,
    max_concurrent_workflow_tasks: int = 100,
) -> Worker:
    """The bare worker of `shape` ("one" or "five"), configured as the engine's job worker."""
    from temporalio.worker import Worker
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

    workflow_cls, activities = SHAPES[shape]
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[workflow_cls],
        activities=activities,
        max_concurrent_activities=max_concurrent_activities,
        max_concurrent_local_activities=max_concurrent_local_activities,
        max_concurrent_workflow_tasks=max_concurrent_workflow_tasks,
        workflow_runner=SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default),
    )


async def run_worker(args: argparse.Namespace) -> None:
    from temporalio.client import Client

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    client = await Client.connect(args.address, namespace=args.namespace)
    worker = build_worker(
        client,
        shape=args.shape,
        task_queue=args.task_queue,
        max_concurrent_activities=args.max_concurrent_activities,
        max_concurrent_local_activities=args.max_concurrent_local_activities,
        max_concurrent_workflow_tasks=args.max_concurrent_workflow_tasks,
    )
    async with worker:
        print(
            f"baseline worker ({args.shape}) polling {args.task_queue}", file=sys.stderr, flush=True
        )
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.baseline")
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="run the baseline worker until SIGTERM")
    w.add_argument("--shape", choices=sorted(SHAPES), default="one")
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
