"""A short transaction in one round trip, on the pooled psycopg connection itself.

The job stages' hot transactions are a few statements whose parameters are all known before the
first one runs (PREPARE's and COMPLETE's reads, RESOLVE's, EXECUTE's last write). Through an
`AsyncSession` each costs BEGIN, one round trip per statement and COMMIT or ROLLBACK, every one
of them bridged through a greenlet and SQLAlchemy's result machinery. `run` sends
`BEGIN; <statements>; COMMIT` (or `ROLLBACK`, for a read) as one psycopg pipeline, on a
connection checked out of the same SQLAlchemy pool, and returns every statement's rows: the
same statements in the same single transaction, so the same commits (a read still ends in
ROLLBACK, which `xact_commit` does not count) and the same effects, in one round trip.

`in_session` pipelines statements inside a session's open transaction instead (PROJECT's
artifacts, terminal CAS, event and usage summary, after its projector ran through the session).

The statements are the repositories' own `text()` constants, compiled once for psycopg (so the
SQL has one home). A driver error comes out as SQLAlchemy would have raised it (`DBAPIError`
and its subclasses, parameters hidden, `connection_invalidated` when the connection broke, which
is then dropped from the pool), so `db/errors.py` answers the same questions about it.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.pq import ExecStatus, TransactionStatus
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from sqlalchemy import TextClause
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql.psycopg import PGDialectAsync_psycopg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.util import greenlet_spawn

from db.session import SessionMaker

Row = dict[str, Any]
Statement = tuple[TextClause, Mapping[str, Any]]

_DIALECT = PGDialectAsync_psycopg()  # type: ignore[no-untyped-call]
_BEGIN, _COMMIT, _ROLLBACK = b"BEGIN", b"COMMIT", b"ROLLBACK"
_TUPLES = (ExecStatus.TUPLES_OK, ExecStatus.SINGLE_TUPLE, ExecStatus.TUPLES_CHUNK)


@dataclass(frozen=True)
class _Compiled:
    sql: str  # psycopg's %(name)s placeholders
    jsonb: frozenset[str]  # parameters bound as jsonb (the statement's JSONB bindparams)


_compiled_cache: dict[int, tuple[TextClause, _Compiled]] = {}


def compiled(stmt: TextClause) -> _Compiled:
    """`stmt` as psycopg takes it, compiled once per statement object."""
    hit = _compiled_cache.get(id(stmt))
    if hit is not None and hit[0] is stmt:
        return hit[1]
    done = stmt.compile(dialect=_DIALECT)
    jsonb = frozenset(n for n, bp in done.binds.items() if isinstance(bp.type, JSONB))
    out = _Compiled(str(done), jsonb)
    _compiled_cache[id(stmt)] = (stmt, out)
    return out


def _params(c: _Compiled, params: Mapping[str, Any]) -> Mapping[str, Any]:
    if not c.jsonb:
        return params
    return {k: Jsonb(v) if k in c.jsonb and v is not None else v for k, v in params.items()}


_engines: weakref.WeakKeyDictionary[SessionMaker, AsyncEngine] = weakref.WeakKeyDictionary()


def _engine(sm: SessionMaker) -> AsyncEngine:
    """The engine `sm` binds its sessions to, read once per sessionmaker from a session's
    public `bind` (a session that never connects costs nothing to drop)."""
    engine = _engines.get(sm)
    if engine is None:
        bind = sm().bind
        if not isinstance(bind, AsyncEngine):
            raise TypeError("the stages' sessionmaker must be bound to one AsyncEngine")
        engine = _engines[sm] = bind
    return engine


async def run(
    sm: SessionMaker, statements: Sequence[Statement], *, commit: bool
) -> list[list[Row]]:
    """BEGIN, `statements` in order, then COMMIT (`commit`) or ROLLBACK, in one round trip;
    each statement's rows (as dicts; [] for a statement that returns none). The transaction
    is all or nothing: an error in any statement rolls it back and is raised."""
    async with transaction(sm) as tx:
        return await tx.run(statements, commit=commit, rollback=not commit)


class Transaction:
    """One transaction on a pooled connection whose statements go in pipelined batches: the
    first batch carries the BEGIN, `run(..., commit=True)` or `commit()` ends it with a COMMIT,
    and a transaction not committed when its block ends is rolled back. For a transaction
    whose later statements depend on what its first ones read (PROJECT: the job, then its
    projection), one round trip per batch instead of one per statement."""

    def __init__(self, raw: psycopg.AsyncConnection[Any]) -> None:
        self._raw = raw
        self._begun = False
        self._ended = False

    async def run(
        self, statements: Sequence[Statement], *, commit: bool = False, rollback: bool = False
    ) -> list[list[Row]]:
        """`statements` in order in this transaction, in one round trip (ending it with a
        COMMIT when `commit`, a ROLLBACK when `rollback`); each one's rows. An error aborts the
        transaction and is raised as SQLAlchemy would raise it."""
        if self._ended:
            raise RuntimeError("the transaction has ended")
        raw = self._raw
        try:
            async with raw.pipeline():
                if not self._begun:
                    await raw.cursor().execute(_BEGIN, prepare=False)
                    self._begun = True
                cursors = await _queue(raw, statements)
                if commit or rollback:
                    await raw.cursor().execute(_COMMIT if commit else _ROLLBACK, prepare=False)
                    self._ended = True
            return await _rows(cursors)
        except psycopg.Error as exc:
            self._ended = True
            raise _dbapi_error(exc, raw) from exc

    async def commit(self) -> None:
        """COMMIT, in a round trip of its own."""
        await self.run((), commit=True)


async def _queue(
    raw: psycopg.AsyncConnection[Any], statements: Sequence[Statement]
) -> list[psycopg.AsyncCursor[Row]]:
    """`statements` queued in `raw`'s open pipeline, a cursor each."""
    cursors: list[psycopg.AsyncCursor[Row]] = []
    for stmt, params in statements:
        c = compiled(stmt)
        cur = raw.cursor(row_factory=dict_row)
        await cur.execute(c.sql, _params(c, params))
        cursors.append(cur)
    return cursors


async def _rows(cursors: Sequence[psycopg.AsyncCursor[Row]]) -> list[list[Row]]:
    """Each statement's rows ([] for one that returns none), once its pipeline has synced."""
    return [await cur.fetchall() if _has_rows(cur) else [] for cur in cursors]


def _has_rows(cur: psycopg.AsyncCursor[Row]) -> bool:
    """Whether the statement returned a result set (what `description is not None` says,
    without building a `Column` for each of its columns: the job row has about sixty)."""
    res = cur.pgresult
    return res is not None and (res.nfields > 0 or res.status in _TUPLES)


def _dbapi_error(exc: psycopg.Error, raw: psycopg.AsyncConnection[Any]) -> Exception:
    return DBAPIError.instance(
        None,
        None,
        exc,
        psycopg.Error,
        hide_parameters=True,
        connection_invalidated=raw.broken or raw.closed,
    )


@contextlib.asynccontextmanager
async def transaction(sm: SessionMaker) -> AsyncIterator[Transaction]:
    """A `Transaction` on a connection of `sm`'s pool, rolled back unless committed."""
    # The pool's connection itself, without an engine-level Connection around it: checkout
    # and return are one greenlet hop each (the check-in's reset needs one), not three.
    try:
        fairy = await _engine(sm).raw_connection()
    except psycopg.Error as exc:
        # The pool hands out the driver's own error when it cannot connect (SQLAlchemy wraps
        # it only on its Connection path): wrap it as that path would, so that a database
        # that is down reads as unavailable here too and the stages wait for it.
        raise DBAPIError.instance(
            None, None, exc, psycopg.Error, hide_parameters=True, connection_invalidated=True
        ) from exc
    raw: psycopg.AsyncConnection[Any] = fairy.driver_connection  # type: ignore[assignment]
    # Our own BEGIN goes into the first pipeline with the statements (psycopg's implicit one
    # would cost a round trip of its own, the pipeline syncing after it), so the connection
    # runs in autocommit mode; it is back in its pool's mode on the way out. The statements
    # keep the extended protocol, so psycopg still prepares them after their fifth use.
    try:
        await raw.set_autocommit(True)
        yield Transaction(raw)
    except psycopg.Error as exc:  # set_autocommit on a broken connection
        raise _dbapi_error(exc, raw) from exc
    finally:
        # Back to the pool only as the sessions expect it (no transaction open, not autocommit);
        # a connection that broke, or whose state is unknown because this was interrupted, is
        # closed and never handed out again.
        reset = False
        try:
            if not (raw.broken or raw.closed):
                if raw.info.transaction_status != TransactionStatus.IDLE:
                    await raw.execute(_ROLLBACK, prepare=False)  # not committed, or failed
                await raw.set_autocommit(False)
                reset = True
        except psycopg.Error:
            pass  # invalidated below; the caller hears of the error that came first
        finally:
            if raw.broken:
                # The server went away: so did every connection pooled beside this one. The
                # engine's pool is replaced (its idle connections closed; those checked out
                # are dropped as they come back), so the next checkout opens a fresh
                # connection instead of failing on a dead one.
                await _engine(sm).dispose()
            if not reset:
                await greenlet_spawn(fairy.invalidate)
            await greenlet_spawn(fairy.close)  # an invalidated one is dropped, not pooled


async def in_session(s: AsyncSession, statements: Sequence[Statement]) -> list[list[Row]]:
    """`statements` in order, pipelined in `s`'s open transaction (or savepoint) on its own
    connection: one round trip for all of them, each one's rows back; the session commits or
    rolls back as it would have. An error is raised as SQLAlchemy raises it, and aborts the
    transaction as a failed statement of the session would."""
    conn = await s.connection()
    fairy = await conn.get_raw_connection()
    raw: psycopg.AsyncConnection[Any] = fairy.driver_connection  # type: ignore[assignment]
    try:
        async with raw.pipeline():
            cursors = await _queue(raw, statements)
        return await _rows(cursors)
    except psycopg.Error as exc:
        if raw.broken or raw.closed:
            await conn.invalidate()
        raise _dbapi_error(exc, raw) from exc
