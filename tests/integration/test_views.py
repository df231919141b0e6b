"""jobs/views.py on a real PostgreSQL: the one public view of a job, the one owner rule
(someone else's job reads exactly like a missing one; admins see all), the pages of jobs and
artifacts, and the webhook body built from the same view."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from api.auth import ADMIN_ROLE, Principal
from db import lifecycle as lifecycle_db
from db.jobs import JobFilter
from db.session import SessionMaker
from engine.errors import JobNotFound
from jobs import views
from jobs.service import CreateJobRequest, CreatePolicy, JobService
from jobs.types import default_catalog
from jobs.views import AdminJobResponse, JobStatusResponse, Owner, TemporalLink
from jobs.webhooks import event_body
from tests.integration.engine_helpers import insert_artifacts, mark_succeeded

# What only SUPER_ADMIN may see: never in the public view.
INTERNAL_KEYS = {f.alias for f in AdminJobResponse.model_fields.values()} - {
    f.alias for f in JobStatusResponse.model_fields.values()
}
ADMIN = Owner("root", is_admin=True)


async def insert_job(sm: SessionMaker, user_id: str) -> uuid.UUID:
    """A queued job, written by the create use case."""
    service = JobService(sm, default_catalog(), CreatePolicy(max_active_jobs=0, max_jobs_per_day=0))
    created = await service.create(
        CreateJobRequest(
            user_id=user_id,
            job_type="synthetic",
            target_type="test",
            target_id="t1",
            input={"echo": {"secret": "job input"}},
        )
    )
    return created.job.id


async def succeed(sm: SessionMaker, job_id: uuid.UUID, artifact_ids: list[str]) -> None:
    """Runs the job to `succeeded` with its artifacts, as PROJECT does (one transaction)."""
    async with sm.begin() as s:
        await lifecycle_db.lock(s, job_id, owner="run-1", identity="w1", ttl_s=60)
    async with sm.begin() as s:
        await insert_artifacts(s, job_id, [("note", a, o) for o, a in enumerate(artifact_ids)])
        await mark_succeeded(s, job_id)


async def status(sm: SessionMaker, job_id: uuid.UUID, viewer: views.Viewer) -> JobStatusResponse:
    async with sm() as s:
        return await views.job_status(s, job_id, viewer)


async def refusal(sm: SessionMaker, job_id: uuid.UUID, viewer: views.Viewer) -> tuple[str, str]:
    with pytest.raises(JobNotFound) as caught:
        await status(sm, job_id, viewer)
    return caught.value.code, caught.value.public_message


async def test_someone_elses_job_reads_exactly_like_a_missing_one(db: SessionMaker) -> None:
    job_id = await insert_job(db, "alice")

    assert (await status(db, job_id, Owner("alice"))).job_id == job_id
    assert (await status(db, job_id, ADMIN)).job_id == job_id  # admins see all
    others = await refusal(db, job_id, Owner("bob"))
    missing = await refusal(db, uuid.uuid4(), Owner("bob"))
    assert others == missing == ("JOB_NOT_FOUND", "Job not found.")

    async with db() as s:
        assert await views.find_job(s, job_id, Owner("bob")) is None
        assert await views.check_visible(s, job_id, Owner("alice")) == "synthetic"
        with pytest.raises(JobNotFound):
            await views.check_visible(s, job_id, Owner("bob"))


async def test_the_public_view_is_the_frozen_shape_without_internals(db: SessionMaker) -> None:
    queued = await insert_job(db, "alice")
    done = await insert_job(db, "alice")
    await succeed(db, done, ["a2", "a1"])
    empty = await insert_job(db, "alice")
    await succeed(db, empty, [])

    body = json.loads((await status(db, queued, Owner("alice"))).model_dump_json(by_alias=True))
    assert body["lifecycleStatus"] == "queued" and body["result"] is None
    assert {"userId", "internalErrorMessage", "workflowId"} <= INTERNAL_KEYS
    assert not INTERNAL_KEYS & set(body)
    assert "job input" not in json.dumps(body)

    ok = (await status(db, done, Owner("alice"))).model_dump(mode="json", by_alias=True)
    assert ok["result"] == {
        "artifactCount": 2,
        "artifacts": [
            {"artifactType": "note", "artifactId": "a2"},
            {"artifactType": "note", "artifactId": "a1"},
        ],
    }
    # A succeeded job that projected nothing says so: a result with no artifacts.
    none = (await status(db, empty, Owner("alice"))).model_dump(mode="json", by_alias=True)
    assert none["result"] == {"artifactCount": 0, "artifacts": []}


async def test_the_admin_view_adds_the_internals_and_the_temporal_link(db: SessionMaker) -> None:
    job_id = await insert_job(db, "alice")
    link = TemporalLink("http://ui:8233/", "my ns")
    async with db() as s:
        job = await views.read_job(s, job_id, ADMIN)
    admin = job.admin_view(link).model_dump(mode="json", by_alias=True)
    public = job.view().model_dump(mode="json", by_alias=True)

    assert {k: admin[k] for k in public} == public
    assert admin["userId"] == "alice"
    assert admin["workflowId"] == f"ai-interactive:synthetic:{job_id}"
    assert admin["temporalUiUrl"] == (
        f"http://ui:8233/namespaces/my%20ns/workflows/ai-interactive%3Asynthetic%3A{job_id}"
    )


async def test_a_users_page_holds_only_their_jobs_whatever_the_filter(db: SessionMaker) -> None:
    mine = [await insert_job(db, "alice") for _ in range(5)]
    theirs = await insert_job(db, "bob")

    seen: list[uuid.UUID] = []
    after: views.JobKey | None = None
    async with db() as s:
        for _ in range(3):
            # The filter names bob: alice's page is still alice's.
            page = await views.job_page(
                s, Owner("alice"), JobFilter(user_id="bob"), after=after, limit=2
            )
            seen += [j.job_id for j in page.items]
            after = page.next_after
            if after is None:
                break
    assert after is None  # 5 jobs in pages of 2: the third page is the last
    assert sorted(seen) == sorted(mine) and len(seen) == len(set(seen)) == 5

    async with db() as s:
        admin_page = await views.admin_job_page(
            s, JobFilter(user_id="bob"), TemporalLink("http://ui", "default"), after=None, limit=10
        )
    assert [j.job_id for j in admin_page.items] == [theirs] and admin_page.next_after is None
    assert admin_page.items[0].user_id == "bob"


async def test_artifact_pages_follow_the_ordinal_and_the_owner_rule(db: SessionMaker) -> None:
    job_id = await insert_job(db, "alice")
    await succeed(db, job_id, ["x0", "x1", "x2"])
    catalog = default_catalog()

    async with db() as s:
        first = await views.artifact_page(s, catalog, job_id, Owner("alice"), after=None, limit=2)
        second = await views.artifact_page(
            s, catalog, job_id, Owner("alice"), after=first.next_after, limit=2
        )
        with pytest.raises(JobNotFound):
            await views.artifact_page(s, catalog, job_id, Owner("bob"), after=None, limit=2)
    assert [(a.artifact_id, a.ordinal) for a in first.items] == [("x0", 0), ("x1", 1)]
    assert first.next_after is not None
    assert [a.artifact_id for a in second.items] == ["x2"] and second.next_after is None


async def test_the_webhook_body_carries_the_same_view_for_its_owner_only(db: SessionMaker) -> None:
    job_id = await insert_job(db, "alice")
    await succeed(db, job_id, ["a"])
    async with db() as s:
        job = await views.find_job(s, job_id, Owner("alice"))
        stranger = await views.find_job(s, job_id, Owner("bob"))
    assert job is not None and stranger is None
    at = datetime(2026, 12, 2, 16, 34, 12, 123456, tzinfo=UTC)

    body = event_body("ai.job.completed", at, job.view())

    assert body["type"] == "ai.job.completed"
    assert body["timestamp"] == "2026-12-02T16:34:12.123456Z"
    assert json.dumps(body["data"], separators=(",", ":"), ensure_ascii=False) == (
        job.view().model_dump_json(by_alias=True)
    )


async def test_the_apis_principal_is_a_viewer_under_the_same_rule(db: SessionMaker) -> None:
    job_id = await insert_job(db, "alice")
    admin = Principal("x", frozenset({ADMIN_ROLE}))
    assert (await status(db, job_id, admin)).job_id == job_id
    await refusal(db, job_id, Principal("x", frozenset()))
    assert (await status(db, job_id, Principal("alice", frozenset()))).job_id == job_id


async def test_the_one_statement_read_gives_the_view_of_the_whole_row(db: SessionMaker) -> None:
    # `job_status` reads the public columns and the artifacts in one statement; whatever the
    # job's state, its view is the one `read_job` builds from the whole row and its artifacts,
    # the artifacts rule included (a job that cannot have any shows none, even if rows exist).
    states = [
        ("queued", None, []),
        ("succeeded", None, ["b", "a", "c"]),
        ("succeeded", None, []),
        ("failed", 3, ["p1", "p0"]),  # a long source that ended early: partial
        ("cancelled", 2, []),
        ("failed", None, ["stray"]),  # one call: never has artifacts, so none is shown
        ("running", 4, ["early"]),
    ]
    for status_, chunk_count, artifact_ids in states:
        job_id = await insert_job(db, "alice")
        async with db.begin() as s:
            # Two with one ordinal: (ordinal, id) orders them.
            notes = [("note", a, o // 2) for o, a in enumerate(artifact_ids)]
            await insert_artifacts(s, job_id, notes)
            # One legal step at a time (the lifecycle guard): queued -> running -> the end.
            for step in ("running", status_) if status_ != "queued" else ():
                await s.execute(
                    text(
                        "UPDATE ai_job SET lifecycle_status = :st, chunk_count = :cc, "
                        "finished_at = CASE WHEN lifecycle_status = 'running' THEN now() END "
                        "WHERE id = :id AND lifecycle_status <> :st"
                    ),
                    {"st": step, "cc": chunk_count, "id": job_id},
                )
        async with db() as s:
            whole = (await views.read_job(s, job_id, Owner("alice"))).view()
        one = await status(db, job_id, Owner("alice"))
        assert one.model_dump_json(by_alias=True) == whole.model_dump_json(by_alias=True), status_
        assert one == whole and one.lifecycle_status == status_
