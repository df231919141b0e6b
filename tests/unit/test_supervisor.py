"""The pollers' supervisor (runtime/supervisor.py): a loop that fails or returns early is started
again with a growing backoff, every restart is logged and counted, and the stop ends it."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

import pytest
from prometheus_client import CollectorRegistry

from activities.metrics import WorkerMetrics
from runtime.supervisor import Backoff, supervise

FAST = Backoff(initial_s=0.01, max_s=0.04, healthy_after_s=60.0)


def restarts(registry: CollectorRegistry, poller: str) -> float:
    value = registry.get_sample_value("aijobs_poller_restarts_total", {"poller": poller})
    return -1.0 if value is None else value


async def test_a_failing_loop_is_restarted_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    stop = asyncio.Event()
    starts: list[float] = []

    async def loop(s: asyncio.Event) -> None:
        starts.append(time.monotonic())
        if len(starts) <= 3:
            raise RuntimeError("secret row content")
        if len(starts) == 4:
            return  # ends before the stop: restarted too
        s.set()  # the fifth run is healthy until the process stops

    with caplog.at_level(logging.ERROR, logger="runtime.supervisor"):
        n = await asyncio.wait_for(
            supervise("relay", loop, stop, backoff=FAST, metrics=WorkerMetrics(registry)), 5
        )
    assert n == 4 and len(starts) == 5
    assert restarts(registry, "relay") == 4
    # Backoff doubles up to its cap between the starts.
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps[0] >= 0.01 and gaps[1] >= 0.02 and gaps[2] >= 0.04 and gaps[3] >= 0.04
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failed) == 3 and all(getattr(r, "poller", None) == "relay" for r in failed)
    # The type and traceback are logged, never the exception's message.
    for r in failed:
        assert r.exc_info is not None and r.exc_info[2] is not None
        assert str(r.exc_info[1]) == "RuntimeError"
    assert any("returned before the stop" in r.getMessage() for r in caplog.records)


async def test_a_loop_that_ends_at_the_stop_is_not_restarted() -> None:
    registry = CollectorRegistry()
    stop = asyncio.Event()
    runs = 0

    async def loop(s: asyncio.Event) -> None:
        nonlocal runs
        runs += 1
        await s.wait()

    task = asyncio.create_task(
        supervise("webhooks", loop, stop, backoff=FAST, metrics=WorkerMetrics(registry))
    )
    while runs == 0:
        await asyncio.sleep(0)
    assert restarts(registry, "webhooks") == 0  # the series exists from the start
    stop.set()
    assert await asyncio.wait_for(task, 5) == 0
    assert runs == 1


async def test_the_stop_interrupts_the_backoff() -> None:
    stop = asyncio.Event()

    async def loop(s: asyncio.Event) -> None:
        s.set()
        raise RuntimeError("boom")

    slow = Backoff(initial_s=60.0, max_s=60.0)
    started = time.monotonic()
    n = await asyncio.wait_for(
        supervise("relay", loop, stop, backoff=slow, metrics=WorkerMetrics(CollectorRegistry())), 5
    )
    assert n == 1 and time.monotonic() - started < 5


async def test_cancelling_the_supervisor_cancels_the_loop() -> None:
    stop = asyncio.Event()
    entered = asyncio.Event()
    cancelled = asyncio.Event()

    async def loop(s: asyncio.Event) -> None:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = asyncio.create_task(
        supervise("relay", loop, stop, backoff=FAST, metrics=WorkerMetrics(CollectorRegistry()))
    )
    await asyncio.wait_for(entered.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled.is_set()
