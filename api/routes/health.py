"""Liveness and readiness (readiness checks PostgreSQL and Temporal)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from api.deps import State
from db.session import ping

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(state: State) -> JSONResponse:
    checks: dict[str, str] = {}
    try:
        async with asyncio.timeout(3):
            async with state.sessionmaker() as s:
                await ping(s)
        checks["postgres"] = "ok"
    except Exception:
        checks["postgres"] = "unavailable"
    try:
        async with asyncio.timeout(3):
            client = await state.temporal_client()
            await client.service_client.check_health()
        checks["temporal"] = "ok"
    except Exception:
        state.temporal = None  # reconnect next time
        checks["temporal"] = "unavailable"
    ok = all(v == "ok" for v in checks.values())
    return JSONResponse(
        {"status": "ready" if ok else "unavailable", "checks": checks},
        status_code=200 if ok else 503,
    )
