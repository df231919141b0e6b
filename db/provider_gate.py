"""`provider_gate`: one row per (AI provider, key), shared by every worker: a pause after that
key's 429 (until its Retry-After), and a circuit breaker that opens after consecutive health
failures of calls made with that key (5xx, transport errors, timeouts) and lets one probe call
through once its cooldown is over.

The key is named, never stored: `key_ref` is `platform` for the platform's key and
`key:<credential id>` (or `user:<user id>` for jobs created before keys were pinned) for a
user's own key. So a user whose key ran out of balance or hit its rate limit holds up only that
key's jobs, and a platform outage never blocks users who bring their own key to a healthy one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

PLATFORM_KEY_REF = "platform"


@dataclass(frozen=True)
class GateKey:
    provider: str
    key_ref: str = PLATFORM_KEY_REF

    def params(self) -> dict[str, str]:
        return {"p": self.provider, "k": self.key_ref}


@dataclass(frozen=True)
class Admission:
    """`wait_s` 0: call now; otherwise ask again after that long. `probe`: this caller holds
    the breaker's one probe and must settle it (reachable, failed or released) on every exit."""

    wait_s: float
    probe: bool = False
    # Why a caller waits: "pause" (a 429's Retry-After) or "breaker" (open, or probing).
    reason: Literal["pause", "breaker"] | None = None


async def admit(s: AsyncSession, key: GateKey, *, probe_ttl_s: float) -> Admission:
    """Whether a call with `key` may go now. When the breaker's cooldown is over, exactly
    one caller claims the probe; the others wait for its outcome. `probe_ttl_s` only
    bounds a probe whose worker died without settling it."""
    row = (
        await s.execute(
            text(
                """
                SELECT greatest(extract(epoch FROM paused_until - now()), 0) AS paused,
                       extract(epoch FROM open_until - now()) AS open_left,
                       open_until IS NOT NULL AS is_open,
                       greatest(extract(epoch FROM probe_until - now()), 0) AS probe_left
                FROM provider_gate WHERE provider = :p AND key_ref = :k
                """
            ),
            key.params(),
        )
    ).first()
    if row is None:
        return Admission(0.0)
    if row.paused and float(row.paused) > 0:
        return Admission(float(row.paused), reason="pause")
    if not row.is_open:
        return Admission(0.0)
    if row.open_left is not None and float(row.open_left) > 0:
        return Admission(float(row.open_left), reason="breaker")
    claimed = (
        await s.execute(
            text(
                """
                UPDATE provider_gate SET probe_until = now() + make_interval(secs => :ttl)
                WHERE provider = :p AND key_ref = :k
                  AND (probe_until IS NULL OR probe_until < now())
                RETURNING provider
                """
            ),
            {**key.params(), "ttl": probe_ttl_s},
        )
    ).first()
    if claimed:
        return Admission(0.0, probe=True)
    # Someone else's probe is out: its outcome decides. Ask again soon, never later than
    # the probe's own deadline.
    return Admission(min(2.0, max(float(row.probe_left or 0.0), 0.5)), reason="breaker")


async def pause(s: AsyncSession, key: GateKey, seconds: float) -> None:
    """A 429 with Retry-After: every worker holds its calls with this key that long. The
    key answered, so its breaker closes (an open breaker and a pause never stack)."""
    await s.execute(
        text(
            """
            INSERT INTO provider_gate (provider, key_ref, paused_until, consecutive_failures)
            VALUES (:p, :k, now() + make_interval(secs => :sec), 0)
            ON CONFLICT (provider, key_ref) DO UPDATE SET
                paused_until = greatest(
                    coalesce(provider_gate.paused_until, now()), EXCLUDED.paused_until),
                consecutive_failures = 0, open_until = NULL, probe_until = NULL
            """
        ),
        {**key.params(), "sec": seconds},
    )


async def failed(s: AsyncSession, key: GateKey, *, threshold: int, cooldown_s: float) -> bool:
    """One more consecutive health failure; opens the breaker at `threshold` (a failed
    probe opens it again and releases the probe). Returns True when this call opened it."""
    row = (
        await s.execute(
            text(
                """
                INSERT INTO provider_gate (provider, key_ref, consecutive_failures)
                VALUES (:p, :k, 1)
                ON CONFLICT (provider, key_ref) DO UPDATE SET
                    consecutive_failures = provider_gate.consecutive_failures + 1
                RETURNING consecutive_failures, open_until IS NOT NULL AS was_open
                """
            ),
            key.params(),
        )
    ).one()
    if int(row.consecutive_failures) < threshold:
        return False
    await s.execute(
        text(
            """
            UPDATE provider_gate SET open_until = now() + make_interval(secs => :cool),
                   probe_until = NULL
            WHERE provider = :p AND key_ref = :k
            """
        ),
        {**key.params(), "cool": cooldown_s},
    )
    return not bool(row.was_open)


# `reachable`; also pipelined in EXECUTE's last transaction (db/attempts.py `settle`).
REACHABLE = text(
    """
    UPDATE provider_gate SET consecutive_failures = 0, open_until = NULL,
           probe_until = NULL
    WHERE provider = :p AND key_ref = :k
      AND (consecutive_failures > 0 OR open_until IS NOT NULL
           OR probe_until IS NOT NULL)
    """
)


async def reachable(s: AsyncSession, key: GateKey) -> None:
    """The provider answered a call made with this key (a valid answer, or any answer that
    is not a health failure): the breaker closes and the count starts again."""
    await s.execute(REACHABLE, key.params())


async def release_probe(s: AsyncSession, key: GateKey) -> None:
    """The probe ended without telling anything about the provider (no call was made, the
    job was cancelled, the worker is stopping): the next caller may probe at once."""
    await s.execute(
        text(
            """
            UPDATE provider_gate SET probe_until = NULL
            WHERE provider = :p AND key_ref = :k AND probe_until IS NOT NULL
            """
        ),
        key.params(),
    )
