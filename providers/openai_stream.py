"""Reading an OpenAI-compatible answer: its usage, and a streamed answer's server-sent events.

A streamed chat completion is a `text/event-stream` of `data: {chunk}` events ending with
`data: [DONE]`; each chunk's `choices[0].delta.content` is the next piece of the answer, and
with `stream_options.include_usage` the last chunk (its `choices` empty) carries the call's
usage. The reader keeps the caller's `CallProgress` up to date after every event, so a call
cut mid-stream (cancelled, timed out, connection broken) still says what of it was read.

Nothing here logs or keeps content beyond the answer being assembled; failures are raised as
`ExecutionFailure` built outside any `except` block (no parser or httpx exception chained).
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from engine.errors import ExecutionFailure, Fault
from providers.base import CallProgress, Usage

# A token of model output is about four characters of text: how much of an answer a cut stream
# had written, when the provider never said.
_CHARS_PER_TOKEN = 4
_DONE = "[DONE]"


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0
    return value


def _details(usage: dict[str, Any], key: str, field: str) -> int:
    details = usage.get(key)
    return _count(details.get(field)) if isinstance(details, dict) else 0


def parse_usage(raw: Any) -> Usage | None:
    """The usage object of an answer or of a stream's last chunk; None when absent.

    `prompt_tokens` and `completion_tokens` as given (DeepSeek's
    `prompt_cache_hit_tokens + prompt_cache_miss_tokens` when `prompt_tokens` is missing); the
    cached part from OpenAI's `prompt_tokens_details.cached_tokens` or DeepSeek's
    `prompt_cache_hit_tokens`, the reasoning part from
    `completion_tokens_details.reasoning_tokens`, each cut to its whole. A count that is not a
    non-negative integer counts 0.
    """
    if not isinstance(raw, dict):
        return None
    hit = _count(raw.get("prompt_cache_hit_tokens"))
    miss = _count(raw.get("prompt_cache_miss_tokens"))
    tokens_in = _count(raw.get("prompt_tokens")) or hit + miss
    tokens_out = _count(raw.get("completion_tokens"))
    cached = _details(raw, "prompt_tokens_details", "cached_tokens") or hit
    reasoning = _details(raw, "completion_tokens_details", "reasoning_tokens")
    return Usage(
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        cached_input_tokens=min(cached, tokens_in),
        reasoning_tokens=min(reasoning, tokens_out),
    )


def malformed(status: int, what: str = "malformed response") -> ExecutionFailure:
    """A 2xx that is not a chat completion: retried, but the provider did answer, so it is no
    outage signal (a proxy's error page must not open the breaker for everyone)."""
    return ExecutionFailure(
        "PROVIDER_UNAVAILABLE",
        internal_message=f"HTTP {status}: {what}",
        fault=Fault.REQUEST,
        answered=True,
    )


def content_filtered() -> ExecutionFailure:
    return ExecutionFailure(
        "CONTENT_SAFETY_BLOCKED", internal_message="finish_reason content_filter", answered=True
    )


@dataclass
class StreamedAnswer:
    """What a stream said: the joined content, the echoed model, the usage of its last chunk."""

    content: str
    model: str | None
    usage: Usage | None


async def _events(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The data of each server-sent event (its `data:` lines joined by newlines); comments and
    other fields are skipped. An event still open when the body ends is dispatched too."""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


class _Reader:
    """Folds chunks into the answer and the progress; one per streamed call."""

    def __init__(
        self, progress: CallProgress, on_delta: Callable[[str], None] | None, status: int
    ) -> None:
        self.progress = progress
        self.on_delta = on_delta
        self.status = status
        self.parts: list[str] = []
        self.model: str | None = None
        self.deltas = 0
        self.billed_chars = 0
        self.finish_reason: str | None = None

    def chunk(self, data: str) -> None:
        try:
            chunk = json.loads(data)
        except ValueError:
            chunk = None
        if not isinstance(chunk, dict):
            raise malformed(self.status, "malformed stream chunk")
        if "error" in chunk and not chunk.get("choices"):
            raise ExecutionFailure(
                "PROVIDER_UNAVAILABLE",
                internal_message=f"HTTP {self.status}: error event in stream",
                answered=True,
            )
        model = chunk.get("model")
        if isinstance(model, str) and model and self.model is None:
            self.model = model
        usage = parse_usage(chunk.get("usage"))
        if usage is not None:
            self.progress.usage = usage
        choices = chunk.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            self._choice(choices[0])

    def _choice(self, choice: dict[str, Any]) -> None:
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            self.finish_reason = reason
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        text = delta.get("content")
        reasoning = delta.get("reasoning_content")
        wrote = False
        if isinstance(reasoning, str) and reasoning:
            self.billed_chars += len(reasoning)
            wrote = True
        if isinstance(text, str) and text:
            self.parts.append(text)
            self.billed_chars += len(text)
            self.progress.chars_received += len(text)
            wrote = True
            if self.on_delta is not None:
                self.on_delta(text)
        if wrote:
            self.deltas += 1
            estimate = max(self.deltas, math.ceil(self.billed_chars / _CHARS_PER_TOKEN))
            self.progress.tokens_received_estimate = max(
                self.progress.tokens_received_estimate, estimate
            )


async def read_stream(
    lines: AsyncIterator[str],
    progress: CallProgress,
    on_delta: Callable[[str], None] | None,
    *,
    status: int,
) -> StreamedAnswer:
    """Read a chat-completion event stream to its end, updating `progress` (and calling
    `on_delta` with each content piece) as events arrive.

    The answer is whole when `[DONE]` came or a chunk gave a finish reason and the body ended;
    a body that ends before either was cut, and fails as PROVIDER_UNAVAILABLE (`progress`
    keeps what was read, `finished` stays False). A `content_filter` finish reason is
    CONTENT_SAFETY_BLOCKED; a chunk that is not JSON, or an error event, is a malformed answer.
    """
    reader = _Reader(progress, on_delta, status)
    done = False
    async for data in _events(lines):
        if data.strip() == _DONE:
            done = True
            break
        reader.chunk(data)
    if not done and reader.finish_reason is None:
        raise ExecutionFailure(
            "PROVIDER_UNAVAILABLE",
            internal_message=f"HTTP {status}: stream ended before the answer did",
            answered=True,
        )
    progress.finished = True
    if reader.finish_reason == "content_filter":
        raise content_filtered()
    return StreamedAnswer("".join(reader.parts), reader.model, progress.usage)
