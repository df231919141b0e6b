"""`python -m bench.replay_cpu [--runs N] [--rounds K]`: CPU a workflow run costs the worker's
workflow side, by replaying the plain synthetic history (`tests/replay/histories/
synthetic-v8-success.json`) N times in one process, through three runners:

- `bare`: the SDK's sandbox with the workers' restrictions (`sandbox_runner().inner`);
- `contexts`: the workers' runner, which answers the payloads' serialization contexts outside
  the sandbox (runtime/workflow_runner.py), the workflow modules read from disk at each run;
- `workers`: the workers' runner as the workers use it, the modules' code read once
  (runtime/workflow_code.py).

Each variant runs in a process of its own (the import finder is process-wide), the variants
alternated K times; a replay is a run's activations without the server or the activities, so
the differences are the workflow side's alone. Prints CPU ms per replay, each variant's rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

HISTORY = (
    Path(__file__).resolve().parent.parent / "tests/replay/histories/synthetic-v8-success.json"
)
VARIANTS = ("bare", "contexts", "workers")


async def _replay_cpu_ms(variant: str, runs: int) -> float:
    from temporalio.client import WorkflowHistory
    from temporalio.worker import Replayer

    from engine.payloads import DATA_CONVERTER
    from runtime import workflow_code
    from runtime.worker import sandbox_runner
    from workflows.job_workflow import JobWorkflow

    runner = sandbox_runner()  # installs the code finder
    if variant != "workers":
        sys.meta_path[:] = [
            f for f in sys.meta_path if not isinstance(f, workflow_code.WorkflowCode)
        ]
    chosen = runner.inner if variant == "bare" else runner
    history = WorkflowHistory.from_json("bench-replay", HISTORY.read_text("utf-8"))
    replayer = Replayer(
        workflows=[JobWorkflow], workflow_runner=chosen, data_converter=DATA_CONVERTER
    )

    async def histories(n: int) -> AsyncIterator[WorkflowHistory]:
        for _ in range(n):
            yield history

    await replayer.replay_workflows(histories(max(10, runs // 10)))  # warm-up
    start = time.process_time()
    await replayer.replay_workflows(histories(runs), raise_on_replay_failure=True)
    return (time.process_time() - start) * 1000 / runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.variant:
        print(f"{asyncio.run(_replay_cpu_ms(args.variant, args.runs)):.3f}")
        return 0
    results: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for v in VARIANTS:
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.replay_cpu",
                    "--variant",
                    v,
                    "--runs",
                    str(args.runs),
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            results[v].append(float(out.stdout.strip()))
    for v, ms in results.items():
        print(f"{v:9s} CPU ms per replay: " + ", ".join(f"{x:.2f}" for x in ms))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
