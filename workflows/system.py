"""Workflows of the `ai-system` queue: the singleton outbox relay and the reconciler."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from engine.contracts import (
        RECONCILE_ONCE,
        RECONCILER_WORKFLOW,
        RELAY_LOOP,
        RELAY_WORKFLOW,
        ReconcileResult,
        RelayInput,
    )


@workflow.defn(name=RELAY_WORKFLOW)
class RelayWorkflow:
    """Runs the long-lived relay activity; Temporal restarts it elsewhere if its worker dies
    (heartbeat timeout), and continue-as-new keeps the history short."""

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
