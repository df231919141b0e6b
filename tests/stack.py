"""The engine in process, for one test: settings, in-process workers and an outbox relay.

`engine_stack` is the one place that starts workers in-process: for the queues, catalog,
create policy, relay configuration and telemetry a test asks for, on its settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from activities.relay import Relay
from db import jobs as jobs_db
from db.credentials import active_user_key_id
from engine.definition import QUEUE_NAMES, QueueSpec, RetryBackoff
from engine.lifecycle import TERMINAL_VALUES
from engine.settings import Settings
from jobs.service import CreateJobRequest, CreatePolicy, JobService
from jobs.spec import AnyJobType, Catalog
from jobs.types import ALL_TYPES
from runtime.limit_waker import limit_waker_task
from runtime.telemetry import Telemetry
from runtime.wiring import Parts, build_parts, create_policy, engine_config, relay_config
from runtime.worker import build_workers
from tests.support import eventually

# The engine's own names, not re-typed: a renamed status or queue cannot leave the tests behind.
TERMINAL = TERMINAL_VALUES
INTERACTIVE = (QueueSpec().queue_name,)  # the queue of a definition that names none
JOB_QUEUES = QUEUE_NAMES


def make_settings(database_url: str, temporal_address: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "DATABASE_URL": database_url,
        "TEMPORAL_ADDRESS": temporal_address,
        "AIJOBS_ENV": "test",
        "TASK_QUEUE_SUFFIX": f"-t{uuid.uuid4().hex[:10]}",
        "QUOTA_MAX_ACTIVE_JOBS": 0,
        "QUOTA_MAX_JOBS_PER_DAY": 0,
        "RELAY_POLL_INTERVAL_S": 0.2,
        # Tests of other things dispatch a user's jobs at once; the window's own tests (and the
        # fairness bench) set USER_DISPATCH_WINDOW themselves.
        "USER_DISPATCH_WINDOW": 1000,
        "DB_POOL_SIZE": 10,
        # In-process workers stop at the end of each test: a hung job must not hold them.
        "WORKER_DRAIN_S": 0,
    }
    values.update(overrides)
    # A name that is no setting would be ignored silently (a removed setting, a typo).
    known = {field.alias for field in Settings.model_fields.values()}
    unknown = sorted(set(values) - known)
    assert not unknown, f"not settings: {unknown}"
    return Settings.model_validate(values)


def variant(base: AnyJobType, job_type: str, **execution: Any) -> AnyJobType:
    """A test-only copy of a job type under another name with other execution settings,
    e.g. `variant(quiz.JOB, "quiz_fast", timeout_ms=1000, max_retries=0, backoff_ms=500)`."""
    if "backoff_ms" in execution:
        execution["retry_backoff"] = RetryBackoff(delay=execution.pop("backoff_ms"))
    d = base.definition
    return dataclasses.replace(
        base,
        definition=d.model_copy(
            update={"job_type": job_type, "execution": d.execution.model_copy(update=execution)}
        ),
    )


def catalog_with(*extra: AnyJobType) -> Catalog:
    """Every job type plus test-only ones."""
    return Catalog([*ALL_TYPES, *extra])


@dataclass
class Stack:
    """A running engine for one test: workers for the given queues plus a relay task."""

    settings: Settings
    parts: Parts
    client: Client
    service: JobService
    relay: Relay
    workers: list[Worker] = field(default_factory=list)

    async def create(self, user_id: str = "u1", **kw: Any) -> uuid.UUID:
        req = CreateJobRequest(
            user_id=user_id,
            job_type=kw.pop("job_type", "synthetic"),
            target_type=kw.pop("target_type", "test"),
            target_id=kw.pop("target_id", "t1"),
            input=kw.pop("input", {}),
            **kw,
        )
        return (await self.service.create(req)).job.id

    async def job(self, job_id: uuid.UUID) -> Any:
        async with self.parts.sessionmaker() as s:
            return await jobs_db.get(s, job_id)

    async def wait_status(self, job_id: uuid.UUID, *statuses: str, timeout: float = 30.0) -> Any:
        """Poll SQL (the source of truth) until the job reaches one of `statuses` (default: a
        terminal one)."""
        wanted = set(statuses or TERMINAL)
        last: str | None = None

        async def reached() -> Any:
            nonlocal last
            row = await self.job(job_id)
            last = row.lifecycle_status if row is not None else None
            return row if last in wanted else None

        return await eventually(
            reached, timeout=timeout, what=lambda: f"job {job_id} to reach {wanted} (at {last})"
        )

    def workflow_id(
        self, job_id: uuid.UUID, job_type: str = "synthetic", queue: str = INTERACTIVE[0]
    ) -> str:
        return f"{queue}:{job_type}:{job_id}"


@contextlib.asynccontextmanager
async def engine_stack(
    settings: Settings,
    client: Client,
    *,
    queues: Sequence[str] = INTERACTIVE,
    relay: bool = True,
    policy: CreatePolicy | None = None,
    catalog: Catalog | None = None,
    extra_types: Sequence[AnyJobType] = (),
    relay_release_every_s: float | None = None,
    relay_overrides: dict[str, Any] | None = None,
    engine_overrides: dict[str, Any] | None = None,
    blocklist: Sequence[str] = (),
    telemetry: Telemetry | None = None,
) -> AsyncIterator[Stack]:
    """In-process workers for `queues` plus a relay task (unless `relay` is false).

    `relay_overrides` and `engine_overrides` replace fields of the relay's and the workers'
    configuration built from `settings` (e.g. a short SQL lock, `lock_ttl_s`); `blocklist` is
    the workers' content safety rules.

    The catalog is `catalog`, or every job type plus `extra_types`; it is chosen before any
    worker is built, since the workers derive their workflow classes from it. The job service
    knows whether a user has an active key, as the API's does."""
    parts = build_parts(settings)
    parts.catalog = catalog if catalog is not None else catalog_with(*extra_types)
    svc = JobService(
        parts.sessionmaker,
        parts.catalog,
        policy or create_policy(settings),
        credential_lookup=active_user_key_id,
    )
    overrides = dict(relay_overrides or {})
    if relay_release_every_s is not None:
        overrides["release_every_s"] = relay_release_every_s
    rc = dataclasses.replace(relay_config(settings), **overrides)
    r = Relay(parts.sessionmaker, client, parts.catalog, rc)
    stack = Stack(settings, parts, client, svc, r)
    stop = asyncio.Event()
    relay_task: asyncio.Task[None] | None = None
    waker: asyncio.Task[int] | None = None
    closers: list[Callable[[], Awaitable[None]]] = []
    try:
        async with contextlib.AsyncExitStack() as es:
            if queues:
                stack.workers = build_workers(
                    client,
                    parts,
                    tuple(queues),
                    telemetry=telemetry,
                    on_close=closers,
                    config=dataclasses.replace(engine_config(settings), **(engine_overrides or {})),
                    blocklist=blocklist,
                    relay=rc,
                )
                for w in stack.workers:
                    await es.enter_async_context(w)
                waker = limit_waker_task(client, parts, tuple(queues), stop)  # as run_workers
            if relay:
                relay_task = asyncio.create_task(r.run(stop=stop))
            yield stack
            stop.set()
            if relay_task is not None:
                await asyncio.wait_for(relay_task, 10)
    finally:
        stop.set()
        if waker is not None:
            waker.cancel()
            with contextlib.suppress(BaseException):
                await waker
        if relay_task is not None and not relay_task.done():
            relay_task.cancel()
            with contextlib.suppress(BaseException):
                await relay_task
        for close in closers:
            await close()
        await parts.close()


def new_relay(stack: Stack, **config: Any) -> Relay:
    """Another relay over the stack's database, client and catalog (e.g. a second relay, or
    one that "dies" after claiming)."""
    rc = dataclasses.replace(relay_config(stack.settings), **config)
    return Relay(stack.parts.sessionmaker, stack.client, stack.parts.catalog, rc)


@contextlib.asynccontextmanager
async def relay_running(relay: Relay) -> AsyncIterator[Relay]:
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop=stop))
    try:
        yield relay
    finally:
        stop.set()
        try:
            await asyncio.wait_for(task, 10)
        except BaseException:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
