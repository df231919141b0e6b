"""The workers' workflow runner (runtime/workflow_runner.py) answers the payloads' serialization
contexts outside the sandbox: replaying recorded runs through it never enters the sandbox for
one, replays them all the same, and a converter that would read a context keeps the sandbox's
answers. No server is needed."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec
from temporalio.worker.workflow_sandbox import _runner

from engine.payloads import DATA_CONVERTER
from runtime.worker import sandbox_runner
from runtime.workflow_runner import ContextFreeRunner, contexts_unread
from tests.replay.replaying import current_workflows, recorded, replay_with


class _Identity(PayloadCodec):
    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each question the sandboxed instances answered inside their sandbox."""
    calls: list[str] = []
    for name in ("get_serialization_context", "get_external_store_context"):
        original = getattr(_runner._Instance, name)

        def spy(self: Any, info: Any, _name: str = name, _orig: Any = original) -> Any:
            calls.append(_name)
            return _orig(self, info)

        monkeypatch.setattr(_runner._Instance, name, spy)
    return calls


def _cases() -> list[Any]:
    wanted = {
        "synthetic-v8-success.json",
        "synthetic-v8-fail.json",
        "quiz_generation-v8-chunked.json",
    }
    return [r for r in recorded() if r.path.name in wanted]


async def test_the_workers_runner_replays_without_asking_the_sandbox_for_contexts(
    asked: list[str],
) -> None:
    records = _cases()
    assert len(records) == 3
    assert await replay_with(current_workflows(), records, sandbox_runner()) == {}
    assert asked == []
    # The same replay through the bare sandbox asks for every payload sequence it visits.
    assert await replay_with(current_workflows(), records, sandbox_runner().inner) == {}
    assert asked.count("get_serialization_context") > 3 * 5, asked


def test_a_converter_with_a_codec_or_external_storage_keeps_the_sandboxs_answers() -> None:
    assert contexts_unread(DATA_CONVERTER)
    assert sandbox_runner().shortcut
    with_codec = dataclasses.replace(DATA_CONVERTER, payload_codec=_Identity())
    assert not contexts_unread(with_codec)
    assert not ContextFreeRunner(sandbox_runner().inner, with_codec).shortcut
