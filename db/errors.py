"""Driver errors become domain questions at one edge: every decision about what a database error
means (a unique violation, the lifecycle trigger, an unreachable database) is taken here, and the
rest of the code asks these functions instead of inspecting driver exceptions. Nothing outside
db/ imports `sqlalchemy.exc` or psycopg's errors (tests/unit/test_error_edge.py): code above
catches `Exception` and asks here what it was."""

from __future__ import annotations

import psycopg
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

UNIQUE_VIOLATION = "23505"
LIFECYCLE_TRIGGER = "AJ001"  # raised by the ai_job lifecycle guard trigger


def sqlstate(exc: BaseException) -> str | None:
    orig = getattr(exc, "orig", exc)
    return getattr(orig, "sqlstate", None)


def constraint_name(exc: BaseException) -> str | None:
    orig = getattr(exc, "orig", exc)
    diag = getattr(orig, "diag", None)
    return getattr(diag, "constraint_name", None) if diag is not None else None


def is_driver_error(exc: BaseException) -> bool:
    """An error raised by the database driver (wrapped by SQLAlchemy or not): its text may
    repeat statement parameters, so callers show its SQLSTATE, never its message."""
    return isinstance(exc, (DBAPIError, psycopg.Error))


def is_unique_violation(exc: BaseException, constraint: str | None = None) -> bool:
    if not isinstance(exc, DBAPIError) or sqlstate(exc) != UNIQUE_VIOLATION:
        return False
    return constraint is None or constraint_name(exc) == constraint


def is_insufficient_privilege(exc: BaseException) -> bool:
    """The role may not do this (SQLSTATE 42501): e.g. ANALYZE of a table it does not own."""
    return sqlstate(exc) == "42501"


def is_lifecycle_violation(exc: BaseException) -> bool:
    return sqlstate(exc) == LIFECYCLE_TRIGGER


# The driver errors that mean "PostgreSQL cannot be reached right now", whatever the statement:
# the API answers them with 503, the activities wait for the database to come back.
UNAVAILABLE_ERRORS: tuple[type[DBAPIError], ...] = (OperationalError, InterfaceError)
# The driver's own, unwrapped: a pool that cannot connect raises them. A pool whose every
# connection is busy past its timeout (SQLAlchemy's TimeoutError) is a database that cannot keep
# up, not a bug of the caller: it is waited out too.
ALL_UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    *UNAVAILABLE_ERRORS,
    psycopg.OperationalError,
    psycopg.InterfaceError,
    PoolTimeoutError,
)


# A statement PostgreSQL stopped (statement_timeout: 57014 query_canceled) or refused for a
# lock it could not get (lock_timeout, NOWAIT: 55P03 lock_not_available). The driver raises them
# as OperationalError like a lost connection, but the database is up and answered: the same
# statement on the same data may stop the same way on every try, so waiting them out could
# last for ever. Callers bound their retries instead (is_statement_fault).
STATEMENT_FAULTS = frozenset({"57014", "55P03"})


def is_statement_fault(exc: BaseException) -> bool:
    """A statement timeout or a lock not available: not an outage (see STATEMENT_FAULTS); a
    bookkeeping stage counts it toward its bound, EXECUTE retries it a bounded number of times."""
    return is_driver_error(exc) and sqlstate(exc) in STATEMENT_FAULTS


def is_unavailable(exc: BaseException) -> bool:
    """Lost connections and the like: worth waiting for PostgreSQL to come back. The driver's
    own errors count too, unwrapped, as a pool that cannot connect raises them. A statement
    fault (a timeout, a lock not available) is not one, whatever class the driver gives it."""
    if is_statement_fault(exc):
        return False
    return isinstance(exc, ALL_UNAVAILABLE_ERRORS) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    )


def is_refused_value(exc: BaseException) -> bool:
    """The database refused a value of the statement (SQLSTATE class 22, a data exception: a
    NUL in a text or json value, a malformed escape), or the driver could not encode it for
    the wire (an unpaired surrogate): the statement cannot succeed with that value, whatever
    the retries."""
    state = sqlstate(exc)
    if state is not None and str(state).startswith("22"):
        return True
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            break
        if isinstance(seen, UnicodeError):
            return True
        seen = getattr(seen, "orig", None) or seen.__cause__
    return False
