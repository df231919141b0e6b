"""The batch API client (providers/batch.py) against the fake server's Files and Batches
endpoints, in process: the JSONL shape, a batch's round trip, results read from the output and
error files, a held batch cancelled, failures mapped to the engine's codes without the key."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from engine.errors import ExecutionFailure
from providers.batch import (
    BatchClient,
    batch_line,
    code_for_status,
    has_batch_api,
    jsonl,
    parse_results,
)
from providers.batch_lines import encode_line
from providers.synthetic import SyntheticProvider
from tests.fakes.openai_server import create_fake_app

KEY = "sk-batch-unit-key-0001"
BODY = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
    "response_format": {"type": "json_object"},
    "max_tokens": 100,
    "stream": True,
    "stream_options": {"include_usage": True},
}


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    app = create_fake_app()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://fake"
    ) as client:
        yield client


def lines(n: int) -> bytes:
    return jsonl(batch_line(f"job-{i}-a1", BODY) for i in range(n))


async def control(http: httpx.AsyncClient, path: str, body: Any = None) -> Any:
    if body is None:
        response = await http.get(path)
    else:
        response = await http.post(path, json=body)
    response.raise_for_status()
    return response.json()


def test_a_line_is_the_chat_request_without_stream() -> None:
    line = batch_line("job-x-a2", BODY)
    assert list(line) == ["custom_id", "method", "url", "body"]
    assert line["method"] == "POST" and line["url"] == "/v1/chat/completions"
    assert "stream" not in line["body"] and "stream_options" not in line["body"]
    assert line["body"]["max_tokens"] == 100 and line["body"]["model"] == "gpt-4o-mini"
    text = lines(2).decode()
    assert text.endswith("\n") and len(text.splitlines()) == 2
    assert json.loads(text.splitlines()[1])["custom_id"] == "job-1-a1"


def test_only_the_openai_compatible_provider_has_a_batch_api() -> None:
    assert has_batch_api("openai_compatible")
    assert not has_batch_api("deepseek")
    assert not has_batch_api(SyntheticProvider())


async def test_a_batch_round_trip_reads_output_and_error_files(http: httpx.AsyncClient) -> None:
    valid = {"kind": "valid", "content": {"ok": 1}, "tokens_in": 50, "tokens_out": 20}
    await control(http, "/_script", {"steps": [valid, {"kind": "status", "status": 400}, valid]})
    client = BatchClient("http://fake/v1", http, KEY)
    file_id = await client.upload(lines(3))
    batch = await client.create(file_id)
    assert batch.status == "completed" and batch.total == 3
    got = await client.get(batch.id)
    assert got.ended and got.output_file_id and got.error_file_id
    assert (got.completed, got.failed) == (2, 1)
    results = parse_results(
        await client.content(got.output_file_id), await client.content(got.error_file_id)
    )
    assert sorted(results) == ["job-0-a1", "job-1-a1", "job-2-a1"]
    ok = results["job-0-a1"]
    assert (
        ok.succeeded
        and ok.usage is not None
        and (ok.usage.tokens_in, ok.usage.tokens_out)
        == (
            50,
            20,
        )
    )
    assert ok.body is not None and json.loads(ok.body["choices"][0]["message"]["content"]) == {
        "ok": 1
    }
    bad = results["job-1-a1"]
    assert not bad.succeeded and bad.error_code == "REQUEST_REJECTED" and bad.status_code == 400
    # Batch lines are not chat calls; the fake reports the batch and its lines.
    assert (await control(http, "/_calls"))["count"] == 0
    seen = await control(http, "/_batches")
    assert [(b["lines"], b["completion_window"], b["endpoint"]) for b in seen["batches"]] == [
        (3, "24h", "/v1/chat/completions")
    ]
    assert all("stream" not in r["body"] for r in seen["batches"][0]["requests"])
    assert set(seen["authorizations"]) == {f"Bearer {KEY}"}


async def test_a_held_batch_cancelled_answers_no_line(http: httpx.AsyncClient) -> None:
    await control(http, "/_batch_script", {"hold": True})
    client = BatchClient("http://fake/v1", http, KEY)
    batch = await client.create(await client.upload(lines(2)))
    assert batch.status == "in_progress" and not batch.ended
    cancelled = await client.cancel(batch.id)
    assert cancelled.status == "cancelled" and cancelled.output_file_id is None
    assert cancelled.error_file_id is not None
    results = parse_results(await client.content(cancelled.error_file_id))
    assert {r.error_code for r in results.values()} == {"PROVIDER_UNAVAILABLE"}
    assert (await control(http, "/_batches"))["cancels"] == [batch.id]


async def test_release_lets_a_held_batch_run(http: httpx.AsyncClient) -> None:
    await control(http, "/_batch_script", {"hold": True})
    client = BatchClient("http://fake/v1", http, KEY)
    batch = await client.create(await client.upload(lines(1)))
    await control(http, "/_release", {})
    assert (await client.get(batch.id)).status == "completed"


async def test_an_expired_batch_answers_its_first_lines_only(http: httpx.AsyncClient) -> None:
    await control(http, "/_batch_script", {"end_status": "expired", "answer_lines": 1})
    client = BatchClient("http://fake/v1", http, KEY)
    batch = await client.create(await client.upload(lines(3)))
    assert batch.status == "expired" and batch.output_file_id and batch.error_file_id
    results = parse_results(
        await client.content(batch.output_file_id), await client.content(batch.error_file_id)
    )
    assert [r.succeeded for _, r in sorted(results.items())] == [True, False, False]


async def test_failures_map_to_provider_codes_without_the_key(http: httpx.AsyncClient) -> None:
    await control(http, "/_batch_script", {"create_status": 503, "fail_times": 1})
    client = BatchClient("http://fake/v1", http, KEY)
    file_id = await client.upload(lines(1))
    with pytest.raises(ExecutionFailure) as failed:
        await client.create(file_id)
    assert failed.value.code == "PROVIDER_UNAVAILABLE"
    assert KEY not in str(failed.value.internal_message) and KEY not in repr(client)
    assert (await client.create(file_id)).status == "completed"  # failed once only
    with pytest.raises(ExecutionFailure) as missing:
        await client.get("batch-nope")
    assert missing.value.code == "REQUEST_REJECTED"


def test_status_codes() -> None:
    assert code_for_status(401) == "CREDENTIAL_INVALID"
    assert code_for_status(429) == "PROVIDER_RATE_LIMITED"
    assert code_for_status(429, "insufficient_quota") == "CREDENTIAL_INSUFFICIENT_BALANCE"
    assert code_for_status(500) == "PROVIDER_UNAVAILABLE"
    assert code_for_status(400, "context_length_exceeded") == "REQUEST_TOO_LARGE"


def test_results_skip_junk_and_prefer_an_answer() -> None:
    answered = {
        "custom_id": "a",
        "response": {"status_code": 200, "body": {"choices": [], "usage": {}}},
        "error": None,
    }
    expired = {"custom_id": "a", "response": None, "error": {"code": "batch_expired"}}
    files = (jsonl([expired]) + b"not json\n{}\n", jsonl([answered]))
    assert parse_results(*files)["a"].succeeded


async def one_piece(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def test_a_streamed_upload_carries_its_length_and_name(http: httpx.AsyncClient) -> None:
    client = BatchClient("http://fake/v1", http, KEY)
    data = b"".join(encode_line(f"job-{i}-a1", BODY) for i in range(3))
    file_id = await client.upload_stream("ai-batch-x.jsonl", len(data), one_piece(data))
    [seen] = (await control(http, "/_batches"))["upload_log"]
    assert (seen["file_id"], seen["filename"], seen["lines"]) == (file_id, "ai-batch-x.jsonl", 3)
    assert seen["bytes"] == len(data) and not seen["chunked"]
    assert int(seen["content_length"]) == seen["body_bytes"] > len(data)
    # The bytes of a line depend on its content only: the body's key order does not count.
    assert encode_line("c", dict(reversed(list(BODY.items())))) == encode_line("c", BODY)
    assert json.loads(encode_line("c", BODY))["body"] == {
        k: v for k, v in BODY.items() if not k.startswith("stream")
    }


async def test_a_batch_is_found_by_its_metadata_across_pages(http: httpx.AsyncClient) -> None:
    await control(http, "/_batch_script", {"foreign_after_create": 25})
    client = BatchClient("http://fake/v1", http, KEY)
    ours = await client.create(await client.upload(lines(1)), metadata={"ai_batch_id": "b-1"})
    assert ours.metadata == {"ai_batch_id": "b-1"} and ours.created_at is not None
    listing = await control(http, "/v1/batches?limit=10")
    assert listing["has_more"] and len(listing["data"]) == 10  # ours is on the third page
    assert (await http.get("/v1/batches", params={"limit": 101})).status_code == 400
    for limit in (100, 10, 1):
        found = await client.find_batch(
            "ai_batch_id", "b-1", since=ours.created_at - 60, limit=limit
        )
        assert found is not None and found.id == ours.id
    assert await client.find_batch("ai_batch_id", "b-2", since=0, limit=7) is None
    # A page every batch of which was created before `since` ends the look-up there.
    later = ours.created_at + 3600
    assert await client.find_batch("ai_batch_id", "b-1", since=later, limit=10) is None


async def test_files_are_found_by_name_and_deleted_once(http: httpx.AsyncClient) -> None:
    client = BatchClient("http://fake/v1", http, KEY)
    first = await client.upload(lines(1), filename="ai-batch-y.jsonl")
    await client.upload(lines(1), filename="other.jsonl")
    second = await client.upload(lines(2), filename="ai-batch-y.jsonl")
    found = await client.find_files("ai-batch-y.jsonl", since=0)
    assert sorted(f.id for f in found) == sorted([first, second])
    assert {f.bytes for f in found} == {len(lines(1)), len(lines(2))}
    await client.delete_file(first)
    await client.delete_file(first)  # a 404: done already
    assert (await http.get(f"/v1/files/{first}/content")).status_code == 404
    assert [f.id for f in await client.find_files("ai-batch-y.jsonl", since=0)] == [second]
    assert (await control(http, "/_batches"))["deletes"] == [first, first]
    await control(http, "/_batch_script", {"delete_status": 503})
    with pytest.raises(ExecutionFailure) as failed:
        await client.delete_file(second)
    assert failed.value.code == "PROVIDER_UNAVAILABLE"


async def test_result_files_are_read_line_by_line(http: httpx.AsyncClient) -> None:
    valid = {"kind": "valid", "content": {"ok": 1}, "tokens_in": 5, "tokens_out": 2}
    await control(http, "/_script", {"steps": [valid, {"kind": "status", "status": 429}]})
    client = BatchClient("http://fake/v1", http, KEY)
    batch = await client.create(await client.upload(lines(2)))
    assert batch.output_file_id and batch.error_file_id
    out = [line async for line in client.content_lines(batch.output_file_id)]
    err = [line async for line in client.content_lines(batch.error_file_id)]
    assert [(r.custom_id, r.succeeded) for r in out] == [("job-0-a1", True)]
    assert [(r.custom_id, r.error_code) for r in err] == [("job-1-a1", "PROVIDER_RATE_LIMITED")]
    with pytest.raises(ExecutionFailure) as missing:
        [line async for line in client.content_lines("file-nope")]
    assert missing.value.code == "REQUEST_REJECTED"
