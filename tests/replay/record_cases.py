"""The recorder's branch cases: runs that take a branch of the job workflow only some jobs take,
each on an engine of its own (`record.py` starts it with the case's settings):

- `synthetic-delayed`: a job with `runAt` two seconds ahead, its row dispatched at once (as a
  relay of an earlier version did), waits on its timer after PREPARE;
- `synthetic-limit_wake`: a job held back by a provider limit (concurrency 1, a slow job holds
  the slot) waits for the limit waker's `limit-wake` signal, sent when the slow call ends;
- `flashcard_generation-reuse`: a job created with reuse allowed, whose source (the same
  input, the same user) succeeded before, copies its answer in the `reuse` stage, no EXECUTE;
- `flashcard_generation-reuse_wait`: the same while the source's call (the fake server's, slow)
  still runs: the job waits for the reuse waker's `reuse-source-ended` signal, then copies;
- `flashcard_generation-offpeak`: an off-peak job held on its timer until its provider's
  window opens a few seconds after the create (the fake OpenAI-compatible server is the
  provider the windows name);
- `flashcard_generation-batch` and `ai_batch-batch`: a batch-tier job against the fake server's
  Files and Batches endpoints, and its batch's own workflow;
- `quiz_generation-fallback`: the primary (the fake server) answers 503, the call moves to the
  AI_FALLBACKS entry (a second fake server) in the same attempt, and the run upserts the move
  as its memo `fallback` (tests/integration/test_provider_fallback.py).

The cases that need a provider get `Fakes`: the primary fake server and a second one.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory

from engine.limit_wait import LIMIT_WAKE_SIGNAL
from engine.tiers import REUSE_SOURCE_ENDED_SIGNAL
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.engine_helpers import wait_jobs, wait_workflow_closed
from tests.integration.provider_helpers import fake_env
from tests.job_data import INPUTS, SCRIPTED
from tests.job_data import SOURCE as SCRIPTED_SOURCE
from tests.replay import SENTINEL
from tests.stack import Stack

CARDS = "flashcard_generation"
CARDS_INPUT = {
    "sourceText": f"Photosynthesis converts light into chemical energy ({SENTINEL}).",
    "count": 2,
}
QUIZ = "quiz_generation"
QUIZ_INPUT = {**INPUTS[QUIZ], "sourceText": f"{SCRIPTED_SOURCE} ({SENTINEL})"}
FALLBACK_MODEL = "gpt-4o-mini"
FALLBACK_KEY = "sk-fallback-replay-key-1111"
# A priced model the fake server answers for (the windows and the batch tier need its provider).
MODEL = "gpt-4o-mini"
ANSWER = {"kind": "valid", "content": SCRIPTED[CARDS], "tokens_in": 120, "tokens_out": 80}
# The limit cases' engine: as record.py's LIMIT_SETTINGS.
LIMITED: dict[str, Any] = {
    "AI_MODEL_LIMITS": json.dumps({"synthetic": {"concurrency": 1}}),
    "AI_INTERACTIVE_CONCURRENCY": 4,
    "AI_BACKGROUND_CONCURRENCY": 4,
}
# How far ahead the delayed job's runAt is, and the off-peak window's opening after the engine's
# settings are made (the engine starts, then the job is created and held).
DELAY_S = 2.0
WINDOW_AFTER_S = 5.0

Histories = dict[str, WorkflowHistory]


@dataclass(frozen=True)
class Fakes:
    """The fake OpenAI-compatible servers: the engine's primary provider, and a second one
    (the fallback case's AI_FALLBACKS entry)."""

    primary: FakeOpenAIServer
    second: FakeOpenAIServer


@dataclass(frozen=True)
class BranchCase:
    name: str  # `<workflow>-<case>`, as `--only` names it
    settings: Callable[[Fakes | None], dict[str, Any]]
    run: Callable[[Stack, Fakes | None], Awaitable[Histories]]
    fake: bool = False  # needs the fake OpenAI-compatible servers


def signals(history: WorkflowHistory) -> list[str]:
    return [
        e.workflow_execution_signaled_event_attributes.signal_name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    ]


def activities(history: WorkflowHistory) -> list[str]:
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


async def closed_history(st: Stack, job_id: uuid.UUID, expect: str = "succeeded") -> Any:
    """The job's closed run's history, once the job ended as `expect` (its input carried the
    sentinel, so the sentinel's absence from the history means something)."""
    final = await wait_jobs(st.parts.sessionmaker, [job_id], timeout=90)
    row = await st.job(job_id)
    assert final[job_id] == expect, (final, row.error_code, row.internal_error_message)
    assert SENTINEL in json.dumps(row.input), row.input
    await wait_workflow_closed(st.client, row.workflow_id)
    return await st.client.get_workflow_handle(row.workflow_id).fetch_history()


def has(history: WorkflowHistory, event_type: int) -> bool:
    return any(e.event_type == event_type for e in history.events)


# ---- the cases -----------------------------------------------------------------------------


async def run_delayed(st: Stack, _: Fakes | None) -> Histories:
    """A delayed job waits in the outbox until its runAt and its workflow starts then, with no
    timer; the workflow's own wait serves a row dispatched before its time (by a relay of an
    earlier version, or across clock skew). This job's row is made due at once, as such a
    relay would have dispatched it, so its run waits on the timer."""
    run_at = datetime.now(UTC) + timedelta(seconds=DELAY_S)
    job = await st.create(job_type="synthetic", input={"echo": {"note": SENTINEL}}, run_at=run_at)
    async with st.parts.sessionmaker.begin() as s:
        await s.execute(text("UPDATE ai_job SET due_at = NULL WHERE id = :id"), {"id": job})
        await s.execute(
            text("UPDATE outbox_event SET available_at = now() WHERE aggregate_id = :a"),
            {"a": str(job)},
        )
    history = await closed_history(st, job)
    assert has(history, EventType.EVENT_TYPE_TIMER_STARTED), "the delayed job did not wait"
    return {"synthetic-{tag}-delayed": history}


async def run_limit_wake(st: Stack, _: Fakes | None) -> Histories:
    """A slow job takes the one concurrency slot; the recorded job finds it taken and waits
    until the waker signals it (the slow call ended), then succeeds."""
    echo = {"note": SENTINEL}
    holder = await st.create(job_type="synthetic", input={"delayMs": 2500, "echo": echo})
    await st.wait_status(holder, "running")
    waiter = await st.create(job_type="synthetic", input={"echo": echo})
    history = await closed_history(st, waiter)
    assert (await st.job(holder)).lifecycle_status == "succeeded"
    assert LIMIT_WAKE_SIGNAL in signals(history), signals(history)
    return {"synthetic-{tag}-limit_wake": history}


async def run_reuse(st: Stack, _: Fakes | None) -> Histories:
    source = await st.create(job_type=CARDS, input=CARDS_INPUT)
    await closed_history(st, source)
    job = await st.create(job_type=CARDS, input=CARDS_INPUT, reuse=True)
    history = await closed_history(st, job)
    assert "execute" not in activities(history), activities(history)
    return {f"{CARDS}-{{tag}}-reuse": history}


async def run_reuse_wait(st: Stack, fakes: Fakes | None) -> Histories:
    assert fakes is not None
    fake = fakes.primary
    await fake.ascript([], default={**ANSWER, "kind": "slow", "delay_s": 2.0})
    source = await st.create(job_type=CARDS, input=CARDS_INPUT, reuse=True)
    await st.wait_status(source, "running")
    job = await st.create(job_type=CARDS, input=CARDS_INPUT, reuse=True)
    history = await closed_history(st, job)
    assert (await st.job(source)).lifecycle_status == "succeeded"
    assert "execute" not in activities(history), activities(history)
    assert REUSE_SOURCE_ENDED_SIGNAL in signals(history), signals(history)
    return {f"{CARDS}-{{tag}}-reuse_wait": history}


def plain(fakes: Fakes | None) -> dict[str, Any]:
    assert fakes is not None
    fake = fakes.primary
    return fake_env(fake, AI_MODEL=MODEL)


def offpeak_settings(fakes: Fakes | None) -> dict[str, Any]:
    assert fakes is not None
    fake = fakes.primary
    opens = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=WINDOW_AFTER_S)
    span = {
        "start": opens.strftime("%H:%M:%S"),
        "end": (opens + timedelta(minutes=5)).strftime("%H:%M:%S"),
        "price": 0.5,
    }
    return fake_env(
        fake, AI_MODEL=MODEL, AI_OFFPEAK_WINDOWS=json.dumps({"openai_compatible": [span]})
    )


async def run_offpeak(st: Stack, fakes: Fakes | None) -> Histories:
    assert fakes is not None
    fake = fakes.primary
    await fake.ascript([], default=ANSWER)
    job = await st.create(job_type=CARDS, input=CARDS_INPUT, service_tier="offpeak")
    history = await closed_history(st, job)
    assert has(history, EventType.EVENT_TYPE_TIMER_STARTED), "the job did not wait for its window"
    return {f"{CARDS}-{{tag}}-offpeak": history}


def batch_settings(fakes: Fakes | None) -> dict[str, Any]:
    assert fakes is not None
    fake = fakes.primary
    return fake_env(fake, AI_MODEL=MODEL, AI_BATCH_WINDOW_S=1.0, AI_BATCH_POLL_S=0.3)


async def run_batch(st: Stack, fakes: Fakes | None) -> Histories:
    """The job and its batch's workflow (`ai_batch`), both closed."""
    assert fakes is not None
    fake = fakes.primary
    await fake.ascript([], default=ANSWER)
    job = await st.create(job_type=CARDS, input=CARDS_INPUT, service_tier="batch")
    history = await closed_history(st, job)
    assert "execute" not in activities(history), activities(history)
    async with st.parts.sessionmaker() as s:
        [batch_wid] = (await s.execute(text("SELECT workflow_id FROM ai_batch"))).scalars().all()
    await wait_workflow_closed(st.client, batch_wid)
    batch = await st.client.get_workflow_handle(batch_wid).fetch_history()
    assert "batch_submit" in activities(batch), activities(batch)
    return {f"{CARDS}-{{tag}}-batch": history, "ai_batch-{tag}-batch": batch}


def fallback_settings(fakes: Fakes | None) -> dict[str, Any]:
    assert fakes is not None
    chain = [{"model": FALLBACK_MODEL, "baseUrl": fakes.second.base_url, "apiKey": FALLBACK_KEY}]
    return fake_env(fakes.primary, AI_FALLBACKS=json.dumps(chain))


async def run_fallback(st: Stack, fakes: Fakes | None) -> Histories:
    assert fakes is not None
    await fakes.primary.ascript([], default={"kind": "status", "status": 503})
    await fakes.second.ascript(
        [], default={"kind": "valid", "content": SCRIPTED[QUIZ], "tokens_in": 120, "tokens_out": 80}
    )
    job = await st.create(job_type=QUIZ, input=QUIZ_INPUT)
    history = await closed_history(st, job)
    assert has(history, EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED), "no fallback memo"
    assert (await fakes.second.acalls())["models"] == [FALLBACK_MODEL]
    assert FALLBACK_KEY not in history.to_json()  # the memo names models and a reason only
    return {f"{QUIZ}-{{tag}}-fallback": history}


BRANCH_CASES = (
    BranchCase("synthetic-delayed", lambda _: {}, run_delayed),
    BranchCase("synthetic-limit_wake", lambda _: dict(LIMITED), run_limit_wake),
    BranchCase(f"{CARDS}-reuse", lambda _: {}, run_reuse),
    BranchCase(f"{CARDS}-reuse_wait", plain, run_reuse_wait, fake=True),
    BranchCase(f"{CARDS}-offpeak", offpeak_settings, run_offpeak, fake=True),
    BranchCase(f"{CARDS}-batch", batch_settings, run_batch, fake=True),
    BranchCase(f"{QUIZ}-fallback", fallback_settings, run_fallback, fake=True),
)
