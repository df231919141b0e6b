"""Only db/ speaks SQL. No module of activities/, jobs/ or api/ reaches the transport
(db/pipeline.py), holds a statement of db/'s (a module-level `text(...)`, any other executable
SQLAlchemy construct, or a string of SQL) or builds one with SQLAlchemy's statement builders:
each goes through a named db/ function, so a query has one home and one form, and the
transport stays private to db/.

Excepted, because a job type's projection is SQL it plans for PROJECT to send: the job-type
modules (jobs/types/) and the projector support of jobs/spec.py, which may use the transport
and its `Statement` type (and nothing else of db/'s that is SQL).

A db/ module's upper-case constants are not all statements: event types (ENQUEUE, COMPLETED),
statuses (DONE, SKIPPED), channel names and column lists are plain names. Each imported or
referenced constant is told apart by importing its db/ module and looking at its value.
Checked on the source."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Executable, TextClause

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("activities", "jobs", "api")
# A job type plans its business rows as SQL (docs/adding-a-job-type.md).
EXEMPT_DIRS = ("jobs/types/",)
# What each excepted module may take of db/'s SQL: the transport and its statement type.
ALLOWED = {"jobs/spec.py": {"db.pipeline", "db.pipeline.Statement"}}
# Modules that may build statements with SQLAlchemy themselves (the projector support).
BUILDERS_ALLOWED = {"jobs/spec.py"}
SQL_VERBS = {"SELECT", "INSERT", "UPDATE", "DELETE", "WITH", "MERGE", "LOCK", "NOTIFY", "LISTEN"}
BUILDERS = {"text", "select", "insert", "update", "delete", "TextClause", "literal_column"}


def is_statement(value: Any) -> bool:
    """A statement: an SQLAlchemy statement object, a (statement, parameters) pair, or a string
    whose first word is an SQL verb. A plain name (an event type, a status) is not."""
    if isinstance(value, (TextClause, Executable)):
        return True
    if isinstance(value, tuple) and value and isinstance(value[0], (TextClause, Executable)):
        return True
    if isinstance(value, str):
        words = value.split(None, 1)
        return bool(words) and words[0].upper() in SQL_VERBS
    return False


def _db_value(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name, None)


def _is_db(module: str) -> bool:
    return module == "db" or module.startswith("db.")


def _db_aliases(tree: ast.AST) -> dict[str, str]:
    """Local names bound to a db/ module (`from db import jobs as jobs_db`, `import db.x as y`)."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "") == "db":
            for a in node.names:
                aliases[a.asname or a.name] = f"db.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if _is_db(a.name) and a.asname:
                    aliases[a.asname] = a.name
    return aliases


def _imports(tree: ast.AST) -> Iterator[str]:
    """Each db/ name the source imports: `db.pipeline` for the transport, else module.name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if _is_db(a.name))
        elif isinstance(node, ast.ImportFrom) and _is_db(node.module or ""):
            module = node.module or "db"
            for a in node.names:
                if module == "db":
                    yield f"db.{a.name}"  # a module of db/ (or the transport)
                elif module == "db.pipeline" or is_statement(_db_value(module, a.name)):
                    yield f"{module}.{a.name}"


def sql_reaches(source: str) -> list[str]:
    """Each reach into db/'s SQL: the transport imported (any form), a statement imported from
    a db/ module, or a statement read as an attribute of a db/ module (`jobs_db.GET`)."""
    tree = ast.parse(source)
    found = [
        n
        for n in _imports(tree)
        if n == "db.pipeline" or n.startswith("db.pipeline.") or n.count(".") >= 2
    ]
    aliases = _db_aliases(tree)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            module = aliases[node.value.id]
            if module != "db.pipeline" and is_statement(_db_value(module, node.attr)):
                found.append(f"{module}.{node.attr}")
    return found


def builds_sql(source: str) -> list[str]:
    """Each statement builder imported from SQLAlchemy (text, select, insert, ...)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
            found += [f"{node.module}.{a.name}" for a in node.names if a.name in BUILDERS]
    return found


def scanned_modules() -> list[Path]:
    paths = sorted(p for d in SCANNED for p in (ROOT / d).rglob("*.py"))
    return [p for p in paths if not p.relative_to(ROOT).as_posix().startswith(EXEMPT_DIRS)]


def test_only_db_speaks_sql() -> None:
    modules = scanned_modules()
    assert len(modules) >= 60  # the check cannot pass by finding nothing
    found = {}
    for p in modules:
        rel = p.relative_to(ROOT).as_posix()
        source = p.read_text()
        reaches = [n for n in sql_reaches(source) if n not in ALLOWED.get(rel, set())]
        if rel not in BUILDERS_ALLOWED:
            reaches += builds_sql(source)
        if reaches:
            found[rel] = reaches
    assert found == {}


def test_the_check_tells_statements_from_plain_names() -> None:
    from db import jobs, outbox

    assert is_statement(jobs.GET)
    assert not is_statement(outbox.COMPLETED)  # an event type
    assert not is_statement(outbox.ENQUEUE)
    assert not is_statement(jobs.JOB_COLUMNS)  # a column list
    assert is_statement("  select 1")
    assert is_statement("WITH x AS (SELECT 1) SELECT * FROM x")


def test_the_check_flags_the_transport_and_a_statement() -> None:
    snippet = """
import db.pipeline
from db import pipeline
from db.pipeline import Statement, run
from db import jobs as jobs_db
from db.jobs import GET, JobRow, JOB_COLUMNS
from db.outbox import COMPLETED, ENQUEUE

async def f(s):
    await s.execute(jobs_db.GET, {"id": 1})
    return jobs_db.get, COMPLETED
"""
    assert sql_reaches(snippet) == [
        "db.pipeline",
        "db.pipeline",
        "db.pipeline.Statement",
        "db.pipeline.run",
        "db.jobs.GET",
        "db.jobs.GET",
    ]


def test_the_check_flags_a_statement_built_outside_db() -> None:
    snippet = """
from sqlalchemy import text, select
from sqlalchemy.ext.asyncio import AsyncSession
"""
    assert builds_sql(snippet) == ["sqlalchemy.text", "sqlalchemy.select"]


def test_a_clean_use_case_passes() -> None:
    snippet = """
from db import jobs as jobs_db
from db.outbox import COMPLETED, enqueue_dedupe_key
from db.session import SessionMaker

async def f(s):
    return await jobs_db.get(s, 1), COMPLETED
"""
    assert sql_reaches(snippet) == []
    assert builds_sql(snippet) == []
