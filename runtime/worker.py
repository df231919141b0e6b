"""Worker bootstrap: one Temporal worker per task queue, built from Settings.

`ai-interactive` / `ai-background` run every job workflow and the stage activities; their
`max_concurrent_activities` is the queue table's concurrency (engine/queues.py: 2 / 1), or
AI_INTERACTIVE_CONCURRENCY / AI_BACKGROUND_CONCURRENCY when set. EXECUTE is the only regular
activity there, so the limit caps concurrent provider calls; the bookkeeping stages (local
activities) are not throttled by it. The worker takes at most WORKFLOW_TASKS workflow tasks and
runs at most DB_POOL_SIZE local activities at once, so that a burst of one user's jobs waits
on the server, where tasks are dispatched fairly across users. `ai-system` runs the relay shard
workflows (`outbox-relay-<k>`, each one heartbeating relay activity), the reconciler schedule
and the admin bulk workflows; its process also runs the webhook deliverer as a supervised loop
(`run_pollers`: it must deliver while Temporal is down; docs/architecture.md "Pollers").
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
)
from temporalio.worker import Interceptor, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.batch import BatchActivities, BatchTiming
from activities.batch_files import BatchFiles, gateway_clients
from activities.bounded import BoundedStagesInterceptor
from activities.bulk import BulkActivities
from activities.deps import EngineConfig
from activities.failures import PublicFailureInterceptor
from activities.metrics import worker_metrics
from activities.reconciler import Reconciler
from activities.relay import Relay, RelayConfig
from activities.relay_activity import (
    RELAY_SHARDS,
    RelayActivities,
    RelayShards,
    ensure_relay_workflows,
)
from activities.stages import JobActivities
from activities.telemetry import JobTelemetryInterceptor
from db.credentials import active_user_key_id
from db.listener import Listener
from engine.contracts import RECONCILER_SCHEDULE_ID, RECONCILER_WORKFLOW
from engine.definition import QUEUE_NAMES, SYSTEM_QUEUE
from engine.payloads import DATA_CONVERTER
from engine.queues import queue_config
from engine.settings import Settings
from jobs.bulk import BulkPolicy, BulkService
from jobs.gateway import Gateway
from jobs.service import JobService
from providers.safety import BLOCKLIST
from runtime import workflow_code
from runtime.limit_waker import limit_waker_task
from runtime.schedules import schedule_activities, schedule_sync, schedules_worker
from runtime.signals import signal_all
from runtime.supervisor import supervise
from runtime.telemetry import Telemetry
from runtime.wiring import (
    Parts,
    create_policy,
    engine_config,
    gateway,
    process_listener,
    reconciler_config,
    relay_config,
    webhook_deliverer,
)
from runtime.workflow_runner import ContextFreeRunner
from workflows.batch import BatchWorkflow
from workflows.bulk import BulkWorkflow
from workflows.job_workflow import JobWorkflow
from workflows.schedule_run import ScheduledRun
from workflows.system import ReconcilerWorkflow, RelayShardWorkflow

log = logging.getLogger(__name__)
ALL_QUEUES: tuple[str, ...] = (*QUEUE_NAMES, SYSTEM_QUEUE)
# How long a stopping `ai-system` worker lets its activities end on their own (the relay's
# batch in hand; a reconciler pass or bulk page still running is cancelled after it).
SYSTEM_DRAIN_S = 10.0
# The job queues, interactive first (unpacking fails loudly if a queue is ever added).
INTERACTIVE_QUEUE, BACKGROUND_QUEUE = QUEUE_NAMES
# How many workflow tasks (each running its bookkeeping stages as local activities) one
# job-queue worker takes at once. Tasks beyond it wait on the server, where they are
# dispatched fairly across users; taken by the worker, they would be served in arrival order
# and one user's burst would hold the database pool while another user's job waits. Six keeps
# a worker's calls fed (2 provider slots) with room for the stages around them.
WORKFLOW_TASKS = 6


def sandbox_runner() -> ContextFreeRunner:
    # Our pure modules are deterministic; passing them through keeps the per-run sandbox cost
    # low. `workflows.stages` holds only the stages' typed stubs (names and signatures, bodies
    # that never run), so it is passed through too: re-importing it re-applied `activity.defn`
    # to each stub at every run. The workflow modules themselves (`workflows.job_workflow`,
    # the system and bulk workflows) are re-imported in each run's sandbox, as the SDK intends,
    # so the sandbox still checks their code.
    # The runner answers the payloads' serialization contexts outside the sandbox, as the
    # engine's converter reads none (runtime/workflow_runner.py); each run's import of the
    # workflow modules executes code read once per process (runtime/workflow_code.py).
    workflow_code.install("workflows")
    sandbox = SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(
            "engine", "workflows.stages", "pydantic", "pydantic_core", "annotated_types"
        )
    )
    return ContextFreeRunner(sandbox, DATA_CONVERTER)


def queue_concurrency(settings: Settings, queue_name: str) -> int:
    """Provider calls at once per worker on a job queue: the queue table's (engine/queues.py),
    unless AI_INTERACTIVE_CONCURRENCY / AI_BACKGROUND_CONCURRENCY override it."""
    override = (
        settings.interactive_concurrency
        if queue_name == INTERACTIVE_QUEUE
        else settings.background_concurrency
    )
    return override or queue_config(queue_name).concurrency


def _job_worker(
    client: Client,
    parts: Parts,
    queue: str,
    stages: JobActivities,
    interceptors: Sequence[Interceptor],
) -> Worker:
    """The worker of one job queue: every job workflow, the batch workflow (its jobs' queue
    runs it) and the stage and batch activities."""
    s = parts.settings
    batch = BatchActivities(
        stages.deps, client, BatchTiming(s.ai_batch_window_s, s.ai_batch_poll_s)
    )
    return Worker(
        client,
        task_queue=s.task_queue(queue),
        workflows=[JobWorkflow, BatchWorkflow],
        activities=[*stages.all(), *batch.all()],
        max_concurrent_activities=queue_concurrency(s, queue),
        # The worker's intake is bounded so that a burst waits on the server's fair queue, not
        # in here (WORKFLOW_TASKS); its bookkeeping stages never hold more connections than
        # the pool keeps, so EXECUTE, which holds a provider slot, is never queued behind them
        # for one.
        max_concurrent_workflow_tasks=WORKFLOW_TASKS,
        max_concurrent_local_activities=s.db_pool_size,
        # Heartbeats reach the server at least every second whatever the heartbeat timeout, so
        # a workflow cancel reaches EXECUTE within about a second while the timeout itself can
        # tolerate a busy event loop.
        max_heartbeat_throttle_interval=timedelta(seconds=1),
        workflow_runner=sandbox_runner(),
        interceptors=interceptors,
        # On SIGTERM: stop polling, let in-flight provider calls finish, then exit.
        graceful_shutdown_timeout=timedelta(seconds=s.worker_drain_s),
    )


def build_workers(
    client: Client,
    parts: Parts,
    queues: Sequence[str],
    *,
    telemetry: Telemetry | None = None,
    on_close: list[Callable[[], Awaitable[None]]] | None = None,
    config: EngineConfig | None = None,
    blocklist: Sequence[str] = BLOCKLIST,
    relay: RelayConfig | None = None,
    listener: Listener | None = None,
) -> list[Worker]:
    """`telemetry` instruments the provider's HTTP client; the client's own interceptors (see
    `connect_temporal`) carry the Temporal spans into these workers. What must be closed once
    the workers have stopped (the providers' HTTP clients) is appended to `on_close`. `config`,
    `blocklist` and the `ai-system` worker's `relay` are the settings' and the engine's unless
    a test gives its own. The relay activity of `ai-system` wakes through `listener`, the
    process's one LISTEN connection."""
    for q in queues:
        if q not in ALL_QUEUES:
            raise ValueError(f"unknown task queue {q!r}; expected one of {', '.join(ALL_QUEUES)}")
    s = parts.settings
    gw = gateway(s, telemetry, blocklist=blocklist)
    if on_close is not None:
        on_close.append(gw.aclose)
    stages = JobActivities(
        parts.sessionmaker,
        parts.catalog,
        gw,
        config or engine_config(s),
        signal_all=signal_all,
    )
    job_queues = [q for q in queues if q in QUEUE_NAMES]
    worker_metrics().prepare((t.job_type for t in parts.catalog), job_queues)
    # Outermost first: stage timing, job ids in logs and spans, then the public-failure rule.
    job_interceptors: Sequence[Interceptor] = [
        JobTelemetryInterceptor(),
        PublicFailureInterceptor(),
        BoundedStagesInterceptor(parts.sessionmaker, s.stage_internal_attempts),
    ]
    workers = [
        _job_worker(client, parts, q, stages, job_interceptors)
        if q in QUEUE_NAMES
        else system_worker(client, parts, relay, gw, listener)
        for q in queues
    ]
    if SYSTEM_QUEUE in queues:
        # The schedules' runs: on `ai-schedules`, in the `ai-system` process, slots of their own.
        workers.append(schedules_worker(client, parts, sandbox_runner(), drain_s=SYSTEM_DRAIN_S))
    return workers


def system_worker(
    client: Client,
    parts: Parts,
    relay_cfg: RelayConfig | None = None,
    gw: Gateway | None = None,
    listener: Listener | None = None,
) -> Worker:
    """The `ai-system` worker: the relay shards, the reconciler and the admin bulk operations
    (the schedules' runs have a worker of their own, `ai-schedules`; `ScheduledRun` stays here
    for the runs an older version started on `ai-system`). `gw`: the process's gateway, whose
    provider the reconciler deletes batch files at; `listener`: the process's one LISTEN
    connection, which wakes the relay activity."""
    s = parts.settings
    # Its `relay` phase starts a missing relay shard workflow; its `schedules` phase makes the
    # Temporal schedules match their rows.
    rc = dataclasses.replace(reconciler_config(s), relay_shards=relay_shards(s))
    files = BatchFiles(parts.sessionmaker, gateway_clients(gw)) if gw is not None else None
    reconciler = Reconciler(
        parts.sessionmaker,
        client,
        rc,
        catalog=parts.catalog,
        schedules=schedule_sync(client, parts),
        batch_files=files,
    )
    # Admin bulk operations act through the same use cases as the API (same catalog,
    # same create policy: a bulk retry is an internal create, outside user quotas).
    bulk = BulkActivities(
        BulkService(
            parts.sessionmaker,
            JobService(
                parts.sessionmaker,
                parts.catalog,
                create_policy(s),
                credential_lookup=active_user_key_id,
            ),
            BulkPolicy.from_settings(s),
        ),
        client,
    )
    relay = RelayActivities(
        parts.sessionmaker,
        client,
        parts.catalog,
        relay_cfg or relay_config(s),
        listener=listener,
    )
    return Worker(
        client,
        task_queue=s.task_queue(SYSTEM_QUEUE),
        workflows=[
            RelayShardWorkflow,
            ReconcilerWorkflow,
            BulkWorkflow,
            ScheduledRun,
        ],
        activities=[
            relay.outbox_relay,
            reconciler.reconcile_once,
            *bulk.all(),
            *schedule_activities(parts).all(),
        ],
        # A slot per relay shard it may hold, beside the reconciler and bulk pages.
        max_concurrent_activities=8 + RELAY_SHARDS,
        # The relay's progress reaches the Temporal UI every 2 s.
        max_heartbeat_throttle_interval=timedelta(seconds=2),
        # On SIGTERM the relay activity finishes its batch and returns (its next
        # attempt starts on another worker at once); what still runs after this
        # is cancelled.
        graceful_shutdown_timeout=timedelta(seconds=SYSTEM_DRAIN_S),
        workflow_runner=sandbox_runner(),
        interceptors=[PublicFailureInterceptor()],
    )


def relay_shards(settings: Settings) -> RelayShards:
    return RelayShards(RELAY_SHARDS, settings.task_queue(SYSTEM_QUEUE), settings.task_queue_suffix)


async def ensure_system_workflows(client: Client, settings: Settings) -> None:
    """Start the relay shard workflows that are not running and the reconciler schedule (both
    idempotent)."""
    await ensure_relay_workflows(client, relay_shards(settings))
    with contextlib.suppress(ScheduleAlreadyRunningError):
        await client.create_schedule(
            RECONCILER_SCHEDULE_ID + settings.task_queue_suffix,
            Schedule(
                action=ScheduleActionStartWorkflow(
                    RECONCILER_WORKFLOW,
                    id=f"ai-system:reconcile{settings.task_queue_suffix}",
                    task_queue=settings.task_queue(SYSTEM_QUEUE),
                ),
                spec=ScheduleSpec(
                    intervals=[
                        ScheduleIntervalSpec(every=timedelta(seconds=settings.reconcile_interval_s))
                    ]
                ),
                policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
            ),
        )


async def shutdown_together(workers: Sequence[Worker]) -> None:
    """Stop every worker at once and wait until all have drained. One after another, each
    would keep polling while those before it drained, taking new calls that it then drained
    too: a stop could last the sum of the drains (2 x WORKER_DRAIN_S for both job queues),
    past compose's stop_grace_period. Together, no worker takes new work once the stop begins
    and the stop lasts the longest drain."""
    results = await asyncio.gather(*(w.shutdown() for w in workers), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            log.warning("a worker failed to shut down cleanly: %s", type(result).__name__)


async def run_pollers(
    client: Client,
    parts: Parts,
    stop: asyncio.Event,
    listener: Listener,
    *,
    relay: Relay | None = None,
) -> None:
    """The webhook deliverer, and `relay` when given (`aijobs relay`: the relay loop outside
    Temporal, woken through `listener`), each a plain loop under `supervise` (restarted with
    backoff if it fails, counted in `aijobs_poller_restarts_total`), until `stop` is set. Every
    `ai-system` worker process runs the deliverer (it must deliver while Temporal is down); its
    claims are disjoint, so any number of processes may (docs/architecture.md "Pollers")."""
    loops = [supervise("webhooks", webhook_deliverer(parts, listener).run, stop)]
    if relay is not None:  # built on the same listener
        loops.append(supervise("relay", relay.run, stop))
    await asyncio.gather(*loops)


async def run_workers(
    client: Client,
    parts: Parts,
    queues: Sequence[str],
    stop: asyncio.Event,
    *,
    telemetry: Telemetry | None = None,
) -> None:
    """The process's workers, pollers and wakers, all woken through one listener (its one
    LISTEN connection, `<process>-listener`), until `stop`."""
    listener = process_listener(parts)
    closers: list[Callable[[], Awaitable[None]]] = [listener.close]
    workers = build_workers(
        client, parts, queues, telemetry=telemetry, on_close=closers, listener=listener
    )
    # What start-up built (modules, classes, the catalog, the SDK's and SQLAlchemy's tables)
    # lives as long as the process: out of the collector's generations, each full collection
    # no longer walks it (the worker's time in garbage collection halved, about 0.6 ms/job).
    gc.freeze()
    pollers: asyncio.Task[None] | None = None
    if SYSTEM_QUEUE in queues:
        await ensure_system_workflows(client, parts.settings)
        pollers = asyncio.create_task(run_pollers(client, parts, stop, listener), name="pollers")
    waker = limit_waker_task(client, parts, queues, stop, listener)
    listener.start()
    log.info("workers running", extra={"queues": list(queues)})
    try:
        async with contextlib.AsyncExitStack() as stack:
            for w in workers:
                await stack.enter_async_context(w)
            try:
                await stop.wait()
            finally:
                # Leaving the stack would shut the workers down one after another; this stops
                # them all first (the stack's own shutdowns then return at once).
                await shutdown_together(workers)
    finally:
        if pollers is not None or waker is not None:
            stop.set()
        for task in (pollers, waker):
            if task is not None:
                await task
        for close in closers:
            await close()


__all__ = [
    "ALL_QUEUES",
    "build_workers",
    "ensure_system_workflows",
    "relay_config",
    "relay_shards",
    "run_pollers",
    "run_workers",
    "shutdown_together",
]
