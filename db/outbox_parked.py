"""The reconciler's repair of parked enqueues (db/outbox.py): the `ai.job.enqueue` rows parked as
`dead` after their dispatch attempts, revived while their job still waits, closed once it ended."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from db.outbox import ENQUEUE, MAX_BACKOFF_S, NOTIFY, UUID_RE


@dataclass(frozen=True)
class ParkedPage:
    """What one page of `repair_parked_enqueues` did."""

    revived: list[tuple[int, str]]  # (event id, job id)
    closed: list[int]  # event ids
    seen: int  # parked rows looked at
    next_after: int  # the cursor after this page


# One page of parked enqueues (`repair_parked_enqueues`): each row's job status and whether it is
# due, then the revivals and the closings, then the page's last id and size, in one statement.
_REPAIR_PARKED = text(
    """
    WITH page AS (
        SELECT o.id, j.lifecycle_status AS job_status,
               (j.lifecycle_status = 'queued'
                AND o.payload->>'jobId' = o.aggregate_id
                AND o.payload ? 'jobType' AND o.payload ? 'queueName'
                AND o.available_at + make_interval(secs => least(:cap,
                      :base * power(2, least(o.revive_count, 20)))) <= now())
                   AS due
        FROM outbox_event o
        LEFT JOIN ai_job j ON j.id = CASE
            WHEN o.aggregate_id ~* :uuid_re THEN o.aggregate_id::uuid END
        WHERE o.event_type = :ev AND o.status = 'dead'
          AND o.id > :after
        ORDER BY o.id LIMIT :lim
    ),
    revived AS (
        UPDATE outbox_event o SET status = 'pending', attempt_count = 0,
               revive_count = o.revive_count + 1, available_at = now()
        FROM page p
        WHERE o.id = p.id AND p.due AND o.status = 'dead'
        RETURNING o.id, o.aggregate_id
    ),
    closed AS (
        UPDATE outbox_event o SET status = 'published', published_at = now(),
               locked_by = NULL, locked_at = NULL,
               last_error = left('closed: job ' || p.job_status
                   || ' while its enqueue was parked; last error: '
                   || coalesce(o.last_error, '-'), 2000)
        FROM page p
        WHERE o.id = p.id AND o.status = 'dead'
          AND p.job_status IN ('succeeded', 'failed', 'cancelled')
        RETURNING o.id
    )
    SELECT 'revived' AS kind, id, aggregate_id FROM revived
    UNION ALL SELECT 'closed', id, NULL FROM closed
    UNION ALL SELECT 'page', max(id), count(*)::text FROM page
    """
)


async def repair_parked_enqueues(
    session: AsyncSession,
    *,
    after_id: int,
    limit: int,
    base_s: float = 30.0,
    cap_s: float = MAX_BACKOFF_S,
) -> ParkedPage:
    """Reconciler, one page of the `ai.job.enqueue` rows parked as `dead` (attempts used up)
    with an id above `after_id`, in id order (the partial index
    `ix_outbox_event_parked_enqueue` holds these rows and the `failed` ones, which are never
    retried and so never looked at here), each looked at once:

    - its job is still `queued`: the row goes out again (`pending`, fresh attempts) once a
      capped backoff that grows with each revival has passed (`available_at` is when the
      row was parked plus its last backoff); a payload that does not name its job stays put;
    - its job ended (`succeeded`, `failed`, `cancelled`): nothing is left to dispatch, so the
      row is closed: `published` now, with the reason first in `last_error`; outbox
      retention deletes it with the other published rows;
    - otherwise (backoff not over, job `running`, no such job): left as it is.

    Closing is what keeps the set of parked rows made of rows that may still matter, so a
    page never fills up with rows of jobs that ended. `next_after` is the last id looked at
    (the caller's cursor); `seen` < `limit` means the end was reached."""
    rows = (
        await session.execute(
            _REPAIR_PARKED,
            {
                "ev": ENQUEUE,
                "base": base_s,
                "cap": cap_s,
                "lim": limit,
                "after": after_id,
                "uuid_re": UUID_RE,
            },
        )
    ).all()
    revived = [(int(r.id), str(r.aggregate_id)) for r in rows if r.kind == "revived"]
    closed = [int(r.id) for r in rows if r.kind == "closed"]
    (last,) = [r for r in rows if r.kind == "page"]
    if revived:
        await session.execute(NOTIFY)
    return ParkedPage(
        revived=revived,
        closed=closed,
        seen=int(last.aggregate_id),
        next_after=int(last.id) if last.id is not None else after_id,
    )
