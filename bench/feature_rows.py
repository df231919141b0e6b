"""The rows of `python -m bench.feature_costs`: per feature, the create request of its jobs and
what the bench does around them (a scope budget to put, a pause to create and lift), and the
stack (engine settings) they run on.

Every row's jobs are created through `JobService.create` by USERS users, `i % USERS`. A row is
compared with its `reference` row: plain synthetic jobs, or plain flashcard jobs for the
features only a job type with a service spec has (reuse, off-peak), both on the synthetic
provider (flashcard_generation answers from its own synthetic output there).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from engine.flow import Concurrency
from engine.scopes import JobScopes
from jobs.requests import CreateJobRequest

USERS = 16
# A whole job's deadline and a start-by TTL far enough out that none is reached.
FAR_S = 600
SCOPE_ORG = "bench-org"
FLASHCARD_SOURCE = "Enzymes are catalysts. They speed reactions up. Temperature changes shape."

# The engine settings of each stack a row may run on (beside the bench's own); `{fake}` is the
# root URL of the scripted OpenAI-compatible server (tests/fakes/openai_server.py), which the
# bench starts for a stack that names it.
FAKE_KEY = "sk-bench-fake-provider-key"
STACKS: dict[str, dict[str, str]] = {
    "default": {},
    "limit": {"AI_MODEL_LIMITS": '{"synthetic": {"concurrency": 1}}'},
    # The batch tier needs a provider with a Batch API: the generic OpenAI-compatible one.
    "provider": {
        "AI_BASE_URL": "{fake}/v1",
        "DEEPSEEK_API_KEY": FAKE_KEY,
        "AI_MODEL": "gpt-4o-mini",
    },
}


def fake_answer() -> dict[str, Any]:
    """The fake server's answer to every call and batch line: a valid flashcard answer."""
    from jobs.types.flashcard_generation import FlashcardGenerationInput, synthetic_output

    content = synthetic_output(FlashcardGenerationInput(source_text=FLASHCARD_SOURCE, count=3))
    return {"kind": "valid", "content": content, "tokens_in": 300, "tokens_out": 120}


@dataclass
class RowCtx:
    """What a row's hooks may use: the bench's session factory and the engine database."""

    sessionmaker: Any
    edb: Any  # bench.infra.EngineDb
    jobs: int
    state: dict[str, Any] = field(default_factory=dict)


Hook = Callable[[RowCtx], Awaitable[None]]


@dataclass(frozen=True)
class Row:
    name: str
    build: Callable[[int, str], CreateJobRequest]
    stack: str = "default"
    reference: str | None = "plain"  # None: it is a reference
    before: Hook | None = None  # before the creates
    after: Hook | None = None  # once every create returned
    note: str = ""


def synthetic(i: int, tag: str, **inp: Any) -> CreateJobRequest:
    return CreateJobRequest(
        user_id=f"bench-u{i % USERS}",
        job_type="synthetic",
        target_type="bench",
        target_id=f"{tag}-{i}",
        input=dict(inp),
    )


def flashcards(i: int, tag: str) -> CreateJobRequest:
    return CreateJobRequest(
        user_id=f"bench-u{i % USERS}",
        job_type="flashcard_generation",
        target_type="bench",
        target_id=f"{tag}-{i}",
        input={"sourceText": FLASHCARD_SOURCE, "count": 3},
    )


def _concurrency(mode: str, delay_ms: int | None = None) -> Callable[[int, str], CreateJobRequest]:
    # A key per job: what the member costs a job it does not collide with.
    def build(i: int, tag: str) -> CreateJobRequest:
        key = Concurrency(key=f"k-{tag}-{i}", mode=mode, delay_ms=delay_ms)
        return replace(synthetic(i, tag), concurrency=key)

    return build


async def _put_budget(ctx: RowCtx) -> None:
    from db import scope_budgets as scope_budgets_db

    async with ctx.sessionmaker.begin() as s:
        await scope_budgets_db.put(
            s, "org", SCOPE_ORG, limit_usd=Decimal(1000), period="day", alert_at=()
        )


async def _pause(ctx: RowCtx) -> None:
    from engine.flow import PauseMatch
    from jobs.pauses import Pauses

    row = await Pauses(ctx.sessionmaker).create(
        PauseMatch(job_type="synthetic"), reason="bench", expires_at=None, actor="bench"
    )
    ctx.state["pause_id"] = row.id


async def _resume_once_held(ctx: RowCtx, timeout_s: float = 120.0) -> None:
    """Lift the pause once every job of the row is held by it."""
    from jobs.pauses import Pauses

    deadline = time.monotonic() + timeout_s
    while True:
        held = (await ctx.edb.fetchall("SELECT count(*) FROM ai_pause_hold"))[0][0]
        if held >= ctx.jobs:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {held}/{ctx.jobs} jobs held by the pause")
        await asyncio.sleep(0.1)
    await Pauses(ctx.sessionmaker).delete(ctx.state["pause_id"], actor="bench")


def _far() -> datetime:
    return datetime.now(UTC) + timedelta(seconds=FAR_S)


def rows() -> list[Row]:
    return [
        Row("plain", synthetic, reference=None, note="plain synthetic jobs (reference)"),
        Row(
            "beyond the dispatch window",
            lambda i, t: synthetic(i, t, delayMs=300),
            note="300 ms calls created at once: a user's jobs past USER_DISPATCH_WINDOW held",
        ),
        Row("concurrency supersede", _concurrency("supersede")),
        Row("concurrency skip", _concurrency("skip")),
        Row("concurrency debounce 50 ms", _concurrency("debounce", 50)),
        Row("ttlSeconds", lambda i, t: replace(synthetic(i, t), ttl_seconds=FAR_S)),
        Row("deadline", lambda i, t: replace(synthetic(i, t), deadline=_far())),
        Row(
            "org with a scope budget",
            lambda i, t: replace(synthetic(i, t), scopes=JobScopes(org_id=SCOPE_ORG)),
            before=_put_budget,
        ),
        Row("operator pause, then resume", synthetic, before=_pause, after=_resume_once_held),
        Row(
            "provider concurrency limit 1",
            lambda i, t: synthetic(i, t, delayMs=20),
            stack="limit",
            note="20 ms calls under AI_MODEL_LIMITS synthetic concurrency 1",
        ),
        Row(
            "flashcards",
            flashcards,
            reference=None,
            note="plain flashcard_generation jobs (reference of reuse and off-peak)",
        ),
        Row(
            "result reuse",
            lambda i, t: replace(flashcards(i, t), reuse=True),
            reference="flashcards",
        ),
        Row(
            "off-peak tier",
            lambda i, t: replace(flashcards(i, t), service_tier="offpeak"),
            reference="flashcards",
            note="the synthetic provider's window is all day: the job runs at once",
        ),
        Row(
            "flashcards, OpenAI-compatible provider",
            flashcards,
            stack="provider",
            reference=None,
            note="plain flashcard jobs on the fake server (reference of the batch tier)",
        ),
        Row(
            "batch tier",
            lambda i, t: replace(flashcards(i, t), service_tier="batch"),
            stack="provider",
            reference="flashcards, OpenAI-compatible provider",
            note="AI_BATCH_WINDOW_S and AI_BATCH_POLL_S at their defaults (60 s)",
        ),
    ]
