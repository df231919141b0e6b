"""Stable hashes: a job's output hash and the request fingerprint for idempotency."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """JSON with keys sorted at every depth and no insignificant whitespace."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def output_hash(validated_output: Any) -> str:
    """SHA-256 (hex) of the key-sorted JSON of a validated output."""
    return hashlib.sha256(canonical_json(validated_output).encode()).hexdigest()


def request_fingerprint(
    job_type: str,
    target_type: str,
    target_id: str,
    input_: Any,
    priority: int | None,
    credential_mode: str | None = None,
    credential_id: str | None = None,
    max_cost_usd: str | None = None,
    *,
    metadata: dict[str, str] | None = None,
    prompt_version: str | None = None,
    output_schema_version: str | None = None,
    run_at: str | None = None,
    service: dict[str, str] | None = None,
    tags: list[str] | None = None,
    flow: dict[str, str] | None = None,
) -> str:
    """Hash of the normalized create request: same key + different body is detected with it.
    The effective credential mode, the key a client named and a per-job cost cap are part of
    the request (who pays, and how much, is not a detail); so are the client's metadata, the
    versions it pinned, its service options and a delayed start (what the job carries and runs
    on, and when), and its tags (in their order: whose spend it is). Left out (or empty), they
    leave earlier fingerprints unchanged."""
    body = {
        "jobType": job_type,
        "targetType": target_type,
        "targetId": target_id,
        "input": input_,
        "priority": priority,
    }
    if credential_mode is not None:
        body["credentialMode"] = credential_mode
    if credential_id is not None:
        body["credentialId"] = credential_id
    if max_cost_usd is not None:
        body["maxCostUsd"] = max_cost_usd
    if metadata:
        body["metadata"] = metadata
    if prompt_version is not None:
        body["promptVersion"] = prompt_version
    if output_schema_version is not None:
        body["outputSchemaVersion"] = output_schema_version
    if run_at is not None:
        body["runAt"] = run_at
    if service:  # a tier other than the type's default, reuse, an off-peak deadline
        body["service"] = service
    if tags:
        body["tags"] = tags
    if flow:  # concurrency, ttlSeconds, deadline (jobs/flow.py `fingerprint`)
        body["flow"] = flow
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()
