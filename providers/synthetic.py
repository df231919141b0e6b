"""The synthetic provider: deterministic, instant (unless told to wait), and keyless.

It exists so that every lifecycle path (success, retries, hangs, invalid output) can be exercised
without a network or an API key. Its whole behaviour comes from `request.synthetic`; it never
looks at the prompts except to count characters for the token estimate.
"""

from __future__ import annotations

import asyncio
import json
import time

from engine.errors import ExecutionFailure
from providers.base import CallProgress, ProviderRequest, ProviderResponse, Usage


class SyntheticProvider:
    """Answers from `ProviderRequest.synthetic` (a `SyntheticBehaviour`).

    Invariants:
    - same request -> same response content (no randomness);
    - every wait (`delay_ms`, `hang`) is a plain `await`, so task cancellation interrupts it;
    - failures are raised as `ExecutionFailure(fail_code)` while `attempt <= fail_times`, which
      lets callers script "fail twice, then succeed" across retries.
    """

    name: str = "synthetic"

    async def generate(self, request: ProviderRequest) -> ProviderResponse:
        started = time.monotonic()
        progress = request.progress if request.progress is not None else CallProgress()
        # Like a real provider, it "received" the request as soon as the call began.
        progress.request_sent = True
        behaviour = request.synthetic
        if behaviour is None:
            content = "{}"
        else:
            if behaviour.delay_ms > 0:
                await asyncio.sleep(behaviour.delay_ms / 1000)
            if request.attempt <= behaviour.fail_times:
                # A scripted failure is an error answer read whole (nothing billed).
                progress.status, progress.finished = 500, True
                raise ExecutionFailure(
                    behaviour.fail_code,
                    internal_message=f"synthetic failure on attempt {request.attempt}",
                )
            if behaviour.hang:
                # Never set: only cancellation of the awaiting task ends this.
                await asyncio.Event().wait()
            if behaviour.invalid_output:
                content = json.dumps({"unexpected": True})
            else:
                content = json.dumps(dict(behaviour.output))
        tokens_in = (len(request.system_prompt) + len(request.user_prompt)) // 4 + 1
        tokens_out = len(content) // 4 + 1
        progress.status = 200
        progress.usage = Usage(tokens_in, tokens_out)
        progress.chars_received += len(content)
        progress.tokens_received_estimate = tokens_out
        progress.finished = True
        if request.on_delta is not None:
            request.on_delta(content)
        return ProviderResponse(
            content=content,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            provider=self.name,
            model=request.model,
            latency_ms=int((time.monotonic() - started) * 1000),
        )
