"""User routes: create, get, list and cancel one's own jobs."""

from __future__ import annotations

import re
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response, status
from fastapi.responses import JSONResponse

from api.cursors import CURSOR_PATTERN
from api.deps import State, User
from api.limits import TOO_LARGE_RESPONSE
from api.schemas import (
    JOB_TYPE_PATTERN,
    ArtifactItem,
    ArtifactPage,
    CancelResponse,
    CreateJobBody,
    JobPage,
    JobStatusResponse,
    Status,
    decode_artifact_cursor,
    decode_cursor,
    encode_artifact_cursor,
    encode_cursor,
    status_response,
)
from db.jobs import JobFilter, JobQueries
from engine.errors import JobNotFound, ValidationFailed
from jobs.service import CreateJobRequest

router = APIRouter(prefix="/api/ai/jobs", tags=["jobs"])
_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")  # visible ASCII, 1..255 chars
_jobs = JobQueries()


def _check_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not _KEY.match(key):
        raise ValidationFailed("Idempotency-Key must be 1-255 visible ASCII characters.")
    return key


async def job_json(state: State, row: Any) -> dict[str, Any]:
    # Artifacts are written in the same transaction that marks a job succeeded: no other job
    # has any, so only a succeeded job costs the second query.
    arts: list[Any] = []
    if row.lifecycle_status == "succeeded":
        async with state.sessionmaker() as s:
            arts = (await _jobs.artifacts(s, [row.id]))[row.id]
    return JobStatusResponse(**status_response(row, arts)).model_dump(mode="json", by_alias=True)


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobStatusResponse,
    responses={
        200: {"model": JobStatusResponse, "description": "Existing job (same key)"},
        **TOO_LARGE_RESPONSE,
    },
    summary="Create a job",
    description=(
        "Creates a job of a public job type; `input` is validated against that type's own input "
        "schema (see the `*Input` schemas). With `Idempotency-Key`, the same key and body return "
        "the existing job (200); the same key with another body is rejected (422). "
        "`credentialId` (with `credentialMode: user_deepseek_key`) names which of your own active "
        "keys pays; anyone else's, a revoked or an unknown key is 404 `CREDENTIAL_NOT_FOUND`."
    ),
)
async def create_job(
    body: CreateJobBody,
    state: State,
    principal: User,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> JSONResponse:
    result = await state.jobs.create(
        CreateJobRequest(
            user_id=principal.user_id,
            job_type=body.job_type,
            target_type=body.target_type,
            target_id=body.target_id,
            input=body.input,
            priority=body.priority,
            idempotency_key=_check_key(idempotency_key),
            credential_mode=body.credential_mode,
            credential_id=body.credential_id,
        )
    )
    payload = await job_json(state, result.job)
    return JSONResponse(
        payload,
        status_code=202 if result.created else 200,
        headers={"Location": f"/api/ai/jobs/{result.job.id}"},
    )


@router.get("/{job_id}", response_model=JobStatusResponse, summary="Get one of your jobs")
async def get_job(job_id: uuid.UUID, state: State, principal: User) -> JSONResponse:
    # One pooled session for the job and its artifacts; the body is built once (no second
    # validation against response_model, which only documents the shape).
    async with state.sessionmaker() as s:
        row = await _jobs.get(s, job_id)
        if row is None or (not principal.is_admin and row.user_id != principal.user_id):
            raise JobNotFound("Job not found.")
        arts = (
            (await _jobs.artifacts(s, [job_id]))[job_id]
            if row.lifecycle_status == "succeeded"
            else []
        )
    return JSONResponse(
        JobStatusResponse(**status_response(row, arts)).model_dump(mode="json", by_alias=True)
    )


@router.get(
    "/{job_id}/artifacts",
    response_model=ArtifactPage,
    summary="The artifacts of one of your jobs, with their content",
    description=(
        "The business rows a succeeded job projected (a quiz question with its choices, a "
        "flashcard, ...), in `ordinal` order. `content` is what the job type exposes of a row, "
        "or null. Paged: pass `nextCursor` back as `cursor` (opaque)."
    ),
)
async def list_artifacts(
    job_id: uuid.UUID,
    state: State,
    principal: User,
    cursor: Annotated[str | None, Query(max_length=200, pattern=CURSOR_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
) -> JSONResponse:
    after = decode_artifact_cursor(cursor)
    async with state.sessionmaker() as s:
        row = await _jobs.get_owner(s, job_id)
        if row is None or (not principal.is_admin and row[1] != principal.user_id):
            raise JobNotFound("Job not found.")
        rows = await _jobs.artifact_page(s, job_id, after=after, limit=limit + 1)
        page = rows[:limit]
        view = state.catalog.get(row[0]).artifact_view if row[0] in state.catalog else None
        contents = await view(s, job_id, [a.artifact_id for _, a in page]) if view else {}
    body = ArtifactPage(
        items=[
            ArtifactItem(
                artifact_type=a.artifact_type,
                artifact_id=a.artifact_id,
                ordinal=a.ordinal,
                content=contents.get(a.artifact_id),
            )
            for _, a in page
        ],
        next_cursor=(
            encode_artifact_cursor(page[-1][1].ordinal, page[-1][0]) if len(rows) > limit else None
        ),
    )
    return JSONResponse(body.model_dump(mode="json", by_alias=True))


@router.get("", response_model=JobPage, summary="List your jobs, newest first")
async def list_jobs(
    state: State,
    principal: User,
    status_: Annotated[Status | None, Query(alias="status")] = None,
    job_type: Annotated[
        str | None, Query(alias="jobType", max_length=64, pattern=JOB_TYPE_PATTERN)
    ] = None,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    after = decode_cursor(cursor)
    f = JobFilter(user_id=principal.user_id, job_type=job_type, status=status_)
    async with state.sessionmaker() as s:
        rows = await _jobs.list_jobs(s, f, after=after, limit=limit + 1)
        page = rows[:limit]
        arts = await _jobs.artifacts(s, [r.id for r in page])
    return {
        "items": [
            JobStatusResponse(**status_response(r, arts[r.id])).model_dump(
                mode="json", by_alias=True
            )
            for r in page
        ],
        "nextCursor": encode_cursor(page[-1]) if len(rows) > limit else None,
    }


@router.post(
    "/{job_id}/cancel",
    response_model=CancelResponse,
    responses={202: {"model": CancelResponse, "description": "Cancel requested (job running)"}},
    summary="Cancel one of your jobs",
)
async def cancel_job(
    job_id: uuid.UUID, state: State, principal: User, response: Response
) -> JSONResponse:
    result = await state.jobs.cancel(
        job_id,
        principal.user_id,
        admin=False,
        cancel_workflow=state.cancel_workflow,
    )
    row = await state.jobs.get_visible(job_id, principal.user_id, admin=False)
    payload = await job_json(state, row)
    payload["cancelOutcome"] = result.outcome
    return JSONResponse(payload, status_code=200 if result.outcome == "cancelled" else 202)
