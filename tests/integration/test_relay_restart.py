"""The relay runs as a supervised loop in every ai-system worker process: when that process dies,
the next one relays what was enqueued meanwhile (including the rows the dead one had claimed,
after their lock TTL), and no relay workflow is involved."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from temporalio.client import Client

from db.session import SessionMaker
from engine.contracts import RECONCILER_SCHEDULE_ID, RELAY_WORKFLOW_ID
from engine.definition import SYSTEM_QUEUE
from tests.integration.engine_helpers import describe_or_none, worker_processes
from tests.stack import INTERACTIVE, engine_stack, make_settings

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def start_system_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "runtime.cli", "worker", "--queue", SYSTEM_QUEUE],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


async def test_relay_survives_the_death_of_its_worker(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    settings = make_settings(database_url, temporal_address)
    suffix = settings.task_queue_suffix
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "TEMPORAL_ADDRESS": temporal_address,
        "TASK_QUEUE_SUFFIX": suffix,
        "AIJOBS_ENV": "test",
        "LOG_LEVEL": "WARNING",
        "RELAY_POLL_INTERVAL_S": "0.2",
    }
    logs = tempfile.TemporaryDirectory(prefix="aijobs-relay-")
    log = Path(logs.name) / "system.log"
    # Job workers in process; the relay only in the ai-system worker subprocesses.
    async with engine_stack(settings, temporal_client, queues=INTERACTIVE, relay=False) as st:
        try:
            with logs, worker_processes() as ps:
                ps.append(start_system_worker(env, log))
                first = await st.create(input={"echo": {"n": 1}})
                row = await st.wait_status(first, "succeeded", "failed", timeout=60)
                assert row.lifecycle_status == "succeeded", log.read_text()[-2000:]

                ps[0].kill()  # the relay loop dies with its process
                assert ps[0].wait(timeout=10) == -signal.SIGKILL
                second = await st.create(input={"echo": {"n": 2}})
                ps.append(start_system_worker(env, log))

                # The new process's relay loop takes the job created while no relay was alive.
                row = await st.wait_status(second, "succeeded", "failed", timeout=90)
                assert row.lifecycle_status == "succeeded", log.read_text()[-2000:]
                assert await describe_or_none(temporal_client, RELAY_WORKFLOW_ID + suffix) is None
        finally:
            with contextlib.suppress(Exception):
                await temporal_client.get_schedule_handle(RECONCILER_SCHEDULE_ID + suffix).delete()
