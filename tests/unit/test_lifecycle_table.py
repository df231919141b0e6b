"""Pure rules of the engine: the lifecycle table, the retry taxonomy of the error codes, the
JobDefinition registry checks and the output hash. No I/O."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from engine.definition import (
    CredentialSpec,
    Execution,
    JobDefinition,
    QueueSpec,
    validate_definition,
)
from engine.errors import (
    DuplicateJobDefinition,
    InvalidJobDefinition,
    Retry,
    UnknownJobType,
    is_retryable,
    public_message_for,
    retry_rule,
)
from engine.hashing import output_hash, request_fingerprint
from engine.lifecycle import (
    LEGACY_STATUS,
    LEGAL_TRANSITIONS,
    TERMINAL,
    LifecycleStatus,
    is_legal,
    is_terminal,
)
from jobs.spec import AnyJobType, Catalog
from jobs.types import synthetic
from jobs.types.synthetic import DEFINITION as SYNTHETIC

S = LifecycleStatus

# ---- lifecycle table ----------------------------------------------------------------------

EXPECTED_LEGAL = {
    (S.QUEUED, S.RUNNING),
    (S.QUEUED, S.CANCELLED),
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.CANCELLED),
}


def test_transition_table_is_exactly_design_section_6() -> None:
    assert set(LEGAL_TRANSITIONS) == EXPECTED_LEGAL


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(S, S)))
def test_is_legal_for_every_pair(src: S, dst: S) -> None:
    assert is_legal(src, dst) is ((src, dst) in EXPECTED_LEGAL)


@pytest.mark.parametrize(
    ("src", "dst"),
    [(S.QUEUED, S.SUCCEEDED), (S.QUEUED, S.FAILED), (S.RUNNING, S.QUEUED)]
    + [(t, d) for t in (S.SUCCEEDED, S.FAILED, S.CANCELLED) for d in S],
)
def test_forbidden_transitions(src: S, dst: S) -> None:
    """Named rules: never straight to a result, never back to queued, terminal is final
    (a retry is a new job, not a transition)."""
    assert not is_legal(src, dst)


def test_terminal_states() -> None:
    assert frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED}) == TERMINAL
    assert [s for s in S if is_terminal(s)] == [S.SUCCEEDED, S.FAILED, S.CANCELLED]
    # Every non-terminal state has a direct way out to a terminal one.
    for s in (S.QUEUED, S.RUNNING):
        assert any(is_legal(s, t) for t in TERMINAL)


def test_legacy_status_mapping_is_the_adr_one() -> None:
    assert LEGACY_STATUS == {
        S.QUEUED: "pending",
        S.RUNNING: "processing",
        S.SUCCEEDED: "completed",
        S.FAILED: "failed",
        S.CANCELLED: "cancelled",
    }


# ---- retry taxonomy --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "rule"),
    [
        ("PROVIDER_UNAVAILABLE", Retry.YES),
        ("PROVIDER_TIMEOUT", Retry.YES),
        ("PROVIDER_RATE_LIMITED", Retry.YES),
        ("VALIDATION_OUTPUT_INVALID", Retry.YES),
        ("CONTENT_SAFETY_BLOCKED", Retry.NO),
        ("TIMEOUT", Retry.PER_DEFINITION),
        ("CREDENTIAL_INVALID", Retry.NO),
        ("CREDENTIAL_MISSING", Retry.NO),
        ("CANCELLED", Retry.NO),
        ("INTERNAL_ERROR", Retry.ONCE),
        ("INTERNAL_LOCK_EXPIRED", Retry.ONCE),
        ("SOMETHING_UNKNOWN", Retry.ONCE),  # unknown codes are treated as INTERNAL
    ],
)
def test_retry_rule_per_code_prefix(code: str, rule: Retry) -> None:
    assert retry_rule(code) is rule


@pytest.mark.parametrize("attempt", [1, 2, 5])
def test_is_retryable(attempt: int) -> None:
    assert is_retryable("PROVIDER_UNAVAILABLE", attempt=attempt)
    assert is_retryable("VALIDATION_OUTPUT_INVALID", attempt=attempt)
    assert not is_retryable("CONTENT_SAFETY_BLOCKED", attempt=attempt)
    assert not is_retryable("CREDENTIAL_INVALID", attempt=attempt)
    assert not is_retryable("CANCELLED", attempt=attempt)
    assert is_retryable("TIMEOUT", attempt=attempt, abort_strategy="retry")
    assert not is_retryable("TIMEOUT", attempt=attempt, abort_strategy="fail")
    # INTERNAL_*: retried exactly once.
    assert is_retryable("INTERNAL_ERROR", attempt=attempt) is (attempt == 1)


def test_public_messages_are_fixed_text() -> None:
    assert public_message_for("PROVIDER_SOMETHING_NEW") == public_message_for(
        "PROVIDER_UNAVAILABLE"
    )
    assert public_message_for("WHATEVER") == public_message_for("INTERNAL_ERROR")
    for code in ("PROVIDER_UNAVAILABLE", "CANCELLED", "INTERNAL_LOCK_EXPIRED"):
        assert code not in public_message_for(code)


# ---- JobDefinition registry -----------------------------------------------------------------


def definition(**changes: Any) -> JobDefinition:
    """The synthetic definition with some fields replaced (it is frozen; copy, never mutate)."""
    d = SYNTHETIC
    if "timeout_ms" in changes:
        d = d.model_copy(
            update={
                "execution": d.execution.model_copy(
                    update={"timeout_ms": changes.pop("timeout_ms")}
                )
            }
        )
    if "queue_name" in changes:
        d = d.model_copy(
            update={"queue": d.queue.model_copy(update={"queue_name": changes.pop("queue_name")})}
        )
    return d.model_copy(update=changes)


def job_of(d: JobDefinition) -> AnyJobType:
    return dataclasses.replace(synthetic.JOB, definition=d)


def job(**changes: Any) -> AnyJobType:
    """The synthetic job type with some definition fields replaced."""
    return job_of(definition(**changes))


def test_registry_registers_and_gets() -> None:
    r = Catalog()
    r.register(synthetic.JOB)
    assert r.get("synthetic") is synthetic.JOB
    assert "synthetic" in r
    assert list(r) == [synthetic.JOB]


def test_registry_rejects_duplicates() -> None:
    r = Catalog([synthetic.JOB])
    with pytest.raises(DuplicateJobDefinition):
        r.register(job(prompt_version="v2"))
    assert r.get("synthetic") is synthetic.JOB


def test_registry_unknown_type() -> None:
    with pytest.raises(UnknownJobType):
        Catalog().get("nope")


@pytest.mark.parametrize(
    "job_type",
    ["", "a", "Quiz", "quiz-gen", "active-recall", "1quiz", "_quiz", "quiz gen", "q" * 65],
)
def test_registry_rejects_bad_job_type(job_type: str) -> None:
    r = Catalog()
    with pytest.raises(InvalidJobDefinition):
        r.register(job(job_type=job_type))
    assert job_type not in r


def test_registry_rejects_job_type_with_trailing_newline() -> None:
    with pytest.raises(InvalidJobDefinition):
        Catalog().register(job(job_type="quiz\n"))


@pytest.mark.parametrize("job_type", ["ab", "active_recall", "q" * 64, "a1_2"])
def test_registry_accepts_good_job_type(job_type: str) -> None:
    r = Catalog()
    r.register(job(job_type=job_type))
    assert job_type in r


@pytest.mark.parametrize("queue", ["ai-system", "default", "AI-INTERACTIVE", ""])
def test_registry_rejects_bad_queue(queue: str) -> None:
    with pytest.raises(InvalidJobDefinition):
        Catalog().register(job(queue_name=queue))


@pytest.mark.parametrize("queue", ["ai-interactive", "ai-background"])
def test_registry_accepts_both_job_queues(queue: str) -> None:
    validate_definition(definition(queue_name=queue))


@pytest.mark.parametrize(
    ("timeout_ms", "ok"),
    [(999, False), (1000, True), (600_000, True), (600_001, False), (0, False)],
)
def test_registry_timeout_bounds(timeout_ms: int, ok: bool) -> None:
    d = definition(timeout_ms=timeout_ms)
    if ok:
        validate_definition(d)
    else:
        with pytest.raises(InvalidJobDefinition):
            validate_definition(d)


def test_registry_rejects_default_mode_not_allowed() -> None:
    d = definition(
        credential=CredentialSpec(allowed_modes=("platform_key",), default_mode="user_deepseek_key")
    )
    with pytest.raises(InvalidJobDefinition):
        Catalog().register(job_of(d))
    with pytest.raises(InvalidJobDefinition):
        Catalog().register(
            job(credential=CredentialSpec(allowed_modes=(), default_mode="platform_key"))
        )


def test_definition_is_frozen() -> None:
    with pytest.raises(ValidationError):
        SYNTHETIC.job_type = "other"  # type: ignore[misc]  # the refused assignment under test
    with pytest.raises(ValidationError):
        QueueSpec(queue_name="ai-interactive", default_priority=101)
    with pytest.raises(ValidationError):
        Execution.model_validate(
            {"timeoutMs": 1000, "maxRetries": 1, "retryBackoff": {"delay": 1}, "surprise": True}
        )


# ---- output hash -----------------------------------------------------------------------------


def reorder(value: Any, rnd: random.Random) -> Any:
    """The same JSON value with every object's keys in a shuffled insertion order."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: reorder(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [reorder(v, rnd) for v in value]
    return value


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=5)
    ),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None)
@given(value=json_values, seed=st.integers(0, 2**32 - 1))
def test_output_hash_ignores_key_order(value: Any, seed: int) -> None:
    shuffled = reorder(value, random.Random(seed))
    assert output_hash(shuffled) == output_hash(value)


def test_output_hash_shape_and_sensitivity() -> None:
    a = {"ok": True, "echo": {"b": 1, "a": [1, 2]}}
    b = {"echo": {"a": [1, 2], "b": 1}, "ok": True}
    assert json.dumps(a) != json.dumps(b)
    assert output_hash(a) == output_hash(b)
    h = output_hash(a)
    assert len(h) == 64 and int(h, 16) >= 0
    # Values and list order matter.
    assert output_hash({"ok": True, "echo": {"b": 1, "a": [2, 1]}}) != h
    assert output_hash({"ok": False, "echo": {"b": 1, "a": [1, 2]}}) != h


def test_request_fingerprint_ignores_input_key_order_but_not_priority() -> None:
    f1 = request_fingerprint("synthetic", "t", "1", {"a": 1, "b": {"c": 2, "d": 3}}, None)
    f2 = request_fingerprint("synthetic", "t", "1", {"b": {"d": 3, "c": 2}, "a": 1}, None)
    assert f1 == f2
    assert request_fingerprint("synthetic", "t", "1", {"a": 1, "b": {"c": 2, "d": 3}}, 50) != f1
    assert request_fingerprint("synthetic", "t", "2", {"a": 1, "b": {"c": 2, "d": 3}}, None) != f1
