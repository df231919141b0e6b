"""`python -m bench.api_server --host H --port P`: the real API app plus two bare routes.

The app is `api.app.create_app(...)` exactly as `aijobs api` builds it (same settings from the
environment, same policy, same lifespan and therefore the same connection pool). The bare routes
are what the real routes are compared with; they use that same pool
(`request.app.state.aijobs.sessionmaker`) and skip everything else (auth, request models,
quotas, fingerprints, redaction, read-backs, response models):

- `GET /bench/jobs/{id}`: one primary-key SELECT on ai_job, the row's status fields as JSON.
- `POST /bench/jobs`: the three inserts of a create (ai_job + ai_job_snapshot + outbox_event) in
  one transaction, through the engine's own repository statements (without the NOTIFY).
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Request
from sqlalchemy import text

from bench.teardown import hard_exit
from db import lifecycle as lifecycle_db
from db import outbox as outbox_db
from db import snapshots as snapshots_db
from db.lifecycle import NewJob
from db.outbox import ENQUEUE
from engine.contracts import workflow_id
from engine.queues import resolve_execution
from jobs.types.synthetic import DEFINITION as SYNTHETIC

router = APIRouter(prefix="/bench", include_in_schema=False)

# The bare read names its columns as the JSON keys: no model, no mapping code, and about the
# same bytes as the real route's body (jobs/views.py builds that one).
_PK = text(
    'SELECT id AS "jobId", job_type AS "jobType", lifecycle_status AS "lifecycleStatus", '
    'queue_name AS "queueName", priority, progress, created_at AS "createdAt", '
    'started_at AS "startedAt", finished_at AS "finishedAt", error_code AS "errorCode", '
    'public_error_message AS "publicErrorMessage" FROM ai_job WHERE id = :id'
)


@router.get("/jobs/{job_id}")
async def bare_get(job_id: uuid.UUID, request: Request) -> dict[str, Any]:
    async with request.app.state.aijobs.sessionmaker() as s:
        row = (await s.execute(_PK, {"id": job_id})).first()
    if row is None:
        raise HTTPException(status_code=404)
    # FastAPI's encoder writes the uuid and the timestamps, as it wrote this route's dict before.
    return dict(row._mapping)


@router.post("/jobs", status_code=202)
async def bare_create(request: Request) -> dict[str, Any]:
    body = await request.json()
    inp = body.get("input") or {}
    job_id = uuid.uuid4()
    d = SYNTHETIC
    sm = request.app.state.aijobs.sessionmaker
    async with sm.begin() as s:
        await lifecycle_db.create(
            s,
            NewJob(
                id=job_id,
                user_id="bench-bare",
                job_type=d.job_type,
                target_type=str(body.get("targetType", "")),
                target_id=str(body.get("targetId", "")),
                idempotency_key=None,
                request_fingerprint="bare",
                queue_name=d.queue.queue_name,
                priority=d.queue.default_priority,
                input=inp,
                credential_mode="platform_key",
                credential_id=None,
                prompt_version=d.prompt_version,
                input_schema_version=d.input.schema_version,
                output_schema_version=d.output.schema_version,
                max_retry_count=resolve_execution(d).max_retries,
                workflow_id=workflow_id(d.queue.queue_name, d.job_type, str(job_id)),
            ),
        )
        await snapshots_db.insert_snapshot(
            s,
            job_id,
            {"input": inp, "targetType": body.get("targetType"), "targetId": body.get("targetId")},
            "v1",
            30,
        )
        await outbox_db.insert(
            s,
            event_type=ENQUEUE,
            aggregate_type="AiJob",
            aggregate_id=str(job_id),
            dedupe_key=f"{d.job_type}:bench-bare:{job_id}",
            payload={
                "jobId": str(job_id),
                "jobType": d.job_type,
                "queueName": d.queue.queue_name,
                "priority": d.queue.default_priority,
            },
            notify=False,
        )
    return {"jobId": str(job_id)}


def build_app() -> FastAPI:
    from engine.settings import Settings
    from runtime.wiring import api_app

    settings = Settings()
    app = api_app(settings)
    app.include_router(router)
    return app


def main(argv: Sequence[str] | None = None) -> None:
    import uvicorn

    from engine.settings import Settings
    from runtime.logs import setup_logging

    p = argparse.ArgumentParser(prog="python -m bench.api_server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    setup_logging(Settings().log_level, process="bench-api")
    # The same server options as `aijobs api` (runtime/cli.py cmd_api).
    uvicorn.run(
        build_app(),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        loop="asyncio",
        http="h11",
    )
    hard_exit(0)


if __name__ == "__main__":
    main()
