"""The reconciler's work per pass is bounded whatever the backlog, no phase can starve another,
and revival never starves (real PostgreSQL, real Temporal dev server).

Jobs are seeded by SQL in bulk (`bench.reconcile.seed_waiting_jobs`); their workflows, where a
test needs them, are started under the jobs' own workflow ids on a queue no worker polls, so they
stay open and waiting, as a job waiting for a worker does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import uuid
from typing import Any, cast

import pytest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.reconciler import Reconciler
from activities.relay import Relay
from bench.reconcile import measure_pass, seed_waiting_jobs, start_waiting_workflows
from db import reconciler as reconciler_db
from db.outbox import MAX_ATTEMPTS
from db.session import SessionMaker
from engine.settings import Settings
from runtime.wiring import reconciler_config, relay_config
from tests.integration.engine_helpers import execute, rows, scalar
from tests.stack import engine_stack, new_relay, relay_running
from tests.support import eventually

pytestmark = pytest.mark.slow


def reconciler(settings: Settings, sm: SessionMaker, client: Client, **kw: Any) -> Reconciler:
    values: dict[str, Any] = {"revive_base_s": 0, **kw}
    return Reconciler(sm, client, dataclasses.replace(reconciler_config(settings), **values))


async def enqueue_row(sm: SessionMaker, job: uuid.UUID) -> Any:
    (row,) = await rows(
        sm,
        "SELECT status, attempt_count, last_error FROM outbox_event "
        "WHERE aggregate_id = :j AND event_type = 'ai.job.enqueue'",
        j=str(job),
    )
    return row


# ---- revival ----------------------------------------------------------------------------------


async def test_a_stalled_job_behind_more_than_500_parked_rows_of_ended_jobs_is_revived(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client, relay=False) as st:
        # 600 jobs cancelled while their enqueue was parked: older than anything that waits.
        ended = await seed_waiting_jobs(db, 600, enqueue_status="dead", end_as="cancelled")
        job = await st.create()
        await execute(
            db,
            "UPDATE outbox_event SET status = 'dead', attempt_count = 3, "
            "last_error = 'start failed' WHERE aggregate_id = :j",
            j=str(job),
        )
        result = await reconciler(st.settings, db, temporal_client).run_once()

        assert result.enqueues_revived == 1
        assert (await enqueue_row(db, job)).status == "pending"
        # The ended jobs' rows are closed: published (retention deletes them), with the reason.
        closed = await rows(
            db,
            "SELECT status, last_error FROM outbox_event WHERE aggregate_id = ANY(:ids)",
            ids=[str(j) for j, _ in ended],
        )
        assert len(closed) == 600
        assert {r.status for r in closed} == {"published"}
        assert all((r.last_error or "").startswith("closed: job cancelled") for r in closed)
        assert result.enqueues_closed == 600
        async with relay_running(new_relay(st)):
            await st.wait_status(job, "succeeded")


async def test_revival_covers_every_parked_row_across_passes_when_a_pass_is_capped(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    """More stalled enqueues of waiting jobs than one pass may touch: successive passes revive
    all of them (a keyset cursor, not the N oldest again and again)."""
    async with engine_stack(settings, temporal_client, queues=(), relay=False) as st:
        waiting = await seed_waiting_jobs(db, 250, enqueue_status="dead")
        rec = reconciler(st.settings, db, temporal_client, page=40, rows_per_phase=100)
        revived = 0
        for _ in range(3):
            result = await rec.run_once()
            assert result.enqueues_revived <= 100
            revived += result.enqueues_revived
        assert revived == 250
        left = await scalar(
            db, "SELECT count(*) FROM outbox_event WHERE status IN ('failed', 'dead')"
        )
        assert left == 0
        assert len(waiting) == 250


# ---- transient Temporal errors ------------------------------------------------------------------


class FailingStarts:
    """The real client, except that its first `failures` `start_workflow` calls fail with the
    RPC status `status` (the error injection; every other call, and the later starts, are
    real)."""

    def __init__(self, real: Client, status: RPCStatusCode, failures: int) -> None:
        self._real = real
        self._status = status
        self.left = failures

    async def start_workflow(self, *args: Any, **kwargs: Any) -> Any:
        if self.left > 0:
            self.left -= 1
            raise RPCError(f"injected {self._status.name}", self._status, b"")
        return await self._real.start_workflow(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@pytest.mark.parametrize(
    "status",
    [RPCStatusCode.RESOURCE_EXHAUSTED, RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED],
)
async def test_a_transient_temporal_error_backs_off_without_spending_an_attempt(
    db: SessionMaker, settings: Settings, temporal_client: Client, status: RPCStatusCode
) -> None:
    async with engine_stack(settings, temporal_client, relay=False) as st:
        job = await st.create()
        flaky = FailingStarts(temporal_client, status, failures=MAX_ATTEMPTS + 1)
        r = Relay(db, cast(Client, flaky), st.parts.catalog, relay_config(st.settings))
        for _ in range(MAX_ATTEMPTS + 1):
            before = await scalar(db, "SELECT clock_timestamp()")
            assert await r.run_once() == 1
            row = await enqueue_row(db, job)
            # The claim was given back, and the row backed off (not claimable at once).
            assert (row.status, row.attempt_count) == ("pending", 0)
            assert await scalar(
                db,
                "SELECT available_at >= CAST(:t AS timestamptz) + interval '1 second' "
                "FROM outbox_event WHERE aggregate_id = :j",
                j=str(job),
                t=before,
            )
            await execute(
                db,
                "UPDATE outbox_event SET available_at = now() WHERE aggregate_id = :j",
                j=str(job),
            )
        assert flaky.left == 0
        assert await r.run_once() == 1  # the server answers again: the real start
        assert (await enqueue_row(db, job)).status == "published"
        await st.wait_status(job, "succeeded")


# ---- phases are independent ---------------------------------------------------------------------


@pytest.mark.parametrize("failure", ["raises", "hangs"])
async def test_a_failing_phase_does_not_stop_the_others(
    db: SessionMaker,
    settings: Settings,
    temporal_client: Client,
    monkeypatch: pytest.MonkeyPatch,
    failure: str,
) -> None:
    async with engine_stack(settings, temporal_client, queues=(), relay=False) as st:
        parked = await st.create()
        await execute(
            db,
            "UPDATE outbox_event SET status = 'dead', attempt_count = 3 WHERE aggregate_id = :j",
            j=str(parked),
        )
        await execute(
            db,
            "UPDATE ai_job_snapshot SET expires_at = now() - interval '1 second' WHERE job_id = :j",
            j=parked,
        )

        async def broken(*args: Any, **kwargs: Any) -> Any:
            if failure == "hangs":
                await asyncio.sleep(3600)
            raise RuntimeError("injected: the expired-lock query fails")

        monkeypatch.setattr(reconciler_db, "find_expired_locks", broken)
        rec = reconciler(st.settings, db, temporal_client, phase_budget_s=1.0)
        result = await rec.run_once()

        assert result.failed_phases == ["expired_locks"]
        # Everything after it ran.
        assert result.enqueues_revived == 1
        assert result.snapshots_deleted == 1


# ---- waiting jobs: O(pages) Temporal calls ----------------------------------------------


async def test_many_healthy_waiting_jobs_cost_a_call_per_page_not_per_job(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    n, page = 450, 200
    async with engine_stack(settings, temporal_client, queues=(), relay=False) as st:
        seeded = await seed_waiting_jobs(db, n)
        queue = f"idle-{uuid.uuid4().hex[:8]}"
        await start_waiting_workflows(temporal_client, [w for _, w in seeded], queue)
        await visible(temporal_client, queue, n)
        rec = reconciler(st.settings, db, temporal_client, page=page, stuck_sample=10)
        result = await rec.run_once()

        assert result.outbox_requeued == 0 and result.failed_phases == []
        # One visibility query per page of waiting jobs, plus the stuck-detection sample.
        assert result.workflows_described <= 10
        assert result.temporal_calls <= math.ceil(n / page) + 10
        assert result.temporal_calls < n / 10


async def test_a_lost_workflow_behind_a_capped_pass_of_healthy_ones_is_found_next_pass(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client, queues=(), relay=False) as st:
        seeded = await seed_waiting_jobs(db, 150)
        await start_waiting_workflows(
            temporal_client, [w for _, w in seeded], f"idle-{uuid.uuid4().hex[:8]}"
        )
        # The newest waiting job's workflow never started (its enqueue says published).
        (lost, _), *_ = await seed_waiting_jobs(db, 1, age_s=120)
        rec = reconciler(
            st.settings, db, temporal_client, page=50, rows_per_phase=100, stuck_sample=0
        )
        first = await rec.run_once()
        assert first.outbox_requeued == 0  # the cap stopped the pass before the newest job
        assert "waiting" in first.phases_cut_short
        second = await rec.run_once()
        assert second.outbox_requeued == 1
        assert second.details == [f"requeued {lost}"]
        assert (await enqueue_row(db, lost)).status == "pending"


async def visible(client: Client, queue: str, n: int) -> None:
    """Until visibility lists all `n` running workflows of `queue` (it lags their start a
    little; a workflow it does not list yet would be described, which is right but not what
    this test counts)."""

    async def listed() -> bool:
        count = await client.count_workflows(
            f"TaskQueue = '{queue}' AND ExecutionStatus = 'Running'"
        )
        return count.count == n

    await eventually(listed, timeout=30, what=f"{n} workflows of {queue} to be visible")


# ---- the bench figure works at a tiny size ----------------------------------------------------


async def test_the_reconcile_bench_measures_a_pass(
    db: SessionMaker, temporal_client: Client
) -> None:
    fig = await measure_pass(db, temporal_client, 50)
    assert fig.jobs == 50 and fig.outbox_requeued == 0 and fig.failed_phases == []
    # The bench's own count of RPCs agrees with the reconciler's.
    assert fig.temporal_calls == fig.reported_calls
    assert 0 < fig.temporal_calls < 50
    assert fig.wall_s > 0
