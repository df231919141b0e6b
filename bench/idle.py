"""The idle figure (10): what an idle `aijobs dev` stack costs PostgreSQL.

The dev stack's four processes (`aijobs api`, and `aijobs worker --queue <q>` for each of
ai-interactive, ai-background and ai-system: the relay, the deliverer, the reconciler, the
wakers), started as `aijobs dev` starts them on the bench's PostgreSQL and Temporal (their own
task queue suffix), nothing queued. `IDLE_SETTLE_S` after the last of them is ready,
`xact_commit + xact_rollback` of the engine's database is read twice, `IDLE_WINDOW_S` apart
(`--quick`: shorter): every transaction PostgreSQL counts, as an operator's dashboard reads it.
Beside it, from pg_stat_statements over the same window, the statements that ran most (what the
idle loops are), and the connections the stack holds, by `application_name`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from typing import Any

import httpx

from bench.infra import DB_NAME, EngineKnobs, Servers, engine_env, wait_pollers
from bench.procs import Proc, check_alive, progress, stop_group
from bench.report import Results

IDLE_SETTLE_S = 30.0
IDLE_WINDOW_S = 120.0
QUICK_SETTLE_S = 5.0
QUICK_WINDOW_S = 20.0
TARGET_PER_MINUTE = 30.0
QUEUES = ("ai-interactive", "ai-background", "ai-system")

_STATEMENTS = """
SELECT s.queryid, sum(s.calls) AS calls,
       left(regexp_replace(min(s.query), '\\s+', ' ', 'g'), 90) AS query
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = %s AND s.toplevel
GROUP BY s.queryid
"""
_CONNECTIONS = """
SELECT coalesce(application_name, ''), count(*),
       count(*) FILTER (WHERE query ILIKE 'LISTEN%%')
FROM pg_stat_activity
WHERE datname = %s AND backend_type = 'client backend' AND pid <> pg_backend_pid()
GROUP BY 1 ORDER BY 1
"""


class DevStack:
    """The four processes of `aijobs dev`, on task queues of their own."""

    def __init__(self, sv: Servers, knobs: EngineKnobs, port: int) -> None:
        from runtime.embedded import free_port

        self.suffix = f"-idle{int(time.time()) % 100000}"
        env = engine_env(sv, knobs, suffix=self.suffix, quotas=True)
        py = [sys.executable, "-m", "runtime.cli"]
        self.port = port or free_port()
        self.procs = [
            Proc(f"idle-worker-{q}", [*py, "worker", "--queue", q], env, sv.log_dir) for q in QUEUES
        ]
        api = [*py, "api", "--host", "127.0.0.1", "--port", str(self.port)]
        self.procs.append(Proc("idle-api", api, env, sv.log_dir))

    async def start(self, client: Any, timeout_s: float = 90.0) -> None:
        for p in self.procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for q in QUEUES:
            await wait_pollers(client, f"{q}{self.suffix}", 1, deadline, self.procs)
        async with httpx.AsyncClient() as http:
            while True:
                check_alive(self.procs)
                with contextlib.suppress(httpx.HTTPError):
                    r = await http.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1.0)
                    if r.status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise TimeoutError("the idle stack's API did not answer")
                await asyncio.sleep(0.2)

    async def forget(self, client: Any) -> None:
        """The system workflows its ai-system worker started (the relay shard, the reconciler's
        schedule) end with it: nothing of it keeps the Temporal server busy afterwards."""
        from engine.contracts import RECONCILER_SCHEDULE_ID, relay_shard_workflow_id

        with contextlib.suppress(Exception):
            await client.get_schedule_handle(RECONCILER_SCHEDULE_ID + self.suffix).delete()
        with contextlib.suppress(Exception):
            handle = client.get_workflow_handle(relay_shard_workflow_id(0, self.suffix))
            await handle.terminate("the idle figure is over")


async def _statements(admin: Any) -> dict[int, tuple[int, str]]:
    return {int(r[0]): (int(r[1]), str(r[2])) for r in await admin.rows(_STATEMENTS, (DB_NAME,))}


async def phase_idle(
    ctx: Any, args: argparse.Namespace, sv: Servers, knobs: EngineKnobs, res: Results
) -> None:
    settle, window = (
        (QUICK_SETTLE_S, QUICK_WINDOW_S) if args.quick else (IDLE_SETTLE_S, IDLE_WINDOW_S)
    )
    await ctx.edb.truncate()
    stack = DevStack(sv, knobs, 0)
    try:
        await stack.start(ctx.client)
        ctx.watch = list(stack.procs)
        progress(f"idle: the dev stack is up; {settle:.0f}s, then {window:.0f}s of idle")
        await asyncio.sleep(settle)
        x0, s0 = await ctx.admin.xacts(), await _statements(ctx.admin)
        t0 = time.monotonic()
        await asyncio.sleep(window)
        check_alive(stack.procs)
        x1, s1 = await ctx.admin.xacts(), await _statements(ctx.admin)
        elapsed = time.monotonic() - t0
        held = await ctx.admin.rows(_CONNECTIONS, (DB_NAME,))
        connections = [(str(r[0]), int(r[1]), int(r[2])) for r in held]
    finally:
        ctx.watch = []
        stop_group(stack.procs)
        res.record_procs(stack.procs)
        await stack.forget(ctx.client)
    per_minute = (x1 - x0) * 60.0 / elapsed
    top = sorted(
        ((calls - s0.get(qid, (0, ""))[0], text) for qid, (calls, text) in s1.items()),
        reverse=True,
    )
    f = res.fig("idle")
    f.update(
        {
            "settle_s": settle,
            "window_s": elapsed,
            "xacts": x1 - x0,
            "per_minute": per_minute,
            "target": f"<= {TARGET_PER_MINUTE:g} a minute",
            "met": per_minute <= TARGET_PER_MINUTE,
            "statements_per_minute": [
                {"query": text, "per_minute": n * 60.0 / elapsed} for n, text in top[:12] if n > 0
            ],
            "connections": [
                {"application_name": name, "connections": n, "listening": listening}
                for name, n, listening in connections
            ],
        }
    )
    progress(f"idle: {per_minute:.1f} PostgreSQL transactions a minute")
