"""EXECUTE's provider call under its attempt's heartbeat and lock checks (activities/execute.py
`_Attempt._provider_call`): `jobs/calls.py` `call` with the attempt's own clock. The SQL lock is
extended every `extend_every_s`, and the call aborted when SQL says the job was cancelled or is
no longer this attempt's; a call that may have been taken over checks once before it is sent."""

from __future__ import annotations

import time
from typing import Protocol

from temporalio import activity

from activities.deps import StageDeps
from activities.heartbeat import beat_interval_s
from engine.contracts import ExecuteInput
from jobs import attempt_start, calls
from jobs.stream_items import Progress
from providers.base import Provider, ProviderRequest, ProviderResponse


class AttemptLike(Protocol):
    _d: StageDeps
    inp: ExecuteInput
    started: attempt_start.Started | None
    began: float


async def provider_call(
    attempt: AttemptLike,
    provider: Provider,
    request: ProviderRequest,
    progress: Progress | None = None,
) -> ProviderResponse:
    d, started = attempt._d, attempt.started
    assert started is not None and started.fence is not None  # a call follows a take
    fence = started.fence
    ttl_s, extend_every_s = d.lock_policy(request.job_type)

    async def still_ours() -> bool:
        return await attempt_start.holds(d.sessionmaker, fence, ttl_s=ttl_s)

    return await calls.call(
        provider,
        request,
        timeout_s=attempt.inp.timeout_ms / 1000,
        beat=(lambda: activity.heartbeat(progress())) if progress else activity.heartbeat,
        beat_interval_s=beat_interval_s(),
        still_ours=still_ours,
        check_every_s=extend_every_s,
        check_first=attempt_start.may_be_taken_over(
            activity.info().heartbeat_timeout, time.monotonic() - attempt.began
        ),
    )
