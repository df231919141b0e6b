"""The outbox relay as a Temporal activity: what an operator sees of it in the Temporal UI.

Each relay shard is a workflow (`outbox_relay_shard`, id `outbox-relay-<k>`, k < RELAY_SHARDS)
on `ai-system` that runs one long `outbox_relay` activity: the relay loop (`Relay.run`: claim
`FOR UPDATE SKIP LOCKED`, start the workflows, mark the rows published; LISTEN wake-ups and the
poll interval), heartbeating its progress (`RelayProgress`) every couple of seconds. Why an
activity: Temporal keeps it alive. A worker that dies stops heartbeating, and after the heartbeat
timeout (10 s) the activity is retried on another `ai-system` worker; a loop that raises fails
its attempt and is retried after a short backoff. Shards are for parallelism, not ownership:
claims are disjoint whatever runs them, so the other shards keep dispatching meanwhile.

An attempt runs for `run_for_s` (an hour), or until its worker shuts down (SIGTERM: it finishes
the batch in hand and returns, so the next attempt starts on another worker without waiting for
a timeout), then returns; the workflow continues as new, so its history stays a dozen events.
A missing shard workflow (terminated, or never started) is started by every `ai-system` worker
at start and by the reconciler's `relay` phase (`ensure_relay_workflows`); a running one is left
alone (`USE_EXISTING`). A shard beyond RELAY_SHARDS (the setting went down) ends its workflow.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from activities.failures import loggable
from activities.metrics import WorkerMetrics, worker_metrics
from activities.relay import Relay, RelayConfig
from db.session import SessionMaker
from engine.contracts import (
    OUTBOX_RELAY,
    RELAY_SHARD_WORKFLOW,
    RelayProgress,
    RelayShardInput,
    RelayShardResult,
    relay_shard_workflow_id,
)
from jobs.spec import Catalog

log = logging.getLogger(__name__)
# Relay shard workflows a deployment runs. One relay dispatches far more jobs a second than the
# workers run (docs/benchmarks.md), and each relay process (`aijobs relay`) adds a loop of its
# own; shards only add parallelism inside Temporal, for a dispatch rate one loop cannot reach.
RELAY_SHARDS = 1


@dataclass(frozen=True)
class RelayShards:
    """Which relay workflows should run: `count` shards on `task_queue`, ids ending `suffix`."""

    count: int
    task_queue: str
    suffix: str = ""

    def ids(self) -> list[str]:
        return [relay_shard_workflow_id(k, self.suffix) for k in range(self.count)]


class RelayActivities:
    """The `outbox_relay` activity of the `ai-system` workers. Built once per worker with the
    worker's Temporal client (the relay starts workflows through it); each attempt runs its own
    `Relay` under a fresh owner id, so claims of a dead attempt never pass for a live one's."""

    def __init__(
        self,
        sessionmaker: SessionMaker,
        client: Client,
        catalog: Catalog,
        config: RelayConfig,
        *,
        shards: int = RELAY_SHARDS,
        heartbeat_every_s: float = 2.0,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._sm = sessionmaker
        self._client = client
        self._catalog = catalog
        self.config = config
        self.shards = shards
        self.heartbeat_every_s = heartbeat_every_s
        self._metrics = metrics or worker_metrics()

    def new_relay(self, config: RelayConfig) -> Relay:
        return Relay(self._sm, self._client, self._catalog, config, self._metrics)

    @activity.defn(name=OUTBOX_RELAY)
    async def outbox_relay(self, inp: RelayShardInput) -> RelayShardResult:
        if inp.shard >= self.shards:
            log.warning("relay shard beyond RELAY_SHARDS; its workflow ends", extra=_shard(inp))
            return RelayShardResult(retired=True)
        # Unique per attempt (two attempts of one shard may overlap for a moment).
        owner = f"relay:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}:{inp.shard}"
        relay = self.new_relay(dataclasses.replace(self.config, owner=owner))
        try:
            await self.run(relay, inp, activity.heartbeat)
        except asyncio.CancelledError:
            # Cancelled (the workflow closed, a heartbeat was refused, the worker's grace ran
            # out): rows claimed by the batch in hand go back after CLAIM_TTL_S.
            raise
        except Exception as exc:
            # A failure the loop did not handle: this attempt fails and Temporal retries it
            # after a short backoff (the retry policy is the relay's supervisor now).
            self._metrics.poller_restarted("relay")
            log.error("relay loop failed", exc_info=loggable(exc), extra=_shard(inp))
            raise
        return RelayShardResult(dispatched=relay.dispatched)

    async def run(self, relay: Relay, inp: RelayShardInput, heartbeat: Callable[..., None]) -> None:
        """Run `relay` until the attempt's time is up or its worker shuts down, heartbeating
        its progress; what the loop raises is raised here."""
        stop = asyncio.Event()
        loop = asyncio.create_task(relay.run(stop), name=f"relay-{inp.shard}")
        shutdown = asyncio.create_task(activity.wait_for_worker_shutdown())
        deadline = time.monotonic() + inp.run_for_s
        try:
            while not loop.done() and not shutdown.done():
                heartbeat(progress(inp.shard, relay))
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                await asyncio.wait({loop, shutdown}, timeout=min(self.heartbeat_every_s, left))
            stop.set()  # the batch in hand is finished and settled, then the loop returns
            await loop
            heartbeat(progress(inp.shard, relay))
        finally:
            stop.set()
            shutdown.cancel()
            if not loop.done():
                loop.cancel()
                with contextlib.suppress(BaseException):
                    await loop


def progress(shard: int, relay: Relay) -> RelayProgress:
    return RelayProgress(
        shard=shard,
        dispatched=relay.dispatched,
        started=relay.started,
        batches=relay.batches,
        last_batch=relay.last_batch,
        last_batch_at=_iso(relay.last_batch_at),
        last_error=relay.last_error,
        last_error_at=_iso(relay.last_error_at),
    )


def _iso(t: datetime | None) -> str | None:
    return t.isoformat(timespec="seconds") if t is not None else None


def _shard(inp: RelayShardInput) -> dict[str, object]:
    return {"shard": inp.shard, "attempt": activity.info().attempt}


async def ensure_relay_workflows(client: Client, shards: RelayShards) -> tuple[int, list[str]]:
    """Start each shard workflow that is not running (a running one is reused, never
    restarted). Returns the Temporal calls it made and the ids it started."""
    calls, started = 0, []
    for k, wid in enumerate(shards.ids()):
        calls += 1
        if await _status(client, wid) == WorkflowExecutionStatus.RUNNING:
            continue
        calls += 1
        await client.start_workflow(
            RELAY_SHARD_WORKFLOW,
            RelayShardInput(shard=k),
            id=wid,
            task_queue=shards.task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        started.append(wid)
        log.warning(
            "relay workflow started",
            extra={"workflow_id": wid, "alert": "AIJOBS_RELAY_WORKFLOW_STARTED"},
        )
    return calls, started


async def _status(client: Client, workflow_id: str) -> WorkflowExecutionStatus | None:
    try:
        return (await client.get_workflow_handle(workflow_id).describe()).status
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


@dataclass(frozen=True)
class RelayCheck:
    calls: int  # Temporal calls made
    notes: list[str]  # what was done, for the pass's details


async def check_relay(client: Client, shards: RelayShards | None) -> RelayCheck:
    """The reconciler's `relay` phase: start the shard workflows that are missing (terminated,
    or never started because no `ai-system` worker restarted since). None skips it."""
    calls, started = await ensure_relay_workflows(client, shards) if shards else (0, [])
    return RelayCheck(calls, [f"relay workflow {wid} started" for wid in started])
