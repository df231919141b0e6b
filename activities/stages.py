"""The five stages of a job and its two finalizers, as Temporal activities (DESIGN §3).

Each activity attempt is one transaction (or two for EXECUTE: a read before the provider call,
a write after it — never a transaction open across the call). Retries are Temporal's: an attempt
raises `ApplicationError(type=CODE, non_retryable=...)` and the job is marked once, at the end,
by the workflow. Failure messages carry the public message only; details go to
`ai_job.internal_error_message`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any, NoReturn, TypeVar

from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.gateway import Gateway
from db.jobs import JobQueries, JobRow
from db.lifecycle import LifecycleRepository
from db.outbox import CANCELLED, COMPLETED, FAILED, OutboxRepository
from db.session import SessionMaker
from db.usage import UsageRepository, UsageRow
from engine.contracts import (
    COMPLETE,
    EXECUTE,
    FINALIZE_CANCELLED,
    FINALIZE_FAILED,
    PREPARE,
    PROJECT,
    RESOLVE,
    CompleteInput,
    CompleteResult,
    ExecuteInput,
    ExecuteResult,
    ExecutionPlan,
    FinalizeFailedInput,
    FinalizeResult,
    PrepareResult,
    ProjectInput,
    ProjectResult,
    ResolveResult,
    StageInput,
)
from engine.errors import (
    EngineError,
    ExecutionFailure,
    IllegalTransition,
    JobNotFound,
    LockConflict,
    is_retryable,
    public_message_for,
)
from engine.hashing import output_hash
from engine.lifecycle import LifecycleStatus
from engine.redaction import redact
from jobs.spec import Catalog, JobType, ProjectionContext
from providers.base import Provider, ProviderRequest, ProviderResponse, SyntheticBehaviour
from providers.pricing import cost_usd

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class EngineConfig:
    lock_ttl_s: int = 60
    heartbeat_timeout_ms: int = 10_000
    # How often EXECUTE extends lock_until in SQL (DESIGN §6: TTL 60 s, every 30 s).
    lock_extend_every_s: float = 30.0
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")


def _fail(
    code: str,
    *,
    attempt: int = 1,
    abort_strategy: str = "retry",
    retry_after_s: float | None = None,
) -> NoReturn:
    raise ApplicationError(
        public_message_for(code),
        type=code,
        non_retryable=not is_retryable(code, attempt=attempt, abort_strategy=abort_strategy),
        next_retry_delay=timedelta(seconds=retry_after_s) if retry_after_s else None,
    )


def _domain(exc: EngineError) -> NoReturn:
    """A domain error in a bookkeeping stage is final: retrying cannot change the answer."""
    raise ApplicationError(exc.public_message, type=exc.code, non_retryable=True) from None


def _transient(exc: BaseException) -> bool:
    """Lost connections and the like: let the stage retry until PostgreSQL is back."""
    return isinstance(exc, OperationalError | InterfaceError) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    )


def _summarise_validation(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors(include_url=False, include_input=False)[:10]:
        loc = ".".join(str(p) for p in e.get("loc", ())) or "(root)"
        parts.append(f"{loc}: {e.get('msg', '')}")
    return "; ".join(parts)


class JobActivities:
    """Built once per worker with its session factory, catalog and gateway (STYLE)."""

    def __init__(
        self,
        sessionmaker: SessionMaker,
        catalog: Catalog,
        gateway: Gateway,
        config: EngineConfig | None = None,
    ) -> None:
        self._sm = sessionmaker
        self._catalog = catalog
        self._gateway = gateway
        self._config = config or EngineConfig()
        self._lifecycle = LifecycleRepository(sessionmaker)
        self._jobs = JobQueries()
        self._outbox = OutboxRepository()
        self._usage = UsageRepository()

    def all(self) -> list[Any]:
        return [
            self.prepare,
            self.resolve,
            self.execute,
            self.project,
            self.complete,
            self.finalize_failed,
            self.finalize_cancelled,
        ]

    # ---- PREPARE ----------------------------------------------------------------------

    @activity.defn(name=PREPARE)
    async def prepare(self, inp: StageInput) -> PrepareResult:
        job_id = uuid.UUID(inp.job_id)
        try:
            # The CAS itself is the check: it matches a queued job (or our own lock after a
            # retry) and names the state it found otherwise.
            locked = await self._lifecycle.lock(
                job_id,
                owner=_owner(),
                run_id=activity.info().workflow_run_id,
                identity=self._config.identity,
                ttl_s=self._config.lock_ttl_s,
            )
        except JobNotFound:
            _fail("INTERNAL_JOB_MISSING", attempt=99)
        except (IllegalTransition, LockConflict) as exc:
            # Already ended (e.g. cancelled while queued): nothing runs; report what won.
            found = exc.from_status if isinstance(exc, IllegalTransition) else "running"
            if found in TERMINAL_STATES:
                return PrepareResult(run=False, lifecycle_status=str(found))
            _domain(exc)
        jt = self._catalog.get(locked.job_type)
        d = jt.definition
        activity.logger.info("job locked", extra={"job_id": inp.job_id})
        return PrepareResult(
            run=True,
            lifecycle_status="running",
            plan=ExecutionPlan(
                queue_name=d.queue.queue_name,
                timeout_ms=d.execution.timeout_ms,
                max_attempts=d.max_attempts,
                backoff_ms=d.execution.retry_backoff.delay,
                abort_strategy=d.execution.abort_strategy,
                cancellable=d.execution.cancellable,
                heartbeat_timeout_ms=self._config.heartbeat_timeout_ms,
            ),
        )

    # ---- RESOLVE ----------------------------------------------------------------------

    @activity.defn(name=RESOLVE)
    async def resolve(self, inp: StageInput) -> ResolveResult:
        """Check that everything EXECUTE needs exists (snapshot, credential) and name the
        provider, model and prompt version. Only references leave this activity."""
        job_id = uuid.UUID(inp.job_id)
        async with self._sm.begin() as s:
            row = await self._jobs.resolve_refs(s, job_id)
            if row is None:
                _fail("INTERNAL_JOB_MISSING", attempt=99)
            jt = self._catalog.get(row.job_type)
            if not row.has_snapshot:
                _fail("INTERNAL_SNAPSHOT_MISSING", attempt=99)
            if not await self._gateway.credential_available(
                s, jt, row.user_id, row.credential_mode, row.credential_id
            ):
                _fail("CREDENTIAL_MISSING")
        provider = self._gateway.provider_for(jt, row.credential_mode)
        return ResolveResult(
            prompt_version=row.prompt_version,
            credential_mode=row.credential_mode,
            provider=provider.name,
            model=self._gateway.model_for(jt, row.credential_mode),
        )

    # ---- EXECUTE ----------------------------------------------------------------------

    @activity.defn(name=EXECUTE)
    async def execute(self, inp: ExecuteInput) -> ExecuteResult:
        info = activity.info()
        attempt = info.attempt
        job_id = uuid.UUID(inp.job_id)
        cfg = self._config
        owner = _owner()

        # 1. Read what the call needs; extend the lock (proves we still own the job).
        async def load() -> tuple[
            JobRow, dict[str, Any], JobType, str | None, ExecutionFailure | None
        ]:
            async with self._sm.begin() as s:
                ext = await self._lifecycle.extend_lock(
                    job_id, owner=owner, ttl_s=cfg.lock_ttl_s, session=s
                )
                row = await self._jobs.get(s, job_id)
                snapshot = await self._jobs.get_snapshot(s, job_id)
                if row is None or not ext.extended:
                    _fail("INTERNAL_NOT_LOCK_OWNER", attempt=99)
                if ext.cancel_requested:
                    _fail("CANCELLED")
                if snapshot is None:
                    _fail("INTERNAL_SNAPSHOT_MISSING", attempt=99)
                jt = self._catalog.get(row.job_type)
                try:
                    key = await self._gateway.api_key(
                        s, jt, row.user_id, row.credential_mode, row.credential_id
                    )
                except ExecutionFailure as f:
                    return row, snapshot, jt, None, f
                return row, snapshot, jt, key, None

        row, snapshot, jt, api_key, key_failure = await _db_retry(load)
        # Recorded after the read transaction ended: it holds the row lock extend_lock took,
        # and _record_failure updates the same row from another connection.
        if key_failure is not None:
            await self._record_failure(row, attempt, key_failure, provider="none", model="none")
            _fail(key_failure.code, attempt=attempt)

        provider = self._gateway.provider_for(jt, row.credential_mode)
        model_name = self._gateway.model_for(jt, row.credential_mode)
        started = time.monotonic()
        response: ProviderResponse | None = None
        failure: ExecutionFailure | None = None
        validated: BaseModel | None = None
        try:
            model_in = jt.input_model.model_validate(snapshot["input"])
            correction = None
            if attempt > 1 and (row.internal_error_message or "").startswith("VALIDATION_"):
                correction = (
                    "Your previous answer was rejected: "
                    + (row.internal_error_message or "").split(": ", 1)[-1]
                    + ". Answer again with JSON that matches the schema exactly."
                )
            prompt = jt.build_prompt(model_in, correction)
            if jt.definition.security.content_safety_check:
                self._gateway.safety.check([prompt.system, prompt.user])
            request = ProviderRequest(
                job_id=inp.job_id,
                job_type=row.job_type,
                attempt=attempt,
                model=model_name,
                system_prompt=prompt.system,
                user_prompt=prompt.user,
                output_schema=_output_schema(jt.output_model),
                timeout_s=inp.timeout_ms / 1000,
                api_key=api_key,
                synthetic=(
                    jt.synthetic_behaviour(model_in)
                    if jt.synthetic_behaviour is not None
                    else SyntheticBehaviour(output=jt.synthetic_output(model_in))
                ),
            )
            del api_key
            response = await self._call(job_id, inp, provider, request, cfg)
            try:
                validated = jt.output_model.model_validate(json.loads(response.content))
            except (ValueError, ValidationError) as exc:
                detail = (
                    _summarise_validation(exc)
                    if isinstance(exc, ValidationError)
                    else "output is not valid JSON"
                )
                failure = ExecutionFailure(
                    "VALIDATION_OUTPUT_INVALID",
                    internal_message=f"VALIDATION_OUTPUT_INVALID: {detail}",
                )
        except TimeoutError:
            failure = ExecutionFailure(
                "TIMEOUT", internal_message=f"provider call exceeded {inp.timeout_ms} ms"
            )
        except ExecutionFailure as f:
            failure = f
        except _SelfCancelled:
            failure = ExecutionFailure("CANCELLED", internal_message="cancel requested (SQL)")
        except asyncio.CancelledError:
            # Cancelled by Temporal (workflow cancel): record the aborted call, then let it go.
            await asyncio.shield(
                self._record_failure(
                    row,
                    attempt,
                    ExecutionFailure("CANCELLED"),
                    provider=provider.name,
                    model=model_name,
                    latency_ms=int((time.monotonic() - started) * 1000),
                )
            )
            raise
        except Exception as exc:  # a bug or an unexpected library error: INTERNAL, retried once
            failure = ExecutionFailure(
                "INTERNAL_ERROR", internal_message=f"{type(exc).__name__}: {str(exc)[:500]}"
            )

        latency_ms = int((time.monotonic() - started) * 1000)
        if failure is not None:
            await self._record_failure(
                row,
                attempt,
                failure,
                provider=provider.name,
                model=model_name,
                latency_ms=latency_ms,
                response=response,
            )
            _fail(
                failure.code,
                attempt=attempt,
                abort_strategy=inp.abort_strategy,
                retry_after_s=failure.retry_after_float,
            )

        assert validated is not None and response is not None
        out = validated.model_dump(mode="json")
        if jt.definition.security.output_redaction:
            # Redacted before it is stored: the stored output, the projected rows and the hash
            # all see the masked text. Still the output model's shape (masks are plain text).
            out = jt.output_model.model_validate(redact(out)).model_dump(mode="json")
        digest = output_hash(out)
        resp = response

        async def store() -> None:
            async with self._sm.begin() as s:
                await self._usage.insert(s, self._usage_row(row, attempt, resp, None, latency_ms))
                stored = await self._jobs.store_output(
                    s, job_id, owner=owner, output=out, output_hash=digest, progress=60
                )
                if not stored:
                    _fail("INTERNAL_NOT_LOCK_OWNER", attempt=99)
                await self._jobs.record_attempt(s, job_id, attempt=attempt, internal_error=None)

        # The provider answered: a database outage now must not cost another provider call.
        await _db_retry(store)
        return ExecuteResult(output_hash=digest, attempt=attempt)

    async def _call(
        self,
        job_id: uuid.UUID,
        inp: ExecuteInput,
        provider: Provider,
        request: ProviderRequest,
        cfg: EngineConfig,
    ) -> ProviderResponse:
        """The provider call under the definition's timeout, heartbeating to Temporal (so a
        workflow cancel arrives within about the heartbeat timeout) and extending the SQL lock.
        A cancel recorded in SQL (e.g. the Temporal cancel RPC failed) aborts the call too."""
        call = asyncio.ensure_future(provider.generate(request))
        self_cancelled = False
        owner = _owner()

        async def beat() -> None:
            nonlocal self_cancelled
            last_extend = time.monotonic()
            interval = max(0.2, min(0.5, cfg.heartbeat_timeout_ms / 4000))
            while not call.done():
                activity.heartbeat()
                await asyncio.sleep(interval)
                if time.monotonic() - last_extend >= cfg.lock_extend_every_s:
                    last_extend = time.monotonic()
                    try:
                        ext = await self._lifecycle.extend_lock(
                            job_id, owner=owner, ttl_s=cfg.lock_ttl_s
                        )
                    except Exception:
                        continue  # a lost extension is survivable; the TTL has slack
                    if ext.cancel_requested or not ext.extended:
                        self_cancelled = True
                        call.cancel()
                        return

        hb = asyncio.ensure_future(beat())
        try:
            async with asyncio.timeout(inp.timeout_ms / 1000):
                return await call
        except asyncio.CancelledError:
            if self_cancelled and not _current_task_cancelling():
                raise _SelfCancelled() from None
            raise
        finally:
            hb.cancel()
            if not call.done():
                call.cancel()

    async def _record_failure(
        self,
        row: JobRow,
        attempt: int,
        failure: ExecutionFailure,
        *,
        provider: str,
        model: str,
        latency_ms: int = 0,
        response: ProviderResponse | None = None,
    ) -> None:
        async with self._sm.begin() as s:
            await self._usage.insert(
                s,
                self._usage_row(row, attempt, response, failure.code, latency_ms, provider, model),
            )
            await self._jobs.record_attempt(
                s,
                row.id,
                attempt=attempt,
                internal_error=failure.internal_message or failure.code,
            )
        activity.logger.info(
            "provider attempt failed",
            extra={"job_id": str(row.id), "attempt": attempt, "error_code": failure.code},
        )

    @staticmethod
    def _usage_row(
        row: JobRow,
        attempt: int,
        response: ProviderResponse | None,
        error_code: str | None,
        latency_ms: int,
        provider: str | None = None,
        model: str | None = None,
    ) -> UsageRow:
        tin = response.tokens_in if response else 0
        tout = response.tokens_out if response else 0
        m = response.model if response else (model or "unknown")
        return UsageRow(
            job_id=row.id,
            user_id=row.user_id,
            attempt_no=attempt,
            credential_mode=row.credential_mode,
            provider=response.provider if response else (provider or "unknown"),
            model=m,
            tokens_in=tin,
            tokens_out=tout,
            cost_usd=cost_usd(m, tin, tout) if response else Decimal(0),
            latency_ms=latency_ms,
            error_code=error_code,
        )

    # ---- PROJECT ----------------------------------------------------------------------

    @activity.defn(name=PROJECT)
    async def project(self, inp: ProjectInput) -> ProjectResult:
        """Projector + markSucceeded + `ai.job.completed` + progress 100 in one transaction.
        Idempotent: a retry after a commit whose result was lost finds `succeeded` and its
        artifacts; unique keys make a repeated projection write nothing new."""
        job_id = uuid.UUID(inp.job_id)
        attempt = activity.info().attempt
        try:
            async with self._sm.begin() as s:
                row = await self._jobs.get(s, job_id)
                if row is None:
                    _fail("INTERNAL_JOB_MISSING", attempt=99)
                if row.lifecycle_status != LifecycleStatus.RUNNING:
                    arts = await self._jobs.artifacts(s, [job_id])
                    return ProjectResult(row.lifecycle_status, len(arts[job_id]))
                if row.output is None or row.output_hash != inp.output_hash:
                    _fail("INTERNAL_OUTPUT_MISMATCH", attempt=99)
                jt = self._catalog.get(row.job_type)
                out = jt.output_model.model_validate(row.output)
                ctx = ProjectionContext(
                    job_id=job_id,
                    user_id=row.user_id,
                    target_type=row.target_type,
                    target_id=row.target_id,
                    output_hash=inp.output_hash,
                )
                artifacts = await jt.project(s, ctx, out)
                for a in artifacts:
                    await self._jobs.insert_artifact(
                        s, job_id, a.artifact_type, a.artifact_id, a.ordinal
                    )
                await self._lifecycle.mark_succeeded(job_id, owner=_owner(), session=s)
                await self._outbox.insert(
                    s,
                    event_type=COMPLETED,
                    aggregate_type="AiJob",
                    aggregate_id=inp.job_id,
                    dedupe_key=f"{COMPLETED}:{inp.job_id}",
                    payload={
                        "jobId": inp.job_id,
                        "jobType": row.job_type,
                        "outputHash": inp.output_hash,
                        "artifactCount": len(artifacts),
                    },
                    notify=False,
                )
                usage = await self._usage.summary(s, job_id)
                result = ProjectResult(
                    "succeeded",
                    len(artifacts),
                    calls=usage.calls,
                    tokens_in=usage.tokens_in,
                    tokens_out=usage.tokens_out,
                    cost_micros=int(usage.cost_usd * 1_000_000),
                )
            # Committed: the job's one "completed" line (the COMPLETE stage no longer runs for
            # new workflows; it stays registered for workflows started before).
            activity.logger.info(
                "job completed",
                extra={
                    "job_id": inp.job_id,
                    "calls": result.calls,
                    "tokens_in": result.tokens_in,
                    "tokens_out": result.tokens_out,
                    "cost_micros": result.cost_micros,
                },
            )
            return result
        except ApplicationError:
            raise
        except (IllegalTransition, LockConflict):
            # A concurrent PROJECT (or a cancel) won the row: report what the job is now.
            async with self._sm.begin() as s:
                row = await self._jobs.get(s, job_id)
                arts = await self._jobs.artifacts(s, [job_id])
            if row is None:
                _fail("INTERNAL_JOB_MISSING", attempt=99)
            return ProjectResult(row.lifecycle_status, len(arts[job_id]))
        except EngineError as exc:
            _domain(exc)
        except Exception as exc:
            if _transient(exc):
                raise  # retried by the bookkeeping policy until the database is back
            await self._note_internal(job_id, f"projection failed: {type(exc).__name__}: {exc}")
            _fail("INTERNAL_PROJECTION_FAILED", attempt=attempt)

    async def _note_internal(self, job_id: uuid.UUID, message: str) -> None:
        try:
            async with self._sm.begin() as s:
                await self._jobs.record_attempt(s, job_id, attempt=0, internal_error=message[:2000])
        except Exception:
            log.warning("could not record internal error", extra={"job_id": str(job_id)})

    # ---- COMPLETE ---------------------------------------------------------------------

    @activity.defn(name=COMPLETE)
    async def complete(self, inp: CompleteInput) -> CompleteResult:
        """Usage summary and the domain event. The durable parts (ai.job.completed in the outbox,
        progress 100, the usage figures) were committed by PROJECT in its transaction
        (ADR §6.2); this stage reports them and touches no table."""
        activity.logger.info(
            "job completed",
            extra={
                "job_id": inp.job_id,
                "calls": inp.calls,
                "tokens_in": inp.tokens_in,
                "tokens_out": inp.tokens_out,
                "cost_micros": inp.cost_micros,
            },
        )
        return CompleteResult(
            calls=inp.calls,
            tokens_in=inp.tokens_in,
            tokens_out=inp.tokens_out,
            cost_micros=inp.cost_micros,
        )

    # ---- finalizers -------------------------------------------------------------------

    @activity.defn(name=FINALIZE_FAILED)
    async def finalize_failed(self, inp: FinalizeFailedInput) -> FinalizeResult:
        job_id = uuid.UUID(inp.job_id)
        try:
            async with self._sm.begin() as s:
                await self._lifecycle.mark_failed(
                    job_id, inp.code, public_message_for(inp.code), None, session=s
                )
                row = await self._jobs.get(s, job_id)
                await self._outbox.insert(
                    s,
                    event_type=FAILED,
                    aggregate_type="AiJob",
                    aggregate_id=inp.job_id,
                    dedupe_key=f"{FAILED}:{inp.job_id}",
                    payload={
                        "jobId": inp.job_id,
                        "jobType": row.job_type if row else None,
                        "errorCode": inp.code,
                    },
                    notify=False,
                )
            return FinalizeResult("failed")
        except IllegalTransition as exc:
            return FinalizeResult(str(exc.from_status))
        except JobNotFound:
            # The job row is gone (deleted): nothing to mark, and retrying cannot change that.
            # The execution still failed.
            return FinalizeResult("failed")

    @activity.defn(name=FINALIZE_CANCELLED)
    async def finalize_cancelled(self, inp: StageInput) -> FinalizeResult:
        job_id = uuid.UUID(inp.job_id)
        try:
            async with self._sm.begin() as s:
                await self._lifecycle.mark_cancelled(job_id, session=s)
                await self._outbox.insert(
                    s,
                    event_type=CANCELLED,
                    aggregate_type="AiJob",
                    aggregate_id=inp.job_id,
                    dedupe_key=f"{CANCELLED}:{inp.job_id}",
                    payload={"jobId": inp.job_id},
                    notify=False,
                )
            return FinalizeResult("cancelled")
        except IllegalTransition as exc:
            return FinalizeResult(str(exc.from_status))
        except JobNotFound:
            return FinalizeResult("cancelled")  # the job row is gone: nothing left to mark


@functools.cache
def _output_schema(model: type[BaseModel]) -> dict[str, Any]:
    """JSON schema of an output model; built once per job type, not per call."""
    return model.model_json_schema()


async def _db_retry(op: Callable[[], Awaitable[T]], *, budget_s: float = 120.0) -> T:
    """EXECUTE's own transactions ride out a database outage (heartbeating meanwhile) instead of
    failing the attempt: a lost connection must not spend one of the job's provider attempts."""
    delay = 0.5
    deadline = time.monotonic() + budget_s
    while True:
        try:
            return await op()
        except Exception as exc:
            if not _transient(exc) or time.monotonic() > deadline:
                raise
            log.warning("database unavailable in EXECUTE; retrying in %.1fs", delay)
            activity.heartbeat()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 4.0)


TERMINAL_STATES = frozenset(
    {LifecycleStatus.SUCCEEDED, LifecycleStatus.FAILED, LifecycleStatus.CANCELLED}
)


def _owner() -> str:
    """The lock owner of the job this activity works on: its workflow id, one per job and the
    same across runs (a Temporal Reset keeps the lock)."""
    workflow_id = activity.info().workflow_id
    if not workflow_id:
        raise RuntimeError("a job stage runs only inside its job's workflow")
    return workflow_id


class _SelfCancelled(Exception):
    """EXECUTE aborted its own call because SQL says the job was cancelled."""


def _current_task_cancelling() -> bool:
    task = asyncio.current_task()
    return bool(task and task.cancelling())
