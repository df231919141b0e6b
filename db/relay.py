"""The outbox relay's two hot transactions, each one round trip (docs/architecture.md).

The relay (activities/relay.py) claims a batch, starts its workflows outside any transaction,
then marks the batch published. Both transactions are short and their parameters known up
front, so each goes as `BEGIN; <statements>; COMMIT` in one psycopg pipeline (db/pipeline.py)
instead of a session's round trip per statement: at the relay's rate that is most of its
database cost. The claim's statement lives here; the publish sends db/outbox.py's and
db/webhook_deliveries.py's own, so each statement has one home. A batch with failures settles
through the session functions of db/outbox.py instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from db import pipeline
from db.outbox import COLUMNS, ENQUEUE, MARK_PUBLISHED, RELEASE_EXPIRED, UUID_RE, OutboxRow
from db.session import SessionMaker
from db.webhook_deliveries import FAN_OUT, fan_out_params

# The claims of all relays are serialized by this transaction-scoped advisory lock, taken as the
# claim transaction's first statement: the claim then reads its users' windows in a snapshot
# taken after the previous claim committed, so concurrent shards never overshoot a window. A
# claim is one short statement; the dispatch, the slow part, stays parallel.
CLAIM_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended('aijobs:relay-claim', 0))")

# USER_DISPATCH_WINDOW's default (engine/settings.py).
DEFAULT_WINDOW = 4
_ENQUEUE_SQL = f"'{ENQUEUE}'"
# A job not dispatched yet (its enqueue row waits in the outbox), whether or not it is due.
_UNDISPATCHED_SQL = "dispatched_at IS NULL AND lifecycle_status = 'queued'"
# One the window may dispatch: not dispatched and due (`ix_ai_job_undispatched`).
_HELD_JOB_SQL = f"{_UNDISPATCHED_SQL} AND due_at IS NULL"

# A by-design wait: a wait the client or the engine chose, not one for capacity (a slot, a
# provider limit). It takes no room in its user's dispatch window, or one user's background
# work would hold that user's interactive jobs for as long. Two kinds:
#
# - Before dispatch, a due time: `ai_job.due_at` (and the enqueue row's `available_at`). The
#   job is left out of the window's scan until then and the relay wakes at the earliest due
#   time (`NEXT_DUE`), so it starts on time without a poll per job. A delayed job's `runAt`
#   is one; a debounce delay sets `due_at` (and `available_at`) the same way at create.
# - After dispatch, a predicate over the dispatched job `d` that has not ended: the job waits
#   without a worker slot by design (an operator pause's hold: `ai_pause_hold`).
#
# Once the wait is over the job counts again (an off-peak job whose window opened runs, and may
# briefly take its user past the window: the window bounds dispatch, not calls).
BY_DESIGN_WAITS: dict[str, str] = {
    # Its batch runs up to 24 h at the provider.
    "batch": "d.service_tier = 'batch'",
    # Held for its provider's discount window.
    "offpeak": "d.service_tier = 'offpeak' AND d.lifecycle_status = 'queued'",
    # Dispatched before its runAt by an earlier version (its workflow sleeps until then).
    "delayed": "d.run_at > now() AND d.lifecycle_status = 'queued'",
    # A reuser waiting for its source (the source counts, if it is dispatched).
    "reuse": (
        "d.reused_from_job_id IS NOT NULL AND d.lifecycle_status = 'queued' AND EXISTS ("
        "SELECT 1 FROM ai_job s WHERE s.id = d.reused_from_job_id"
        " AND s.lifecycle_status IN ('queued', 'running'))"
    ),
    # Held by an operator pause before its call (jobs/pauses.py): no slot, no attempt spent.
    "operator_pause": "EXISTS (SELECT 1 FROM ai_pause_hold h WHERE h.job_id = d.id)",
}
# NULL-safe: `NOT` of an unknown predicate would leave the job out of the count.
_PARKED_SQL = "coalesce(" + " OR ".join(f"({p})" for p in BY_DESIGN_WAITS.values()) + ", false)"

# One claim, sent pipelined by `claim` after `CLAIM_LOCK`, in three parts:
# - window: for each user with due jobs not yet dispatched (a loose index scan of
#   `ix_ai_job_undispatched`: one probe per such user; jobs not due are not in it), room =
#   :window minus the user's dispatched jobs that have not ended (`ix_ai_job_user_dispatched`,
#   counted up to :window), less those in a by-design wait (`BY_DESIGN_WAITS`);
#   the user's first `room` undispatched jobs in (priority, created_at, id) order whose enqueue
#   row is pending and due; up to :lim of them, oldest first. Their jobs are marked dispatched
#   in the same statement, so the next claim counts them.
# - ready: up to :lim due pending rows that are not held (`ix_outbox_event_ready`), oldest
#   first: job events, bulk starts, enqueue rows of jobs dispatched before (a retry after a
#   failed dispatch, an expired claim, a re-enqueue) or of no waiting job (they go out as they
#   always did). An enqueue row of a job not yet dispatched is claimed only through the window:
#   if the window did not pick it (no room, or not due: a due time that came before its row's
#   `available_at`), it is held (`held_at`), still `pending`, and leaves the ready index, so
#   held rows cost the claim nothing however many there are.
# - the claimed rows (ready and windowed) go `processing`.
# Rows another relay holds are skipped, not waited for (SKIP LOCKED). Every claimed row was
# `pending` when this statement locked it (a locked row's newest version is read: `ready`'s
# condition; `windowed` reads the status as a column, not a condition, so its rows are found by
# id through the primary key), and the last UPDATE finds them by id alone. As conditions, the
# planner read both through the partial index of every pending row, filtered by id.
# Each job's enqueue row (in `pick`) and each row's job (in `ready`) is looked up by a
# per-row probe (a LATERAL ... LIMIT 1, an EXISTS), not joined: with no statistics yet (fresh
# or truncated tables taking a burst) the planner costed the joins as one-row scans and chose
# nested loops that read the whole backlog per row, a claim taking 1.1 s at 800 waiting jobs
# and 4.2 s at 3,200 (the probes: 86 and 200 ms, the same as with statistics). The enqueue
# row's probe has an index of its own (`ix_outbox_event_pending_enqueue`, by job): through the
# index of every pending row it read the backlog once per waiting job.
CLAIM = text(
    f"""
    WITH RECURSIVE waiting_users(user_id) AS (
        (SELECT user_id FROM ai_job WHERE {_HELD_JOB_SQL} ORDER BY user_id LIMIT 1)
        UNION ALL
        SELECT (SELECT j.user_id FROM ai_job j
                WHERE j.{_HELD_JOB_SQL} AND j.user_id > u.user_id
                ORDER BY j.user_id LIMIT 1)
        FROM waiting_users u WHERE u.user_id IS NOT NULL),
    room AS (
        SELECT u.user_id, :window - (
            SELECT count(*) FROM (
                SELECT 1 FROM ai_job d
                WHERE d.user_id = u.user_id AND d.dispatched_at IS NOT NULL
                  AND d.lifecycle_status IN ('queued', 'running') AND NOT {_PARKED_SQL}
                LIMIT :window) n) AS n
        FROM waiting_users u WHERE u.user_id IS NOT NULL),
    pick AS (
        SELECT h.event_id, h.job_id FROM room r
        CROSS JOIN LATERAL (
            SELECT o.id AS event_id, j.id AS job_id, j.created_at
            FROM ai_job j
            CROSS JOIN LATERAL (
                SELECT o.id FROM outbox_event o
                WHERE o.aggregate_id = j.id::text AND o.event_type = {_ENQUEUE_SQL}
                  AND o.status = 'pending' AND o.available_at <= now()
                LIMIT 1) o
            WHERE j.user_id = r.user_id AND j.{_HELD_JOB_SQL}
            ORDER BY j.priority, j.created_at, j.id
            LIMIT r.n) h
        WHERE r.n > 0
        ORDER BY h.created_at LIMIT :lim),
    windowed AS (
        SELECT o.id, o.status = 'pending' AS pending FROM outbox_event o
        WHERE o.id = ANY(ARRAY(SELECT event_id FROM pick))
        FOR UPDATE SKIP LOCKED),
    ready AS (
        SELECT o.id, (o.event_type = {_ENQUEUE_SQL} AND EXISTS (
                   SELECT 1 FROM ai_job j
                   WHERE j.id = CASE WHEN o.aggregate_id ~* '{UUID_RE}'
                                     THEN o.aggregate_id::uuid END
                     AND j.{_UNDISPATCHED_SQL})) AS waits
        FROM outbox_event o
        WHERE o.status = 'pending' AND o.held_at IS NULL AND o.available_at <= now()
        ORDER BY o.available_at, o.id
        LIMIT :lim
        FOR UPDATE OF o SKIP LOCKED),
    held AS (
        UPDATE outbox_event o SET held_at = now()
        WHERE o.id = ANY(ARRAY(SELECT id FROM ready WHERE waits
                               EXCEPT SELECT id FROM windowed))),
    dispatched AS (
        UPDATE ai_job j SET dispatched_at = now()
        WHERE j.id = ANY(ARRAY(SELECT p.job_id FROM pick p
                               JOIN windowed w ON w.id = p.event_id AND w.pending))
          AND j.dispatched_at IS NULL)
    UPDATE outbox_event o SET status = 'processing', locked_by = :owner,
           locked_at = now(), attempt_count = o.attempt_count + 1, held_at = NULL
    WHERE o.id = ANY(ARRAY(SELECT id FROM ready WHERE NOT waits
                           UNION SELECT id FROM windowed WHERE pending))
    RETURNING {", ".join("o." + c.strip() for c in COLUMNS.split(","))}
    """
)

# The claim's first step, before `CLAIM`: the jobs whose due time has passed become due (the
# window may now dispatch them). `ix_ai_job_due`: one probe when none is due. A job locked
# meanwhile (a cancel) is skipped and made due by the next claim.
MAKE_DUE = text(
    """
    UPDATE ai_job SET due_at = NULL
    WHERE id IN (SELECT id FROM ai_job WHERE due_at <= now()
                 ORDER BY due_at LIMIT :lim FOR UPDATE SKIP LOCKED)
    """
)
# The claim's last step: seconds from now until the next due time, the sooner of a job's
# (`ix_ai_job_due`) and a pending row's that is not due yet (a dispatch retry backing off:
# `ix_outbox_event_ready`), and until the next start-by time or deadline of a job not
# dispatched yet (flow control: the relay expires it, jobs/flow.py `expire_undispatched`;
# `ix_ai_job_expires_undispatched`, `ix_ai_job_deadline_undispatched`); NULL: none. The relay
# sleeps no longer than that, so a delayed or debounced job starts, and an undispatched job
# expires, at its time without a poll per job.
NEXT_DUE = text(
    """
    SELECT extract(epoch FROM least(
        (SELECT min(due_at) FROM ai_job WHERE due_at IS NOT NULL),
        (SELECT min(available_at) FROM outbox_event
         WHERE status = 'pending' AND held_at IS NULL AND available_at > now()))
        - clock_timestamp()) AS due_in_s,
      extract(epoch FROM least(
        (SELECT min(expires_at) FROM ai_job WHERE lifecycle_status = 'queued'
         AND dispatched_at IS NULL AND expires_at IS NOT NULL),
        (SELECT min(deadline_at) FROM ai_job WHERE lifecycle_status = 'queued'
         AND dispatched_at IS NULL AND deadline_at IS NOT NULL))
        - clock_timestamp()) AS expire_in_s
    """
)

# Held enqueue rows whose job ended without being dispatched (cancelled while held, say) have
# nothing left to start: closed as published, the reason first in `last_error`. Bounded by the
# held rows (`ix_outbox_event_held`).
CLOSE_ENDED_HELD = text(
    f"""
    UPDATE outbox_event o SET status = 'published', published_at = now(), held_at = NULL,
           locked_by = NULL, locked_at = NULL,
           last_error = 'closed: job ' || j.lifecycle_status || ' while held by its window'
    FROM ai_job j
    WHERE o.status = 'pending' AND o.held_at IS NOT NULL
      AND j.id = CASE WHEN o.aggregate_id ~* '{UUID_RE}' THEN o.aggregate_id::uuid END
      AND j.lifecycle_status <> 'queued'
    RETURNING o.id
    """
)


class Claim(list[OutboxRow]):
    """The rows a claim took, in id order, and `due_in_s`: seconds from the claim to the next
    due time (a delayed or debounced job's, a backing-off row's), None when nothing is waiting
    for one; `expire_in_s`: to the next start-by time or deadline of a job not dispatched yet."""

    due_in_s: float | None = None
    # Seconds to the next start-by time or deadline of a job not dispatched yet; None: none.
    expire_in_s: float | None = None


# The enqueue row of a job that ended before it was dispatched (cancelled while its due time, or
# room in its window, was still to come) has nothing left to start: closed in the transaction
# that ended the job, so no workflow ever runs for it. A row a relay has claimed meanwhile, or
# is claiming (its row locked: SKIP LOCKED, so a cancel never waits on a claim, which may wait
# on the job's row the cancel holds), is left to it: its workflow sees the job ended at PREPARE,
# and a held row the claim left pending is closed by the relay's sweep (`CLOSE_ENDED_HELD`).
CLOSE_UNSENT = text(
    f"""
    UPDATE outbox_event SET status = 'published', published_at = now(), held_at = NULL,
           last_error = 'closed: job ended before it was dispatched'
    WHERE id IN (SELECT id FROM outbox_event
                 WHERE aggregate_id = :aid AND event_type = {_ENQUEUE_SQL} AND status = 'pending'
                 FOR UPDATE SKIP LOCKED)
    """
)


async def close_unsent(session: AsyncSession, job_id: object) -> bool:
    """`CLOSE_UNSENT` for the job, in the caller's transaction; True: a row was closed."""
    result = await session.execute(CLOSE_UNSENT, {"aid": str(job_id)})
    return bool(result.rowcount)  # type: ignore[attr-defined]


def _claimed(rows: Sequence[Any], due: Sequence[Any]) -> Claim:
    """`CLAIM`'s rows (mappings) as outbox rows, in id order, and `NEXT_DUE`'s answer."""
    out = Claim(sorted((OutboxRow(**r) for r in rows), key=lambda r: r.id))
    seconds = due[0]["due_in_s"] if due else None
    out.due_in_s = None if seconds is None else float(seconds)
    expiry = due[0]["expire_in_s"] if due else None
    out.expire_in_s = None if expiry is None else float(expiry)
    return out


# Whether enqueue rows are held by their users' windows after a claim (read in its transaction,
# so it sees what the claim held and admitted): the relay then wakes on job changes, which may
# make room (`ix_outbox_event_held`).
HOLDING = text(
    "SELECT EXISTS (SELECT 1 FROM outbox_event WHERE status = 'pending' "
    "AND held_at IS NOT NULL) AS holding"
)


@dataclass(frozen=True)
class Claimed:
    rows: list[OutboxRow]  # claimed, in id order
    holding: bool  # enqueue rows wait for room in their users' windows
    released: int = 0  # expired claims put back first
    closed: int = 0  # held rows of jobs that ended while held, closed
    # Seconds from the claim to the next due time (a delayed job's, a backing-off row's);
    # None: nothing waits for one.
    due_in_s: float | None = None
    # Seconds to the next start-by time or deadline of a job not dispatched yet; None: none.
    expire_in_s: float | None = None


async def claim_batch(
    sm: SessionMaker,
    *,
    owner: str,
    limit: int,
    window: int = DEFAULT_WINDOW,
    release_ttl_s: float | None = None,
    publish: Sequence[int] = (),
    ended: Sequence[int] = (),
) -> Claimed:
    """`claim`, and in the same transaction and round trip whether rows stay held. Before it:
    `publish`'s rows (dispatched by `owner`) marked published, with the webhook deliveries of
    `ended` (the job events among them), as `publish` does; with `release_ttl_s`, the expired
    claims put back (`RELEASE_EXPIRED`) and the held rows of ended jobs closed
    (`CLOSE_ENDED_HELD`). Jobs whose due time passed become due first (`MAKE_DUE`), and the
    next due time is read last (`NEXT_DUE`). The relay's marks and housekeeping cost no
    transaction of their own."""
    params = {"lim": limit, "owner": owner, "window": max(1, window)}
    statements: list[pipeline.Statement] = [(CLAIM_LOCK, {})]
    statements += _publish_statements(publish, ended, owner=owner)
    housekeeping = len(statements)
    if release_ttl_s is not None:
        statements += [(RELEASE_EXPIRED, {"ttl": release_ttl_s}), (CLOSE_ENDED_HELD, {})]
    statements += [(MAKE_DUE, {"lim": limit}), (CLAIM, params), (HOLDING, {}), (NEXT_DUE, {})]
    results = await pipeline.run(sm, statements, commit=True)
    released = closed = 0
    if release_ttl_s is not None:
        released, closed = len(results[housekeeping]), len(results[housekeeping + 1])
    rows = _claimed(results[-3], results[-1])
    holding = bool(results[-2][0]["holding"])
    return Claimed(list(rows), holding, released, closed, rows.due_in_s, rows.expire_in_s)


def _publish_statements(
    published: Sequence[int], ended: Sequence[int], *, owner: str
) -> list[pipeline.Statement]:
    if not published:
        return []
    statements: list[pipeline.Statement] = [
        (MARK_PUBLISHED, {"ids": list(published), "owner": owner})
    ]
    if ended:
        statements.append((FAN_OUT, fan_out_params(ended)))
    return statements


async def claim(sm: SessionMaker, *, owner: str, limit: int, window: int = DEFAULT_WINDOW) -> Claim:
    """Up to `limit` due pending rows that need no window, and up to `limit` held enqueue rows
    their users' windows (`window` dispatched jobs that have not ended, per user) have room
    for, claimed by `owner` and committed in one round trip, in id order. A user's held rows
    are admitted in (priority, created_at, id) order: priority orders a user's own jobs only.
    Rows another relay holds are skipped (SKIP LOCKED), so claims are disjoint; the claims
    themselves are serialized (`CLAIM_LOCK`), so no window is overshot; an enqueue row whose
    user has no room is left pending and held (`held_at`) for a later claim. Jobs whose due
    time passed become due first (`MAKE_DUE`); the next due time is read last (`NEXT_DUE`),
    all in the same round trip."""
    params = {"lim": limit, "owner": owner, "window": max(1, window)}
    [_, _, rows, due] = await pipeline.run(
        sm,
        [(CLAIM_LOCK, {}), (MAKE_DUE, {"lim": limit}), (CLAIM, params), (NEXT_DUE, {})],
        commit=True,
    )
    return _claimed(rows, due)


async def close_ended_held(session: AsyncSession) -> int:
    """`CLOSE_ENDED_HELD` in the caller's transaction; how many rows it closed."""
    result = await session.execute(CLOSE_ENDED_HELD)
    return int(result.rowcount)  # type: ignore[attr-defined]


async def publish(
    sm: SessionMaker, published: Sequence[int], ended: Sequence[int], *, owner: str
) -> None:
    """A batch every row of which went out: `published` (still `owner`'s) are marked published
    and `ended` (the job endings among them) become their owners' webhook deliveries, in one
    transaction and one round trip, so an ending is never published without its deliveries."""
    await pipeline.run(sm, _publish_statements(published, ended, owner=owner), commit=True)
