"""Workflows of the `ai-system` queue: the reconciler, and the retired outbox relay workflow.

The relay is a supervised loop of the `ai-system` worker process now (activities/relay.py,
docs/architecture.md "Pollers"). `RelayWorkflow` is kept, unchanged and registered, only so that
its recorded histories (tests/replay/histories/relay-*.json) replay and a run an older version
left open can still take its workflow tasks until it is terminated (`retire_relay_workflow`).
Nothing starts it; do not change its commands."""

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
