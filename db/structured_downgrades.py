"""`ai_structured_downgrade`: the structured-output form a (base URL, model) took after it refused
a higher one, shared by every process until it expires.

`LIVE` is read in the transaction EXECUTE's attempt already opens (pipelined with its take,
db/attempts.py), and in a batch enroll's; `record` writes a refusal, keeping the lowest form
seen while the row lives (two processes that saw two refusals agree on the lower one), and
restarting its period.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

# (base URL, model) -> the form it takes now.
Downgrades = Mapping[tuple[str, str], str]

LIVE = text("SELECT base_url, model, form FROM ai_structured_downgrade WHERE expires_at > now()")

# The lower form wins while the row lives; an expired row is replaced outright.
_RECORD = text(
    """
    INSERT INTO ai_structured_downgrade AS d (base_url, model, form, expires_at, updated_at)
    VALUES (:base_url, :model, :form, now() + make_interval(secs => :ttl), now())
    ON CONFLICT (base_url, model) DO UPDATE SET
        form = CASE WHEN d.expires_at > now() AND d.form = 'none' THEN d.form
                    ELSE EXCLUDED.form END,
        expires_at = EXCLUDED.expires_at,
        updated_at = now()
    RETURNING form
    """
)


def downgrades_of(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """The rows of `LIVE` as a map."""
    return {(str(r["base_url"]), str(r["model"])): str(r["form"]) for r in rows}


async def live(session: AsyncSession) -> dict[tuple[str, str], str]:
    """Every (base URL, model) that takes a lower form now, in the caller's transaction."""
    rows = await session.execute(LIVE)
    return downgrades_of(dict(r._mapping) for r in rows)


async def record(session: AsyncSession, base_url: str, model: str, form: str, *, ttl_s: int) -> str:
    """(base URL, model) takes `form` (or the lower one already recorded) for `ttl_s` seconds
    from now; the form it takes."""
    got = await session.scalar(
        _RECORD, {"base_url": base_url[:512], "model": model[:128], "form": form, "ttl": ttl_s}
    )
    return str(got)
