"""FastAPI dependencies as `Annotated` aliases.

They are `async def` although none of them awaits: FastAPI runs a plain `def` dependency in its
thread pool, a hand-off to a worker thread and back on every request (two per authenticated
route: the state and the token). What they do (an attribute read, an HS256 check) is cheaper
than that hand-off, so they run on the event loop.
"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import Depends, Header, Path, Query, Request

from api.auth import JwtConfig, Principal, verify_token
from api.browser import STREAM_TOKEN_PARAM, verify_stream_token
from api.state import AppState
from engine.errors import Forbidden


async def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.aijobs
    return state


State = Annotated[AppState, Depends(get_state)]


async def get_principal(
    state: State, authorization: Annotated[str | None, Header(include_in_schema=False)] = None
) -> Principal:
    return verify_token(JwtConfig.from_settings(state.settings), authorization)


User = Annotated[Principal, Depends(get_principal)]


async def get_stream_principal(
    state: State,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
    stream_token: Annotated[
        str | None,
        Query(
            alias=STREAM_TOKEN_PARAM,
            max_length=2048,
            description="A token from `POST /api/ai/stream-tokens`, for a browser's "
            "EventSource (which cannot send `Authorization`). Instead of the bearer token.",
        ),
    ] = None,
) -> Principal:
    """The event-stream routes: a bearer token, or a stream token in the query string (then
    a `StreamPrincipal`: own jobs only)."""
    cfg = JwtConfig.from_settings(state.settings)
    if stream_token is not None:
        return verify_stream_token(cfg, stream_token)
    return verify_token(cfg, authorization)


StreamUser = Annotated[Principal, Depends(get_stream_principal)]


async def get_admin(principal: User) -> Principal:
    if not principal.is_admin:
        raise Forbidden("This route requires the SUPER_ADMIN role.")
    return principal


Admin = Annotated[Principal, Depends(get_admin)]


# Path parameters are camelCase on the wire and in OpenAPI (`{jobId}`), as every JSON member is.
JobId = Annotated[uuid.UUID, Path(alias="jobId", description="The job's id (`jobId`)")]
CredentialId = Annotated[
    uuid.UUID, Path(alias="credentialId", description="The credential's id (`credentialId`)")
]
WebhookId = Annotated[
    uuid.UUID, Path(alias="webhookId", description="The webhook endpoint's id (`webhookId`)")
]
OperationId = Annotated[
    uuid.UUID, Path(alias="operationId", description="The bulk operation's id (`operationId`)")
]
ScheduleId = Annotated[
    uuid.UUID, Path(alias="scheduleId", description="The schedule's id (`scheduleId`)")
]
