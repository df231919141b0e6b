"""User routes: create, get, list, cancel, retry and purge one's own jobs."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from api.auth import Principal
from api.cursors import CURSOR_PATTERN
from api.deps import JobId, State, User
from api.errors import PROBLEM
from api.flow_schemas import concurrency_of
from api.limits import RATE_LIMITED_RESPONSE, TOO_LARGE_RESPONSE, RateLimitedUser
from api.pins import check_pins
from api.quote_schemas import quote_response
from api.schemas import (
    JOB_TYPE_PATTERN,
    MAX_METADATA_KEY_LENGTH,
    MAX_METADATA_KEYS,
    MAX_METADATA_VALUE_LENGTH,
    METADATA_KEY_PATTERN,
    NO_NUL,
    ArtifactPage,
    CancelResponse,
    CreateJobBody,
    JobPage,
    QuoteResponse,
    RetriedJobResponse,
    Status,
    decode_artifact_cursor,
    decode_cursor,
    encode_artifact_cursor,
    encode_cursor,
    storable_text,
)
from api.strict import QueryPrefix
from db.jobs import JobFilter
from engine.errors import UnknownJobType, ValidationFailed
from engine.flow import SUPERSEDED
from engine.scopes import JobScopes
from jobs import views
from jobs.purge import purge_own_job
from jobs.requests import CreateJobRequest, validation_errors
from jobs.views import JobStatusResponse

router = APIRouter(prefix="/api/ai/jobs", tags=["jobs"])
_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")  # visible ASCII, 1..255 chars


def _check_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not _KEY.match(key):
        raise ValidationFailed("Idempotency-Key must be 1-255 visible ASCII characters.")
    return key


def _located(exc: ValidationFailed, *prefix: str) -> ValidationFailed:
    """The same refusal, each error located from the request's root (`["body", "input", ...]`),
    as FastAPI locates the body's own fields."""
    errors = [{**e, "loc": [*prefix, *map(str, e.get("loc", ()))]} for e in exc.errors]  # type: ignore[call-overload]
    return ValidationFailed(
        exc.public_message,
        errors=errors or [{"loc": list(prefix), "msg": exc.public_message, "type": "value_error"}],
    )


def _checked(body: CreateJobBody, state: State) -> None:
    """What a create or a quote refuses about `jobType` and `input` before the service sees
    them, with errors located in the body. The input is read by its camelCase names only:
    `source_text` is an unknown member, never another spelling of `sourceText`."""
    try:
        jt = state.jobs.creation.requests.job_type_for_create(body.job_type)
    except UnknownJobType:
        accepted = ", ".join(public_job_types(state))
        msg = f"jobType must be one of: {accepted}"
        raise ValidationFailed(
            f"Unknown job type. {msg}.",
            errors=[{"loc": ["body", "jobType"], "msg": msg, "type": "enum"}],
        ) from None
    try:
        jt.input_model.model_validate(body.input, strict=True, by_alias=True, by_name=False)
    except ValidationError as exc:
        raise _located(
            ValidationFailed(
                "The input does not match the job type's input schema.",
                errors=validation_errors(exc),
            ),
            "body",
            "input",
        ) from None
    try:
        state.jobs.creation.requests.validate_input(
            jt, body.input
        )  # what JSON cannot say: NaN, Infinity
    except ValidationFailed as exc:
        raise _located(exc, "body", "input") from None
    check_pins(body, jt)


def public_job_types(state: State) -> list[str]:
    """The job types a client may create on this server, sorted."""
    out = []
    for jt in state.catalog:
        try:
            state.jobs.creation.requests.job_type_for_create(jt.job_type)
        except UnknownJobType:
            continue
        out.append(jt.job_type)
    return sorted(out)


def _request(
    body: CreateJobBody, principal: Principal, *, idempotency_key: str | None = None
) -> CreateJobRequest:
    return CreateJobRequest(
        user_id=principal.user_id,
        job_type=body.job_type,
        target_type=body.target_type,
        target_id=body.target_id,
        input=body.input,
        priority=body.priority,
        idempotency_key=idempotency_key,
        credential_mode=body.credential_mode,
        credential_id=body.credential_id,
        max_cost_usd=body.max_cost_usd,
        metadata=dict(body.metadata),
        prompt_version=body.prompt_version,
        output_schema_version=body.output_schema_version,
        run_at=body.run_at,
        service_tier=body.service_tier,
        reuse=body.reuse == "allow",
        offpeak_deadline_at=body.offpeak_deadline.at if body.offpeak_deadline else None,
        offpeak_on_deadline=body.offpeak_deadline.then if body.offpeak_deadline else None,
        # The job keeps its creator's organisation and teams: past spend never moves.
        scopes=JobScopes(principal.org_id, principal.team_ids, tuple(body.tags)),
        concurrency=concurrency_of(body.concurrency),
        ttl_seconds=body.ttl_seconds,
        deadline=body.deadline,
    )


@router.post(
    "/quote",
    response_model=QuoteResponse,
    responses={**TOO_LARGE_RESPONSE, **RATE_LIMITED_RESPONSE},
    summary="What a job would cost, and whether it would be admitted now",
    description=(
        "Takes a create body and answers with the model, the estimated input tokens, each "
        "call's answer budget, the estimated and worst-case cost (the worst case is what a "
        "create reserves against your cost budgets), and whether a create now would be "
        "admitted; if not, which limit refuses it and until when (`refusal`). The body is "
        "checked as a create checks it (422 for what a create would refuse). Creates nothing "
        "and counts against nothing; a later create may still be refused if your jobs or "
        "spend changed in between."
    ),
)
async def quote_job(body: CreateJobBody, state: State, principal: RateLimitedUser) -> QuoteResponse:
    _checked(body, state)
    q = await state.jobs.quote(_request(body, principal))
    return quote_response(q, principal.user_id, body.max_cost_usd)


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobStatusResponse,
    responses={
        200: {
            "model": JobStatusResponse,
            "description": "Existing job: the same Idempotency-Key and body, or the job "
            "holding the `concurrency` key of a `skip` create",
        },
        **TOO_LARGE_RESPONSE,
        **RATE_LIMITED_RESPONSE,
    },
    summary="Create a job",
    description=(
        "Creates a job of a public job type; `input` is validated against that type's own input "
        "schema (see the `*Input` schemas). With `Idempotency-Key`, the same key and body return "
        "the existing job (200); the same key with another body is rejected (422). "
        "`credentialId` (with `credentialMode: user_deepseek_key`) names which of your own active "
        "keys pays; anyone else's, a revoked or an unknown key is 404 `CREDENTIAL_NOT_FOUND`. "
        "Flow control: `concurrency` (`supersede`, `skip`, `debounce` on a key of yours), "
        "`ttlSeconds` (start by then or end `JOB_EXPIRED`) and `deadline` (stop there, "
        "`JOB_DEADLINE_EXCEEDED`); a `skip` create whose key is held answers 200 with the job "
        "holding it."
    ),
)
async def create_job(
    request: Request,
    body: CreateJobBody,
    state: State,
    principal: RateLimitedUser,
    response: Response,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> JobStatusResponse:
    _checked(body, state)
    result = await state.jobs.create(
        _request(body, principal, idempotency_key=_check_key(idempotency_key)),
        cancel_workflow=state.cancel_workflow,
    )
    superseded = [*result.flow.replaced, *result.flow.running]
    for old in superseded:  # counted once the create committed (jobs/flow.py)
        request.app.state.metrics.flow.ended(old.job_type, SUPERSEDED)
    response.status_code = 202 if result.created else 200
    response.headers["Location"] = f"/api/ai/jobs/{result.job.id}"
    # The job as the create left it (an existing one, returned for its key, may have ended).
    return await views.present(state.sessionmaker, result.job)


@router.get("/{jobId}", response_model=JobStatusResponse, summary="Get one of your jobs")
async def get_job(job_id: JobId, state: State, principal: User) -> JobStatusResponse:
    async with state.sessionmaker() as s:
        return await views.job_status(s, job_id, principal)


@router.get(
    "/{jobId}/artifacts",
    response_model=ArtifactPage,
    # Rendered by json.dumps, as before: `content` is the job type's own JSON, and its numbers
    # keep their spelling (pydantic's fast path writes 1e-05 as 0.00001).
    response_class=JSONResponse,
    summary="The artifacts of one of your jobs, with their content",
    description=(
        "The business rows a succeeded job projected (a quiz question with its choices, a "
        "flashcard, ...), in `ordinal` order. `content` is what the job type exposes of a row, "
        "or null (always null once the job's private data is purged: the references stay, the "
        "rows are gone). Paged: pass `nextCursor` back as `cursor` (opaque)."
    ),
)
async def list_artifacts(
    job_id: JobId,
    state: State,
    principal: User,
    cursor: Annotated[str | None, Query(max_length=200, pattern=CURSOR_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
) -> ArtifactPage:
    after = decode_artifact_cursor(cursor)
    async with state.sessionmaker() as s:
        page = await views.artifact_page(
            s, state.catalog, job_id, principal, after=after, limit=limit
        )
    return ArtifactPage(items=page.items, next_cursor=encode_artifact_cursor(page.next_after))


_METADATA_QUERY = QueryPrefix("metadata.")
_METADATA_KEY = re.compile(METADATA_KEY_PATTERN)


def metadata_filter(
    pairs: Annotated[list[tuple[str, str]], Depends(_METADATA_QUERY)],
) -> tuple[tuple[str, str], ...]:
    """`metadata.<key>=<value>` query parameters (repeatable; a job must hold every pair). A
    pair no stored metadata could hold (a key or a value the create would refuse, more pairs
    than a job has keys) is a 422 located at its parameter, never an empty page."""
    errors = []
    for key, value in pairs:
        if not _METADATA_KEY.match(key) or len(key) > MAX_METADATA_KEY_LENGTH:
            msg = f"the key must be 1-{MAX_METADATA_KEY_LENGTH} characters [A-Za-z0-9_.-]"
        elif len(value) > MAX_METADATA_VALUE_LENGTH or not storable_text(value):
            msg = f"the value must be at most {MAX_METADATA_VALUE_LENGTH} characters, no NUL"
        elif len(pairs) > MAX_METADATA_KEYS:
            msg = f"at most {MAX_METADATA_KEYS} metadata filters"
        else:
            continue
        errors.append({"loc": ("query", f"metadata.{key}"), "msg": msg, "type": "value_error"})
    if errors:
        raise RequestValidationError(errors)
    return tuple(pairs)


@router.get(
    "",
    response_model=JobPage,
    summary="List your jobs, newest first",
    description=(
        "Your jobs, newest first, filtered by `status`, `jobType`, `targetType`, `targetId` "
        "and your own `metadata`: `metadata.<key>=<value>` (repeatable; a job must hold every "
        "pair, e.g. `?metadata.courseId=C42&metadata.term=autumn`). Filters combine with AND. "
        "Paged: pass `nextCursor` back as `cursor` (opaque)."
    ),
)
async def list_jobs(
    state: State,
    principal: User,
    status_: Annotated[Status | None, Query(alias="status")] = None,
    job_type: Annotated[
        str | None, Query(alias="jobType", max_length=64, pattern=JOB_TYPE_PATTERN)
    ] = None,
    target_type: Annotated[
        str | None,
        Query(
            alias="targetType",
            min_length=1,
            max_length=64,
            pattern=NO_NUL,
            description="Only jobs about this kind of thing (the create's `targetType`)",
            examples=["lesson"],
        ),
    ] = None,
    target_id: Annotated[
        str | None,
        Query(
            alias="targetId",
            min_length=1,
            max_length=128,
            pattern=NO_NUL,
            description="Only jobs about this thing (the create's `targetId`)",
            examples=["L1"],
        ),
    ] = None,
    metadata: Annotated[tuple[tuple[str, str], ...], Depends(metadata_filter)] = (),
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> JobPage:
    after = decode_cursor(cursor)
    f = JobFilter(
        user_id=principal.user_id,
        job_type=job_type,
        status=status_,
        target_type=target_type,
        target_id=target_id,
        metadata=metadata,
    )
    async with state.sessionmaker() as s:
        page = await views.job_page(s, principal, f, after=after, limit=limit)
    return JobPage(items=page.items, next_cursor=encode_cursor(page.next_after))


@router.post(
    "/{jobId}/cancel",
    response_model=CancelResponse,
    responses={202: {"model": CancelResponse, "description": "Cancel requested (job running)"}},
    summary="Cancel one of your jobs",
)
async def cancel_job(
    job_id: JobId, state: State, principal: User, response: Response
) -> CancelResponse:
    result = await state.jobs.cancel(
        job_id,
        principal.user_id,
        admin=False,
        cancel_workflow=state.cancel_workflow,
    )
    async with state.sessionmaker() as s:
        job = await views.job_status(s, job_id, principal)
    response.status_code = 200 if result.outcome == "cancelled" else 202
    return CancelResponse(**dict(job), cancel_outcome=result.outcome)


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }


@router.post(
    "/{jobId}/retry",
    status_code=status.HTTP_201_CREATED,
    response_model=RetriedJobResponse,
    responses={
        200: {"model": RetriedJobResponse, "description": "Already retried: that retry"},
        409: _problem("The job is not `failed` or `cancelled` (`JOB_NOT_RETRYABLE`)"),
        429: _problem(
            "Your quotas or cost budgets refuse the retry, as they would refuse a create "
            "(`QUOTA_EXCEEDED`, `TOO_MANY_JOBS`), or you are past your request rate, which "
            "retries share with creates and quotes (`RATE_LIMITED`); see Retry-After"
        ),
    },
    summary="Retry one of your failed or cancelled jobs as a new job",
    description=(
        "Creates a new job with the original's type, target, input, priority, credential "
        "choice, cost cap and `metadata` (not its `runAt`: the retry runs now) and answers 201 "
        "with it, `retriedFromJobId` naming the original. It counts against your quotas and "
        "cost budgets exactly as a create does. One retry per job: retrying it again answers "
        "200 with that same retry. A job in any other state is 409 `JOB_NOT_RETRYABLE` (so is "
        "one whose input retention has purged, or whose key was revoked); someone else's job "
        "is 404 `JOB_NOT_FOUND`."
    ),
)
async def retry_own_job(
    job_id: JobId, state: State, principal: RateLimitedUser, response: Response
) -> RetriedJobResponse:
    # `RateLimitedUser` took one request from the user's rate, as a create's does.
    result = await state.jobs.retry(job_id, owner=principal.user_id)
    response.status_code = 201 if result.created else 200
    response.headers["Location"] = f"/api/ai/jobs/{result.job.id}"
    job = await views.present(state.sessionmaker, result.job)
    return RetriedJobResponse(**dict(job), retried_from_job_id=job_id)


@router.delete(
    "/{jobId}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    summary="Purge the private data of one of your ended jobs",
    description=(
        "Removes the job's private data now, as retention (`DATA_RETENTION_DAYS`) would later, "
        "in one transaction: its input, its output, the business rows its job type projected "
        "from it (quiz questions, flashcards, weak-point candidates), its chunks' outputs (the "
        "partial items of a long source), its streamed items, its batch line and answer, its "
        "snapshot and its internal error message. The job itself stays (status, codes, times, "
        "costs and usage, for billing and audit) and reads `privateDataPurged: true`; its "
        "artifacts route still lists each artifact reference, with `content: null`; a purged "
        "job cannot be retried. Only a `succeeded`, "
        "`failed` or `cancelled` job can be purged (409 `JOB_NOT_TERMINAL`: cancel it first); "
        "another user's job is 404 `JOB_NOT_FOUND`. A second DELETE is 204 again."
    ),
    responses={
        204: {"description": "Purged (or already purged)"},
        404: {"description": "No such job of yours (problem+json, `JOB_NOT_FOUND`)"},
        409: {"description": "The job has not ended (problem+json, `JOB_NOT_TERMINAL`)"},
    },
)
async def purge_job(job_id: JobId, state: State, principal: User) -> Response:
    await purge_own_job(state.sessionmaker, job_id, principal.user_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
