"""Which structured-output form a call asks for, and what a refused form changes.

The form of a call to (base URL, model): the configured one (providers/structured.py
`FormPolicy`: an AI_FALLBACKS entry's own, AI_STRUCTURED_OUTPUT, the default by model name),
lowered to what the cluster learned that endpoint takes (`ai_structured_downgrade`, read with
the attempt's take: db/attempts.py). Forms are only learned from real calls.

A 400 refusing the form (providers/structured.py `FormRefused`) is asked again at once, in the
same attempt, in the next form down (activities/fallback.py); before that, one transaction
(`refused`) charges the refused call as money.md says (its usage row: an error answer read
whole is what the provider said, normally nothing), records the downgrade for every process
for AI_STRUCTURED_DOWNGRADE_TTL_S, and numbers the next call (its usage row's identity).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping

from sqlalchemy.ext.asyncio import AsyncSession

from db import fallback_calls as fallback_calls_db
from db import structured_downgrades as downgrades_db
from db import usage as usage_db
from db.usage import UsageRow
from providers.base import Provider
from providers.structured import Form, FormPolicy, lower

log = logging.getLogger(__name__)


def base_url_of(provider: Provider) -> str:
    """The base URL a downgrade is keyed by (a provider without one: its name)."""
    url = getattr(provider, "base_url", None)
    return str(url) if isinstance(url, str) and url else f"provider:{provider.name}"


def form_for(
    policy: FormPolicy,
    downgrades: Mapping[tuple[str, str], str],
    provider: Provider,
    model: str,
    *,
    entry: bool = False,
) -> Form:
    """The form a call to `provider`'s `model` asks for now (`entry`: an AI_FALLBACKS entry's
    call, whose own `structuredOutput` wins over the model's)."""
    configured = policy.configured(model, entry=entry)
    return lower(configured, downgrades.get((base_url_of(provider), model)))


async def refused(
    s: AsyncSession,
    usage: UsageRow,
    provider: Provider,
    model: str,
    lowered: Form,
    *,
    ttl_s: int,
) -> tuple[Form, int | None]:
    """In the caller's transaction: the refused call's usage row, the downgrade of (base URL,
    model) to `lowered` (or lower, when another process saw more), and the next call's
    number. Returns the form to ask in and that number (None: the job is gone)."""
    await usage_db.insert(s, usage)
    taken = await downgrades_db.record(s, base_url_of(provider), model, lowered, ttl_s=ttl_s)
    call_no = await fallback_calls_db.next_call(s, usage.job_id)
    return lower(lowered, taken), call_no


def warn(job_id: uuid.UUID, model: str, refused_form: str, lowered: str) -> None:
    """The warning an operator reads when a model refused its form (models and forms only)."""
    log.warning(
        "model refused its structured-output form; asking again in the next form down",
        extra={
            "job_id": str(job_id),
            "model": model,
            "refused_form": refused_form,
            "structured_output": lowered,
        },
    )
