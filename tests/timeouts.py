"""What a per-test timeout reports when the hung test is a coroutine.

pytest-timeout's `signal` method (the suite's, see pyproject.toml) fails only the test that ran
out of time and leaves the session alive, so the session's PostgreSQL and Temporal servers keep
serving the tests after it (the `thread` method calls `os._exit` instead: no teardown, servers
orphaned, every later test lost). Its traceback, though, is where the SIGALRM landed: for an
async test that is the event loop's `select`, not the `await` that never returned. This plugin
wraps the timeout handler so it first prints the stack of every pending asyncio task of the
running loop, which names the hung `await` line. tests/conftest.py loads it; so does the
subprocess of tests/unit/test_suite_hygiene.py that proves the timeout fires.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections.abc import Generator
from types import FrameType
from typing import Any

import pytest

# A stalled stack runs many tasks (workers, pollers, servers); past this many the rest is noise.
MAX_TASKS = 40


def print_pending_tasks() -> None:
    """Print the stack of each pending task of the loop running in this thread, if any."""
    loop = asyncio._get_running_loop()
    if loop is None:
        return
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    print(f"\n+++ Timeout: {len(tasks)} pending asyncio task(s) +++", file=sys.stderr)
    for task in tasks[:MAX_TASKS]:
        print(f"--- task {task.get_name()}", file=sys.stderr)
        task.print_stack(file=sys.stderr)


@pytest.hookimpl(wrapper=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> Generator[None, Any, Any]:
    result = yield
    installed = signal.getsignal(signal.SIGALRM)
    if threading.current_thread() is not threading.main_thread() or not callable(installed):
        return result  # the `thread` method, or no timer: nothing to wrap

    def handler(signum: int, frame: FrameType | None) -> Any:
        __tracebackhide__ = True
        print_pending_tasks()
        return installed(signum, frame)

    signal.signal(signal.SIGALRM, handler)
    return result
