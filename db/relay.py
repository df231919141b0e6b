"""The outbox relay's two hot transactions, each one round trip (docs/architecture.md).

The relay (activities/relay.py) claims a batch, starts its workflows outside any transaction,
then marks the batch published. Both transactions are short and their parameters known up
front, so each goes as `BEGIN; <statements>; COMMIT` in one psycopg pipeline (db/pipeline.py)
instead of a session's round trip per statement: at the relay's rate that is most of its
database cost. The statements are db/outbox.py's and db/webhooks.py's own, so the SQL keeps
one home; a batch with failures settles through the session functions of db/outbox.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from db import pipeline
from db.outbox import CLAIM, MARK_PUBLISHED, OutboxRow, claimed
from db.session import SessionMaker
from db.webhook_deliveries import FAN_OUT, fan_out_params


async def claim(sm: SessionMaker, *, owner: str, limit: int) -> list[OutboxRow]:
    """Up to `limit` due pending rows, claimed by `owner` and committed in one round trip, in
    id order. Rows another relay holds are skipped (SKIP LOCKED), so claims are disjoint."""
    [rows] = await pipeline.run(sm, [(CLAIM, {"lim": limit, "owner": owner})], commit=True)
    return claimed(rows)


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
