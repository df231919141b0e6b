"""SUPER_ADMIN's operator pauses (docs/admin.md "Operator pauses"): create, list, delete
(resume). The use cases and their audit entries are jobs/pauses.py."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Path, Response, status

from api.deps import Admin, State
from api.flow_schemas import PauseBody, PauseList, PauseMatchOut, PauseOut
from db.pauses import PauseRow
from engine.errors import ValidationFailed
from engine.flow import PauseMatch
from jobs.pauses import Pauses

router = APIRouter(prefix="/admin-api/ai/pauses", tags=["admin"])
PauseId = Annotated[uuid.UUID, Path(alias="pauseId", description="The pause's id (`pauseId`)")]


def pause_out(row: PauseRow) -> PauseOut:
    return PauseOut(
        pause_id=row.id,
        match=PauseMatchOut(
            job_type=row.job_type, provider=row.provider, model=row.model, user_id=row.user_id
        ),
        reason=row.reason,
        expires_at=row.expires_at,
        created_at=row.created_at,
        created_by=row.created_by,
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=PauseOut,
    summary="Pause the calls of matching jobs",
    description=(
        "From the moment this answers 201, no provider call of a job the pause matches starts, "
        "on any process (a call already in flight may finish). `match` names at least one of "
        "`jobType` (a job type the engine knows), `provider`, `model` (of the call about to be "
        "sent: a fallback's included) and `userId`; a job matches when every given member "
        "equals its own. Held jobs keep their state (`queued`, or `running` between calls), "
        "spend no attempt and hold no worker slot; creates still answer 202, TTLs and "
        "deadlines still fire. `expiresAt` (optional, in the future) ends it as a DELETE does. "
        "Written to the audit log (`pause.create`)."
    ),
)
async def create_pause(body: PauseBody, state: State, admin: Admin) -> PauseOut:
    m = body.match
    if m.job_type is not None and m.job_type not in state.catalog:
        msg = "unknown jobType (GET /api/ai/job-types lists them)"
        raise ValidationFailed(
            msg, errors=[{"loc": ["body", "match", "jobType"], "msg": msg, "type": "enum"}]
        )
    row = await Pauses(state.sessionmaker).create(
        PauseMatch(m.job_type, m.provider, m.model, m.user_id),
        reason=body.reason,
        expires_at=body.expires_at,
        actor=admin.user_id,
    )
    return pause_out(row)


@router.get(
    "",
    response_model=PauseList,
    summary="The pauses in force",
    description="Every operator pause in force, oldest first.",
)
async def list_pauses(state: State, admin: Admin) -> PauseList:
    rows = await Pauses(state.sessionmaker).listed()
    return PauseList(items=[pause_out(r) for r in rows])


@router.delete(
    "/{pauseId}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    summary="Resume: lift a pause",
    description=(
        "Lifts the pause (204): the jobs it held go again within seconds, each user's first, "
        "then each user's second..., at most AI_RESUME_RATE a second across the cluster. An "
        "unknown (or expired) pause is 404 `PAUSE_NOT_FOUND`. Written to the audit log "
        "(`pause.delete`)."
    ),
    responses={204: {"description": "Lifted"}},
)
async def delete_pause(pause_id: PauseId, state: State, admin: Admin) -> Response:
    await Pauses(state.sessionmaker).delete(pause_id, actor=admin.user_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
