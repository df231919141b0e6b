"""The FastAPI application factory. The process's composition root (`runtime/wiring.py`,
`api_app`) decides its collaborators and passes them in."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from temporalio.client import Client

from api import errors, limits, metrics
from api.events import JobEventHub
from api.metrics import ApiMetrics
from api.openapi import document_errors, job_type_bodies
from api.routes import admin, admin_bulk, credentials, events, health, jobs, outbox, usage
from api.routes import schedules as schedules_routes
from api.routes.webhooks import router as webhooks_router
from api.state import AppState
from db.credentials import active_user_key_id
from db.session import make_engine, make_sessionmaker
from engine.settings import Settings
from jobs.credentials import CredentialService, credential_cipher
from jobs.service import CreatePolicy, JobService
from jobs.spec import Catalog
from jobs.webhooks import WebhookService


def create_app(
    settings: Settings,
    *,
    policy: CreatePolicy,
    catalog: Catalog,
    temporal: Client | None = None,
) -> FastAPI:
    """The API app, given its collaborators: `runtime.wiring.api_app` is the one place that
    chooses them. The keyring is `credential_cipher(settings)`, the one the workers use."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.require_database_url(), pool_size=settings.db_pool_size)
        sm = make_sessionmaker(engine)
        keyring = credential_cipher(settings)
        app.state.aijobs = AppState(
            settings=settings,
            sessionmaker=sm,
            catalog=catalog,
            jobs=JobService(sm, catalog, policy, credential_lookup=active_user_key_id),
            temporal=temporal,
            credentials=CredentialService(sm, keyring),
            events=JobEventHub(settings.require_database_url(), sm),
            webhooks=WebhookService(
                sm,
                keyring,
                allow_private=settings.webhooks_allow_private,
                rotation_grace_s=settings.webhook_rotation_grace_s,
                max_endpoints=settings.webhook_max_endpoints_per_user,
            ),
        )
        try:
            yield
        finally:
            await app.state.aijobs.events.close()
            await engine.dispose()

    app = FastAPI(
        title="ai-job-engine",
        version="0.1.0",
        description="Create, follow and cancel AI jobs; admins list, filter and retry them.",
        lifespan=lifespan,
    )
    errors.install(app)
    limits.install(app, max_bytes=settings.max_request_bytes)
    metrics.install(app, ApiMetrics(t.job_type for t in catalog))
    # Before the jobs router: `/api/ai/jobs/events` is not a job id.
    app.include_router(events.router)
    app.include_router(jobs.router)
    app.include_router(usage.router)
    app.include_router(admin.router)
    app.include_router(admin_bulk.router)
    app.include_router(outbox.router)
    app.include_router(credentials.router)
    app.include_router(webhooks_router)
    app.include_router(schedules_routes.router)
    app.include_router(schedules_routes.admin_router)
    app.include_router(health.router)

    def openapi() -> dict[str, Any]:
        """Adds each public job type's input schema, so clients see what `input` takes."""
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        comps = schema.setdefault("components", {}).setdefault("schemas", {})
        comps.setdefault("securitySchemes", None)
        comps.pop("securitySchemes")
        schema["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}
        }
        schema["security"] = [{"bearer": []}]
        variants = []
        public_types: list[str] = []
        for jt in catalog:
            if not jt.definition.creatable(development=policy.synthetic_public):
                continue
            name = f"{jt.input_model.__name__}"
            sub = jt.input_model.model_json_schema(
                by_alias=True, ref_template="#/components/schemas/{model}"
            )
            for k, v in sub.pop("$defs", {}).items():
                comps[k] = v
            sub["description"] = f"`input` of jobType `{jt.job_type}`: {jt.definition.description}"
            comps[name] = sub
            variants.append({"$ref": f"#/components/schemas/{name}"})
            public_types.append(jt.job_type)
        # Only the types a client may create: `synthetic` must not show up in production.
        schema.setdefault("x-job-types", public_types)
        create = schema["paths"]["/api/ai/jobs"]["post"]
        body = create["requestBody"]["content"]["application/json"]["schema"]
        ref = body.get("$ref", "").split("/")[-1]
        if ref in comps and variants:
            comps[ref]["properties"]["input"] = {"oneOf": variants, "title": "Input"}
        job_type_bodies(
            schema,
            [
                (t.job_type, t.input_model.__name__, t.definition.credential.allowed_modes)
                for t in catalog
                if t.job_type in public_types
            ],
        )
        document_errors(schema)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
