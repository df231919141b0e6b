"""`ai_usage_log`: one row per provider call, written in EXECUTE's transaction."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession


@dataclass(frozen=True)
class UsageRow:
    job_id: uuid.UUID
    user_id: str
    attempt_no: int
    credential_mode: str
    provider: str
    model: str
    tokens_in: int
    tokens_out: int
    cost_usd: Decimal
    latency_ms: int
    error_code: str | None


@dataclass(frozen=True)
class UsageSummary:
    calls: int
    tokens_in: int
    tokens_out: int
    cost_usd: Decimal


class UsageRepository:
    async def insert(self, session: AsyncSession, row: UsageRow) -> None:
        await session.execute(
            text(
                """
                INSERT INTO ai_usage_log (job_id, user_id, attempt_no, credential_mode, provider,
                    model, tokens_in, tokens_out, cost_usd, latency_ms, error_code, created_at)
                VALUES (:job_id, :user_id, :attempt_no, :credential_mode, :provider, :model,
                    :tokens_in, :tokens_out, :cost_usd, :latency_ms, :error_code, now())
                """
            ),
            row.__dict__,
        )

    async def calls_with(
        self, session: AsyncSession, job_id: uuid.UUID, attempt_no: int, error_code: str
    ) -> int:
        """How many calls of one attempt of a job ended with `error_code`."""
        n = (
            await session.execute(
                text(
                    "SELECT count(*) FROM ai_usage_log "
                    "WHERE job_id = :j AND attempt_no = :a AND error_code = :c"
                ),
                {"j": job_id, "a": attempt_no, "c": error_code},
            )
        ).scalar_one()
        return int(n)

    async def summary(self, session: AsyncSession, job_id: uuid.UUID) -> UsageSummary:
        r = (
            await session.execute(
                text(
                    """
                    SELECT count(*) AS calls, coalesce(sum(tokens_in), 0) AS tin,
                           coalesce(sum(tokens_out), 0) AS tout,
                           coalesce(sum(cost_usd), 0) AS cost
                    FROM ai_usage_log WHERE job_id = :id
                    """
                ),
                {"id": job_id},
            )
        ).one()
        return UsageSummary(int(r.calls), int(r.tin), int(r.tout), Decimal(r.cost))

    async def user_cost_since(
        self, session: AsyncSession, user_id: str, since: datetime
    ) -> Decimal:
        """A user's provider cost since `since` (a UTC day or month start, computed by the
        caller, so the database's time zone never moves the boundary)."""
        r = (
            await session.execute(
                text(
                    """
                    SELECT coalesce(sum(cost_usd), 0) AS cost FROM ai_usage_log
                    WHERE user_id = :u AND created_at >= :since
                    """
                ),
                {"u": user_id, "since": since},
            )
        ).one()
        return Decimal(r.cost)
