"""The engine's payload converter decodes what Temporal's default converter decodes, and fails
where it fails: only the cost differs (engine/payloads.py)."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.converter import DataConverter

from engine import contracts, payloads
from engine.payloads import DATA_CONVERTER, CachedDataclassHints

DEFAULT = DataConverter.default.payload_converter
ENGINE = DATA_CONVERTER.payload_converter

PLAN = contracts.ExecutionPlan(30_000, 3, 1_000, "retry", 30_000, 45_000)
VALUES: list[Any] = [
    contracts.JobWorkflowInput("j", "quiz", "k", "2026-12-03T00:00:00Z", attemptsSpent=2),
    contracts.StageInput("j", "ai-interactive:quiz:j"),
    contracts.PrepareResult(True, "running", PLAN),
    contracts.PrepareResult(False, "cancelled"),
    contracts.ResolveResult("v1", "user", "openai", "m", "c", 1, 2, 3, 4, 2, [0, 3], [1, 0, 2]),
    contracts.ExecuteInput("j", 30_000, "retry", 1, 3),
    contracts.ExecuteResult("h", 2, None, 1.5, "rpm"),
    contracts.ProjectResult("succeeded", 3, 1, 10, 20, 30),
    contracts.CompleteResult(1, 2, 3, 4),
    contracts.FinalizeFailedInput("j", "TIMEOUT"),
    contracts.JobWorkflowResult("j", "failed", "TIMEOUT", None),
    contracts.ReconcileResult(),
]


def _payload(obj: Any) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(obj).encode())


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_a_stage_payload_is_written_and_read_as_by_default(value: Any) -> None:
    written = ENGINE.to_payloads([value])
    assert written == DEFAULT.to_payloads([value])  # the wire format is Temporal's
    assert ENGINE.from_payloads(written, [type(value)]) == [value]


def test_every_contract_dataclass_decodes_as_the_default_converter_decodes_it() -> None:
    classes = [
        c
        for c in vars(contracts).values()
        if isinstance(c, type)
        and dataclasses.is_dataclass(c)
        and c.__module__ == contracts.__name__
    ]
    assert len(classes) >= 20
    for cls in classes:
        # Every field it has defaults for left out, plus a key an older version wrote.
        required = {
            f.name: _sample(f.type)
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        p = _payload({**required, "relay_restarted": False})
        assert ENGINE.from_payloads([p], [cls]) == DEFAULT.from_payloads([p], [cls]), cls


def _sample(annotation: Any) -> Any:
    a = str(annotation)
    if a.startswith("int"):
        return 7
    if a.startswith("float"):
        return 0.5
    if a.startswith("bool"):
        return True
    if a.startswith("list"):
        return []
    if a.startswith("ExecutionPlan"):
        return dataclasses.asdict(PLAN)
    return "x"


@pytest.mark.parametrize(
    "raw",
    [
        {"run": "yes", "lifecycle_status": "running"},  # a field of the wrong type
        {"lifecycle_status": "running"},  # a required field missing
        {"run": True, "lifecycle_status": "running", "plan": {"timeout_ms": "x"}},  # nested
        ["not", "an", "object"],
    ],
)
def test_a_bad_payload_fails_as_the_default_converter_fails(raw: Any) -> None:
    p = _payload(raw)
    with pytest.raises(Exception) as default_err:
        DEFAULT.from_payloads([p], [contracts.PrepareResult])
    with pytest.raises(Exception) as engine_err:
        ENGINE.from_payloads([p], [contracts.PrepareResult])
    assert type(engine_err.value) is type(default_err.value)
    assert str(engine_err.value) == str(default_err.value)
    cause, default_cause = engine_err.value.__cause__, default_err.value.__cause__
    assert type(cause) is type(default_cause)
    assert str(cause) == str(default_cause)


def test_the_hints_are_resolved_once_per_class_and_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(payloads, "_FIELDS", {})
    resolved: list[type] = []
    real = typing.get_type_hints

    def counting(cls: type) -> dict[str, Any]:
        resolved.append(cls)
        return real(cls)

    monkeypatch.setattr(typing, "get_type_hints", counting)
    for _ in range(3):  # a converter per workflow run, as Temporal builds them
        conv = CachedDataclassHints()
        conv.to_typed_value(contracts.PrepareResult, {"run": True, "lifecycle_status": "x"})
    assert resolved == [contracts.PrepareResult]
    assert conv.to_typed_value(str, "x") is CachedDataclassHints.Unhandled  # not a dataclass
