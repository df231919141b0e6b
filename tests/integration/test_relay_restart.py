"""The relay runs as the heartbeating activity of the `outbox-relay-0` workflow, which an
ai-system worker process starts: when the process that runs the activity is killed, the
activity is retried on the next ai-system worker within its heartbeat timeout, and a job created
meanwhile still starts within about 15 s; SIGTERM makes a worker exit well within 45 s."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from temporalio.client import Client

from db.session import SessionMaker
from engine.contracts import RECONCILER_SCHEDULE_ID, relay_shard_workflow_id
from engine.definition import SYSTEM_QUEUE
from tests.integration.engine_helpers import describe_or_none, relay_heartbeat, worker_processes
from tests.stack import INTERACTIVE, engine_stack, make_settings
from tests.support import eventually

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
                # The Temporal server lists the relay workflow with its heartbeating activity.
                shard = relay_shard_workflow_id(0, suffix)

                async def progressed() -> dict[str, object] | None:
                    details = await relay_heartbeat(temporal_client, shard)
                    return details if details and int(str(details["dispatched"])) >= 1 else None

                await eventually(progressed, timeout=20, what="the relay activity's heartbeat")

                ps[0].kill()  # the relay activity's process dies: no heartbeat any more
                assert ps[0].wait(timeout=10) == -signal.SIGKILL
                killed = time.monotonic()
                ps.append(start_system_worker(env, log))
                second = await st.create(input={"echo": {"n": 2}})

                # The activity is retried on the new process after its heartbeat timeout (10 s)
                # and takes the job created while no relay was alive.
                await eventually(
                    lambda: describe_or_none(temporal_client, st.workflow_id(second)),
                    timeout=30,
                    interval=0.2,
                    what="the second job's workflow started",
                )
                took = time.monotonic() - killed
                print(f"a job's workflow started {took:.1f} s after the relay's process died")
                assert took < 20, f"the relay came back after {took:.1f} s"
                row = await st.wait_status(second, "succeeded", "failed", timeout=60)
                assert row.lifecycle_status == "succeeded", log.read_text()[-2000:]

                # SIGTERM: the worker ends its relay attempt and exits well within 45 s.
                t0 = time.monotonic()
                ps[1].send_signal(signal.SIGTERM)
                assert ps[1].wait(timeout=45) == 0, log.read_text()[-2000:]
                print(f"SIGTERM to exit: {time.monotonic() - t0:.1f} s")
                shard_desc = await temporal_client.get_workflow_handle(shard).describe()
                pending = list(shard_desc.raw_description.pending_activities)
                assert all(a.attempt == 1 for a in pending), pending  # it returned, not failed
        finally:
            with contextlib.suppress(Exception):
                await temporal_client.get_schedule_handle(RECONCILER_SCHEDULE_ID + suffix).delete()
            with contextlib.suppress(Exception):
                await temporal_client.get_workflow_handle(
                    relay_shard_workflow_id(0, suffix)
                ).terminate("test over")
