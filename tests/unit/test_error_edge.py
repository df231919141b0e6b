"""One error edge: db/errors.py decides what a driver error means (a unique violation, the
lifecycle trigger, an unreachable database), so nothing outside db/ imports or names
`sqlalchemy.exc` or psycopg's errors. Checked on the source, like the layer table."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Every package of ours above db/ (docs/architecture.md's layer table).
ABOVE_DB = ("engine", "providers", "jobs", "workflows", "activities", "api", "runtime")
DRIVER_ERROR_MODULES = ("sqlalchemy.exc", "psycopg.errors")


def _error_name(name: str) -> bool:
    """psycopg's exception classes all end in Error or Warning (psycopg.Error,
    psycopg.OperationalError, ...); its connection and cursor classes do not."""
    return name.endswith(("Error", "Warning")) or name == "errors"


def driver_error_uses(source: str) -> list[str]:
    """What in `source` reaches for a driver's errors: imports of their modules or classes,
    and attribute paths such as `sqlalchemy.exc.X` or `psycopg.OperationalError`."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith(DRIVER_ERROR_MODULES)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith(DRIVER_ERROR_MODULES):
                found.append(node.module)
            elif node.module == "sqlalchemy" and any(a.name == "exc" for a in node.names):
                found.append("sqlalchemy.exc")
            elif node.module == "psycopg":
                found += [f"psycopg.{a.name}" for a in node.names if _error_name(a.name)]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "psycopg" and _error_name(node.attr):
                found.append(f"psycopg.{node.attr}")
            elif node.value.id == "sqlalchemy" and node.attr == "exc":
                found.append("sqlalchemy.exc")
    return found


def test_nothing_above_db_touches_driver_errors() -> None:
    bad = {
        str(path.relative_to(ROOT)): uses
        for package in ABOVE_DB
        for path in sorted((ROOT / package).rglob("*.py"))
        if (uses := driver_error_uses(path.read_text()))
    }
    assert not bad, f"ask db/errors.py instead of inspecting driver errors: {bad}"


def test_the_checker_sees_each_form() -> None:
    # Guards the test itself: every spelling of a driver-error import is caught, and the
    # driver's connection types (which the LISTEN loops need) are not.
    for source in (
        "from sqlalchemy.exc import DBAPIError",
        "import sqlalchemy.exc",
        "from sqlalchemy import exc",
        "from psycopg import Error",
        "from psycopg import errors",
        "from psycopg.errors import UniqueViolation",
        "import psycopg\nx = psycopg.OperationalError",
        "import psycopg.errors",
    ):
        assert driver_error_uses(source), source
    assert not driver_error_uses("import psycopg\nc: psycopg.AsyncConnection[object]")
    # db/ itself is the edge: it does import them.
    assert driver_error_uses((ROOT / "db" / "errors.py").read_text())
