"""The relay shard workflow and its activity on the real PostgreSQL and Temporal dev server: an
attempt ends after its run time and the workflow continues as new (its history stays small); a
worker that stops ends the attempt at once; a shard beyond RELAY_SHARDS ends its workflow; the
reconciler starts a missing shard, and leaves a running one alone."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import timedelta

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import Worker

from activities.reconciler import Reconciler
from activities.relay_activity import RelayActivities
from db.session import SessionMaker
from engine.contracts import (
    RELAY_SHARD_WORKFLOW,
    RelayShardInput,
    RelayShardResult,
    relay_shard_workflow_id,
)
from engine.definition import SYSTEM_QUEUE
from engine.settings import Settings
from runtime.wiring import reconciler_config
from runtime.worker import SYSTEM_DRAIN_S, relay_shards, sandbox_runner
from tests.integration.engine_helpers import describe_or_none, relay_heartbeat
from tests.stack import INTERACTIVE, Stack, engine_stack, new_relay
from tests.support import eventually
from workflows.system import RelayShardWorkflow


def relay_worker(st: Stack, *, shards: int = 1) -> Worker:
    """An `ai-system` worker that serves the relay shards only (as `build_workers` does)."""
    relays = RelayActivities(
        st.parts.sessionmaker,
        st.client,
        st.parts.catalog,
        new_relay(st, poll_interval_s=0.2).config,
        shards=shards,
        heartbeat_every_s=0.5,
    )
    return Worker(
        st.client,
        task_queue=st.settings.task_queue(SYSTEM_QUEUE),
        workflows=[RelayShardWorkflow],
        activities=[relays.outbox_relay],
        workflow_runner=sandbox_runner(),
        max_heartbeat_throttle_interval=timedelta(seconds=1),
        graceful_shutdown_timeout=timedelta(seconds=SYSTEM_DRAIN_S),
    )


async def start_shard(st: Stack, shard: int, run_for_s: float = 3600.0) -> str:
    wid = relay_shard_workflow_id(shard, st.settings.task_queue_suffix)
    await st.client.start_workflow(
        RELAY_SHARD_WORKFLOW,
        RelayShardInput(shard=shard, run_for_s=run_for_s),
        id=wid,
        task_queue=st.settings.task_queue(SYSTEM_QUEUE),
    )
    return wid


async def test_a_shard_continues_as_new_and_a_surplus_shard_ends(
    settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client, queues=INTERACTIVE, relay=False) as st:
        async with relay_worker(st, shards=1):
            wid = await start_shard(st, 0, run_for_s=1.0)
            first = await temporal_client.get_workflow_handle(wid).describe()
            try:
                job = await st.create()
                assert (await st.wait_status(job, timeout=30)).lifecycle_status == "succeeded"

                async def next_run() -> bool:
                    desc = await describe_or_none(temporal_client, wid)
                    return bool(
                        desc
                        and desc.run_id != first.run_id
                        and desc.status == WorkflowExecutionStatus.RUNNING
                    )

                await eventually(next_run, timeout=20, what="the relay workflow continued as new")
                history = await temporal_client.get_workflow_handle(
                    wid, run_id=first.run_id
                ).fetch_history()
                assert len(history.events) <= 15, len(history.events)
                # A shard beyond RELAY_SHARDS ends its workflow instead of continuing.
                extra = await start_shard(st, 1)
                result = await temporal_client.get_workflow_handle(
                    extra, result_type=RelayShardResult
                ).result()
                assert result.retired
            finally:
                await temporal_client.get_workflow_handle(wid).terminate("test over")


async def test_a_stopping_worker_ends_the_relay_attempt_at_once(
    settings: Settings, temporal_client: Client
) -> None:
    """SIGTERM's path: the worker shuts down, the activity finishes its batch and returns; the
    next worker continues the workflow as new and relays, without a heartbeat timeout."""
    async with engine_stack(settings, temporal_client, queues=INTERACTIVE, relay=False) as st:
        worker = relay_worker(st)
        await worker.__aenter__()
        wid = await start_shard(st, 0)
        try:
            await eventually(
                lambda: relay_heartbeat(temporal_client, wid), timeout=15, what="a heartbeat"
            )
            before = (await temporal_client.get_workflow_handle(wid).describe()).run_id
            t0 = time.monotonic()
            await worker.shutdown()
            assert time.monotonic() - t0 < 5, "the relay attempt did not end on shutdown"
            # The attempt returned (nothing pending): no heartbeat timeout to wait out.
            desc = await temporal_client.get_workflow_handle(wid).describe()
            assert list(desc.raw_description.pending_activities) == []
            async with relay_worker(st):
                job = await st.create()
                assert (await st.wait_status(job, timeout=30)).lifecycle_status == "succeeded"
                # The next worker continued the workflow as new and runs its relay.
                desc = await temporal_client.get_workflow_handle(wid).describe()
                assert desc.run_id != before and desc.status == WorkflowExecutionStatus.RUNNING
        finally:
            await temporal_client.get_workflow_handle(wid).terminate("test over")


async def test_the_reconciler_starts_a_missing_relay_workflow(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client, queues=INTERACTIVE, relay=False) as st:
        config = dataclasses.replace(
            reconciler_config(settings), relay_shards=relay_shards(settings)
        )
        reconciler = Reconciler(db, temporal_client, config)
        wid = relay_shard_workflow_id(0, settings.task_queue_suffix)
        async with relay_worker(st):
            try:
                result = await reconciler.run_once()
                assert f"relay workflow {wid} started" in result.details
                job = await st.create()
                assert (await st.wait_status(job, timeout=30)).lifecycle_status == "succeeded"
                # Running: the next pass leaves it alone.
                run = (await temporal_client.get_workflow_handle(wid).describe()).run_id
                again = await reconciler.run_once()
                assert not any("started" in d for d in again.details), again.details
                assert (await temporal_client.get_workflow_handle(wid).describe()).run_id == run
                # Terminated by someone: the next pass starts it again.
                await temporal_client.get_workflow_handle(wid).terminate("an operator")
                third = await reconciler.run_once()
                assert f"relay workflow {wid} started" in third.details
            finally:
                await temporal_client.get_workflow_handle(wid).terminate("test over")


async def test_a_terminated_relay_workflow_ends_its_activity_and_the_worker_stops(
    settings: Settings, temporal_client: Client
) -> None:
    """The cancel path: the workflow is terminated while its activity relays; the activity
    learns it from its next heartbeat and stops its loop, so the worker still stops at once."""
    async with engine_stack(settings, temporal_client, queues=INTERACTIVE, relay=False) as st:
        worker = relay_worker(st)
        await worker.__aenter__()
        try:
            wid = await start_shard(st, 0)
            await eventually(
                lambda: relay_heartbeat(temporal_client, wid), timeout=15, what="a heartbeat"
            )
            await temporal_client.get_workflow_handle(wid).terminate("an operator")
            await asyncio.sleep(3)  # a few heartbeats: the activity is cancelled
        finally:
            t0 = time.monotonic()
            await asyncio.wait_for(worker.shutdown(), 30)
        assert time.monotonic() - t0 < 5, f"the worker took {time.monotonic() - t0:.1f} s to stop"
