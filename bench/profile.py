"""`python -m bench.profile RAW --jobs N`: where a worker's time goes per job, from a py-spy
profile in raw (collapsed-stack) format.

Record one with py-spy (a dev dependency: `make install-dev`) attached to the engine
worker of a bench run, e.g. `py-spy record --pid PID --rate 100 --nonblocking --format raw
--output worker.txt --duration 120`; N is the number of jobs the worker ran meanwhile. py-spy
samples the stacks of threads that are not idle: time on the stack, not CPU time, and on a
process whose Python threads share one GIL the two are close. Each category counts a sample when
any frame of the stack belongs to it, so the categories overlap (SQL inside an activity is in
both); "no Python frame" is the SDK core's Rust threads and GIL waits.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

# Category -> substrings of a frame ("function (path:line)"); the first match names the frame.
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("SQL: psycopg", ("psycopg/", "psycopg_c", "psycopg_pool")),
    ("SQL: SQLAlchemy", ("sqlalchemy/",)),
    (
        "sandbox: fresh instance, module re-import",
        ("workflow_sandbox/", "importlib/_bootstrap", "<frozen importlib"),
    ),
    ("compilation (compile, bytecode)", ("compile (", "source_to_code", "_compile_bytecode")),
    (
        "payload conversion (converter, protobuf, visitor)",
        ("temporalio/converter", "google/protobuf", "_visitor", "serialization_context"),
    ),
    ("pydantic", ("pydantic/", "pydantic_core")),
    ("logging", ("logging/__init__", "runtime/logs", "logging/handlers")),
    ("metrics (prometheus_client)", ("prometheus_client/", "activities/metrics")),
    ("tracing (opentelemetry)", ("opentelemetry/",)),
    ("workflow code (workflows/)", ("workflows/",)),
    ("activity code (activities/, jobs/, providers/)", ("activities/", "jobs/", "providers/")),
    ("asyncio event loop", ("asyncio/",)),
)


def shares(raw: str) -> dict[str, float]:
    """Samples per category (overlapping), plus "total" and "no Python frame"."""
    out = {name: 0.0 for name, _ in CATEGORIES}
    out["total"] = 0.0
    out["no Python frame"] = 0.0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        out["total"] += n
        frames = stack.split(";")
        if not any("(" in f for f in frames[1:]):  # the first frame names the thread
            out["no Python frame"] += n
        for name, needles in CATEGORIES:
            if any(needle in f for f in frames for needle in needles):
                out[name] += n
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.profile")
    p.add_argument("raw", type=Path, help="py-spy --format raw output")
    p.add_argument("--jobs", type=int, required=True, help="jobs the worker ran meanwhile")
    p.add_argument("--rate", type=float, default=100.0, help="py-spy --rate (samples/s)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    counts = shares(args.raw.read_text())
    ms = 1e3 / args.rate / args.jobs  # one sample's milliseconds, per job
    if args.json:
        sys.stdout.write(json.dumps({k: v * ms for k, v in counts.items()}) + "\n")
        return
    total = counts["total"] or 1.0
    print("| category | ms/job on the stack | share of samples |\n|---|---:|---:|")
    for k, v in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"| {k} | {v * ms:.1f} | {100 * v / total:.0f} % |")


if __name__ == "__main__":
    main()
