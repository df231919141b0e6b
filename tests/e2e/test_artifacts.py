"""`GET /api/ai/jobs/{jobId}/artifacts`: the projected business rows of a job, owner or admin
only, in ordinal order, paged by an opaque cursor."""

from __future__ import annotations

import uuid
from typing import Any

from tests.e2e.conftest import Api, assert_no_leak, assert_problem
from tests.stack import Stack

SOURCE = (
    "Photosynthesis converts light energy into chemical energy. Chloroplasts contain the "
    "pigment chlorophyll. Plants release oxygen as a byproduct. Glucose stores the captured "
    "energy. Stomata regulate the exchange of gases."
)


async def _quiz_job(api: Api, count: int = 5) -> str:
    job_id = await api.create_id(
        jobType="quiz_generation", input={"sourceText": SOURCE, "count": count}
    )
    job = await api.wait_status(job_id, timeout=60)
    assert job["lifecycleStatus"] == "succeeded", job
    return job_id


async def _page(api: Api, job_id: str, headers: dict[str, str], **params: Any) -> Any:
    r = await api.http.get(f"/api/ai/jobs/{job_id}/artifacts", headers=headers, params=params)
    assert r.status_code == 200, r.text
    return r.json()


async def test_owner_reads_quiz_questions_with_their_content(api: Api, workers: Stack) -> None:
    job_id = await _quiz_job(api)
    page = await _page(api, job_id, api.as_user())
    assert set(page) == {"items", "nextCursor"} and page["nextCursor"] is None
    items = page["items"]
    assert [i["ordinal"] for i in items] == [0, 1, 2, 3, 4]
    job = await api.get(job_id)
    assert [i["artifactId"] for i in items] == [a["artifactId"] for a in job["result"]["artifacts"]]
    for item in items:
        assert item["artifactType"] == "quiz_question"
        content = item["content"]
        assert {"question", "choices", "answerIndex", "explanation"} <= set(content)
        assert len(content["choices"]) == 4 and 0 <= content["answerIndex"] <= 3
        assert not {"userId", "user_id", "jobId", "targetId"} & set(content)
    assert "alice" not in str(items)


async def test_someone_else_gets_the_same_404_as_a_missing_job(api: Api, workers: Stack) -> None:
    job_id = await _quiz_job(api, count=1)
    theirs = await api.http.get(f"/api/ai/jobs/{job_id}/artifacts", headers=api.as_user("bob"))
    missing = await api.http.get(
        f"/api/ai/jobs/{uuid.uuid4()}/artifacts", headers=api.as_user("bob")
    )
    assert_problem(theirs, 404, "JOB_NOT_FOUND")
    assert_problem(missing, 404, "JOB_NOT_FOUND")
    assert theirs.json() == missing.json()
    get_missing = await api.http.get(f"/api/ai/jobs/{uuid.uuid4()}", headers=api.as_user("bob"))
    assert get_missing.json() == missing.json()
    assert_problem(await api.http.get(f"/api/ai/jobs/{job_id}/artifacts"), 401, "UNAUTHENTICATED")


async def test_admin_reads_anyones_artifacts(api: Api, workers: Stack) -> None:
    job_id = await _quiz_job(api, count=2)
    page = await _page(api, job_id, api.as_admin())
    assert [i["ordinal"] for i in page["items"]] == [0, 1]
    assert all(i["content"]["question"] for i in page["items"])


async def test_paging_follows_the_cursor_in_ordinal_order(api: Api, workers: Stack) -> None:
    job_id = await _quiz_job(api, count=5)
    seen: list[int] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = await _page(api, job_id, api.as_user(), **params)
        pages += 1
        seen += [i["ordinal"] for i in page["items"]]
        cursor = page["nextCursor"]
        if cursor is None:
            break
        assert pages < 10
    assert seen == [0, 1, 2, 3, 4] and pages == 3
    for bad in ({"cursor": "not a cursor"}, {"cursor": "eHl6"}, {"limit": 0}, {"limit": 101}):
        r = await api.http.get(
            f"/api/ai/jobs/{job_id}/artifacts", headers=api.as_user(), params=bad
        )
        assert_problem(r, 422, "VALIDATION_FAILED")
        assert_no_leak(r.text)


async def test_a_job_without_artifacts_has_an_empty_page(api: Api) -> None:
    job_id = await api.create_id()
    page = await _page(api, job_id, api.as_user())
    assert page == {"items": [], "nextCursor": None}
