"""Workflows of the `ai-system` queue: the relay shards, the reconciler, and the retired outbox
relay workflow.

`RelayShardWorkflow` (ids `outbox-relay-<k>`) runs the relay's long heartbeating activity and
continues as new after it (activities/relay_activity.py, docs/architecture.md "Pollers").
`RelayWorkflow` is kept, unchanged and registered, only so that its recorded histories
(tests/replay/histories/relay-*.json) replay and a run an older version left open can still
take its workflow tasks until it is terminated (`retire_relay_workflow`). Nothing starts it; do
not change its commands."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from engine.contracts import (
        OUTBOX_RELAY,
        RECONCILE_ONCE,
        RECONCILER_WORKFLOW,
        RELAY_LOOP,
        RELAY_SHARD_WORKFLOW,
        RELAY_WORKFLOW,
        ReconcileResult,
        RelayInput,
        RelayShardInput,
        RelayShardResult,
    )

# The relay activity's heartbeat timeout: a worker that dies is noticed this long after its last
# heartbeat, and the activity is retried on another `ai-system` worker.
RELAY_HEARTBEAT_TIMEOUT = timedelta(seconds=10)


@workflow.defn(name=RELAY_SHARD_WORKFLOW)
class RelayShardWorkflow:
    """One relay shard: one long `outbox_relay` activity, then continue-as-new (a dozen events
    per run). The activity is retried without limit, within seconds: the relay must run
    whenever Temporal does. A shard the workers no longer count (RELAY_SHARDS is lower) ends."""

    @workflow.run
    async def run(self, inp: RelayShardInput) -> RelayShardResult:
        result: RelayShardResult = await workflow.execute_activity(
            OUTBOX_RELAY,
            inp,
            result_type=RelayShardResult,
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


@workflow.defn(name=RELAY_WORKFLOW)
class RelayWorkflow:
    """Retired (see the module docstring). It ran the long-lived relay activity, which Temporal
    restarted elsewhere when its worker died (heartbeat timeout), and continued-as-new to keep
    its history short."""

    @workflow.run
    async def run(self, inp: RelayInput) -> None:
        await workflow.execute_activity(
            RELAY_LOOP,
            inp,
            start_to_close_timeout=timedelta(hours=1),
            heartbeat_timeout=timedelta(seconds=15),
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=1),
                maximum_interval=timedelta(seconds=10),
                maximum_attempts=0,
            ),
        )
        workflow.continue_as_new(inp)


@workflow.defn(name=RECONCILER_WORKFLOW)
class ReconcilerWorkflow:
    @workflow.run
    async def run(self) -> ReconcileResult:
        # A pass is at most seven phases of 15 s (+5 s hard stop) each; it heartbeats between
        # pages and phases, so a pass whose worker died is retried after 30 s, not after the
        # whole start-to-close timeout. (Activity options are not replayed: changing them is
        # safe for recorded histories.)
        result: ReconcileResult = await workflow.execute_activity(
            RECONCILE_ONCE,
            result_type=ReconcileResult,
            start_to_close_timeout=timedelta(minutes=3),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )
        return result
