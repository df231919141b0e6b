"""`DELETE /api/ai/jobs/{jobId}`: the owner purges an ended job's private data, as retention
would; the job and its usage stay, its views say `privateDataPurged: true`, its event stream
still answers but replays none of the purged content."""

from __future__ import annotations

import asyncio
import uuid

from sqlalchemy import text

from db.session import SessionMaker
from tests.e2e.conftest import Api, assert_problem
from tests.sse import Event, events_of
from tests.stack import Stack


async def _row(db: SessionMaker, job_id: str) -> dict[str, object]:
    async with db() as s:
        r = (
            await s.execute(
                text(
                    "SELECT input, output, internal_error_message, private_data_purged_at, "
                    "lifecycle_status, (SELECT count(*) FROM ai_usage_log u "
                    "WHERE u.job_id = j.id) AS usage, (SELECT count(*) FROM ai_job_snapshot n "
                    "WHERE n.job_id = j.id) AS snaps FROM ai_job j WHERE id = :id"
                ),
                {"id": uuid.UUID(job_id)},
            )
        ).one()
    return dict(r._mapping)


async def test_the_owner_purges_an_ended_job(api: Api, db: SessionMaker, workers: Stack) -> None:
    secret = f"PURGE-{uuid.uuid4().hex}"
    job_id = await api.create_id(input={"echo": {"s": secret}})
    done = await api.wait_status(job_id)
    assert done["lifecycleStatus"] == "succeeded" and done["privateDataPurged"] is False
    before = await _row(db, job_id)
    assert secret in str(before["input"]) and before["usage"] == 1

    path = f"/api/ai/jobs/{job_id}"
    foreign = await api.http.delete(path, headers=api.as_user("mallory"))
    assert_problem(foreign, 404, "JOB_NOT_FOUND")
    r = await api.http.delete(path, headers=api.as_user())
    assert r.status_code == 204 and r.content == b"", r.text
    assert (await api.http.delete(path, headers=api.as_user())).status_code == 204  # idempotent

    after = await _row(db, job_id)
    assert after["input"] == {} and after["output"] is None and after["snaps"] == 0
    assert after["private_data_purged_at"] is not None
    assert (after["lifecycle_status"], after["usage"]) == ("succeeded", 1)  # billing and audit
    view = await api.get(job_id)
    assert view["privateDataPurged"] is True and view["lifecycleStatus"] == "succeeded"
    assert (await api.admin_get(job_id))["privateDataPurged"] is True
    r = await api.http.get(f"{path}/artifacts", headers=api.as_user())
    assert r.status_code == 200 and secret not in r.text
    (item,) = r.json()["items"]
    assert item["artifactType"] == "synthetic_result" and item["content"] is None

    # The event stream still answers, with the job's state and nothing purged.
    async with (
        asyncio.timeout(15),
        api.http.stream("GET", f"{path}/events", headers=api.as_user()) as r,
    ):
        assert r.status_code == 200
        body = [item async for item in events_of(r)]
    assert [e.data["lifecycleStatus"] for e in body if isinstance(e, Event)] == ["succeeded"]
    assert secret not in str(body)


async def test_a_job_that_has_not_ended_cannot_be_purged(api: Api) -> None:
    job_id = await api.create_id(input={"echo": {"n": 1}})  # no workers: it stays queued
    r = await api.http.delete(f"/api/ai/jobs/{job_id}", headers=api.as_user())
    assert_problem(r, 409, "JOB_NOT_TERMINAL")
    assert (await api.get(job_id))["privateDataPurged"] is False
    missing = f"/api/ai/jobs/{uuid.uuid4()}"
    assert_problem(await api.http.delete(missing, headers=api.as_user()), 404, "JOB_NOT_FOUND")


async def test_a_purge_leaves_no_card_readable(api: Api, db: SessionMaker, workers: Stack) -> None:
    """A flashcard job's cards are business rows: after the 204 the artifacts route still lists
    each card's reference, with `content: null`, and the `flashcard` rows are gone."""
    source = "Ribosomes assemble proteins from amino acids. " * 12
    job_id = await api.create_id(
        jobType="flashcard_generation", input={"sourceText": source, "count": 3}
    )
    assert (await api.wait_status(job_id))["lifecycleStatus"] == "succeeded"
    path = f"/api/ai/jobs/{job_id}/artifacts"
    before = (await api.http.get(path, headers=api.as_user())).json()["items"]
    assert len(before) == 3
    fronts = [i["content"]["front"] for i in before]
    assert all(fronts) and all(i["content"]["back"] for i in before)

    r = await api.http.delete(f"/api/ai/jobs/{job_id}", headers=api.as_user())
    assert r.status_code == 204, r.text
    after = (await api.http.get(path, headers=api.as_user())).json()["items"]
    assert [(i["artifactId"], i["content"]) for i in after] == [
        (i["artifactId"], None) for i in before
    ]
    admin = await api.http.get(path, headers=api.as_admin())
    assert all(i["content"] is None for i in admin.json()["items"])
    for front in fronts:
        assert front not in admin.text
    async with db() as s:
        cards = await s.scalar(
            text("SELECT count(*) FROM flashcard WHERE job_id = :j"), {"j": uuid.UUID(job_id)}
        )
    assert cards == 0
