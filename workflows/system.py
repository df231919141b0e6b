"""Workflows of the `ai-system` queue: the relay shards and the reconciler.

`RelayShardWorkflow` (ids `outbox-relay-<k>`) runs the relay's long heartbeating activity and
continues as new after it (activities/relay_activity.py, docs/architecture.md "Pollers")."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

from workflows.stages import stub

with workflow.unsafe.imports_passed_through():
    from engine.contracts import (
        RECONCILER_WORKFLOW,
        RELAY_SHARD_WORKFLOW,
        ReconcileResult,
        RelayShardInput,
        RelayShardResult,
    )

# The relay activity's heartbeat timeout: a worker that dies is noticed this long after its last
# heartbeat, and the activity is retried on another `ai-system` worker.
RELAY_HEARTBEAT_TIMEOUT = timedelta(seconds=10)


# Typed stubs of their activities (as workflows/stages.py's; activities/relay_activity.py and
# activities/reconciler.py register them).
@activity.defn
async def outbox_relay(inp: RelayShardInput) -> RelayShardResult:
    stub()


@activity.defn
async def reconcile_once() -> ReconcileResult:
    stub()


@workflow.defn(name=RELAY_SHARD_WORKFLOW)
class RelayShardWorkflow:
    """One relay shard: one long `outbox_relay` activity, then continue-as-new (a dozen events
    per run). The activity is retried without limit, within seconds: the relay must run
    whenever Temporal does. A shard the workers no longer count (RELAY_SHARDS is lower) ends."""

    @workflow.run
    async def run(self, inp: RelayShardInput) -> RelayShardResult:
        result = await workflow.execute_activity(
            outbox_relay,
            inp,
            start_to_close_timeout=timedelta(seconds=2 * inp.run_for_s + 600),
            heartbeat_timeout=RELAY_HEARTBEAT_TIMEOUT,
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=1),
                maximum_interval=timedelta(seconds=4),
                maximum_attempts=0,
            ),
        )
        if result.retired:
            return result
        workflow.continue_as_new(inp)


@workflow.defn(name=RECONCILER_WORKFLOW)
class ReconcilerWorkflow:
    @workflow.run
    async def run(self) -> ReconcileResult:
        # A pass is at most seven phases of 15 s (+5 s hard stop) each; it heartbeats between
        # pages and phases, so a pass whose worker died is retried after 30 s, not after the
        # whole start-to-close timeout. (Activity options are not replayed: changing them is
        # safe for recorded histories.)
        return await workflow.execute_activity(
            reconcile_once,
            start_to_close_timeout=timedelta(minutes=3),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )
