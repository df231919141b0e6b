"""Bulk cancel and bulk retry by filter: the use cases behind the admin bulk routes and the
bulk workflow's activities.

- A dry run counts the matching jobs and shows a sample; nothing is written but its audit entry.
- A submission freezes the matching job ids (one pending item each) with the operation row and
  its audit entry in ONE transaction, or refuses (422 `BULK_TOO_LARGE`, with the count) a filter
  matching more than ADMIN_BULK_MAX_JOBS. The caller then starts the operation's workflow.
- `act` handles one item: the action on its job and the item's CAS pending → done run in the
  same transaction (the cancel or retry use case's `within` hook). A retried activity finds the
  item settled and its transaction rolls back: each job is acted on at most once per operation,
  and a bulk retry creates at most one retry per job whatever the operations (the
  `retried_from_job_id` rule of the single retry).
- A bulk retry goes through each owner's quotas and budgets as the single retry does: a job
  they refuse settles `refused` (reason: the refusal's code), never `done`, unless the
  operation was submitted with the admin's budget override.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy.ext.asyncio import AsyncSession

from db import bulk as bulk_db
from db import jobs as jobs_db
from db import outbox as outbox_db
from db.jobs import JobFilter, JobRow
from db.session import SessionMaker
from engine.contracts import BulkInput, BulkResult, bulk_workflow_id
from engine.errors import (
    BulkOperationNotFound,
    BulkTooLarge,
    EngineError,
    JobAlreadyCancelled,
    JobNotCancellable,
    JobNotFound,
    JobNotRetryable,
    QuotaExceeded,
    TooManyJobs,
)
from engine.lifecycle import TERMINAL, LifecycleStatus
from engine.settings import Settings
from jobs.audit import BULK_CANCEL, BULK_RETRY, AuditEntry, AuditLog
from jobs.cancellation import WorkflowCanceller
from jobs.service import JobService

log = logging.getLogger(__name__)
Action = Literal["cancel", "retry"]
SAMPLE_SIZE = 20
_AUDIT_ACTION: dict[str, str] = {"cancel": BULK_CANCEL, "retry": BULK_RETRY}
# An operation's items are acted on in pages of PAGE_SIZE (one transaction and one workflow
# activity each), at most JOBS_PER_SECOND: a bulk retry of thousands of jobs after an outage
# must not crowd out the jobs users create meanwhile, nor hold a page's row locks for long.
PAGE_SIZE = 100
JOBS_PER_SECOND = 50.0


@dataclass(frozen=True)
class BulkPolicy:
    max_jobs: int = 5000  # ADMIN_BULK_MAX_JOBS
    page_size: int = PAGE_SIZE
    jobs_per_second: float = JOBS_PER_SECOND

    @classmethod
    def from_settings(cls, settings: Settings) -> BulkPolicy:
        return cls(
            max_jobs=settings.admin_bulk_max_jobs,
            page_size=PAGE_SIZE,  # read when called: a test may patch them
            jobs_per_second=JOBS_PER_SECOND,
        )


@dataclass(frozen=True)
class Preview:
    matched: int
    sample: list[uuid.UUID]


@dataclass(frozen=True)
class Submitted:
    operation: bulk_db.OperationRow
    created: bool  # False: an earlier submission with the same Idempotency-Key


@dataclass(frozen=True)
class OperationStatus:
    operation: bulk_db.OperationRow
    done: int
    skipped: int
    failed: int
    pending: int
    skipped_reasons: dict[str, int]
    failed_reasons: dict[str, int]
    refused: int = 0
    refused_reasons: dict[str, int] = dataclasses.field(default_factory=dict)


class _AlreadySettled(Exception):
    """The item left `pending` in an earlier attempt: roll this attempt's action back."""


class BulkService:
    def __init__(
        self,
        sessionmaker: SessionMaker,
        jobs: JobService,
        policy: BulkPolicy,
        *,
        audit: AuditLog | None = None,
    ) -> None:
        self._sm = sessionmaker
        self._jobs = jobs
        self._policy = policy
        self._audit = audit or AuditLog(sessionmaker)

    # ---- submission ---------------------------------------------------------------------

    async def preview(
        self, actor: str, action: Action, f: JobFilter, filter_json: dict[str, Any]
    ) -> Preview:
        async with self._sm.begin() as s:
            matched = await bulk_db.count_matching(s, f)
            sample = await bulk_db.sample(s, f, SAMPLE_SIZE)
            await self._audit.write(
                s,
                AuditEntry(actor, _AUDIT_ACTION[action], "bulk_filter", None),
                "dry_run",
                filter=filter_json,
                matched=matched,
            )
        return Preview(matched, sample)

    async def submit(
        self,
        actor: str,
        action: Action,
        f: JobFilter,
        filter_json: dict[str, Any],
        *,
        idempotency_key: str | None = None,
        override_budget: bool = False,
    ) -> Submitted:
        entry = AuditEntry(actor, _AUDIT_ACTION[action], "bulk_operation", None)
        if idempotency_key is not None:
            async with self._sm.begin() as s:
                existing = await bulk_db.find_by_key(s, actor, idempotency_key)
            if existing is not None:
                return Submitted(existing, created=False)
        limit = self._policy.max_jobs
        operation_id = uuid.uuid4()
        async with self._audit.refusals(entry):
            async with self._sm.begin() as s:
                # Counted first: the refusal names the full count, not a capped one.
                matched = await bulk_db.count_matching(s, f)
                if matched > limit:
                    raise BulkTooLarge(matched, limit)
                await bulk_db.insert_operation(
                    s,
                    operation_id=operation_id,
                    action=action,
                    actor=actor,
                    filter_json=filter_json,
                    idempotency_key=idempotency_key,
                    workflow_id=bulk_workflow_id(str(operation_id)),
                    override_budget=override_budget,
                )
                # Jobs created since the count may match too; the cap still holds.
                frozen = await bulk_db.freeze_items(s, operation_id, f, limit)
                # The relay starts the workflow once this commits (ids and numbers only).
                start = self.workflow_input_for(operation_id, action)
                await outbox_db.insert(
                    s,
                    event_type=bulk_db.BULK_START,
                    aggregate_type="BulkOperation",
                    aggregate_id=str(operation_id),
                    dedupe_key=bulk_db.start_dedupe_key(operation_id),
                    payload={
                        "operationId": start.operation_id,
                        "action": start.action,
                        "pageSize": start.page_size,
                        "jobsPerSecond": start.jobs_per_second,
                    },
                )
                await self._audit.write(
                    s,
                    AuditEntry(actor, entry.action, entry.target_type, str(operation_id)),
                    "accepted",
                    filter=filter_json,
                    matched=frozen,
                    **({"overrideBudget": True} if override_budget else {}),
                )
                op = await bulk_db.get(s, operation_id)
        assert op is not None
        log.info(
            "bulk operation submitted",
            extra={"operation_id": str(operation_id), "action": action, "matched": frozen},
        )
        return Submitted(op, created=True)

    def workflow_input(self, op: bulk_db.OperationRow) -> BulkInput:
        return self.workflow_input_for(op.id, op.action)

    def workflow_input_for(self, operation_id: uuid.UUID, action: str) -> BulkInput:
        return BulkInput(
            operation_id=str(operation_id),
            action=action,
            page_size=self._policy.page_size,
            jobs_per_second=self._policy.jobs_per_second,
        )

    async def mark_started(self, operation_id: uuid.UUID) -> None:
        async with self._sm.begin() as s:
            await bulk_db.mark_workflow_started(s, operation_id)

    # ---- reading ------------------------------------------------------------------------

    async def status(self, operation_id: uuid.UUID) -> OperationStatus:
        async with self._sm.begin() as s:
            op = await bulk_db.get(s, operation_id)
            if op is None:
                raise BulkOperationNotFound("No bulk operation has this id.")
            counts = await bulk_db.counts(s, operation_id)

        def total(state: str) -> int:
            return sum(n for (st, _), n in counts.items() if st == state)

        def reasons(state: str) -> dict[str, int]:
            return {r or "unknown": n for (st, r), n in sorted(counts.items()) if st == state}

        return OperationStatus(
            operation=op,
            done=total(bulk_db.DONE),
            skipped=total(bulk_db.SKIPPED),
            failed=total(bulk_db.FAILED),
            pending=total(bulk_db.PENDING),
            skipped_reasons=reasons(bulk_db.SKIPPED),
            failed_reasons=reasons(bulk_db.FAILED),
            refused=total(bulk_db.REFUSED),
            refused_reasons=reasons(bulk_db.REFUSED),
        )

    # ---- the workflow's work ------------------------------------------------------------

    async def override_budget(self, operation_id: uuid.UUID) -> bool:
        """Whether the operation's retries skip the owners' quotas and budgets (read once a
        page: the workflow's input never carries it, so recorded histories replay)."""
        async with self._sm.begin() as s:
            op = await bulk_db.get(s, operation_id)
        return op is not None and op.override_budget

    async def pending_page(
        self, operation_id: uuid.UUID, *, after: int, limit: int
    ) -> list[bulk_db.Item]:
        async with self._sm.begin() as s:
            return await bulk_db.pending_page(s, operation_id, after=after, limit=limit)

    async def act(
        self,
        operation_id: uuid.UUID,
        action: str,
        item: bulk_db.Item,
        *,
        cancel_workflow: WorkflowCanceller | None = None,
        override_budget: bool = False,
    ) -> str:
        """Act on one item's job; returns the item's new state ('' if it was already settled).
        Domain refusals settle the item as skipped (with why), refused (the owner's quotas or
        budgets, with the code) or failed (with the error code); any other error propagates
        and leaves it pending for the activity's retry."""
        try:
            if action == "cancel":
                return await self._cancel(operation_id, item, cancel_workflow)
            if action == "retry":
                return await self._retry(operation_id, item, override_budget)
            raise ValueError(f"unknown bulk action {action!r}")
        except _AlreadySettled:
            return ""
        except (QuotaExceeded, TooManyJobs) as exc:
            return await self._settle(operation_id, item, bulk_db.REFUSED, exc.code)
        except (JobAlreadyCancelled, JobNotCancellable, JobNotRetryable, JobNotFound) as exc:
            reason = await self._skip_reason(item.job_id, action, exc)
            return await self._settle(operation_id, item, bulk_db.SKIPPED, reason)
        except EngineError as exc:
            return await self._settle(operation_id, item, bulk_db.FAILED, exc.code)

    async def _cancel(
        self,
        operation_id: uuid.UUID,
        item: bulk_db.Item,
        cancel_workflow: WorkflowCanceller | None,
    ) -> str:
        async def within(s: AsyncSession, outcome: str) -> None:
            if not await bulk_db.settle(
                s, operation_id, item.ordinal, bulk_db.DONE, reason=outcome
            ):
                raise _AlreadySettled()

        await self._jobs.cancel(
            item.job_id, "", admin=True, cancel_workflow=cancel_workflow, within=within
        )
        return bulk_db.DONE

    async def _retry(
        self, operation_id: uuid.UUID, item: bulk_db.Item, override_budget: bool
    ) -> str:
        async def within(s: AsyncSession, new_job: JobRow) -> None:
            if not await bulk_db.settle(
                s, operation_id, item.ordinal, bulk_db.DONE, result_job_id=new_job.id
            ):
                raise _AlreadySettled()

        result = await self._jobs.retry(item.job_id, within=within, override_budget=override_budget)
        if result.created:
            return bulk_db.DONE
        # Retried before (by hand or another operation): the existing retry stands.
        async with self._sm.begin() as s:
            settled = await bulk_db.settle(
                s,
                operation_id,
                item.ordinal,
                bulk_db.SKIPPED,
                reason="already_retried",
                result_job_id=result.job.id,
            )
        return bulk_db.SKIPPED if settled else ""

    async def _skip_reason(self, job_id: uuid.UUID, action: str, exc: EngineError) -> str:
        if isinstance(exc, JobNotFound):
            return "job_not_found"
        if isinstance(exc, JobAlreadyCancelled):
            return "already_cancelled"
        async with self._sm.begin() as s:
            row = await jobs_db.get(s, job_id)
        status = LifecycleStatus(row.lifecycle_status) if row is not None else None
        if action == "retry":
            if row is None or status not in (LifecycleStatus.FAILED, LifecycleStatus.CANCELLED):
                return "not_failed"
            # The two refusals of a failed or cancelled job: its input expired, or its key.
            return "input_expired" if row.private_data_purged_at else "credential_revoked"
        if status in TERMINAL:
            return "already_finished"
        return "not_cancellable"

    async def _settle(
        self, operation_id: uuid.UUID, item: bulk_db.Item, state: str, reason: str
    ) -> str:
        async with self._sm.begin() as s:
            settled = await bulk_db.settle(s, operation_id, item.ordinal, state, reason=reason)
        return state if settled else ""

    async def finish(self, operation_id: uuid.UUID) -> BulkResult:
        """Mark the operation completed (once) with its audit entry; its final counts."""
        st = await self.status(operation_id)
        op = st.operation
        async with self._sm.begin() as s:
            if await bulk_db.complete(s, operation_id):
                await self._audit.write(
                    s,
                    AuditEntry(op.actor, _AUDIT_ACTION[op.action], "bulk_operation", str(op.id)),
                    "completed",
                    matched=op.matched,
                    done=st.done,
                    skipped=st.skipped_reasons,
                    failed=st.failed_reasons,
                    refused=st.refused_reasons,
                )
        log.info(
            "bulk operation completed",
            extra={
                "operation_id": str(op.id),
                "done": st.done,
                "skipped": st.skipped,
                "refused": st.refused,
            },
        )
        return BulkResult(str(op.id), op.matched, st.done, st.skipped, st.failed)
