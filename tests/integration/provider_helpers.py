"""Helpers of the provider tests (job types, gateway errors, credentials, key sentinel): test-only
job-type variants, settings that point the engine at the fake OpenAI-compatible server, and the
API in process. The stack itself is `tests.stack.engine_stack`.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import text

from api.auth import JwtConfig, issue_token
from engine.settings import Settings
from runtime.wiring import api_app
from tests.fakes.openai_server import FakeOpenAIServer
from tests.stack import Stack

FAKE_MODEL = "deepseek-chat"


PLATFORM_KEY = "sk-platform-test-key-0000"


def fake_env(fake: FakeOpenAIServer, **env: Any) -> dict[str, Any]:
    """Settings overrides pointing the engine at the fake server with a platform key."""
    values: dict[str, Any] = {
        "AI_BASE_URL": fake.base_url,
        # Users' own keys may go to the fake server only because it is allowlisted.
        "USER_KEY_ALLOWED_BASE_URLS": fake.base_url,
        "DEEPSEEK_API_KEY": PLATFORM_KEY,
        "AI_MODEL": FAKE_MODEL,
    }
    values.update(env)
    return values


async def usage_rows(stack: Stack, job_id: uuid.UUID) -> list[Any]:
    async with stack.parts.sessionmaker() as s:
        rows = await s.execute(
            text("SELECT * FROM ai_usage_log WHERE job_id = :j ORDER BY attempt_no, id"),
            {"j": job_id},
        )
        return list(rows)


async def user_prompts(fake: FakeOpenAIServer) -> list[str]:
    """The user message of every call the fake server saw, in order."""
    return [
        next(m["content"] for m in messages if m["role"] == "user")
        for messages in await fake.amessages()
    ]


@contextlib.asynccontextmanager
async def api_client(settings: Settings) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The real app (its lifespan included) behind an in-process ASGI transport."""
    app = api_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c,
    ):
        yield app, c


def auth(settings: Settings, user_id: str, *, admin: bool = False) -> dict[str, str]:
    token = issue_token(JwtConfig.from_settings(settings), user_id, admin=admin)
    return {"Authorization": f"Bearer {token}"}
