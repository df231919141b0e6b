"""The outbox relay on the real PostgreSQL and Temporal dev server: the crash
window between claim and publish, two relays at once, the relay as the heartbeating activity of
the `outbox-relay-<k>` workflows that `ai-system` workers run, and a crashed relay loop started
again by the activity's retry."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid

import psycopg
from prometheus_client import REGISTRY
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import Worker

from activities.metrics import worker_metrics
from activities.relay import Relay, RelayConfig
from activities.relay_activity import RelayActivities
from db import outbox as outbox_db
from db.outbox import COMPLETED, ENQUEUE
from db.session import SessionMaker
from engine.contracts import (
    RECONCILER_SCHEDULE_ID,
    RELAY_SHARD_WORKFLOW,
    RelayShardInput,
    relay_shard_workflow_id,
    workflow_id,
)
from engine.definition import SYSTEM_QUEUE
from engine.settings import Settings
from runtime.worker import ensure_system_workflows, run_workers, sandbox_runner
from tests.integration.engine_helpers import (
    describe_or_none,
    job_facts,
    relay_heartbeat,
    rows,
    scalar,
    wait_jobs,
    wait_workflow_closed,
)
from tests.stack import INTERACTIVE, engine_stack, make_settings, new_relay, relay_running
from tests.support import eventually
from workflows.system import RelayShardWorkflow


async def runs_of(client: Client, wid: str) -> list[str]:
    """Every execution (run) Temporal has under one workflow id."""
    return [w.run_id async for w in client.list_workflows(f"WorkflowId = '{wid}'")]


async def test_relay_crash_between_claim_and_publish_starts_each_workflow_once(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    settings = make_settings(database_url, temporal_address)
    async with engine_stack(settings, temporal_client, relay=False) as st:
        job_ids = [await st.create(input={"echo": {"i": i}}) for i in range(6)]

        # A relay claims every row, starts half of the workflows, then dies before marking
        # anything published: its rows stay `processing` under its name.
        dead = new_relay(st, owner="relay:dead")
        claimed = await dead.claim()
        assert sorted(r.aggregate_id for r in claimed) == sorted(map(str, job_ids))
        for row in claimed[:3]:
            assert await dead._dispatch(row) is None  # its start step, without the publish
        assert dead.started == 3
        started_early = [uuid.UUID(r.aggregate_id) for r in claimed[:3]]
        never_started = [uuid.UUID(r.aggregate_id) for r in claimed[3:]]
        # The started ones run to the end meanwhile (workers are up); the others wait.
        await wait_jobs(db, started_early, "succeeded", timeout=30)
        for j in never_started:
            assert await describe_or_none(temporal_client, st.workflow_id(j)) is None
        assert await scalar(
            db, "SELECT count(*) FROM outbox_event WHERE status = 'processing'"
        ) == len(job_ids)

        # A live relay releases the dead one's expired claims and dispatches them again.
        live = new_relay(st, owner="relay:live", release_every_s=0.2, lock_ttl_s=1)
        async with relay_running(live):
            final = await wait_jobs(db, job_ids, timeout=30)

            async def all_published() -> bool:
                n = await scalar(
                    db,
                    "SELECT count(*) FROM outbox_event WHERE event_type = :t "
                    "AND status = 'published'",
                    t=ENQUEUE,
                )
                return bool(n == len(job_ids))

            await eventually(all_published, timeout=15, what="every enqueue published")

        assert set(final.values()) == {"succeeded"}
        # Re-dispatching an already-run workflow is refused by its id: the live relay
        # started only the three that never ran.
        assert live.started == len(never_started)
        enqueues = await rows(
            db,
            "SELECT attempt_count, locked_by, published_at FROM outbox_event WHERE event_type = :t",
            t=ENQUEUE,
        )
        assert all(e.attempt_count == 2 and e.locked_by is None for e in enqueues)
        assert all(e.published_at is not None for e in enqueues)
        for j in job_ids:
            wid = st.workflow_id(j)
            desc = await wait_workflow_closed(temporal_client, wid)
            assert desc.status == WorkflowExecutionStatus.COMPLETED
            # The run that locked the job in PREPARE is the only run of its workflow id.
            row = await st.job(j)
            assert row.locked_by.split("/")[1] == desc.run_id
            runs = await eventually(
                functools.partial(runs_of, temporal_client, wid), timeout=15, what=f"{wid} visible"
            )
            assert runs == [desc.run_id]
            f = await job_facts(db, j)
            assert len(f.artifacts) == 1 and f.events[COMPLETED] == 1 and len(f.usage) == 1


JOBS_500 = 500


async def test_two_relays_500_jobs_each_published_and_started_once(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    # Everything (500 workflows, two relays, the creates) shares this one Python process on a
    # small machine: a generous heartbeat timeout keeps event-loop stalls from causing retries
    # that this test is not about.
    settings = make_settings(
        database_url,
        temporal_address,
        AI_INTERACTIVE_CONCURRENCY=50,
        DB_POOL_SIZE=20,
        AI_HEARTBEAT_TIMEOUT_MS=15_000,
    )
    async with engine_stack(settings, temporal_client, relay=False) as st:
        sem = asyncio.Semaphore(16)

        async def create(i: int) -> uuid.UUID:
            async with sem:
                return await st.create(input={"echo": {"i": i}})

        t0 = time.monotonic()
        job_ids = await asyncio.gather(*(create(i) for i in range(JOBS_500)))
        created_s = time.monotonic() - t0
        assert len(set(job_ids)) == JOBS_500

        r1 = new_relay(st, owner="relay:one")
        r2 = new_relay(st, owner="relay:two")
        async with relay_running(r1), relay_running(r2):
            final = await wait_jobs(db, job_ids, timeout=120)
        print(
            f"500 jobs: created in {created_s:.1f}s, all succeeded after "
            f"{time.monotonic() - t0:.1f}s; relay one started {r1.started}, two {r2.started}"
        )
        assert set(final.values()) == {"succeeded"}

        # Claims were disjoint: each row was claimed and dispatched once, by one relay, and
        # both relays took part.
        assert r1.started + r2.started == JOBS_500
        assert r1.started > 0 and r2.started > 0, (r1.started, r2.started)
        by_owner = await rows(
            db,
            "SELECT status, attempt_count, count(*) AS n FROM outbox_event "
            "WHERE event_type = :t GROUP BY status, attempt_count",
            t=ENQUEUE,
        )
        assert [(r.status, r.attempt_count, r.n) for r in by_owner] == [("published", 1, JOBS_500)]
        assert await scalar(db, "SELECT count(*) FROM ai_job_artifact") == JOBS_500
        assert await scalar(db, "SELECT count(*) FROM synthetic_result") == JOBS_500
        assert (
            await scalar(db, "SELECT count(*) FROM outbox_event WHERE event_type = :t", t=COMPLETED)
            == JOBS_500
        )
        assert await scalar(db, "SELECT count(DISTINCT job_id) FROM ai_usage_log") == JOBS_500

        # Temporal: 500 executions on this test's queue, one per job id.
        tq = settings.task_queue(INTERACTIVE[0])

        async def counted() -> int | None:
            n = (await temporal_client.count_workflows(f"TaskQueue = '{tq}'")).count
            return n if n >= JOBS_500 else None

        assert await eventually(counted, timeout=20, what="500 executions visible") == JOBS_500
        ids = {w.id async for w in temporal_client.list_workflows(f"TaskQueue = '{tq}'")}
        assert ids == {st.workflow_id(j) for j in job_ids}


async def test_the_system_worker_process_relays(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    """The production path: an `ai-system` worker process starts the relay workflow
    `outbox-relay-0` and runs its relay activity, whose heartbeat details show what it
    dispatched; an event type nobody knows is acknowledged, never dispatched."""
    async with engine_stack(settings, temporal_client, queues=INTERACTIVE, relay=False) as st:
        stop = asyncio.Event()
        system = asyncio.create_task(
            run_workers(temporal_client, st.parts, [SYSTEM_QUEUE], stop), name="system"
        )
        try:
            await ensure_system_workflows(temporal_client, settings)  # idempotent

            job_id = await st.create(input={"echo": {"via": "system-worker"}})
            row = await st.wait_status(job_id, timeout=30)
            assert row.lifecycle_status == "succeeded"
            # The relay is the pending activity of `outbox-relay-0`; its heartbeat shows it.
            shard = relay_shard_workflow_id(0, settings.task_queue_suffix)

            async def progressed() -> dict[str, object] | None:
                details = await relay_heartbeat(temporal_client, shard)
                return details if details and int(str(details["dispatched"])) >= 1 else None

            details = await eventually(progressed, timeout=15, what="relay heartbeat progress")
            assert details["shard"] == 0 and details["batches"], details

            # An unknown event whose payload looks like an enqueue of a job.
            ghost = uuid.uuid4()
            async with db.begin() as s:
                event_id = await outbox_db.insert(
                    s,
                    event_type="ai.job.unknown_kind",
                    aggregate_type="AiJob",
                    aggregate_id=str(ghost),
                    dedupe_key=f"ai.job.unknown_kind:{ghost}",
                    payload={
                        "jobId": str(ghost),
                        "jobType": "synthetic",
                        "queueName": "ai-interactive",
                        "priority": 50,
                    },
                )

            async def published(kind: str, aggregate: str) -> bool:
                status = await scalar(
                    db,
                    "SELECT status FROM outbox_event WHERE event_type = :t AND aggregate_id = :a",
                    t=kind,
                    a=aggregate,
                )
                return bool(status == "published")

            await eventually(
                lambda: published("ai.job.unknown_kind", str(ghost)),
                timeout=15,
                what="the unknown event acknowledged",
            )
            (unknown,) = await rows(
                db, "SELECT attempt_count, last_error FROM outbox_event WHERE id = :i", i=event_id
            )
            assert unknown.attempt_count == 1 and unknown.last_error is None
            wid = workflow_id(INTERACTIVE[0], "synthetic", str(ghost))
            assert await describe_or_none(temporal_client, wid) is None  # not dispatched
            # The job's own events went through the same relay.
            assert await published(ENQUEUE, str(job_id))
            await eventually(
                lambda: published(COMPLETED, str(job_id)), timeout=15, what="completed event"
            )
        finally:
            stop.set()
            await asyncio.wait_for(system, 30)
            await temporal_client.get_workflow_handle(
                relay_shard_workflow_id(0, settings.task_queue_suffix)
            ).terminate("test over")
            schedule = temporal_client.get_schedule_handle(
                RECONCILER_SCHEDULE_ID + settings.task_queue_suffix
            )
            await schedule.delete()


class CrashingRelay(Relay):
    """Fails outside its own per-iteration guard the first time it would sleep: what a bug in
    the loop looks like to the activity that runs it. Counted across attempts (each attempt
    runs a relay of its own)."""

    crashes = 0

    async def _wait(
        self, listener: psycopg.AsyncConnection[object] | None, stop: asyncio.Event
    ) -> None:
        if CrashingRelay.crashes == 0:
            CrashingRelay.crashes += 1
            raise RuntimeError("relay bug")
        await super()._wait(listener, stop)


class CrashingRelays(RelayActivities):
    def new_relay(self, config: RelayConfig) -> Relay:
        return CrashingRelay(self._sm, self._client, self._catalog, config)


def relay_restarts() -> float:
    worker_metrics()  # the families exist on the default registry
    value = REGISTRY.get_sample_value("aijobs_poller_restarts_total", {"poller": "relay"})
    return value or 0.0


async def test_a_crashed_relay_loop_is_started_again_and_counted(
    settings: Settings, temporal_client: Client
) -> None:
    """A loop that raises fails its activity attempt; Temporal retries it a second later."""
    async with engine_stack(settings, temporal_client, queues=INTERACTIVE, relay=False) as st:
        CrashingRelay.crashes = 0
        relays = CrashingRelays(
            st.parts.sessionmaker, temporal_client, st.parts.catalog, new_relay(st).config
        )
        before = relay_restarts()
        tq = settings.task_queue(SYSTEM_QUEUE)
        async with Worker(
            temporal_client,
            task_queue=tq,
            workflows=[RelayShardWorkflow],
            activities=[relays.outbox_relay],
            workflow_runner=sandbox_runner(),
        ):
            handle = await temporal_client.start_workflow(
                RELAY_SHARD_WORKFLOW,
                RelayShardInput(shard=0),
                id=relay_shard_workflow_id(0, settings.task_queue_suffix),
                task_queue=tq,
            )
            try:
                job_id = await st.create()
                row = await st.wait_status(job_id, timeout=30)
                assert row.lifecycle_status == "succeeded"
                assert CrashingRelay.crashes == 1
                # Counted once the failed attempt has closed its loop (the job may be faster).

                async def counted() -> bool:
                    return relay_restarts() == before + 1

                await eventually(counted, timeout=10, what="the restart counted")
                assert relay_restarts() == before + 1
            finally:
                await handle.terminate("test over")
