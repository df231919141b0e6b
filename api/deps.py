"""FastAPI dependencies as `Annotated` aliases.

They are `async def` although none of them awaits: FastAPI runs a plain `def` dependency in its
thread pool, a hand-off to a worker thread and back on every request (two per authenticated
route: the state and the token). What they do (an attribute read, an HS256 check) is cheaper
than that hand-off, so they run on the event loop.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from api.auth import JwtConfig, Principal, verify_token
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


async def get_admin(principal: User) -> Principal:
    if not principal.is_admin:
        raise Forbidden("This route requires the SUPER_ADMIN role.")
    return principal


Admin = Annotated[Principal, Depends(get_admin)]
