"""A retry: a failed or cancelled job runs again as a new job, asked for by an admin or by the
job's owner (the same use case: an owner's retry is an admin's without the budget override).

One new job per original, found by `retried_from_job_id` (unique), never by an idempotency key
a user could have claimed first: a double-click, or two admins at once, get the same job. The
retry is an internal create (jobs/creation.py: outside the job type's visibility and the target
check) that reserves against the OWNER's quotas and budgets exactly as the owner's create would
(same lock, same standing read, same refusal: a retry is money the owner spends), unless the
admin overrides the budget (`override_budget`, recorded on the audit entry by the caller). It
runs under the original's own credential choice (its mode and its pinned key, never whichever
key is newest: a revoked one refuses the retry). A long source's chunks the original already
paid for are copied into its plan in the same transaction.
"""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncSession

from db import jobs as jobs_db
from db.chunks import copy_succeeded as copy_succeeded_chunks
from db.errors import is_unique_violation
from db.jobs import JobRow
from db.session import SessionMaker
from engine.errors import (
    CredentialNotFound,
    JobNotFound,
    JobNotRetryable,
    VersionUnavailable,
)
from engine.lifecycle import LifecycleStatus
from engine.scopes import JobScopes
from jobs.creation import CreateHook, CreateJobResult, JobCreation
from jobs.requests import CreateJobRequest
from jobs.rollouts import ArmChoice


class JobRetry:
    """The admin retry use case, creating through `creation`."""

    def __init__(self, sessionmaker: SessionMaker, creation: JobCreation) -> None:
        self._sm = sessionmaker
        self._creation = creation

    async def retry(
        self,
        job_id: uuid.UUID,
        *,
        within: CreateHook | None = None,
        override_budget: bool = False,
        owner: str | None = None,
    ) -> CreateJobResult:
        """The retry of `job_id`: the existing one (`created` False), or a new job. `within`
        runs in the transaction that creates the retry (not when one existed). Past the
        owner's quotas or budgets it raises the create's refusal (`QuotaExceeded`,
        `TooManyJobs`) unless `override_budget`. `owner`: the user retrying their own job (a
        job of anyone else's is JobNotFound, as a missing one: an id tells an outsider
        nothing); None: an admin's retry."""
        async with self._sm.begin() as s:
            row = await jobs_db.get(s, job_id)
            existing = await jobs_db.find_retry_of(s, job_id) if row is not None else None
        if row is None or (owner is not None and row.user_id != owner):
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
            return await self._creation.create(
                _request_of(row), within=keep_paid_chunks, budgeted=not override_budget
            )
        except CredentialNotFound:
            # The original's pinned key was revoked (or deleted): the retry would fail at once.
            raise JobNotRetryable("The job's credential is no longer active.") from None
        except VersionUnavailable:
            raise JobNotRetryable("The job's prompt version is no longer published.") from None
        except Exception as exc:
            # Two retries raced: the loser's unique violation resolves to the winner's job.
            if not is_unique_violation(exc):
                raise
            async with self._sm.begin() as s:
                existing = await jobs_db.find_retry_of(s, job_id)
            if existing is None:
                raise
            return CreateJobResult(job=existing, created=False)


def _request_of(row: JobRow) -> CreateJobRequest:
    """The original's request again, as an internal create naming the original."""
    return CreateJobRequest(
        user_id=row.user_id,
        job_type=row.job_type,
        target_type=row.target_type,
        target_id=row.target_id,
        input=row.input,
        priority=row.priority,
        credential_mode=row.credential_mode,
        # The key the original was pinned to (None: a platform-key job, or one created before
        # keys were pinned, which gets the owner's newest active key as it did then).
        credential_id=row.credential_id,
        retried_from_job_id=row.id,
        max_cost_usd=row.max_cost_usd,
        # The client's references go with it (the retry is the same piece of their product);
        # a delayed start does not: the retry runs now.
        metadata=row.metadata,
        # The versions it ran with (a version no longer published refuses the retry).
        prompt_version=row.prompt_version,
        output_schema_version=row.output_schema_version,
        # Its service terms too: the same tier (an off-peak job's deadline counts from the
        # retry's create again) and the same reuse choice.
        service_tier=row.service_tier,
        reuse=row.reuse_allowed,
        offpeak_on_deadline=row.offpeak_on_deadline if row.service_tier == "offpeak" else None,
        # Whose money it is: the original's organisation, teams and tags (its budgets).
        scopes=JobScopes(row.org_id, tuple(row.team_ids), tuple(row.tags)),
        # Its rollout's arm: a retry runs on what its original ran on (an original outside a
        # rollout stays outside).
        arm=ArmChoice.of_job(row),
        internal=True,
    )
