"""Payloads that cross Temporal: workflow and activity inputs and results.

Plain dataclasses of ids, hashes, codes and numbers only: never job input, snapshot content,
prompts, model output or credentials (docs/contracts.md, privacy). They are imported inside the
workflow sandbox.

Recorded histories hold these payloads as JSON objects, and a payload recorded by an earlier
version may carry a field removed since: the default data converter ignores a key the dataclass
does not declare, so such a payload still decodes (tests/unit/test_recorded_payloads.py). A
field added later needs a default, or payloads recorded without it no longer decode.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Names of activities, shared by workflows (which call them) and activities (which define them).
PREPARE = "prepare"
RESOLVE = "resolve"
EXECUTE = "execute"
PROJECT = "project"
COMPLETE = "complete"
MERGE = "merge"
REUSE = "reuse"  # result reuse: a job's answer copied from the same user's job (jobs/reuse.py)
FINALIZE_FAILED = "finalize_failed"
FINALIZE_CANCELLED = "finalize_cancelled"
# Flow control: a job's start-by TTL or deadline reached while its workflow waits.
FLOW_EXPIRE = "flow_expire"
# A batch-tier job's stages in place of EXECUTE (workflows/batch_tier.py, docs/batch.md).
BATCH_ENROLL = "batch_enroll"
BATCH_COLLECT = "batch_collect"
BATCH_LEAVE = "batch_leave"
# The relay: one long heartbeating activity per shard workflow (activities/relay_activity.py).
OUTBOX_RELAY = "outbox_relay"
RECONCILE_ONCE = "reconcile_once"

BULK_PROCESS_PAGE = "bulk_process_page"
BULK_FINISH = "bulk_finish"

# The relay's shard workflows (`RELAY_SHARDS` of them, ids `outbox-relay-<k>`).
RELAY_SHARD_WORKFLOW = "outbox_relay_shard"
RECONCILER_WORKFLOW = "reconciler"
RECONCILER_SCHEDULE_ID = "ai-system:reconciler"
BULK_WORKFLOW = "bulk_operation"


def bulk_workflow_id(operation_id: str) -> str:
    """One workflow per bulk operation: starting it twice is a no-op."""
    return f"bulk:{operation_id}"


def relay_shard_workflow_id(shard: int, suffix: str = "") -> str:
    """One workflow per relay shard: starting a running one again is a no-op."""
    return f"outbox-relay-{shard}{suffix}"


def workflow_id(queue_name: str, job_type: str, job_id: str) -> str:
    """Unique per job, so starting it twice is a no-op (docs/contracts.md, queues and ids)."""
    return f"{queue_name}:{job_type}:{job_id}"


@dataclass(frozen=True)
class JobWorkflowInput:
    """The frozen queue payload (camelCase on the wire; docs/contracts.md, queues and ids)."""

    jobId: str
    jobType: str
    idempotencyKey: str
    createdAt: str
    # Provider attempts the job spent before a continue-as-new (a long wait on its provider's
    # gate starts a new run so the history stays bounded); 0 on the relay's start.
    attemptsSpent: int = 0
    # A delayed job's start (RFC 3339, from its enqueue row; "": at once): the run waits for it
    # on a durable timer before its first stage.
    runAt: str = ""


@dataclass(frozen=True)
class StageInput:
    job_id: str
    workflow_id: str  # PREPARE: a job `running` under this workflow's own lock goes on


@dataclass(frozen=True)
class ExecutionPlan:
    """What the workflow needs from the job's definition, read once by PREPARE."""

    timeout_ms: int
    max_attempts: int
    backoff_ms: int
    abort_strategy: str
    heartbeat_timeout_ms: int
    # EXECUTE's start-to-close: the job's timeout plus room for its own database retries.
    start_to_close_ms: int = 0


@dataclass(frozen=True)
class PrepareResult:
    """`run` = the job is ours and running; otherwise it ended before us (e.g. cancelled)."""

    run: bool
    lifecycle_status: str
    plan: ExecutionPlan | None = None
    # Flow control (engine/flow.py), RFC 3339 UTC, "": none. `expires_at`: a queued job's
    # start-by time (its TTL); `deadline`: the whole job's. The workflow arms a durable timer for
    # them, and only for them (a plain job issues no command more).
    expires_at: str = ""
    deadline: str = ""


@dataclass(frozen=True)
class OffpeakHold:
    """An off-peak job's wait, as RESOLVE found it (times only, RFC 3339 UTC): its provider's
    next discount window (`window_at`; "": none configured), its deadline and what it does there
    (`then`: "standard" runs at once at the standard price, "fail" fails the job)."""

    window_at: str
    deadline: str
    then: str


@dataclass(frozen=True)
class ResolveResult:
    """What RESOLVE found, for the operator who reads the job's history in the Temporal UI
    (EXECUTE resolves its own row in its first transaction; the workflow reads only the chunk
    fields): names, versions, ids, limits and chunk numbers only (never a key, a prompt, the
    input or a user id)."""

    prompt_version: str
    credential_mode: str
    provider: str
    model: str
    credential_id: str | None = None  # the pinned user key's id (user-key jobs)
    timeout_ms: int = 0
    max_output_tokens: int = 0
    max_attempts: int = 0
    # A long source's chunks (0: one call), read by the workflow: how many, how many in flight
    # at once (the worker's AI_CHUNK_CONCURRENCY, a result so that replay sees the same
    # window), the chunks already succeeded (copied by an admin retry, or done before a
    # continue-as-new: not run again) and each chunk's attempts spent so far (by chunk
    # number), so its retries stay its own.
    chunk_count: int = 0
    chunk_concurrency: int = 0
    chunks_done: list[int] = field(default_factory=list)
    chunk_attempts: list[int] = field(default_factory=list)
    # The job reuses another job's answer (`reused_from_job_id`): the workflow runs the `reuse`
    # stage instead of EXECUTE.
    reuses: bool = False
    # An off-peak job's hold (None: not off-peak), read by the workflow: it waits on a timer
    # before EXECUTE (workflows/offpeak_hold.py).
    offpeak: OffpeakHold | None = None
    # The job's service tier (engine/tiers.py), read by the workflow: a `batch` job goes
    # through its provider's Batch API instead of EXECUTE.
    service_tier: str = "standard"


@dataclass(frozen=True)
class ExecuteInput:
    # The workflow and run ids are the activity's own (`activity.info()`): not repeated here.
    job_id: str
    timeout_ms: int
    abort_strategy: str
    # Provider attempts spent by earlier EXECUTE activities of this job (the job's attempt
    # number is this plus Temporal's attempt number).
    attempt_offset: int = 0
    # A long source's chunk this activity calls for (None: the job's one call). Its attempt
    # number is the chunk's own (`attempt_offset` counts that chunk's earlier attempts).
    chunk_no: int | None = None


@dataclass(frozen=True)
class ExecuteResult:
    output_hash: str
    attempt: int
    # Set when the job ended before it ran: the state it had reached (cancelled while it
    # waited). None: the output is stored, PROJECT is next.
    lifecycle_status: str | None = None
    # > 0: the provider gate held the job; nothing happened, ask again after this long.
    gate_wait_s: float = 0.0
    # Why: "pause", "breaker" (polled with a growing wait) or a provider limit (LIMIT_WAITS:
    # the wait is exactly what the limit needs, so the workflow waits just that).
    gate_reason: str = ""
    # The call moved down the fallback chain: "<from model>-><to model>:<reason>" (models from
    # configuration, a reason of a fixed set; never a key or a URL). Empty: no move.
    fallback: str = ""


@dataclass(frozen=True)
class BatchAttemptInput:
    """A batch-tier job's attempt (1-based, the job's own count): the input of `batch_enroll`,
    `batch_collect` and `batch_leave` (which ignores `attempt`: it leaves whatever is live)."""

    job_id: str
    attempt: int
    timeout_ms: int = 0


@dataclass(frozen=True)
class BatchEnrollResult:
    """`enrolled`: the attempt's item waits in batch `batch_id` (ids only). Otherwise the job
    ended before it could join (`lifecycle_status`), or its output was already stored
    (`output_hash`: PROJECT is next, nothing is bought again)."""

    enrolled: bool
    batch_id: str = ""
    lifecycle_status: str | None = None
    output_hash: str = ""


@dataclass(frozen=True)
class BatchCollectResult:
    """The attempt's item as `batch_collect` found it: `pending` (no outcome yet: wait for the
    next signal), `succeeded` (the validated answer stored as the job's output, `output_hash`)
    or `failed` (the attempt is spent, `error_code` says why)."""

    status: str
    output_hash: str = ""
    error_code: str = ""


@dataclass(frozen=True)
class BatchLeaveResult:
    """`left`: the job's live item was cancelled; `poked`: its submitted batch has no live item
    any more and was told to poll now (and so cancel itself at the provider)."""

    left: bool
    poked: bool = False


# The gate reasons whose wait is exact: a provider limit's bucket refills at a known rate.
LIMIT_WAITS = frozenset({"rpm", "tpm", "concurrency", "announced"})


@dataclass(frozen=True)
class ReuseInput:
    job_id: str  # the stage reads the job's source itself


@dataclass(frozen=True)
class ReuseResult:
    """`copied` (the source's answer is the job's: `output_hash`; PROJECT next), `wait` (the
    source is still active: wait for its `reuse-source-ended` signal), `run` (nothing to reuse:
    EXECUTE makes the job's own call) or `ended` (the job ended before: `lifecycle_status`)."""

    action: str
    output_hash: str = ""
    lifecycle_status: str = ""
    # `wait` on a source the stage moved to just now: wait at most this long for its signal.
    look_again_s: float = 0.0


@dataclass(frozen=True)
class MergeInput:
    job_id: str  # MERGE reads the job's succeeded chunks itself


@dataclass(frozen=True)
class MergeResult:
    output_hash: str  # of the merged output, stored as the job's output
    item_count: int  # distinct items kept


@dataclass(frozen=True)
class ProjectInput:
    job_id: str
    output_hash: str


@dataclass(frozen=True)
class ProjectResult:
    lifecycle_status: str
    artifact_count: int
    # The job's usage, summed in PROJECT's transaction (its "job completed" log line).
    calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_micros: int = 0
    # True when the four figures above are that sum (a retry that found the job already ended
    # carries none: COMPLETE then reads it itself).
    summarized: bool = False


@dataclass(frozen=True)
class CompleteInput:
    job_id: str
    # The usage summary PROJECT read in the transaction that ended the job, which COMPLETE
    # reports; None (a PROJECT that found the job ended): it reads it.
    usage: CompleteResult | None = None


@dataclass(frozen=True)
class CompleteResult:
    calls: int
    tokens_in: int
    tokens_out: int
    cost_micros: int


@dataclass(frozen=True)
class FinalizeFailedInput:
    job_id: str
    code: str


@dataclass(frozen=True)
class FinalizeResult:
    """The job's terminal state after finalizing: what actually won any race."""

    lifecycle_status: str


@dataclass(frozen=True)
class FlowExpireInput:
    """A job's start-by TTL (`JOB_EXPIRED`) or deadline (`JOB_DEADLINE_EXCEEDED`) came while its
    workflow waited."""

    job_id: str
    code: str


@dataclass(frozen=True)
class FlowExpireResult:
    """`ended`: the job ended (or, running, was asked to: its deadline), and the run stops
    waiting; False: a TTL that came after the job started (it no longer applies)."""

    ended: bool
    lifecycle_status: str = ""


@dataclass(frozen=True)
class JobWorkflowResult:
    job_id: str
    lifecycle_status: str
    error_code: str | None = None
    output_hash: str | None = None


@dataclass(frozen=True)
class RelayShardInput:
    """A relay shard's workflow input. `run_for_s` bounds one activity run: the workflow then
    continues as new, so its history stays a dozen events whatever the relay's uptime."""

    shard: int
    run_for_s: float = 3600.0


@dataclass(frozen=True)
class RelayShardResult:
    """`retired`: this shard is not among the worker's `RELAY_SHARDS` any more (a version that
    runs fewer), so its workflow ends instead of continuing as new."""

    dispatched: int = 0
    retired: bool = False


@dataclass(frozen=True)
class RelayProgress:
    """The relay activity's heartbeat details, what the Temporal UI shows of it: counts, times
    (ISO 8601) and an error's type or kind, never a message (a driver's repeats parameters)."""

    shard: int
    dispatched: int  # rows claimed and settled by this attempt
    started: int  # workflows it started
    batches: int
    last_batch: int
    last_batch_at: str | None = None
    last_error: str | None = None
    last_error_at: str | None = None


@dataclass(frozen=True)
class ReconcileResult:
    expired_locks_failed: int = 0
    outbox_requeued: int = 0
    snapshots_deleted: int = 0
    cancels_resent: int = 0
    details: list[str] = field(default_factory=list)
    stuck_workflows: int = 0
    enqueues_revived: int = 0
    private_data_purged: int = 0
    outbox_deleted: int = 0
    # Enqueue rows of jobs that ended while the row was parked, closed (published, with reason).
    enqueues_closed: int = 0
    # What the pass cost Temporal: every RPC (describe, visibility page, cancel, start), and how
    # many of them were describes. Bounded per pass whatever the backlog.
    temporal_calls: int = 0
    workflows_described: int = 0
    # Phases that raised or overran their time budget (the others ran), and phases that
    # stopped at a per-pass cap or their budget and left the rest for the next pass.
    failed_phases: list[str] = field(default_factory=list)
    phases_cut_short: list[str] = field(default_factory=list)
    # Jobs whose workflow closed because a finalizer gave up, ended as it was ending them.
    finalizers_ended: int = 0


@dataclass(frozen=True)
class BulkInput:
    """A bulk operation's workflow input: its id, its action and its pacing, fixed at submission.
    `after_ordinal` is where a continued-as-new run resumes (items are numbered from 1)."""

    operation_id: str
    action: str  # "cancel" | "retry"
    page_size: int
    jobs_per_second: float
    after_ordinal: int = 0


@dataclass(frozen=True)
class BulkPageInput:
    operation_id: str
    action: str
    after_ordinal: int
    page_size: int
    jobs_per_second: float


@dataclass(frozen=True)
class BulkPageResult:
    """`last_ordinal`: the highest item ordinal this page reached; `more`: items may follow."""

    last_ordinal: int
    processed: int
    more: bool


@dataclass(frozen=True)
class BulkResult:
    operation_id: str
    matched: int
    done: int
    skipped: int
    failed: int
