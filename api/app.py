"""The FastAPI application factory. The process's composition root (`runtime/wiring.py`,
`api_app`) decides its collaborators and passes them in."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from fastapi_offline import FastAPIOffline
from temporalio.client import Client

from api import browser, console, errors, limits, metrics, openapi
from api.events import JobEventHub
from api.heavy_requests import HeavyRequestGate
from api.metrics import ApiMetrics
from api.routes import (
    admin,
    admin_bulk,
    admin_webhooks,
    credentials,
    events,
    feedback,
    health,
    jobs,
    outbox,
    pauses,
    rollouts,
    stream_tokens,
    usage,
)
from api.routes import budgets as budgets_routes
from api.routes import schedules as schedules_routes
from api.routes.job_types import router as job_types_router
from api.routes.webhooks import router as webhooks_router
from api.state import AppState
from api.strict import check_request
from db.credentials import active_user_key_id
from db.session import make_engine, make_sessionmaker
from engine.settings import Settings
from jobs import token_count
from jobs.credentials import CredentialService, credential_cipher
from jobs.rollouts import CHANNEL as ROLLOUTS_CHANNEL
from jobs.service import CreatePolicy, JobService
from jobs.spec import Catalog
from jobs.webhooks import WebhookService


def create_app(
    settings: Settings,
    *,
    policy: CreatePolicy,
    catalog: Catalog,
    temporal: Client | None = None,
    application_name: str = "aijobs-api",
) -> FastAPI:
    """The API app, given its collaborators: `runtime.wiring.api_app` is the one place that
    chooses them. The keyring is `credential_cipher(settings)`, the one the workers use. Its
    connections name it `application_name` (its listener's, that with `-listener`)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(
            settings.require_database_url(),
            pool_size=settings.db_pool_size,
            pooled=settings.database_pooled,
            application_name=application_name,
        )
        sm = make_sessionmaker(engine)
        keyring = credential_cipher(settings)
        app.state.aijobs = AppState(
            settings=settings,
            sessionmaker=sm,
            catalog=catalog,
            jobs=JobService(sm, catalog, policy, credential_lookup=active_user_key_id),
            temporal=temporal,
            credentials=CredentialService(sm, keyring),
            events=JobEventHub(
                settings.session_database_url, sm, application_name=application_name
            ),
            webhooks=WebhookService(
                sm,
                keyring,
                allow_private=settings.webhooks_allow_private,
            ),
        )
        # Creates read a job type's rollout from memory while the listener hears its changes.
        book = app.state.aijobs.jobs.creation.rollouts
        app.state.aijobs.events.follow(ROLLOUTS_CHANNEL, book.on_notify)
        book.listening = True
        try:
            yield
        finally:
            await app.state.aijobs.events.close()
            await engine.dispose()

    # Swagger UI (/docs) and ReDoc (/redoc) from assets in the process: no CDN, no font host.
    app = FastAPIOffline(
        title="ai-job-engine",
        version="0.1.0",
        description="Create, follow and cancel AI jobs; admins list, filter and retry them.",
        lifespan=lifespan,
        # Every route refuses unknown query parameters and non-JSON bodies (api/strict.py).
        dependencies=[Depends(check_request)],
        swagger_ui_parameters={"validatorUrl": None},
    )
    errors.install(app)
    # Large bodies take turns (inside the size limit, so an oversized one is refused at once),
    # as many at once as the check pool has threads plus one, waiting as long as it lets them.
    app.add_middleware(
        HeavyRequestGate,
        slots=token_count.pool().concurrency + 1,
        wait_s=token_count.pool().wait_s,
    )
    limits.install(app, max_bytes=limits.MAX_REQUEST_BYTES)
    metrics.install(app, ApiMetrics(t.job_type for t in catalog))
    console.install(app)  # the operator console at /console (api/console/)
    browser.install(app, settings)  # CORS outermost: refusals carry its headers too
    _include_routes(app)
    openapi.install(app, catalog, synthetic_public=policy.synthetic_public)
    return app


def _include_routes(app: FastAPI) -> None:
    # Before the jobs router: `/api/ai/jobs/events` is not a job id.
    app.include_router(events.router)
    app.include_router(jobs.router)
    app.include_router(feedback.router)
    app.include_router(rollouts.router)
    app.include_router(job_types_router)
    app.include_router(usage.router)
    app.include_router(admin.router)
    app.include_router(admin_bulk.router)
    app.include_router(budgets_routes.router)
    app.include_router(admin_webhooks.router)
    app.include_router(outbox.router)
    app.include_router(pauses.router)
    app.include_router(credentials.router)
    app.include_router(webhooks_router)
    app.include_router(schedules_routes.router)
    app.include_router(schedules_routes.admin_router)
    app.include_router(health.router)
    app.include_router(stream_tokens.router)
