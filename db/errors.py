"""Driver errors become domain questions at one edge (STYLE: procrastinate `wrap_exceptions`)."""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError

UNIQUE_VIOLATION = "23505"
LIFECYCLE_TRIGGER = "AJ001"  # raised by the ai_job lifecycle guard trigger


def sqlstate(exc: BaseException) -> str | None:
    orig = getattr(exc, "orig", exc)
    return getattr(orig, "sqlstate", None)


def constraint_name(exc: BaseException) -> str | None:
    orig = getattr(exc, "orig", exc)
    diag = getattr(orig, "diag", None)
    return getattr(diag, "constraint_name", None) if diag is not None else None


def is_unique_violation(exc: BaseException, constraint: str | None = None) -> bool:
    if not isinstance(exc, DBAPIError) or sqlstate(exc) != UNIQUE_VIOLATION:
        return False
    return constraint is None or constraint_name(exc) == constraint


def is_lifecycle_violation(exc: BaseException) -> bool:
    return sqlstate(exc) == LIFECYCLE_TRIGGER
