"""Every stage payload a recorded job history holds decodes into today's contract.

A run recorded by an earlier version is finished by today's workers: they decode the stage
results in its history (replay) and the inputs of the activity tasks it already scheduled.
Fields removed from `engine/contracts.py` since still travel in those payloads: the default
data converter must ignore them, and every field a contract still declares must come through
unchanged."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, fields
from typing import Any, get_type_hints

import pytest
from google.protobuf.json_format import ParseDict
from temporalio.api.common.v1 import Payload
from temporalio.converter import DataConverter

from engine.contracts import (
    BATCH_COLLECT,
    BATCH_ENROLL,
    BATCH_LEAVE,
    COMPLETE,
    EXECUTE,
    FINALIZE_CANCELLED,
    FINALIZE_FAILED,
    FLOW_EXPIRE,
    MERGE,
    PREPARE,
    PROJECT,
    RESOLVE,
    REUSE,
)
from tests.replay import HISTORIES
from workflows import batch_tier, stages

STUBS: dict[str, Callable[..., Any]] = {
    PREPARE: stages.prepare,
    RESOLVE: stages.resolve,
    EXECUTE: stages.execute,
    PROJECT: stages.project,
    COMPLETE: stages.complete,
    MERGE: stages.merge,
    FINALIZE_FAILED: stages.finalize_failed,
    FINALIZE_CANCELLED: stages.finalize_cancelled,
    REUSE: stages.reuse,
    FLOW_EXPIRE: stages.flow_expire,
    BATCH_ENROLL: batch_tier.batch_enroll,
    BATCH_COLLECT: batch_tier.batch_collect,
    BATCH_LEAVE: batch_tier.batch_leave,
}
# Activity name -> (input type, result type), read from the typed stubs the workflow calls.
TYPES: dict[str, tuple[type, type]] = {
    name: (get_type_hints(stub)["inp"], get_type_hints(stub)["return"])
    for name, stub in STUBS.items()
}
JOB_HISTORIES = sorted(
    p
    for p in HISTORIES.glob("*.json")
    if not p.name.startswith(("reconciler-", "ai_batch-"))  # no job stage's payloads
)


def _payloads(attrs: dict[str, Any], key: str) -> list[Payload]:
    return [ParseDict(p, Payload()) for p in attrs.get(key, {}).get("payloads", [])]


def _recorded(path: Any) -> list[tuple[str, Payload, type]]:
    """(activity name, payload, contract type) of every stage input and result in a history."""
    events = json.loads(path.read_text())["events"]
    scheduled: dict[str, str] = {}
    found: list[tuple[str, Payload, type]] = []
    for e in events:
        if "activityTaskScheduledEventAttributes" in e:
            attrs = e["activityTaskScheduledEventAttributes"]
            name = attrs["activityType"]["name"]
            scheduled[e["eventId"]] = name
            found += [(name, p, TYPES[name][0]) for p in _payloads(attrs, "input")]
        elif "activityTaskCompletedEventAttributes" in e:
            attrs = e["activityTaskCompletedEventAttributes"]
            name = scheduled[attrs["scheduledEventId"]]
            found += [(name, p, TYPES[name][1]) for p in _payloads(attrs, "result")]
        elif "markerRecordedEventAttributes" in e:
            details = e["markerRecordedEventAttributes"].get("details", {})
            if "data" not in details or "result" not in details:
                continue  # a patch marker, or a local activity that failed
            data = json.loads(_payloads(details, "data")[0].data)
            name = data["activity_type"]
            found += [(name, p, TYPES[name][1]) for p in _payloads(details, "result")]
    return found


@pytest.mark.parametrize("path", JOB_HISTORIES, ids=lambda p: p.name)
def test_every_recorded_stage_payload_decodes_into_todays_contract(path: Any) -> None:
    converter = DataConverter.default.payload_converter
    recorded = _recorded(path)
    assert recorded, f"{path.name}: no stage payloads found"
    for name, payload, cls in recorded:
        raw = json.loads(payload.data)
        value: Any = converter.from_payload(payload, cls)
        # What the contract still declares came through as recorded (nested plans included).
        declared = asdict(value)
        assert isinstance(value, cls), (path.name, name)
        for f in fields(cls):
            if f.name in raw:
                expected = raw[f.name]
                got = declared[f.name]
                if isinstance(expected, dict) and isinstance(got, dict):
                    got = {k: v for k, v in got.items() if k in expected}
                    expected = {k: v for k, v in expected.items() if k in got}
                assert got == expected, (path.name, name, f.name)


def test_a_payload_with_fields_the_contract_no_longer_declares_decodes() -> None:
    """What the test above relies on for runs recorded before a field was removed: every
    recorded EXECUTE input, with fields `ExecuteInput` no longer declares added (its workflow and
    run ids, removed since, and a flag), decodes into the same value as without them."""
    converter = DataConverter.default.payload_converter
    removed = {"workflow_id": "w", "run_id": "r", "a_flag_removed_since": True}
    inputs = [
        (payload, cls)
        for path in JOB_HISTORIES
        for name, payload, cls in _recorded(path)
        if name == EXECUTE and cls is TYPES[EXECUTE][0]
    ]
    assert inputs
    for payload, cls in inputs:
        raw = json.loads(payload.data)
        assert not set(removed) & set(raw)
        older = Payload(metadata=payload.metadata, data=json.dumps({**raw, **removed}).encode())
        assert converter.from_payload(older, cls) == converter.from_payload(payload, cls)
