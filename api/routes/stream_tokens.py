"""`POST /api/ai/stream-tokens`: a short-lived token a browser's EventSource puts in the query
string of the event-stream routes (api/browser.py says what it can and cannot open)."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, status
from pydantic import Field

from api.auth import JwtConfig
from api.browser import STREAM_TOKEN_TTL_S, issue_stream_token
from api.deps import State, User
from api.schemas import Camel

router = APIRouter(prefix="/api/ai/stream-tokens", tags=["events"])


class StreamTokenResponse(Camel):
    token: str = Field(description="Pass it as `?streamToken=` to `GET .../events`")
    expires_at: datetime = Field(description="When it stops being accepted (RFC 3339)")


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=StreamTokenResponse,
    summary="Get a token for following your jobs from a browser",
    description=(
        "A browser's `EventSource` cannot send `Authorization`. This token, valid for "
        f"{STREAM_TOKEN_TTL_S // 60} minutes, is accepted as `?streamToken=` on "
        "`GET /api/ai/jobs/events` and `GET /api/ai/jobs/{jobId}/events` for your own jobs "
        "only; it is refused (401) as a bearer token, on any other route and for anyone "
        "else's job. Get a new one for each (re)connection."
    ),
)
async def create_stream_token(state: State, principal: User) -> StreamTokenResponse:
    token, expires_at = issue_stream_token(
        JwtConfig.from_settings(state.settings), principal.user_id
    )
    return StreamTokenResponse(token=token, expires_at=expires_at)
