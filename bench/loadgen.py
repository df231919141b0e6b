"""A closed-loop HTTP load generator: `connections` clients, each sending its next request as
soon as the previous answer arrived, for a fixed duration (httpx.AsyncClient, keep-alive).

It runs in the bench process and so shares the machine with the server it loads; its own CPU
use is reported next to the server's so a client-bound run can be recognised.
"""

from __future__ import annotations

import asyncio
import itertools
import resource
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from bench.procs import process_cpu_s
from bench.stats import summary_ms


@dataclass(frozen=True)
class Request:
    method: str
    url: str
    headers: dict[str, str]
    content: bytes | None = None


def _self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def http_load(
    base_url: str,
    make: Callable[[int], Request],
    *,
    seconds: float,
    connections: int,
    server_pid: int | None = None,
) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    counter = itertools.count()
    latencies: list[float] = []
    codes: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=30.0) as client:
        deadline = time.perf_counter() + seconds

        async def loop() -> None:
            while time.perf_counter() < deadline:
                req = make(next(counter))
                t = time.perf_counter()
                try:
                    r = await client.request(
                        req.method, req.url, headers=req.headers, content=req.content
                    )
                except httpx.HTTPError as exc:
                    errors[type(exc).__name__] += 1
                    continue
                codes[r.status_code] += 1
                if r.status_code < 300:
                    latencies.append(time.perf_counter() - t)

        cpu0 = _self_cpu_s()
        srv0 = process_cpu_s(server_pid) if server_pid else None
        t0 = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(connections)))
        wall = time.perf_counter() - t0
        cpu1 = _self_cpu_s()
        srv1 = process_cpu_s(server_pid) if server_pid else None
    out: dict[str, Any] = summary_ms(latencies)
    out.update(
        {
            "ok": len(latencies),
            "req_per_s": len(latencies) / wall,
            "wall_s": wall,
            "status_codes": {str(k): v for k, v in sorted(codes.items())},
            "transport_errors": dict(errors),
            "client_cpu_pct": 100.0 * (cpu1 - cpu0) / wall,
            "server_cpu_pct": (
                100.0 * (srv1 - srv0) / wall if srv0 is not None and srv1 is not None else None
            ),
        }
    )
    return out
