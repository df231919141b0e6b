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
from typing import Any

from sqlalchemy import text

from db import pipeline
from db.outbox import COLUMNS, MARK_PUBLISHED, OutboxRow
from db.session import SessionMaker
from db.webhook_deliveries import FAN_OUT, fan_out_params

# Up to :lim due pending rows, oldest first, claimed by :owner (rows another relay holds are
# skipped, not waited for), sent pipelined by `claim`.
CLAIM = text(
    f"""
    WITH c AS (
        SELECT id FROM outbox_event
        WHERE status = 'pending' AND available_at <= now()
        ORDER BY available_at, id
        LIMIT :lim
        FOR UPDATE SKIP LOCKED)
    UPDATE outbox_event o SET status = 'processing', locked_by = :owner,
           locked_at = now(), attempt_count = o.attempt_count + 1
    FROM c WHERE o.id = c.id AND o.status = 'pending'
    RETURNING {", ".join("o." + c.strip() for c in COLUMNS.split(","))}
    """
)


def _claimed(rows: Sequence[Any]) -> list[OutboxRow]:
    """`CLAIM`'s rows (mappings) as outbox rows, in id order."""
    return sorted((OutboxRow(**r) for r in rows), key=lambda r: r.id)


async def claim(sm: SessionMaker, *, owner: str, limit: int) -> list[OutboxRow]:
    """Up to `limit` due pending rows, claimed by `owner` and committed in one round trip, in
    id order. Rows another relay holds are skipped (SKIP LOCKED), so claims are disjoint."""
    [rows] = await pipeline.run(sm, [(CLAIM, {"lim": limit, "owner": owner})], commit=True)
    return _claimed(rows)


async def publish(
    sm: SessionMaker, published: Sequence[int], ended: Sequence[int], *, owner: str
) -> None:
    """A batch every row of which went out: `published` (still `owner`'s) are marked published
    and `ended` (the job endings among them) become their owners' webhook deliveries, in one
    transaction and one round trip, so an ending is never published without its deliveries."""
    statements: list[pipeline.Statement] = [
        (MARK_PUBLISHED, {"ids": list(published), "owner": owner})
    ]
    if ended:
        statements.append((FAN_OUT, fan_out_params(ended)))
    await pipeline.run(sm, statements, commit=True)
