"""What a create decides under its user's lock (jobs/creation.py `JobCreation._write`): an
`Idempotency-Key` replay, keyed concurrency (jobs/flow.py), the user's quotas and budgets and
its scopes' budgets, in that order, from reads taken under the locks.

A per-user transaction-scoped advisory lock serialises one user's creates on every API process,
so count-then-insert cannot overshoot, creates with one concurrency key see each other, and the
job's worst-case cost, reserved by the insert that follows in the create's transaction, cannot
take spend plus reservations past a budget; the row locks of its scopes' budgets
(jobs/scope_budgets.py) do the same for every user of an organisation, team or tag.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncSession

from db import jobs as jobs_db
from db.jobs import JobRow
from jobs import flow, scope_budgets
from jobs.flow import Decision
from jobs.policy import CreatePolicy
from jobs.quotas import Quotas
from jobs.requests import CheckedRequest, CreateJobRequest


async def admit(
    s: AsyncSession,
    quotas: Quotas,
    policy: CreatePolicy,
    req: CreateJobRequest,
    checked: CheckedRequest,
    new_id: uuid.UUID,
) -> tuple[JobRow | None, Decision]:
    """Under the locks, in this order: a create with a key that a concurrent create just
    committed is answered with that job (returned first) instead of a quota error; the
    concurrency decision (a `skip` whose key is held makes nothing and is refused by no quota;
    replaced queued jobs end before the quotas count them); the quotas and budgets (raised). A
    plain job on a deployment without quotas costs no statement here."""
    limited, concurrency = quotas.limited, checked.flow.concurrency
    if not limited and not req.scopes and concurrency is None:
        return None, Decision()
    if limited or concurrency is not None:
        await quotas.lock(s, req.user_id)
    # The budgets of the job's organisation, teams and tags: their rows locked (after the
    # user's lock, in one order) and read; none for a job without scopes.
    now = datetime.now(UTC)
    scoped = await scope_budgets.standing(s, req.scopes, lock=True, now=now)
    if req.idempotency_key is not None and (limited or scoped or concurrency is not None):
        existing = await jobs_db.find_by_idempotency_key(
            s, req.user_id, req.job_type, req.idempotency_key
        )
        if existing is not None:
            return existing, Decision()
    decided = Decision()
    if concurrency is not None:
        decided = await flow.decide(
            s, req, concurrency, new_id, default_max_delay_ms=policy.debounce_max_delay_ms
        )
        if decided.holder is not None:
            return None, decided
    if limited:
        refusal = (await quotas.admission(s, req.user_id, checked.estimate)).refusal
        if refusal is not None:
            raise refusal.error
    error = scope_budgets.first_refusal(scoped, checked.estimate.worst_case_cost_usd, now)
    if error is not None:
        raise error
    return None, decided
