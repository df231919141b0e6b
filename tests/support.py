"""Waiting in tests: poll a condition with a deadline, never sleep in place of synchronisation.

Every wait of the suite (a job reaching a status, a workflow closing, a row appearing) is built
on `eventually`, so the polling policy lives here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T | None]],
    *,
    timeout: float = 10.0,
    interval: float = 0.05,
    what: str | Callable[[], str] = "a condition",
) -> T:
    """Call `probe` every `interval` seconds until it returns a truthy value, and return it.

    The probe runs at least once. After `timeout` seconds the wait fails with `what` (a text, or
    a function that builds it from the state the caller saw last) and the probe's last value.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            raise AssertionError(
                f"timed out after {timeout}s waiting for {described}; last: {value!r}"
            )
        await asyncio.sleep(interval)


async def until_passes(
    check: Callable[[], Awaitable[T]], *, timeout: float = 15.0, interval: float = 0.5
) -> T:
    """Call `check`, whose asserts state what must eventually hold, until it stops failing, and
    return its result; after `timeout` seconds its last failure is raised."""
    failure: AssertionError | None = None

    async def passes() -> tuple[T] | None:
        nonlocal failure
        try:
            return (await check(),)
        except AssertionError as exc:
            failure = exc
            return None

    try:
        (result,) = await eventually(passes, timeout=timeout, interval=interval)
    except AssertionError:
        assert failure is not None
        raise failure from None
    return result
