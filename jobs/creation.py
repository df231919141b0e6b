"""Create a job (idempotent, quota-checked, transactional outbox), and quote one.

Create writes the job, its snapshot and its `ai.job.enqueue` outbox row in ONE transaction and
never talks to Temporal; the relay starts the workflow after commit. The request is checked
before any I/O (jobs/requests.py); the quotas and budgets are decided under the user's lock from
one read (jobs/quotas.py); the rows are written by db/ (`lifecycle.create`, `insert_plan`,
`snapshots.insert_snapshot_and_enqueue`). An `Idempotency-Key` seen before answers with that
job (same request) or refuses (`IDEMPOTENCY_KEY_REUSED`), including when two creates with one
key race: the loser's unique violation resolves to the winner.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from opentelemetry import trace
from sqlalchemy.ext.asyncio import AsyncSession

from db import jobs as jobs_db
from db import lifecycle as lifecycle_db
from db import snapshots as snapshots_db
from db.budgets import Committed
from db.chunks import insert_plan
from db.credentials import owned_active_key_id
from db.errors import is_unique_violation
from db.jobs import JobRow
from db.lifecycle import NewJob
from db.outbox import ENQUEUE, enqueue_dedupe_key
from db.session import SessionMaker
from engine.contracts import workflow_id
from engine.definition import PLATFORM_KEY, USER_DEEPSEEK_KEY
from engine.errors import (
    CredentialMissing,
    CredentialNotFound,
    IdempotencyKeyReused,
    PlatformUnavailable,
)
from engine.logcontext import job_context
from engine.queues import resolve_execution
from engine.tiers import OFFPEAK
from jobs import create_lock, flow, offpeak, scope_budgets
from jobs.cancellation import WorkflowCanceller
from jobs.costs import BudgetWindow
from jobs.flow import Decision
from jobs.policy import CreatePolicy
from jobs.quotas import Quotas, Refusal
from jobs.requests import CheckedRequest, CreateJobRequest, RequestChecker, arm_model_of
from jobs.reuse import attach, key_for
from jobs.rollouts import RolloutBook, choice
from jobs.scope_budgets import SCOPE_BUDGET, ScopeHolding
from jobs.spec import Catalog
from jobs.token_count import off_loop
from jobs.tracecontext import current_trace_context

log = logging.getLogger(__name__)
# Logged when a create is answered with the job an earlier create made under the same
# Idempotency-Key: the specification marks duplicates with `{{##duplicate}}`.
DUPLICATE_CREATE_LOG = "{{##duplicate}} create answered with the existing job"
# `ai_job_snapshot.redaction_version` of a snapshot stored as the user wrote it.
SNAPSHOT_VERBATIM = "none"

# Runs inside the create's transaction, after the job's rows: what must commit or roll back
# with it (an audit entry, a bulk item's state, a retry's copied chunks). Raising rolls the
# create back.
CreateHook = Callable[[AsyncSession, JobRow], Awaitable[None]]
CredentialLookup = Callable[[AsyncSession, str], Awaitable[uuid.UUID | None]]


@dataclass(frozen=True)
class CreateJobResult:
    job: JobRow
    created: bool
    # What keyed concurrency decided (jobs/flow.py): the jobs the create replaced, its due time;
    # `flow.holder` is `job` when a `skip` found the key held (nothing created).
    flow: Decision = dataclasses.field(default_factory=Decision)


@dataclass(frozen=True)
class Quote:
    checked: CheckedRequest
    refusal: Refusal | None  # None: a create now would be admitted
    budgets: list[tuple[BudgetWindow, Committed]]
    # The budgets of the job's organisation, teams and tags, and what each holds.
    scope_budgets: list[ScopeHolding] = dataclasses.field(default_factory=list)


class RolloutMoved(Exception):
    """The job's type has another rollout (or none, or one) than its arm was chosen from."""


class EnqueueNotWritten(RuntimeError):
    """The create transaction could not write its job's enqueue row (an invariant broke)."""


class JobCreation:
    """The create and quote use cases over one session factory, catalog and create policy."""

    def __init__(
        self,
        sessionmaker: SessionMaker,
        catalog: Catalog,
        policy: CreatePolicy,
        *,
        credential_lookup: CredentialLookup | None = None,
    ) -> None:
        self._sm = sessionmaker
        self._catalog = catalog
        self._policy = policy
        self._credential_lookup = credential_lookup
        self.requests = RequestChecker(catalog, policy)
        self.quotas = Quotas(policy)
        # The job types' rollouts, as creates read them (jobs/rollouts.py).
        self.rollouts = RolloutBook(sessionmaker)

    async def quote(self, req: CreateJobRequest) -> Quote:
        """What creating `req` now would cost and whether it would be admitted: the checks and
        the estimate of create, and its quotas and budgets read without the user's lock. It
        writes nothing and counts against nothing."""
        # Token counting of a long source: on the process's bounded check pool, not the loop.
        checked = await off_loop(self.requests.check, await self.with_arm(req))
        self._check_platform(checked)
        now = datetime.now(UTC)
        async with self._sm.begin() as s:
            admission = await self.quotas.admission(s, req.user_id, checked.estimate)
            scoped = await scope_budgets.standing(s, req.scopes, lock=False, now=now)
        refusal = admission.refusal
        if refusal is None:
            error = scope_budgets.first_refusal(scoped, checked.estimate.worst_case_cost_usd, now)
            refusal = Refusal(SCOPE_BUDGET, error) if error is not None else None
        return Quote(checked, refusal, admission.budgets, scoped)

    async def create(
        self,
        req: CreateJobRequest,
        *,
        within: CreateHook | None = None,
        budgeted: bool = False,
        cancel_workflow: WorkflowCanceller | None = None,
    ) -> CreateJobResult:
        """Check `req`, then write the job, its plan, its snapshot and its enqueue row in one
        transaction (`within` runs last in it). Returns the existing job for a repeated
        `Idempotency-Key` with the same request (`created` False), or the job holding the
        key of a `skip` create. `budgeted`: an internal create (an admin retry) that still
        reserves against the owner's quotas and budgets. After the commit, the jobs a
        `supersede` replaced while they ran are cancelled, and the workflows of the queued ones
        it replaced with them (`cancel_workflow`, best effort).

        Its arm of the job type's rollout: from the rollout cache when the process listens for
        rollout changes (none read otherwise); the job's INSERT says which rollout stands now,
        and a create whose arm came from another one (or none) is rolled back and made again
        with the rollout read afresh. A create of a type without a rollout pays nothing."""
        open_to_arm = req.arm is None and req.prompt_version is None
        armed = await self.with_arm(req)
        for last in (False, False, True):
            try:
                result = await self._create(armed, within, budgeted, open_to_arm and not last)
            except RolloutMoved:
                armed = await self.with_arm(req, fresh=True)
                continue
            if result.created:  # replaced running jobs stopped, workflows cancelled
                await flow.after_create(
                    self._sm, self._catalog, result.flow, result.job.id, cancel_workflow
                )
            return result
        raise AssertionError("unreachable: the last create checks no rollout")

    async def _create(
        self,
        req: CreateJobRequest,
        within: CreateHook | None,
        budgeted: bool,
        open_to_arm: bool,
    ) -> CreateJobResult:
        checked = await off_loop(self.requests.check, req)
        if req.idempotency_key is not None:
            existing = await self._find_by_key(req, checked)
            if existing is not None:
                return _same_request(existing, checked.fingerprint)
        self._check_platform(checked)
        new = self._new_job(req, checked, uuid.uuid4())
        try:
            async with self._sm.begin() as s:
                result = await self._write(s, req, checked, new, within, budgeted, open_to_arm)
        except Exception as exc:
            # Two creates with one key raced past the lookup: the loser resolves to the winner.
            if req.idempotency_key is None or not is_unique_violation(exc):
                raise
            existing = await self._find_by_key(req, checked)
            if existing is None:
                raise
            return _same_request(existing, checked.fingerprint)
        if result.created:
            _announce(result.job)
        return result

    @property
    def policy(self) -> CreatePolicy:
        """The create policy (its models: what a rollout's arm may name)."""
        return self._policy

    async def with_arm(self, req: CreateJobRequest, *, fresh: bool = False) -> CreateJobRequest:
        """`req` with its arm of the job type's rollout (jobs/rollouts.py): none when it pins a
        version or already has one (a retry keeps its original's), or no rollout stands. Read
        from the rollout cache (nothing, without a listener), or the database (`fresh`)."""
        if req.arm is not None or req.prompt_version is not None:
            return req
        if not fresh and not self.rollouts.listening:
            return req  # the job's INSERT tells whether one stands
        rollout = await self.rollouts.current(req.job_type, fresh=fresh)
        if rollout is None:
            return req
        return dataclasses.replace(req, arm=choice(rollout, req.job_type, req.user_id))

    def _check_platform(self, checked: CheckedRequest) -> None:
        """The platform's key is needed and not configured: 503, before any write."""
        if (
            checked.mode == PLATFORM_KEY
            and not checked.job_type.always_synthetic
            and not self._policy.platform_key_available
        ):
            raise PlatformUnavailable()

    async def _find_by_key(self, req: CreateJobRequest, checked: CheckedRequest) -> JobRow | None:
        assert req.idempotency_key is not None
        async with self._sm.begin() as s:
            return await jobs_db.find_by_idempotency_key(
                s, req.user_id, checked.job_type.definition.job_type, req.idempotency_key
            )

    async def _write(
        self,
        s: AsyncSession,
        req: CreateJobRequest,
        checked: CheckedRequest,
        new: NewJob,
        within: CreateHook | None,
        budgeted: bool = False,
        open_to_arm: bool = False,
    ) -> CreateJobResult:
        """The create transaction's work, in order: quotas (a user's create), the target check,
        the credential pinned, the job row, its chunk plan, its snapshot and enqueue row.
        `open_to_arm`: the job joins its type's rollout, so a rollout the INSERT sees other than
        the one its arm came from rolls the create back (`RolloutMoved`)."""
        jt = checked.job_type
        # Result reuse: the source looked up under the user's create lock (jobs/reuse.py).
        new, checked = await attach(s, new, checked, self.quotas.lock)
        decided = Decision()
        if not req.internal or budgeted or checked.flow.concurrency is not None:
            winner, decided = await create_lock.admit(
                s, self.quotas, self._policy, req, checked, new.id
            )
            if winner is not None:
                return _same_request(winner, checked.fingerprint)
            if decided.holder is not None:  # `skip`: the key is held, nothing is created
                return CreateJobResult(job=decided.holder, created=False, flow=decided)
            # A debounced job's due time (its runAt's, if later: jobs/flow.py `decide`).
            new = dataclasses.replace(
                new,
                debounce_until=decided.debounce_until,
                due_at=decided.due_at or new.due_at,
            )
        if not req.internal and jt.check_target is not None:
            await jt.check_target(s, req.user_id, req.target_type, req.target_id)
        new = await self._pin_credential(s, req, new)
        row, rollout_now = await lifecycle_db.create_seeing_rollout(s, new)
        if open_to_arm and rollout_now != new.rollout_id:
            raise RolloutMoved()  # rolls back: made again with its arm of the rollout now
        if checked.chunks:
            await insert_plan(s, row.id, checked.chunks)
        await self._enqueue(s, req, checked, row, due_at=decided.due_at)
        if within is not None:
            await within(s, row)
        return CreateJobResult(job=row, created=True, flow=decided)

    async def _pin_credential(self, s: AsyncSession, req: CreateJobRequest, new: NewJob) -> NewJob:
        """The user's key the job will use, pinned on its row (user_deepseek_key only)."""
        if new.credential_mode != USER_DEEPSEEK_KEY:
            return new
        if req.credential_id is not None:
            # The key the client named: its own and active, or 404 as if absent (no way to
            # learn whether someone else's key id exists). Read FOR SHARE: a revoke racing this
            # create waits for it, then the job fails at EXECUTE.
            credential_id = await owned_active_key_id(s, req.user_id, req.credential_id)
            if credential_id is None:
                raise CredentialNotFound("Credential not found.")
        else:
            # The key chosen now is the key the job uses: pinned on the row, so a key added
            # later never silently replaces it (a revoked one fails the job).
            lookup = self._credential_lookup
            credential_id = await lookup(s, req.user_id) if lookup is not None else None
            if credential_id is None:
                raise CredentialMissing("No active credential for user_deepseek_key.")
        return dataclasses.replace(new, credential_id=credential_id)

    def _new_job(self, req: CreateJobRequest, checked: CheckedRequest, job_id: uuid.UUID) -> NewJob:
        """The `ai_job` row of a checked request, before its credential is pinned."""
        d, estimate = checked.job_type.definition, checked.estimate
        plan, now = checked.flow, datetime.now(UTC)
        return NewJob(
            id=job_id,
            user_id=req.user_id,
            job_type=d.job_type,
            target_type=req.target_type,
            target_id=req.target_id,
            idempotency_key=req.idempotency_key,
            request_fingerprint=checked.fingerprint,
            queue_name=d.queue.queue_name,
            priority=checked.priority,
            input=checked.normalized,
            credential_mode=checked.mode,
            credential_id=None,
            prompt_version=checked.prompt_version or d.prompt_version,
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
            metadata=req.metadata,
            run_at=req.run_at,
            service_tier=checked.service_tier,
            offpeak_deadline_at=offpeak.deadline(
                req, checked.service_tier, self._policy.offpeak_max_wait_s, now
            ),
            offpeak_on_deadline=(
                (req.offpeak_on_deadline or "fail") if checked.service_tier == OFFPEAK else None
            ),
            reuse_allowed=req.reuse,
            reuse_key=key_for(checked, self._model_of(checked)),
            rollout_id=checked.arm.rollout_id if checked.arm else None,
            rollout_arm=checked.arm.name if checked.arm else None,
            arm_model=arm_model_of(checked.arm, checked.mode),
            org_id=req.scopes.org_id,
            team_ids=list(req.scopes.team_ids),
            tags=list(req.scopes.tags),
            # A delayed job is not dispatched before its time: it waits in the outbox, taking
            # no room in its user's dispatch window (db/relay.py).
            due_at=req.run_at,
            # Flow control (jobs/flow.py): as given, and the times it fixes.
            concurrency=plan.concurrency.given() if plan.concurrency else None,
            concurrency_key=plan.concurrency.key if plan.concurrency else None,
            expires_at=plan.start_by(now, req.run_at),
            deadline_at=plan.deadline,
        )

    def _model_of(self, checked: CheckedRequest) -> str:
        """The model a checked create's job asks first: its arm's, else the configured one."""
        model = self._policy.model_for(checked.job_type, checked.mode)
        arm_model = arm_model_of(checked.arm, checked.mode)
        return arm_model if arm_model is not None and model != "synthetic" else model

    async def _enqueue(
        self,
        s: AsyncSession,
        req: CreateJobRequest,
        checked: CheckedRequest,
        row: JobRow,
        *,
        due_at: datetime | None = None,
    ) -> None:
        """The snapshot and the enqueue row in one statement (one round trip). A job without
        its enqueue row would wait forever: no row written rolls the create back. `due_at`: a
        debounced job's enqueue row is not available to the relay before then (it waits in
        the outbox, outside its user's dispatch window)."""
        d = checked.job_type.definition
        enqueued = await snapshots_db.insert_snapshot_and_enqueue(
            s,
            row.id,
            {
                # What the user wrote: prompts are built from it, so it must keep its meaning
                # (a redacted "[phone]" inside a prompt would not). It is private data under
                # the retention rule, never logged, never sent to Temporal.
                "input": checked.normalized,
                "targetType": req.target_type,
                "targetId": req.target_id,
            },
            SNAPSHOT_VERBATIM,
            self._policy.snapshot_ttl_days,
            event_type=ENQUEUE,
            aggregate_type="AiJob",
            aggregate_id=str(row.id),
            dedupe_key=enqueue_dedupe_key(row.id),
            payload={
                "jobId": str(row.id),
                "jobType": d.job_type,
                "queueName": d.queue.queue_name,
                "priority": checked.priority,
                # Fair dispatch per user without naming the user in Temporal.
                "fairnessKey": self._policy.fairness_key(req.user_id),
                "fairnessWeight": self._policy.fairness_weights.get(req.user_id, 1.0),
                # A delayed job's workflow waits for it (a time, not job content); metadata is
                # the client's and never leaves PostgreSQL.
                **({"runAt": req.run_at.isoformat()} if req.run_at is not None else {}),
            },
            # The relay continues this request's trace when it starts the workflow.
            trace_context=current_trace_context(),
            due_at=due_at or req.run_at,
        )
        if enqueued is None:
            raise EnqueueNotWritten(str(row.id))


def _same_request(existing: JobRow, fingerprint: str) -> CreateJobResult:
    """An idempotent repeat: the job `existing` when its request was this one, else 409."""
    if existing.request_fingerprint != fingerprint:
        raise IdempotencyKeyReused(
            "This Idempotency-Key was already used with a different request."
        )
    # The specification's duplicate marker: ids, type and state only (never the key or input).
    log.info(
        DUPLICATE_CREATE_LOG,
        extra={
            "job_id": str(existing.id),
            "job_type": existing.job_type,
            "lifecycle_status": existing.lifecycle_status,
        },
    )
    return CreateJobResult(job=existing, created=False)


def _announce(row: JobRow) -> None:
    """The new job on the request's span and in the log (ids and type only)."""
    job_id = str(row.id)
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes({"aijobs.job_id": job_id, "aijobs.job_type": row.job_type})
    with job_context(job_id, row.job_type, row.workflow_id):
        log.info("job created", extra={"job_id": job_id, "job_type": row.job_type})
