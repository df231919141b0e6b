"""The console's CSRF check: every state-changing POST (cancel, retry, bulk, requeue, pause,
resume, sign-out) carries its session's CSRF token, as the hidden form field `csrf` or the
`X-CSRF-Token` header, and is refused with 403 without it, before anything else is read or
checked: whatever its body, its cookies or its other headers, it changes nothing.

The token is an HMAC of the session id the cookie holds (`api/console/sessions.py`): a page of
another site can make the browser send the cookie (not with SameSite=Strict, but older browsers
and misconfigured proxies exist) but can neither read it nor the token in the console's pages.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from api.console.sessions import COOKIE, ConsoleSession, console_admin, csrf_token, state_of

FIELD = "csrf"
HEADER = "X-CSRF-Token"
_FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")


class CsrfRefused(Exception):
    """A state-changing POST without its session's CSRF token: 403, nothing done."""


async def _sent_token(request: Request) -> str | None:
    header = request.headers.get(HEADER)
    if header is not None:
        return header
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type not in _FORMS:
        return None
    try:
        value = (await request.form()).get(FIELD)
    except Exception:  # a malformed form has no token
        return None
    return value if isinstance(value, str) else None


async def check(request: Request) -> None:
    session_id = request.cookies.get(COOKIE)
    sent = await _sent_token(request)
    if not session_id or not sent:
        raise CsrfRefused
    expected = csrf_token(state_of(request).settings, session_id)
    if not hmac.compare_digest(sent.encode("utf-8", "replace"), expected.encode()):
        raise CsrfRefused


async def console_action(request: Request) -> ConsoleSession:
    """A console action's dependency: the CSRF token first, then the session."""
    await check(request)
    return await console_admin(request)


Action = Annotated[ConsoleSession, Depends(console_action)]
