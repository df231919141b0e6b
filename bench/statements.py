"""`python -m bench.statements --requests K`: the SQL one `POST /api/ai/jobs` and one
`GET /api/ai/jobs/{id}` send, counted through SQLAlchemy's engine events.

Run in a process of its own with the engine's environment (the API figure's, `bench/phases.py`):
the app is `api.app.create_app` as `aijobs api` builds it, served in-process over ASGI (no
socket, no load), so what is counted is the request path's statements and nothing else. Every
transaction boundary (BEGIN, COMMIT, ROLLBACK) and every statement sent through a cursor is a
round trip to PostgreSQL; statements are named by their first words and table, never with their
parameters (job input). Prints one JSON object: per route (the real ones and the API figure's
bare ones, `bench/api_server.py`), the statements of one request (the mean over K requests
after one warm-up request each) and their total.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from bench.teardown import hard_exit

_COUNTS: Counter[str] = Counter()
_SPACE = re.compile(r"\s+")


def statement_name(sql: str) -> str:
    """`INSERT INTO ai_job`, `SELECT ... FROM ai_job`, `UPDATE provider_limit`, `SELECT
    pg_notify`: the verb and the first table (or function), enough to read the path from."""
    s = _SPACE.sub(" ", sql).strip()
    verb = s.split(" ", 1)[0].upper()
    if verb == "WITH":
        m = re.search(r"\b(INSERT INTO|UPDATE|DELETE FROM|SELECT)\b", s[4:], re.IGNORECASE)
        verb = "WITH ... " + (m.group(1).split()[0].upper() if m else "?")
    for pattern in (
        r"\bINSERT INTO ([\w.]+)",
        r"\bUPDATE ([\w.]+)",
        r"\bDELETE FROM ([\w.]+)",
        r"\bFROM ([\w.]+)",
        r"\bSELECT ([\w.]+)\(",
    ):
        m = re.search(pattern, s, re.IGNORECASE)
        if m:
            return f"{verb} {m.group(1)}"
    return verb


def _install() -> None:
    def on_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        _COUNTS[statement_name(statement)] += 1

    def on(name: str) -> Any:
        def count(*args: Any) -> None:
            _COUNTS[name] += 1

        return count

    event.listen(Engine, "before_cursor_execute", on_execute)
    event.listen(Engine, "begin", on("BEGIN"))
    event.listen(Engine, "commit", on("COMMIT"))
    event.listen(Engine, "rollback", on("ROLLBACK"))


async def measure(requests: int, secret: str) -> dict[str, Any]:
    import httpx

    from api.auth import issue_token
    from bench.api_server import router as bare_router
    from engine.settings import Settings
    from runtime.wiring import api_app

    app = api_app(Settings())
    app.include_router(bare_router)
    _install()
    auth = {"Authorization": "Bearer " + issue_token(secret, "bench-statements")}
    body = {"jobType": "synthetic", "targetType": "bench", "targetId": "t1", "input": {}}
    out: dict[str, Any] = {"requests": requests}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as c:

            async def post(i: int) -> str:
                r = await c.post("/api/ai/jobs", json={**body, "targetId": f"s{i}"}, headers=auth)
                if r.status_code >= 300:
                    raise RuntimeError(f"POST /api/ai/jobs answered {r.status_code}")
                job_id: str = r.json()["jobId"]
                return job_id

            async def get(job_id: str) -> None:
                r = await c.get(f"/api/ai/jobs/{job_id}", headers=auth)
                if r.status_code != 200:
                    raise RuntimeError(f"GET /api/ai/jobs/{{id}} answered {r.status_code}")

            async def post_bare(i: int) -> None:
                r = await c.post("/bench/jobs", json=body)
                if r.status_code >= 300:
                    raise RuntimeError(f"POST /bench/jobs answered {r.status_code}")

            async def get_bare(job_id: str) -> None:
                r = await c.get(f"/bench/jobs/{job_id}")
                if r.status_code != 200:
                    raise RuntimeError(f"GET /bench/jobs/{{id}} answered {r.status_code}")

            first = await post(0)
            # Warm-up: the pool's first connections, first-use caches.
            await get(first)
            await post_bare(0)
            await get_bare(first)
            for route in ("post", "get", "post_bare", "get_bare"):
                _COUNTS.clear()
                for i in range(requests):
                    if route == "post":
                        await post(i + 1)
                    elif route == "get":
                        await get(first)
                    elif route == "post_bare":
                        await post_bare(i)
                    else:
                        await get_bare(first)
                per = {k: v / requests for k, v in sorted(_COUNTS.items())}
                out[route] = {
                    "per_request": per,
                    "round_trips": sum(per.values()),
                    "statements": sum(
                        v for k, v in per.items() if k not in ("BEGIN", "COMMIT", "ROLLBACK")
                    ),
                }
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.statements")
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--jwt-secret", required=True)
    args = p.parse_args(argv)
    out = asyncio.run(measure(args.requests, args.jwt_secret))
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    hard_exit(0)


if __name__ == "__main__":
    main()
