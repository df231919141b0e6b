"""The job use cases as the wiring builds them: one facade over one session factory, catalog and
create policy, for the API, the bulk operations, the tests and the bench.

It holds no logic. Each use case is a class of its own module, and the facade's methods ARE
theirs (bound at construction), so a call goes straight to the use case:

- create and quote: jobs/creation.py `JobCreation` (the request's checks in jobs/requests.py,
  the quotas and budgets in jobs/quotas.py);
- cancel: jobs/cancellation.py `JobCancellation` (its transition: jobs/lifecycle.py
  `request_cancel`);
- admin retry: jobs/retry.py `JobRetry` (an internal create).

The use cases' public names are re-exported here, so a caller imports them from one place.
"""

from __future__ import annotations

from db.session import SessionMaker
from jobs.cancellation import (
    CancelHook,
    CancelOutcome,
    CancelResult,
    JobCancellation,
    WorkflowCanceller,
)
from jobs.creation import (
    SNAPSHOT_VERBATIM,
    CreateHook,
    CreateJobResult,
    CredentialLookup,
    EnqueueNotWritten,
    JobCreation,
    Quote,
)
from jobs.policy import CreatePolicy
from jobs.quotas import TOO_MANY_JOBS_RETRY_AFTER_S, Refusal, RefusalLimit
from jobs.requests import CheckedRequest, CreateJobRequest, validation_errors
from jobs.retry import JobRetry
from jobs.spec import Catalog

__all__ = [
    "SNAPSHOT_VERBATIM",
    "TOO_MANY_JOBS_RETRY_AFTER_S",
    "CancelHook",
    "CancelOutcome",
    "CancelResult",
    "CheckedRequest",
    "CreateHook",
    "CreateJobRequest",
    "CreateJobResult",
    "CreatePolicy",
    "EnqueueNotWritten",
    "JobService",
    "Quote",
    "Refusal",
    "RefusalLimit",
    "WorkflowCanceller",
    "validation_errors",
]


class JobService:
    """The use cases, built once and shared: `create`, `quote`, `cancel`, `retry`, and the
    chunk plan of a long source (`plan_chunks`), each the use case's own bound method."""

    def __init__(
        self,
        sessionmaker: SessionMaker,
        catalog: Catalog,
        policy: CreatePolicy,
        *,
        credential_lookup: CredentialLookup | None = None,
    ) -> None:
        self.creation = JobCreation(
            sessionmaker, catalog, policy, credential_lookup=credential_lookup
        )
        self.cancellation = JobCancellation(sessionmaker, catalog)
        self.retries = JobRetry(sessionmaker, self.creation)
        self.create = self.creation.create
        self.quote = self.creation.quote
        self.plan_chunks = self.creation.requests.plan_chunks
        self.cancel = self.cancellation.cancel
        self.retry = self.retries.retry
