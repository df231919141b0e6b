"""A job as its readers see it: the one public model, the one owner check and the reads.

Every reader of a job goes through here: the jobs and admin routes, the event streams
(`api/routes/events.py`) and the webhook body (`activities/webhooks.py`), so the JSON of a job is
the same wherever a client meets it. `JobStatusResponse` is the frozen shape of
docs/contracts.md; the admin view adds the internals only SUPER_ADMIN may see.

The owner check (`can_see`): a job is visible to its owner and to admins; for anyone else it is
`JOB_NOT_FOUND`, the same answer as for a job that does not exist, so a job id never tells an
outsider whether the job exists.

The reads run in the session the caller gives them (one pooled session per request) and never
write. Paging is keyset paging: a page says where the next one starts (`Page.next_after`) and the
API turns that into its opaque cursor (`api/schemas.py`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import quote

from sqlalchemy.ext.asyncio import AsyncSession

from db import artifacts as artifacts_db
from db import fallback_calls as fallback_calls_db
from db import jobs as jobs_db
from db.artifacts import ArtifactRef
from db.chunks import job_chunking
from db.jobs import Answered, JobFilter, JobRow, JobStatusRow
from db.session import SessionMaker
from engine import flow
from engine.errors import JobNotFound
from engine.flow import SUPERSEDED
from engine.settings import Settings
from jobs.chunk_items import CHUNK_ITEM_TYPE, running_items, streams_items
from jobs.spec import Catalog
from jobs.view_models import AdminJobResponse as AdminJobResponse
from jobs.view_models import ArtifactItem as ArtifactItem
from jobs.view_models import ArtifactOut as ArtifactOut
from jobs.view_models import Camel as Camel
from jobs.view_models import JobStatusResponse as JobStatusResponse
from jobs.view_models import ResultOut as ResultOut
from jobs.view_models import UsdAmount as UsdAmount
from jobs.view_models import usd_text as usd_text

# The models live in jobs/view_models.py; they are imported from here by every reader.

# ---- who may see a job ------------------------------------------------------------------


class Viewer(Protocol):
    """Who reads: the API's authenticated principal, or `Owner` for a reader acting for a user
    (the webhook deliverer acts for the endpoint's owner)."""

    @property
    def user_id(self) -> str: ...

    @property
    def is_admin(self) -> bool: ...


@dataclass(frozen=True)
class Owner:
    """A plain user as a viewer: sees their own jobs only."""

    user_id: str
    is_admin: bool = False


def can_see(viewer: Viewer, owner_id: str) -> bool:
    """The one owner rule: the owner and admins see a job; nobody else does."""
    return viewer.is_admin or owner_id == viewer.user_id


def not_found() -> JobNotFound:
    """The one answer for a missing job and for someone else's: they must not differ."""
    return JobNotFound("Job not found.")


async def check_visible(session: AsyncSession, job_id: uuid.UUID, viewer: Viewer) -> str:
    """The job's type when `viewer` may see the job, else JobNotFound. One narrow query: what a
    route needs before it streams or pages a job's parts."""
    owner = await jobs_db.get_owner(session, job_id)
    if owner is None or not can_see(viewer, owner[1]):
        raise not_found()
    return owner[0]


# ---- one job ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TemporalLink:
    """Where the Temporal Web UI shows a workflow (TEMPORAL_UI_URL, TEMPORAL_NAMESPACE)."""

    ui_url: str
    namespace: str

    @classmethod
    def from_settings(cls, settings: Settings) -> TemporalLink:
        return cls(settings.temporal_ui_url, settings.temporal_namespace)

    def workflow_url(self, workflow_id: str) -> str:
        ui = self.ui_url.rstrip("/")
        ns = quote(self.namespace, safe="")
        return f"{ui}/namespaces/{ns}/workflows/{quote(workflow_id, safe='')}"


# A row a public view is built from: the whole job, or the columns `job_status` reads.
PublicRow = JobRow | JobStatusRow


def _public_fields(row: PublicRow, artifacts: list[ArtifactRef]) -> dict[str, Any]:
    # `result` is present once a job succeeded (an empty list when it projected nothing), and
    # on a long-source job that ended early with the items of its succeeded chunks (`partial`).
    result = None
    if artifacts or row.lifecycle_status == "succeeded":
        result = ResultOut(
            artifact_count=len(artifacts),
            artifacts=[
                ArtifactOut(artifact_type=a.artifact_type, artifact_id=a.artifact_id)
                for a in artifacts
            ],
            partial=row.lifecycle_status != "succeeded",
            flagged_items=row.flagged_items,
        )
    return {
        "job_id": row.id,
        "job_type": row.job_type,
        "lifecycle_status": row.lifecycle_status,
        "queue_name": row.queue_name,
        "priority": row.priority,
        "progress": row.progress,
        "created_at": row.created_at,
        "started_at": row.started_at,
        "finished_at": row.finished_at,
        "error_code": row.error_code,
        "public_error_message": row.public_error_message,
        "result": result,
        "target_type": row.target_type,
        "target_id": row.target_id,
        "metadata": row.metadata,
        "run_at": row.run_at,
        "prompt_version": row.prompt_version,
        "output_schema_version": row.output_schema_version,
        "private_data_purged": row.private_data_purged_at is not None,
        "service_tier": row.service_tier,
        "reused_from_job_id": row.reused_from_job_id,
        "tags": list(row.tags),
        "rollout_arm": row.rollout_arm,
        "concurrency": flow.view(row.concurrency),
        # Only once it ended replaced: a running job asked to stop may still finish first.
        "superseded_by": row.superseded_by if row.error_code == SUPERSEDED else None,
        "expires_at": row.expires_at,
        "deadline": row.deadline_at,
    }


def job_view(row: PublicRow, artifacts: list[ArtifactRef]) -> JobStatusResponse:
    return JobStatusResponse(**_public_fields(row, artifacts))


def admin_view(row: JobRow, artifacts: list[ArtifactRef], link: TemporalLink) -> AdminJobResponse:
    return AdminJobResponse(
        **_public_fields(row, artifacts),
        user_id=row.user_id,
        org_id=row.org_id,
        team_ids=list(row.team_ids),
        internal_error_message=row.internal_error_message,
        workflow_id=row.workflow_id,
        temporal_ui_url=link.workflow_url(row.workflow_id),
        attempt_count=row.attempt_count,
        cancel_requested_at=row.cancel_requested_at,
        retried_from_job_id=row.retried_from_job_id,
        output_hash=row.output_hash,
        cost_usd=row.spent_cost_usd,
    )


@dataclass(frozen=True)
class JobRead:
    """A job's row and its artifacts, read in one session: what every view is built from."""

    row: JobRow
    artifacts: list[ArtifactRef]
    answered: Answered = field(default_factory=Answered)  # what answered a succeeded job

    @property
    def model(self) -> str | None:
        return self.answered.model

    def view(self) -> JobStatusResponse:
        return _with_answer(job_view(self.row, self.artifacts), self.answered)

    def admin_view(self, link: TemporalLink) -> AdminJobResponse:
        return admin_view(self.row, self.artifacts, link)


def _may_have_artifacts(row: PublicRow) -> bool:
    # Artifacts are written in the transaction that ends a job: when it succeeds, and when a
    # long-source job fails or is cancelled after some chunks succeeded (what they produced is
    # kept). No other job has any, so only these cost the second query.
    status = row.lifecycle_status
    return status == "succeeded" or (
        row.chunk_count is not None and status in ("failed", "cancelled")
    )


async def _artifacts_of(session: AsyncSession, row: JobRow) -> list[ArtifactRef]:
    if not _may_have_artifacts(row):
        return []
    return (await artifacts_db.artifacts(session, [row.id]))[row.id]


async def find_job(session: AsyncSession, job_id: uuid.UUID, viewer: Viewer) -> JobRead | None:
    """The job as `viewer` may see it; None when it is missing or someone else's."""
    row = await jobs_db.get(session, job_id)
    if row is None or not can_see(viewer, row.user_id):
        return None
    answered = (
        await fallback_calls_db.answered(session, job_id)
        if row.lifecycle_status == "succeeded"
        else Answered()
    )
    return JobRead(row, await _artifacts_of(session, row), answered)


async def present(sessionmaker: SessionMaker, row: JobRow) -> JobStatusResponse:
    """The public view of a row the caller already holds (a create's answer): a session is
    opened only for a job that may have artifacts."""
    if not _may_have_artifacts(row):
        return job_view(row, [])
    async with sessionmaker() as s:
        return job_view(row, await _artifacts_of(s, row))


async def read_job(session: AsyncSession, job_id: uuid.UUID, viewer: Viewer) -> JobRead:
    """As `find_job`, but a job the viewer may not see is JobNotFound (404)."""
    found = await find_job(session, job_id, viewer)
    if found is None:
        raise not_found()
    return found


async def job_status(session: AsyncSession, job_id: uuid.UUID, viewer: Viewer) -> JobStatusResponse:
    """`GET /api/ai/jobs/{jobId}`: the public view, or JobNotFound. The view `read_job` gives,
    from one statement (the job's public columns and its artifacts; not its input and output
    JSON) and, for a succeeded job, the model that produced its output: one round trip however
    the job ended."""
    found = await jobs_db.status_with_artifacts(session, job_id)
    if found is None or not can_see(viewer, found[0].user_id):
        raise not_found()
    row, artifacts, answered = found
    return _with_answer(job_view(row, artifacts if _may_have_artifacts(row) else []), answered)


def _with_answer(view: JobStatusResponse, answered: Answered) -> JobStatusResponse:
    """A succeeded job's view with what answered it (`result.model`, `structuredOutput`)."""
    if view.result is not None:
        view.result.model = answered.model
        view.result.structured_output = answered.structured_output
    return view


# ---- pages --------------------------------------------------------------------------------

T = TypeVar("T")
K = TypeVar("K")

JobKey = tuple[datetime, uuid.UUID]  # (created_at, id) of the last job of a page
ArtifactKey = tuple[int, int]  # (ordinal, ai_job_artifact.id) of the last artifact of a page


@dataclass(frozen=True)
class Page(Generic[T, K]):
    """One page of items; `next_after` is where the next page starts (None: this was the last)."""

    items: list[T]
    next_after: K | None


async def _job_rows(
    session: AsyncSession, f: JobFilter, after: JobKey | None, limit: int
) -> tuple[list[JobRow], dict[uuid.UUID, list[ArtifactRef]], JobKey | None]:
    # One row past the page says whether another page follows.
    rows = await jobs_db.list_jobs(session, f, after=after, limit=limit + 1)
    page = rows[:limit]
    arts = await artifacts_db.artifacts(session, [r.id for r in page])
    nxt = (page[-1].created_at, page[-1].id) if len(rows) > limit else None
    return page, arts, nxt


async def job_page(
    session: AsyncSession,
    viewer: Viewer,
    f: JobFilter,
    *,
    after: JobKey | None,
    limit: int,
) -> Page[JobStatusResponse, JobKey]:
    """A page of jobs, newest first. A viewer who is not an admin pages their own jobs only,
    whatever the filter says."""
    if not viewer.is_admin:
        f = JobFilter(**{**f.__dict__, "user_id": viewer.user_id})
    rows, arts, nxt = await _job_rows(session, f, after, limit)
    return Page([job_view(r, arts[r.id]) for r in rows], nxt)


async def admin_job_page(
    session: AsyncSession,
    f: JobFilter,
    link: TemporalLink,
    *,
    after: JobKey | None,
    limit: int,
) -> Page[AdminJobResponse, JobKey]:
    """A page of any user's jobs with their internals (SUPER_ADMIN's list), newest first."""
    rows, arts, nxt = await _job_rows(session, f, after, limit)
    return Page([admin_view(r, arts[r.id], link) for r in rows], nxt)


_ACTIVE = ("queued", "running")


async def artifact_page(
    session: AsyncSession,
    catalog: Catalog,
    job_id: uuid.UUID,
    viewer: Viewer,
    *,
    after: ArtifactKey | None,
    limit: int,
) -> Page[ArtifactItem, ArtifactKey]:
    """A page of a job's artifacts in ordinal order, each with what its job type exposes of the
    projected row (`content`, or None: always None once the job's private data is purged);
    JobNotFound when the viewer may not see the job.

    A long-source job that has not ended has no artifacts yet: its page lists the items of its
    succeeded chunks instead (`final` false), in (chunk, index) order, paged by their position
    in that order (the page key's first part; its second is 0)."""
    job_type = await check_visible(session, job_id, viewer)
    state = await job_chunking(session, job_id)
    if state is not None and state.chunk_count is not None and state.status in _ACTIVE:
        return await _chunk_item_page(session, catalog, job_type, job_id, after, limit)
    if state is not None and state.status == "running" and streams_items(catalog, job_type):
        return await _chunk_item_page(session, catalog, job_type, job_id, after, limit, False)
    rows = await artifacts_db.artifact_page(session, job_id, after=after, limit=limit + 1)
    page = rows[:limit]
    # A purged job's artifacts are references only: no view runs, every content is null.
    purged = state is not None and state.purged
    view = catalog.get(job_type).artifact_view if job_type in catalog and not purged else None
    contents = await view(session, job_id, [a.artifact_id for _, a in page]) if view else {}
    items = [
        ArtifactItem(
            artifact_type=a.artifact_type,
            artifact_id=a.artifact_id,
            ordinal=a.ordinal,
            content=contents.get(a.artifact_id),
        )
        for _, a in page
    ]
    nxt = (page[-1][1].ordinal, page[-1][0]) if len(rows) > limit else None
    return Page(items, nxt)


async def _chunk_item_page(
    session: AsyncSession,
    catalog: Catalog,
    job_type: str,
    job_id: uuid.UUID,
    after: ArtifactKey | None,
    limit: int,
    chunked: bool = True,
) -> Page[ArtifactItem, ArtifactKey]:
    """The items of a running long-source job's succeeded chunks (a one-call job's streamed
    items, `chunked` False): a few dozen at most (the requested count plus one per chunk), so
    they are read whole and the page cut here."""
    items = await running_items(session, catalog, job_type, job_id, chunked=chunked)
    start = after[0] + 1 if after is not None else 0
    page = items[start : start + limit]
    out = [
        ArtifactItem(
            artifact_type=CHUNK_ITEM_TYPE,
            artifact_id=f"{it.chunk}:{it.ordinal}",
            ordinal=it.ordinal,
            content=it.content,
            final=False,
            chunk=it.chunk,
        )
        for it in page
    ]
    last = start + len(page) - 1
    return Page(out, (last, 0) if start + limit < len(items) else None)
