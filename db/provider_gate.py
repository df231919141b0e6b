"""`provider_gate`: one row per AI provider, shared by every worker: a pause after a 429 (until
its Retry-After), and a circuit breaker that opens after consecutive failures (5xx, timeouts)
and lets one probe call through once its cooldown is over."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession


class ProviderGate:
    """Every method runs in the caller's transaction and never commits."""

    async def wait_seconds(self, s: AsyncSession, provider: str, *, probe_ttl_s: float) -> float:
        """0 when a call to `provider` may go now; otherwise how long to wait before asking
        again. When the breaker's cooldown is over, exactly one caller claims the probe (0);
        the others wait for its outcome."""
        row = (
            await s.execute(
                text(
                    """
                    SELECT greatest(extract(epoch FROM paused_until - now()), 0) AS paused,
                           extract(epoch FROM open_until - now()) AS open_left,
                           open_until IS NOT NULL AS is_open
                    FROM provider_gate WHERE provider = :p
                    """
                ),
                {"p": provider},
            )
        ).first()
        if row is None:
            return 0.0
        if row.paused and float(row.paused) > 0:
            return float(row.paused)
        if not row.is_open:
            return 0.0
        if row.open_left is not None and float(row.open_left) > 0:
            return float(row.open_left)
        claimed = (
            await s.execute(
                text(
                    """
                    UPDATE provider_gate SET probe_until = now() + make_interval(secs => :ttl)
                    WHERE provider = :p AND (probe_until IS NULL OR probe_until < now())
                    RETURNING provider
                    """
                ),
                {"p": provider, "ttl": probe_ttl_s},
            )
        ).first()
        return 0.0 if claimed else 1.0

    async def pause(self, s: AsyncSession, provider: str, seconds: float) -> None:
        """A 429 with Retry-After: every worker holds its calls to `provider` that long."""
        await s.execute(
            text(
                """
                INSERT INTO provider_gate (provider, paused_until, consecutive_failures)
                VALUES (:p, now() + make_interval(secs => :sec), 0)
                ON CONFLICT (provider) DO UPDATE SET paused_until = greatest(
                    coalesce(provider_gate.paused_until, now()), EXCLUDED.paused_until)
                """
            ),
            {"p": provider, "sec": seconds},
        )

    async def failed(
        self, s: AsyncSession, provider: str, *, threshold: int, cooldown_s: float
    ) -> bool:
        """One more consecutive failure; opens the breaker at `threshold` (a failed probe opens
        it again). Returns True when this call opened it."""
        row = (
            await s.execute(
                text(
                    """
                    INSERT INTO provider_gate (provider, consecutive_failures)
                    VALUES (:p, 1)
                    ON CONFLICT (provider) DO UPDATE SET
                        consecutive_failures = provider_gate.consecutive_failures + 1
                    RETURNING consecutive_failures, open_until IS NOT NULL AS was_open
                    """
                ),
                {"p": provider},
            )
        ).one()
        if int(row.consecutive_failures) < threshold:
            return False
        await s.execute(
            text(
                """
                UPDATE provider_gate SET open_until = now() + make_interval(secs => :cool),
                       probe_until = NULL
                WHERE provider = :p
                """
            ),
            {"p": provider, "cool": cooldown_s},
        )
        return not bool(row.was_open)

    async def succeeded(self, s: AsyncSession, provider: str) -> None:
        """A good answer closes the breaker (a successful probe) and resets the count."""
        await s.execute(
            text(
                """
                UPDATE provider_gate SET consecutive_failures = 0, open_until = NULL,
                       probe_until = NULL
                WHERE provider = :p AND (consecutive_failures > 0 OR open_until IS NOT NULL)
                """
            ),
            {"p": provider},
        )
