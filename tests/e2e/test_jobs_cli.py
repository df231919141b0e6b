"""`aijobs jobs` against the real API over HTTP: the CLI runs in-process (in a thread, as the
server shares this event loop) with AIJOBS_API_URL and AIJOBS_TOKEN set, and prints the API's
JSON on stdout, or its problem+json on stderr with exit code 1."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from runtime.cli import build_parser
from tests.e2e.conftest import Api


async def _aijobs(*argv: str) -> int:
    args = build_parser().parse_args(argv)
    code: int = await asyncio.to_thread(args.func, args)
    return code


def _env(monkeypatch: pytest.MonkeyPatch, api: Api, token: str | None) -> None:
    monkeypatch.setenv("AIJOBS_API_URL", api.base_url)
    if token is None:
        monkeypatch.delenv("AIJOBS_TOKEN", raising=False)
    else:
        monkeypatch.setenv("AIJOBS_TOKEN", token)


def _out(capsys: pytest.CaptureFixture[str]) -> Any:
    return json.loads(capsys.readouterr().out)


async def test_create_get_cancel_list_and_retry(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = await api.create_id("alice")
    _env(monkeypatch, api, api.token("alice"))

    assert await _aijobs("jobs", "get", job_id) == 0
    assert _out(capsys)["jobId"] == job_id

    assert await _aijobs("jobs", "cancel", job_id) == 0
    cancelled = _out(capsys)
    assert cancelled["jobId"] == job_id and cancelled["lifecycleStatus"] == "cancelled"

    assert await _aijobs("jobs", "list", "--status", "cancelled", "--job-type", "synthetic") == 0
    assert [j["jobId"] for j in _out(capsys)["items"]] == [job_id]
    assert await _aijobs("jobs", "list", "--status", "queued", "--limit", "5") == 0
    assert _out(capsys)["items"] == []

    # A user's token retries its own job through the owner's route: no admin audit entry.
    assert await _aijobs("jobs", "retry", job_id) == 0
    retried = _out(capsys)
    assert retried["jobId"] != job_id and retried["retriedFromJobId"] == job_id
    assert await _audited_retries(api) == []


async def _audited_retries(api: Api) -> list[str]:
    r = await api.http.get(
        "/admin-api/ai/audit", params={"action": "job.retry"}, headers=api.as_admin()
    )
    assert r.status_code == 200, r.text
    return [e["targetId"] for e in r.json()["items"]]


async def test_retry_uses_the_route_the_token_may_use(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Someone else's job: a user's token gets the owner route's 404 (never the admin route's
    403), an admin's token retries it through the admin route (audited)."""
    job_id = await api.create_id("alice")
    assert (await api.cancel(job_id)).status_code == 200
    _env(monkeypatch, api, api.token("mallory"))
    assert await _aijobs("jobs", "retry", job_id) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    problem = json.loads(captured.err)
    assert (problem["status"], problem["code"]) == (404, "JOB_NOT_FOUND")

    _env(monkeypatch, api, api.token("root", admin=True))
    assert await _aijobs("jobs", "retry", job_id) == 0
    retried = _out(capsys)
    assert retried["jobId"] != job_id and retried["retriedFromJobId"] == job_id
    assert await _audited_retries(api) == [job_id]
    # Again: the same retry (200), still through the admin route.
    assert await _aijobs("jobs", "retry", job_id) == 0
    assert _out(capsys)["jobId"] == retried["jobId"]


async def test_an_http_error_prints_the_problem_on_stderr(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _env(monkeypatch, api, api.token("alice"))
    assert await _aijobs("jobs", "get", "00000000-0000-0000-0000-000000000000") == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert json.loads(captured.err)["status"] == 404


async def test_a_missing_token_is_one_line_naming_it(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _env(monkeypatch, api, None)
    assert await _aijobs("jobs", "list") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "AIJOBS_TOKEN" in captured.err
