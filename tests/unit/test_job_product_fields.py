"""The join fields' pure parts: what the idempotency fingerprint covers, and the list filter's
SQL (one containment test per metadata pair, so the GIN index on metadata serves each)."""

from __future__ import annotations

import json
from typing import Any

from db.jobs import JobFilter, filter_sql
from engine.hashing import request_fingerprint

BASE: tuple[str, str, str, dict[str, Any], int] = ("synthetic", "lesson", "L1", {"echo": {}}, 50)


def test_metadata_pins_and_run_at_are_part_of_the_fingerprint() -> None:
    plain = request_fingerprint(*BASE)
    # Left out or empty, they leave the fingerprints of earlier jobs as they were.
    assert request_fingerprint(*BASE, metadata={}) == plain
    assert request_fingerprint(*BASE, metadata=None, prompt_version=None, run_at=None) == plain
    variants = [
        request_fingerprint(*BASE, metadata={"courseId": "C42"}),
        request_fingerprint(*BASE, metadata={"courseId": "C43"}),
        request_fingerprint(*BASE, prompt_version="synthetic.v1"),
        request_fingerprint(*BASE, output_schema_version="synthetic.output.v1"),
        request_fingerprint(*BASE, run_at="2026-12-05T08:00:00+00:00"),
    ]
    assert len({plain, *variants}) == 1 + len(variants)
    # Key order is not part of the request.
    a = request_fingerprint(*BASE, metadata={"a": "1", "b": "2"})
    assert a == request_fingerprint(*BASE, metadata={"b": "2", "a": "1"})


def test_target_and_metadata_filters() -> None:
    where, params = filter_sql(
        JobFilter(
            user_id="u",
            target_type="lesson",
            target_id="L1",
            metadata=(("courseId", "C42"), ("term", "autumn")),
        )
    )
    assert "target_type = :target_type" in where and "target_id = :target_id" in where
    contains = [w for w in where if "metadata @>" in w]
    assert len(contains) == 2
    pairs = [json.loads(params[w.split(":")[1].split(" ")[0]]) for w in contains]
    assert pairs == [{"courseId": "C42"}, {"term": "autumn"}]
    assert filter_sql(JobFilter(user_id="u")) == (["TRUE", "user_id = :user_id"], {"user_id": "u"})
