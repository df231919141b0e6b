"""SUPER_ADMIN routes for acting on many jobs at once (bulk cancel and retry by filter) and for
reading the admin audit log.

A bulk submission freezes the matching jobs in PostgreSQL and writes the operation's
`ai.bulk.start` outbox row in the same transaction (with its audit entry); the relay starts the
operation's Temporal workflow (`bulk:{operationId}`, queue `ai-system`) from it, as it starts
jobs: an accepted operation cannot lose its workflow between commit and Temporal. As a second
line, reading an operation that no worker has picked up START_AFTER_S after its
submission starts the workflow from the API (idempotent by workflow id; a closed one is never
run again): a relay that is down or a row that went dead never leaves an operation waiting once
someone looks at it.
"""

from __future__ import annotations

import logging
import re
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Header, Query
from fastapi.responses import JSONResponse
from pydantic import BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from api import cursors
from api.deps import Admin, OperationId, State
from api.routes.admin import ERROR_CODE_PATTERN, iso_datetime
from api.schemas import (
    JOB_TYPE_PATTERN,
    MAX_METADATA_KEYS,
    NO_NUL,
    Camel,
    Metadata,
    Queue,
    Status,
    metadata_schema,
)
from api.state import AppState
from db import audit as audit_db
from db.audit import AuditRow
from db.bulk import OperationRow
from db.jobs import JobFilter
from engine.contracts import BULK_WORKFLOW
from engine.definition import SYSTEM_QUEUE
from engine.errors import ValidationFailed
from jobs.bulk import JOBS_PER_SECOND, Action, BulkPolicy, BulkService, OperationStatus

log = logging.getLogger(__name__)
router = APIRouter(prefix="/admin-api/ai", tags=["admin"])
# The relay starts an operation's workflow from the outbox within a poll; one still not started
# this long after its submission (no relay running, a dead row) is started by its next read.
START_AFTER_S = 10.0
_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")
_AUDIT_CURSOR = "audit:"
IsoDateTime = Annotated[datetime, BeforeValidator(iso_datetime)]


class BulkBody(Camel):
    """The admin list's filters; every filter given must hold (AND)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
    job_type: str | None = Field(default=None, max_length=64, pattern=JOB_TYPE_PATTERN)
    status: Status | None = None
    queue_name: Queue | None = None
    user_id: str | None = Field(default=None, max_length=128, pattern=NO_NUL)
    error_code: str | None = Field(default=None, max_length=64, pattern=ERROR_CODE_PATTERN)
    created_from: IsoDateTime | None = None
    created_to: IsoDateTime | None = None
    target_type: str | None = Field(default=None, min_length=1, max_length=64, pattern=NO_NUL)
    target_id: str | None = Field(default=None, min_length=1, max_length=128, pattern=NO_NUL)
    metadata: Metadata | None = Field(
        default=None,
        max_length=MAX_METADATA_KEYS,
        description="Pairs the job's `metadata` must all hold (the list's `metadata.<key>`)",
        examples=[{"courseId": "C42"}],
        json_schema_extra=metadata_schema,
    )
    dry_run: bool = Field(default=False, strict=True)  # `0` is not a boolean

    def job_filter(self) -> JobFilter:
        return JobFilter(
            user_id=self.user_id,
            job_type=self.job_type,
            status=self.status,
            queue_name=self.queue_name,
            error_code=self.error_code,
            created_from=self.created_from,
            created_to=self.created_to,
            target_type=self.target_type,
            target_id=self.target_id,
            metadata=tuple((self.metadata or {}).items()),
        )

    def filter_json(self) -> dict[str, Any]:
        """The filter as recorded (operation row, audit detail): ids and codes, no job data."""
        return self.model_dump(
            mode="json", by_alias=True, exclude_none=True, exclude={"dry_run", "override_budget"}
        )


class BulkRetryBody(BulkBody):
    """A bulk retry's body: the filters, plus the admin's budget override (the retries are
    created even past their owners' quotas and cost budgets)."""

    override_budget: bool = Field(default=False, strict=True)  # `0` is not a boolean


class BulkPreviewResponse(Camel):
    dry_run: Literal[True] = True
    matched: int
    sample: list[uuid.UUID]


class BulkAcceptedResponse(Camel):
    operation_id: uuid.UUID
    action: str
    status: str
    matched: int


class BulkStatusResponse(BulkAcceptedResponse):
    done: int
    skipped: int
    failed: int
    pending: int
    skipped_reasons: dict[str, int]
    failed_reasons: dict[str, int]
    refused: int = Field(
        default=0,
        description="Bulk retry: jobs whose owner's quotas or cost budgets refused the retry "
        "(no job created; never counted in `done`)",
    )
    refused_reasons: dict[str, int] = Field(
        default_factory=dict, description="The refusals' codes (`QUOTA_EXCEEDED`, ...)"
    )
    actor: str
    filter: dict[str, Any]
    workflow_id: str
    temporal_ui_url: str
    created_at: datetime
    finished_at: datetime | None = None


class AuditEntryOut(Camel):
    id: int
    actor: str
    action: str
    target_type: str
    target_id: str | None
    detail: dict[str, Any]
    outcome: str
    created_at: datetime


class AuditPage(Camel):
    items: list[AuditEntryOut]
    next_cursor: str | None = None


def bulk_service(state: AppState) -> BulkService:
    """The bulk use case of these routes and of the console's bulk forms."""
    return BulkService(state.sessionmaker, state.jobs, BulkPolicy.from_settings(state.settings))


async def _start(state: State, bulk: BulkService, op: OperationRow) -> None:
    """Start the operation's workflow; idempotent (same id: the running one is kept, a closed
    one is not run again). A failure is logged: the GET of the operation tries again."""
    try:
        client = await state.temporal_client()
        await client.start_workflow(
            BULK_WORKFLOW,
            bulk.workflow_input(op),
            id=op.workflow_id,
            task_queue=state.settings.task_queue(SYSTEM_QUEUE),
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        )
    except WorkflowAlreadyStartedError:
        pass  # started before (and perhaps finished): recorded below
    except Exception as exc:
        log.warning(
            "bulk workflow not started; retried on the next read",
            extra={"operation_id": str(op.id), "error": type(exc).__name__},
        )
        return
    await bulk.mark_started(op.id)


def _status_json(state: State, st: OperationStatus) -> dict[str, Any]:
    op = st.operation
    ui = state.settings.temporal_ui_url.rstrip("/")
    ns = quote(state.settings.temporal_namespace, safe="")
    return BulkStatusResponse(
        operation_id=op.id,
        action=op.action,
        status=op.status,
        matched=op.matched,
        done=st.done,
        skipped=st.skipped,
        failed=st.failed,
        pending=st.pending,
        skipped_reasons=st.skipped_reasons,
        failed_reasons=st.failed_reasons,
        refused=st.refused,
        refused_reasons=st.refused_reasons,
        actor=op.actor,
        filter=op.filter,
        workflow_id=op.workflow_id,
        temporal_ui_url=f"{ui}/namespaces/{ns}/workflows/{quote(op.workflow_id, safe='')}",
        created_at=op.created_at,
        finished_at=op.finished_at,
    ).model_dump(mode="json", by_alias=True)


async def _submit(
    action: Action, body: BulkBody, state: State, admin: Admin, key: str | None
) -> JSONResponse:
    if key is not None and not _KEY.match(key):
        raise ValidationFailed("Idempotency-Key must be 1-255 visible ASCII characters.")
    bulk = bulk_service(state)
    f = body.job_filter()
    if body.dry_run:
        preview = await bulk.preview(admin.user_id, action, f, body.filter_json())
        return JSONResponse(
            BulkPreviewResponse(matched=preview.matched, sample=preview.sample).model_dump(
                mode="json", by_alias=True
            )
        )
    submitted = await bulk.submit(
        admin.user_id,
        action,
        f,
        body.filter_json(),
        idempotency_key=key,
        override_budget=isinstance(body, BulkRetryBody) and body.override_budget,
    )
    op = submitted.operation
    return JSONResponse(
        BulkAcceptedResponse(
            operation_id=op.id, action=op.action, status=op.status, matched=op.matched
        ).model_dump(mode="json", by_alias=True),
        status_code=202 if submitted.created else 200,
        headers={"Location": f"/admin-api/ai/bulk/{op.id}"},
    )


_SUBMIT_DOC = (
    "Selects jobs with the admin list's filters (`jobType`, `status`, `queueName`, `userId`, "
    "`errorCode`, `createdFrom`, `createdTo`, `targetType`, `targetId` and `metadata`, an "
    "object of pairs the job's metadata must all hold; all optional, combined with AND). "
    "`dryRun: true` answers 200 `{matched, sample}` (up to 20 job ids) and changes "
    "nothing. Otherwise the matching job ids are frozen as the operation's items and a Temporal "
    "workflow (`bulk:{operationId}` on `ai-system`) acts on them in pages, at most "
    f"{JOBS_PER_SECOND:g} a second: 202 `{{operationId, matched}}`, follow it with "
    "`GET /admin-api/ai/bulk/{operationId}`. More than ADMIN_BULK_MAX_JOBS matches → 422 "
    "`BULK_TOO_LARGE` with `matched` and `limit`. The same filters sent again start a new "
    "operation whose items are mostly skipped; with the same `Idempotency-Key` the existing "
    "operation is returned (200)."
)
_SUBMIT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "model": BulkPreviewResponse | BulkAcceptedResponse,
        "description": "A dry run, or the operation of a reused Idempotency-Key",
    },
    202: {"model": BulkAcceptedResponse, "description": "Operation accepted"},
}


@router.post(
    "/bulk/cancel",
    status_code=202,
    response_model=BulkAcceptedResponse,
    responses=_SUBMIT_RESPONSES,
    summary="Cancel every job a filter matches",
    description=_SUBMIT_DOC
    + " Each job gets the owner's cancel: queued → cancelled, running → cancel requested; "
    "ended ones are skipped (`already_finished`, `already_cancelled`).",
)
async def bulk_cancel(
    body: BulkBody,
    state: State,
    admin: Admin,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> JSONResponse:
    return await _submit("cancel", body, state, admin, idempotency_key)


@router.post(
    "/bulk/retry",
    status_code=202,
    response_model=BulkAcceptedResponse,
    responses=_SUBMIT_RESPONSES,
    summary="Retry every failed or cancelled job a filter matches",
    description=_SUBMIT_DOC
    + " Each job gets the admin retry: at most one retry per job ever; jobs retried before are "
    "skipped (`already_retried`), jobs not failed or cancelled too (`not_failed`). Each retry "
    "reserves against its OWNER's quotas and cost budgets like the owner's create, under the "
    "original's own credential choice: a job they refuse is counted in `refused` (with "
    "`refusedReasons`, e.g. `QUOTA_EXCEEDED`), never in `done`, unless the body says "
    "`overrideBudget: true` (recorded on the operation's audit entry).",
)
async def bulk_retry(
    body: BulkRetryBody,
    state: State,
    admin: Admin,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> JSONResponse:
    return await _submit("retry", body, state, admin, idempotency_key)


@router.get(
    "/bulk/{operationId}",
    response_model=BulkStatusResponse,
    summary="A bulk operation's progress",
    description=(
        "`status` is `running` until every item is settled, then `completed`. Items are "
        "`done`, `skipped` (`skippedReasons` says why, e.g. `already_retried`, `not_failed`), "
        "`refused` (a bulk retry the owner's quotas or cost budgets refused; `refusedReasons`: "
        "the code), `failed` (`failedReasons`: the error code) or still `pending`."
    ),
)
async def get_operation(operation_id: OperationId, state: State, _admin: Admin) -> dict[str, Any]:
    bulk = bulk_service(state)
    st = await bulk.status(operation_id)
    op = st.operation
    waited = (datetime.now(UTC) - op.created_at).total_seconds()
    if op.status == "running" and op.workflow_started_at is None and waited >= START_AFTER_S:
        await _start(state, bulk, op)
    return _status_json(state, st)


def _audit_json(row: AuditRow) -> dict[str, Any]:
    return AuditEntryOut(**row.__dict__).model_dump(mode="json", by_alias=True)


@router.get(
    "/audit",
    response_model=AuditPage,
    summary="The admin audit log, newest first",
    description=(
        "Every admin action (cancel, retry, bulk submissions and their completion, outbox "
        "requeue, webhook replay) and view of internals (the admin job view and list), with "
        "its actor, target, outcome (`cancelled`, `retried`, `accepted`, ... or the refusal's "
        "error code) and details (ids, filters, counts). Filters: `actor`, `action`, `from` "
        "(inclusive), `to` (exclusive). Entries are kept 365 days unless the operator set "
        "otherwise (RETENTION_DAYS `admin_audit`)."
    ),
)
async def list_audit(
    state: State,
    _admin: Admin,
    actor: Annotated[str | None, Query(max_length=128, pattern=NO_NUL)] = None,
    action: Annotated[str | None, Query(max_length=64, pattern=r"^[a-z_.]{1,64}$")] = None,
    from_: Annotated[IsoDateTime | None, Query(alias="from")] = None,
    to: Annotated[IsoDateTime | None, Query()] = None,
    cursor: Annotated[str | None, Query(max_length=200, pattern=cursors.CURSOR_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> dict[str, Any]:
    before = cursors.decode_id(cursor, _AUDIT_CURSOR)
    async with state.sessionmaker() as s:
        rows = await audit_db.list_page(
            s, actor=actor, action=action, since=from_, until=to, before_id=before, limit=limit + 1
        )
    page = rows[:limit]
    return {
        "items": [_audit_json(r) for r in page],
        "nextCursor": cursors.encode_ints(_AUDIT_CURSOR, page[-1].id)
        if len(rows) > limit
        else None,
    }
