"""The job use cases: create (idempotent, quota-checked, transactional outbox), cancel, retry.

Create writes the job, its snapshot and its `ai.job.enqueue` outbox row in ONE transaction and
never talks to Temporal; the relay starts the workflow after commit. Every use case opens its own
transactions; the repositories it calls run in them and never commit.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import hmac
import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from opentelemetry import trace
from pydantic import BaseModel, ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from db import budgets as budgets_db
from db import jobs as jobs_db
from db import lifecycle as lifecycle_db
from db import snapshots as snapshots_db
from db.chunks import PlannedChunk, insert_plan
from db.chunks import copy_succeeded as copy_succeeded_chunks
from db.credentials import owned_active_key_id
from db.errors import is_unique_violation
from db.jobs import JOB_COLUMNS, JobRow
from db.lifecycle import NewJob
from db.outbox import ENQUEUE, enqueue_dedupe_key
from db.session import SessionMaker
from engine.contracts import workflow_id
from engine.definition import PLATFORM_KEY, USER_DEEPSEEK_KEY
from engine.errors import (
    CredentialMissing,
    CredentialNotFound,
    IdempotencyKeyReused,
    JobAlreadyCancelled,
    JobNotCancellable,
    JobNotFound,
    JobNotRetryable,
    PlatformUnavailable,
    QuotaExceeded,
    RequestTooLarge,
    TooManyJobs,
    UnknownJobType,
    ValidationFailed,
)
from engine.hashing import request_fingerprint
from engine.lifecycle import LifecycleStatus
from engine.logcontext import job_context
from engine.queues import resolve_execution
from engine.tokens import count_chat_tokens, estimate_prompt_tokens
from jobs import chunked, lifecycle
from jobs.costs import (
    BudgetWindow,
    JobEstimate,
    budget_windows,
    estimate_job,
    next_utc_day,
    next_utc_month,
    seconds_until,
    utc_day_start,
    utc_month_start,
)
from jobs.spec import AnyJobType, Catalog
from jobs.tracecontext import current_trace_context
from jobs.views import Owner, can_see, not_found
from providers.pricing import PriceTable

log = logging.getLogger(__name__)
# `ai_job_snapshot.redaction_version` of a snapshot stored as the user wrote it.
SNAPSHOT_VERBATIM = "none"


@dataclass(frozen=True)
class CreatePolicy:
    max_active_jobs: int = 50  # 0 = unlimited
    max_jobs_per_day: int = 1000  # 0 = unlimited
    max_jobs_per_month: int = 20_000  # 0 = unlimited
    max_cost_usd_per_day: float = 0.0  # 0 = unlimited
    max_cost_usd_per_month: float = 0.0  # 0 = unlimited
    synthetic_public: bool = True  # "dev" job types may be created over REST
    platform_key_available: bool = True
    snapshot_ttl_days: int = 30
    # The key for the pseudonymous fairness key (HMAC of the user id); weights per user.
    fairness_secret: bytes = b"aijobs-fairness"
    fairness_weights: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # Tokens the configured model accepts (prompt and answer); None: unknown, no check.
    context_window: int | None = None
    # What a job's calls will cost (jobs/costs.py): the configured model (AI_MODEL), whether the
    # platform's calls go to the synthetic provider (no key and no base URL: model "synthetic"),
    # the prices, and the margin a worst case adds to the token estimate.
    model: str = "synthetic"
    platform_synthetic: bool = True
    prices: PriceTable = dataclasses.field(default_factory=PriceTable)
    estimate_margin: float = 0.25
    # A long source's per-call input budget (AI_CHUNK_INPUT_TOKENS): past it, chunks.
    chunking: chunked.ChunkPolicy = dataclasses.field(default_factory=chunked.ChunkPolicy)

    def model_for(self, jt: AnyJobType, mode: str) -> str:
        """The model a job's calls use (as jobs/gateway.py chooses it for EXECUTE)."""
        if jt.always_synthetic or (mode == PLATFORM_KEY and self.platform_synthetic):
            return "synthetic"
        return self.model

    def fairness_key(self, user_id: str) -> str:
        """The user's fairness key on Temporal's task queues: stable per user, not reversible
        without the secret, short (Temporal keys are at most 64 bytes)."""
        digest = hmac.new(self.fairness_secret, user_id.encode(), hashlib.sha256).hexdigest()
        return f"u-{digest[:24]}"


@dataclass(frozen=True)
class CreateJobRequest:
    user_id: str
    job_type: str
    target_type: str
    target_id: str
    input: dict[str, Any]
    priority: int | None = None
    idempotency_key: str | None = None
    credential_mode: str | None = None
    # One of the caller's own active keys (user_deepseek_key only); None: the newest.
    credential_id: uuid.UUID | None = None
    retried_from_job_id: uuid.UUID | None = None
    # The most this job may cost in all (USD); its answer budget is cut to fit. None: no cap.
    max_cost_usd: Decimal | None = None
    # Admin retry and internal callers bypass visibility and quotas.
    internal: bool = False


# Retry-After (seconds) on 429 TOO_MANY_JOBS.
TOO_MANY_JOBS_RETRY_AFTER_S = 5


@dataclass(frozen=True)
class CreateJobResult:
    job: JobRow
    created: bool


@dataclass(frozen=True)
class CancelResult:
    job_id: uuid.UUID
    outcome: Literal["cancelled", "cancel_requested"]


WorkflowCanceller = Callable[[str], Awaitable[None]]
# Runs inside a use case's transaction, after its decision (a cancel's outcome, a created job):
# what must commit or roll back with the action (an audit entry, a bulk item's state). Raising
# rolls the action back.
CancelHook = Callable[[AsyncSession, Literal["cancelled", "cancel_requested"]], Awaitable[None]]
CreateHook = Callable[[AsyncSession, JobRow], Awaitable[None]]


def validation_errors(exc: ValidationError) -> list[dict[str, object]]:
    """Pydantic errors without the offending input values (they may be sensitive)."""
    return [
        {"loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg", ""), "type": e.get("type")}
        for e in exc.errors(include_url=False, include_input=False)
    ]


class JobService:
    def __init__(
        self,
        sessionmaker: SessionMaker,
        catalog: Catalog,
        policy: CreatePolicy,
        *,
        credential_lookup: Callable[[AsyncSession, str], Awaitable[uuid.UUID | None]] | None = None,
    ) -> None:
        self._sm = sessionmaker
        self._catalog = catalog
        self._policy = policy
        self._credential_lookup = credential_lookup

    # ---- create -------------------------------------------------------------------------

    def job_type_for_create(self, job_type: str, *, internal: bool = False) -> AnyJobType:
        jt = self._catalog.get(job_type)
        if not internal and not jt.definition.creatable(development=self._policy.synthetic_public):
            raise UnknownJobType(job_type)
        return jt

    def validate_input(self, jt: AnyJobType, raw: Any) -> BaseModel:
        if not _finite(raw):
            # JSON has no NaN/Infinity; PostgreSQL jsonb would silently change them.
            raise ValidationFailed("The input contains a non-finite number.")
        try:
            # Strict: the input is JSON, and its types are what the schema says (`true` is not
            # a count, "5" is not a number); a stored input is re-read laxly by EXECUTE.
            model: BaseModel = jt.input_model.model_validate(
                raw if raw is not None else {}, strict=True
            )
            return model
        except ValidationError as exc:
            raise ValidationFailed(
                "The input does not match the job type's input schema.",
                errors=validation_errors(exc),
            ) from None

    def plan_chunks(self, jt: AnyJobType, model: BaseModel) -> list[PlannedChunk] | None:
        """A long source's chunks (jobs/chunked.py), or None: one call. Each chunk's prompt fits
        the per-call budget, and never more than the model's window leaves beside the answer."""
        if jt.chunking is None:
            return None
        window = None if jt.always_synthetic else self._policy.context_window
        leaves = window - jt.definition.execution.max_output_tokens if window is not None else None
        return chunked.plan(
            jt, model, self._policy.chunking, window_budget=max(leaves, 1) if leaves else None
        )

    def _check_fits_the_model(
        self, jt: AnyJobType, model: BaseModel, chunks: list[PlannedChunk] | None
    ) -> None:
        """Refuse (422 REQUEST_TOO_LARGE, naming the limit) a job whose prompt, by a lower-bound
        estimate, plus its output budget cannot fit the model's context window: no provider
        call could succeed, so nothing is queued, retried or paid for. A chunked job's calls are
        its chunks', each planned within the window."""
        window = self._policy.context_window
        if window is None or jt.always_synthetic or chunks:
            return
        prompt = jt.prompt(model, None)
        needed = estimate_prompt_tokens(prompt.system, prompt.user)
        budget = jt.definition.execution.max_output_tokens
        if needed + budget > window:
            raise RequestTooLarge(
                f"The input is too long for the AI model: at least {needed} prompt tokens plus "
                f"an answer budget of {budget} exceed its context window of {window} tokens. "
                "Shorten the input."
            )

    def estimate(
        self,
        jt: AnyJobType,
        model: BaseModel,
        mode: str,
        max_cost_usd: Decimal | None,
        chunks: list[PlannedChunk] | None = None,
    ) -> JobEstimate:
        """The job's tokens and cost before any call (jobs/costs.py), over all its chunks' calls
        for a long source; a cap too low for it raises CostCapTooLow."""
        model_name = self._policy.model_for(jt, mode)
        budget = jt.definition.execution.max_output_tokens
        inputs = [chunked.chunk_model(jt, model, c) for c in chunks] if chunks else [model]
        expected = sum(
            jt.expected_output_tokens(i) if jt.expected_output_tokens else budget // 4
            for i in inputs
        )
        if jt.always_synthetic:
            # A synthetic job type's calls are free and never reach a provider: no prompt is
            # built for it here (EXECUTE builds it, and a failure there is the job's own).
            prompt_tokens: list[int] = []
        elif chunks:
            # The plan counted each chunk's prompt already; a long source is not counted twice.
            prompt_tokens = [c.input_tokens for c in chunks]
        else:
            prompt = jt.prompt(model, None)
            prompt_tokens = [count_chat_tokens(prompt.system, prompt.user)]
        return estimate_job(
            prompt_tokens,
            model=model_name,
            price=self._policy.prices.price_for(model_name),
            output_budget=budget,
            expected_output_tokens=expected,
            margin=self._policy.estimate_margin,
            max_cost_usd=max_cost_usd,
        )

    def checked_request(self, req: CreateJobRequest) -> CheckedRequest:
        """Everything create decides before it touches the database: the type, the validated
        input, priority, credential mode, the estimate and the request's fingerprint. A quote
        stops here; create goes on."""
        jt = self.job_type_for_create(req.job_type, internal=req.internal)
        d = jt.definition
        model = self.validate_input(jt, req.input)
        normalized = model.model_dump(mode="json", by_alias=True, exclude_none=True)
        priority = d.queue.default_priority if req.priority is None else req.priority
        if not 0 <= priority <= 100:
            raise ValidationFailed("priority must be between 0 and 100")
        mode = req.credential_mode or d.credential.default_mode
        if mode not in d.credential.allowed_modes:
            raise ValidationFailed("credentialMode is not allowed for this job type")
        if req.credential_id is not None and mode != USER_DEEPSEEK_KEY:
            raise ValidationFailed(
                "credentialId is only accepted with credentialMode user_deepseek_key",
                errors=[
                    {"loc": ["credentialId"], "msg": "needs user_deepseek_key", "type": "value"}
                ],
            )
        if req.max_cost_usd is not None and not (
            req.max_cost_usd.is_finite() and req.max_cost_usd > 0
        ):
            raise ValidationFailed(
                "maxCostUsd must be a positive number",
                errors=[{"loc": ["maxCostUsd"], "msg": "must be > 0", "type": "value"}],
            )
        chunks = self.plan_chunks(jt, model)
        self._check_fits_the_model(jt, model, chunks)
        if jt.target_types is not None and req.target_type not in jt.target_types:
            raise ValidationFailed(
                f"targetType must be one of: {', '.join(jt.target_types)}",
                errors=[{"loc": ["targetType"], "msg": "unsupported targetType", "type": "enum"}],
            )
        estimate = self.estimate(jt, model, mode, req.max_cost_usd, chunks)
        # The effective priority and credential mode: omitting them and sending the defaults
        # are the same request.
        fingerprint = request_fingerprint(
            d.job_type,
            req.target_type,
            req.target_id,
            normalized,
            priority,
            mode,
            str(req.credential_id) if req.credential_id is not None else None,
            str(req.max_cost_usd) if req.max_cost_usd is not None else None,
        )
        return CheckedRequest(jt, normalized, priority, mode, estimate, fingerprint, chunks)

    async def quote(self, req: CreateJobRequest) -> Quote:
        """What creating `req` now would cost and whether it would be admitted: the checks and
        the estimate of create, and its quotas and budgets read without the user's lock. It
        writes nothing and counts against nothing."""
        checked = self.checked_request(req)
        if (
            checked.mode == PLATFORM_KEY
            and not checked.job_type.always_synthetic
            and not self._policy.platform_key_available
        ):
            raise PlatformUnavailable()
        now = dt.datetime.now(dt.UTC)
        async with self._sm.begin() as s:
            refusal = await self.admission_refusal(s, req.user_id, checked.estimate)
            held = [
                (w, await budgets_db.committed(s, req.user_id, w.since))
                for w in self.budget_windows(now)
            ]
        return Quote(checked, refusal, held)

    async def create(
        self, req: CreateJobRequest, *, within: CreateHook | None = None
    ) -> CreateJobResult:
        checked = self.checked_request(req)
        jt, d = checked.job_type, checked.job_type.definition
        normalized, priority, mode = checked.normalized, checked.priority, checked.mode
        estimate, fingerprint = checked.estimate, checked.fingerprint
        if req.idempotency_key is not None:
            async with self._sm.begin() as s:
                existing = await jobs_db.find_by_idempotency_key(
                    s, req.user_id, d.job_type, req.idempotency_key
                )
            if existing is not None:
                return self._same_request(existing, fingerprint)

        if mode == PLATFORM_KEY and not jt.always_synthetic:
            if not self._policy.platform_key_available:
                raise PlatformUnavailable()

        job_id = uuid.uuid4()
        new = NewJob(
            id=job_id,
            user_id=req.user_id,
            job_type=d.job_type,
            target_type=req.target_type,
            target_id=req.target_id,
            idempotency_key=req.idempotency_key,
            request_fingerprint=fingerprint,
            queue_name=d.queue.queue_name,
            priority=priority,
            input=normalized,
            credential_mode=mode,
            credential_id=None,
            prompt_version=d.prompt_version,
            input_schema_version=d.input.schema_version,
            output_schema_version=d.output.schema_version,
            max_retry_count=resolve_execution(d).max_retries,
            workflow_id=workflow_id(d.queue.queue_name, d.job_type, str(job_id)),
            retried_from_job_id=req.retried_from_job_id,
            estimated_input_tokens=estimate.input_tokens,
            max_output_tokens=estimate.output_budget,
            max_cost_usd=req.max_cost_usd,
            reserved_cost_usd=estimate.worst_case_cost_usd,
            chunk_count=len(checked.chunks) if checked.chunks else None,
        )
        try:
            async with self._sm.begin() as s:
                if not req.internal:
                    winner = await self._enforce_quotas(s, req, fingerprint, estimate)
                    if winner is not None:
                        return winner
                if jt.check_target is not None and not req.internal:
                    await jt.check_target(s, req.user_id, req.target_type, req.target_id)
                if mode == USER_DEEPSEEK_KEY and req.credential_id is not None:
                    # The key the client named: its own and active, or 404 as if absent (no
                    # way to learn whether someone else's key id exists). Read FOR SHARE: a
                    # revoke racing this create waits for it, then the job fails at EXECUTE.
                    credential_id = await owned_active_key_id(s, req.user_id, req.credential_id)
                    if credential_id is None:
                        raise CredentialNotFound("Credential not found.")
                    new = dataclasses.replace(new, credential_id=credential_id)
                elif mode == USER_DEEPSEEK_KEY:
                    # The key chosen now is the key the job uses: pinned on the row, so a key
                    # added later never silently replaces it (a revoked one fails the job).
                    credential_id = (
                        await self._credential_lookup(s, req.user_id)
                        if self._credential_lookup is not None
                        else None
                    )
                    if credential_id is None:
                        raise CredentialMissing("No active credential for user_deepseek_key.")
                    new = dataclasses.replace(new, credential_id=credential_id)
                created = await lifecycle_db.create(s, new, returning=JOB_COLUMNS)
                assert created is not None
                row = JobRow(**created)
                if checked.chunks:
                    await insert_plan(s, job_id, checked.chunks)
                # The snapshot and the enqueue row in one statement (one round trip).
                enqueued = await snapshots_db.insert_snapshot_and_enqueue(
                    s,
                    job_id,
                    {
                        # What the user wrote: prompts are built from it, so it must keep its
                        # meaning (a redacted "[phone]" inside a prompt would not). It is private
                        # data under the retention rule, never logged, never sent to Temporal.
                        "input": normalized,
                        "targetType": req.target_type,
                        "targetId": req.target_id,
                    },
                    SNAPSHOT_VERBATIM,
                    self._policy.snapshot_ttl_days,
                    event_type=ENQUEUE,
                    aggregate_type="AiJob",
                    aggregate_id=str(job_id),
                    dedupe_key=enqueue_dedupe_key(job_id),
                    payload={
                        "jobId": str(job_id),
                        "jobType": d.job_type,
                        "queueName": d.queue.queue_name,
                        "priority": priority,
                        # Fair dispatch per user without naming the user in Temporal.
                        "fairnessKey": self._policy.fairness_key(req.user_id),
                        "fairnessWeight": self._policy.fairness_weights.get(req.user_id, 1.0),
                    },
                    # The relay continues this request's trace when it starts the workflow.
                    trace_context=current_trace_context(),
                )
                if enqueued is None:
                    # A job without its enqueue row would wait forever: roll the create back.
                    raise EnqueueNotWritten(str(job_id))
                if within is not None:
                    await within(s, row)
        except Exception as exc:
            # Two creates with one key raced past the lookup: the loser resolves to the winner.
            if req.idempotency_key is not None and is_unique_violation(exc):
                async with self._sm.begin() as s:
                    existing = await jobs_db.find_by_idempotency_key(
                        s, req.user_id, d.job_type, req.idempotency_key
                    )
                if existing is not None:
                    return self._same_request(existing, fingerprint)
            raise
        assert row is not None
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attributes({"aijobs.job_id": str(job_id), "aijobs.job_type": d.job_type})
        with job_context(str(job_id), d.job_type, row.workflow_id):
            log.info("job created", extra={"job_id": str(job_id), "job_type": d.job_type})
        return CreateJobResult(job=row, created=True)

    @staticmethod
    def _same_request(existing: JobRow, fingerprint: str) -> CreateJobResult:
        if existing.request_fingerprint != fingerprint:
            raise IdempotencyKeyReused(
                "This Idempotency-Key was already used with a different request."
            )
        return CreateJobResult(job=existing, created=False)

    async def _enforce_quotas(
        self, s: AsyncSession, req: CreateJobRequest, fingerprint: str, estimate: JobEstimate
    ) -> CreateJobResult | None:
        """Race-safe quotas: a per-user transaction-scoped advisory lock serialises one user's
        creates, so count-then-insert cannot overshoot, and the job's worst-case cost, reserved
        by the insert that follows in this transaction, cannot take spend plus reservations
        past a budget. Under the lock, a create with a key that a concurrent create just
        committed is answered with that job instead of a quota error."""
        p = self._policy
        if not (
            p.max_active_jobs
            or p.max_jobs_per_day
            or p.max_jobs_per_month
            or p.max_cost_usd_per_day
            or p.max_cost_usd_per_month
        ):
            return None
        await budgets_db.lock_user(s, req.user_id)
        if req.idempotency_key is not None:
            existing = await jobs_db.find_by_idempotency_key(
                s, req.user_id, req.job_type, req.idempotency_key
            )
            if existing is not None:
                return self._same_request(existing, fingerprint)
        refusal = await self.admission_refusal(s, req.user_id, estimate)
        if refusal is not None:
            raise refusal.error
        return None

    async def admission_refusal(
        self, s: AsyncSession, user_id: str, estimate: JobEstimate
    ) -> Refusal | None:
        """The first quota or budget a job of `estimate` would break now, or None. Create calls
        it under the user's lock and raises; a quote calls it without and reports."""
        p = self._policy
        now = dt.datetime.now(dt.UTC)
        day, month = utc_day_start(now), utc_month_start(now)
        # One round trip for the three counts; each only when its limit exists.
        active, today, this_month = await jobs_db.quota_counts(
            s,
            user_id,
            active=bool(p.max_active_jobs),
            day=day if p.max_jobs_per_day else None,
            month=month if p.max_jobs_per_month else None,
        )
        if p.max_active_jobs and active >= p.max_active_jobs:
            # A slot frees when one of the user's jobs ends, which no clock predicts: a short,
            # fixed hint, so a polite client neither hammers nor waits a job's whole timeout.
            return Refusal(
                "active_jobs",
                TooManyJobs(
                    f"At most {p.max_active_jobs} active jobs per user.",
                    retry_after_s=TOO_MANY_JOBS_RETRY_AFTER_S,
                ),
            )
        if p.max_jobs_per_day and today >= p.max_jobs_per_day:
            return Refusal(
                "jobs_per_day",
                QuotaExceeded(
                    f"At most {p.max_jobs_per_day} jobs per user per day.",
                    retry_after_s=seconds_until(next_utc_day(now), now),
                ),
            )
        if p.max_jobs_per_month and this_month >= p.max_jobs_per_month:
            return Refusal(
                "jobs_per_month",
                QuotaExceeded(
                    f"At most {p.max_jobs_per_month} jobs per user per month.",
                    retry_after_s=seconds_until(next_utc_month(now), now),
                ),
            )
        for window in self.budget_windows(now):
            held = await budgets_db.committed(s, user_id, window.since)
            error = window.refusal(held, estimate.worst_case_cost_usd, now)
            if error is not None:
                return Refusal(
                    "daily_cost_budget" if window.name == "daily" else "monthly_cost_budget",
                    error,
                )
        return None

    def budget_windows(self, now: dt.datetime) -> list[BudgetWindow]:
        """The user cost budgets in force (daily, monthly), each with its window."""
        return budget_windows(
            self._policy.max_cost_usd_per_day, self._policy.max_cost_usd_per_month, now
        )

    # ---- cancel -------------------------------------------------------------------------

    async def cancel(
        self,
        job_id: uuid.UUID,
        user_id: str,
        *,
        admin: bool = False,
        cancel_workflow: WorkflowCanceller | None = None,
        within: CancelHook | None = None,
    ) -> CancelResult:
        """One transaction locks the job row and decides on its state: queued → cancelled at
        once (with its `ai.job.cancelled` event); running → cancel requested, and the workflow
        ends the job itself; ended → an error naming why. The workflow is cancelled after
        commit, outside the transaction. If that Temporal call fails, the request stays
        recorded: the EXECUTE heartbeat reads it and the reconciler re-sends the cancel."""
        async with self._sm.begin() as s:
            row = await jobs_db.get_for_update(s, job_id)
            # The one owner rule (jobs/views.py): someone else's job reads as missing.
            if row is None or not can_see(Owner(user_id, is_admin=admin), row.user_id):
                raise not_found()
            current = LifecycleStatus(row.lifecycle_status)
            jt = self._catalog.get(row.job_type) if row.job_type in self._catalog else None
            if (
                current in (LifecycleStatus.QUEUED, LifecycleStatus.RUNNING)
                and jt is not None
                and not jt.definition.execution.cancellable
            ):
                # Declared non-cancellable: refused whether it waits or runs, so a client
                # cannot cancel it by being quick.
                raise JobNotCancellable("This job type cannot be cancelled.")
            if current == LifecycleStatus.QUEUED:
                # The job's end and its event, in this transaction (webhooks, streams).
                await lifecycle.cancel(s, job_id, only_if_queued=True)
                outcome: Literal["cancelled", "cancel_requested"] = "cancelled"
            elif current == LifecycleStatus.RUNNING:
                await lifecycle_db.request_cancel(s, job_id)
                outcome = "cancel_requested"
            elif current == LifecycleStatus.CANCELLED:
                raise JobAlreadyCancelled("The job is already cancelled.")
            else:
                raise JobNotCancellable("The job has already finished.")
            if within is not None:
                await within(s, outcome)
        if cancel_workflow is not None:
            try:
                await cancel_workflow(row.workflow_id)
            except Exception:
                if outcome == "cancelled":
                    # Its workflow may not exist yet; EXECUTE would find the job cancelled
                    # anyway, so ending it now is best effort.
                    log.info("no workflow to cancel yet", extra={"job_id": str(job_id)})
                else:  # recorded in SQL; the reconciler re-sends
                    log.warning("workflow cancel failed", extra={"job_id": str(job_id)})
        return CancelResult(job_id, outcome)

    # ---- admin retry --------------------------------------------------------------------

    async def retry(
        self, job_id: uuid.UUID, *, within: CreateHook | None = None
    ) -> CreateJobResult:
        """One new job per original, found by `retried_from_job_id` (unique), never by an
        idempotency key a user could have claimed first. A double-click returns the same job.
        `within` runs in the transaction that creates the retry (not when one existed)."""
        async with self._sm.begin() as s:
            row = await jobs_db.get(s, job_id)
            existing = await jobs_db.find_retry_of(s, job_id) if row is not None else None
        if row is None:
            raise JobNotFound("Job not found.")
        if row.lifecycle_status not in (LifecycleStatus.FAILED, LifecycleStatus.CANCELLED):
            raise JobNotRetryable("Only failed or cancelled jobs can be retried.")
        if existing is not None:
            return CreateJobResult(job=existing, created=False)
        if row.private_data_purged_at is not None:
            raise JobNotRetryable("The job's input has expired under the retention rule.")
        original = row.id

        async def keep_paid_chunks(s: AsyncSession, new: JobRow) -> None:
            # A long source's chunks the original already paid for are copied into the retry's
            # plan (same ranges only), in its create transaction: it calls for the others.
            await copy_succeeded_chunks(s, from_job=original, to_job=new.id)
            if within is not None:
                await within(s, new)

        try:
            return await self.create(
                CreateJobRequest(
                    user_id=row.user_id,
                    job_type=row.job_type,
                    target_type=row.target_type,
                    target_id=row.target_id,
                    input=row.input,
                    priority=row.priority,
                    credential_mode=row.credential_mode,
                    retried_from_job_id=row.id,
                    max_cost_usd=row.max_cost_usd,
                    internal=True,
                ),
                within=keep_paid_chunks,
            )
        except Exception as exc:
            if not is_unique_violation(exc):
                raise
            async with self._sm.begin() as s:
                existing = await jobs_db.find_retry_of(s, job_id)
            if existing is None:
                raise
            return CreateJobResult(job=existing, created=False)


RefusalLimit = Literal[
    "active_jobs", "jobs_per_day", "jobs_per_month", "daily_cost_budget", "monthly_cost_budget"
]


@dataclass(frozen=True)
class Refusal:
    """Which limit refuses a create now, and the 429 that says so."""

    limit: RefusalLimit
    error: TooManyJobs | QuotaExceeded


@dataclass(frozen=True)
class CheckedRequest:
    job_type: AnyJobType
    normalized: dict[str, Any]
    priority: int
    mode: str
    estimate: JobEstimate
    fingerprint: str
    chunks: list[PlannedChunk] | None = None  # a long source's plan; None: one call


@dataclass(frozen=True)
class Quote:
    checked: CheckedRequest
    refusal: Refusal | None  # None: a create now would be admitted
    budgets: list[tuple[BudgetWindow, budgets_db.Committed]]


class EnqueueNotWritten(RuntimeError):
    """The create transaction could not write its job's enqueue row (an invariant broke)."""


def _finite(value: Any, depth: int = 0) -> bool:
    if depth > 64:
        return False
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v, depth + 1) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_finite(v, depth + 1) for v in value)
    return True


def seconds_until_utc_midnight() -> int:
    now = dt.datetime.now(dt.UTC)
    return seconds_until(next_utc_day(now), now)
