"""Every repository in db/ has one form: a module of functions whose first argument is the
caller's session. A class whose methods take a session (a repository object to build and hold)
fails here, as does a module-level function that reaches the database without being handed a
session. A stage's hot transaction (one round trip through the transport, db/pipeline.py) is
handed the sessionmaker instead, the transport's one way in, and must go through the transport.
The transport itself is checked too: only its own entry points are exempt. Checked on the
source."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from sqlalchemy import TextClause

ROOT = Path(__file__).resolve().parents[2]
DB = ROOT / "db"
# Modules that are not repositories: the schema, sessions, the process's LISTEN connection
# (db/listener.py), migrations, and the error edge.
NOT_REPOSITORIES = {
    "session.py",
    "listener.py",
    "migrate.py",
    "errors.py",
    "__init__.py",
}
# db/pipeline.py, the transport, is checked like a repository except for its own entry points,
# which pass by rule: they are what a hot transaction goes through, so they cannot themselves be
# handed a session or go through the transport. `run` and `transaction` take the sessionmaker
# and open the transaction on a pooled connection; `in_session` pipelines into the caller's
# session; `Transaction` is what `transaction` yields (its methods send the batches of that one
# open transaction). Any other function added to db/pipeline.py is checked as any repository
# function is.
TRANSPORT_OWN = {"pipeline.py": {"run", "transaction", "in_session", "Transaction"}}
SESSION_TYPES = {"AsyncSession", "AsyncConnection"}
# What a hot transaction is handed: it opens its transaction through the transport only.
TRANSPORT_TYPES = {"SessionMaker"}
TRANSPORT_ENTRIES = {"pipeline.run", "pipeline.transaction"}


def through_the_transport(node: ast.AsyncFunctionDef) -> bool:
    """The function opens its transaction through db/pipeline.py, never a session of its own."""
    body = ast.unparse(node)
    sessions = ".begin()" in body or "sessionmaker(" in body.lower() or "sm()" in body
    return any(e in body for e in TRANSPORT_ENTRIES) and not sessions


def repository_modules() -> list[Path]:
    return sorted(p for p in DB.glob("*.py") if p.name not in NOT_REPOSITORIES)


def annotation_name(arg: ast.arg) -> str:
    a = arg.annotation
    if isinstance(a, ast.Name):
        return a.id
    if isinstance(a, ast.Attribute):
        return a.attr
    if isinstance(a, ast.Subscript):
        return ast.unparse(a.value).split(".")[-1]
    if isinstance(a, ast.Constant) and isinstance(a.value, str):
        return a.value.split("[")[0].split(".")[-1]
    return ""


def violations(path: Path, source: str) -> list[str]:
    found = []
    tree = ast.parse(source, filename=str(path))
    own = TRANSPORT_OWN.get(path.name, set())
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.AsyncFunctionDef)) and node.name in own:
            continue
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AsyncFunctionDef):
                    found.append(f"{path.name}:{item.lineno} {node.name}.{item.name} is a method")
        if isinstance(node, ast.AsyncFunctionDef) and not node.name.startswith("_"):
            args = node.args.posonlyargs + node.args.args
            first = annotation_name(args[0]) if args else ""
            hot = first in TRANSPORT_TYPES and through_the_transport(node)
            if first not in SESSION_TYPES and not hot:
                found.append(f"{path.name}:{node.lineno} {node.name} takes no session first")
    return found


def test_every_repository_is_a_module_of_functions_taking_the_session_first() -> None:
    modules = repository_modules()
    assert len(modules) >= 15  # the check cannot pass by finding nothing
    found = [v for p in modules for v in violations(p, p.read_text())]
    assert found == [], found


def test_the_check_flags_a_repository_class() -> None:
    snippet = """
class JobQueries:
    async def get(self, session: AsyncSession, job_id): ...

async def count(user_id: str) -> int: ...

async def fine(s: AsyncSession, user_id: str) -> int: ...

async def hot(sm: SessionMaker, job_id) -> int:
    [rows] = await pipeline.run(sm, [(READ, {"id": job_id})], commit=False)

async def own(sm: SessionMaker, job_id) -> int:
    async with sm.begin() as s:
        await s.execute(READ)
"""
    assert violations(Path("x.py"), snippet) == [
        "x.py:3 JobQueries.get is a method",
        "x.py:5 count takes no session first",
        "x.py:12 own takes no session first",
    ]


def test_the_transport_is_checked_but_for_its_own_entry_points() -> None:
    assert (DB / "pipeline.py") in repository_modules()
    snippet = """
async def run(sm: SessionMaker, statements, *, commit: bool): ...

async def transaction(sm: SessionMaker): ...

async def in_session(s: AsyncSession, statements): ...

class Transaction:
    async def run(self, statements): ...

async def read_job(sm: SessionMaker, job_id): ...

class Batch:
    async def send(self, s: AsyncSession): ...
"""
    assert violations(Path("pipeline.py"), snippet) == [
        "pipeline.py:11 read_job takes no session first",
        "pipeline.py:14 Batch.send is a method",
    ]
    # Elsewhere the same names are no exception.
    assert "x.py:2 run takes no session first" in violations(Path("x.py"), snippet)


# The stages and the ending speak to the database through named db/ functions only: none of
# them reaches the transport or holds a statement of db/'s.
SQL_FREE = [
    "activities/prepare.py",
    "activities/resolve.py",
    "activities/complete.py",
    "activities/project.py",
    "activities/finalize.py",
    "jobs/lifecycle.py",
]


def sql_reaches(source: str) -> list[str]:
    """Each import of db/pipeline.py, and of a statement (a `TextClause`) from a db/ module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name == "db.pipeline"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "db":
            module = importlib.import_module(node.module or "db")
            for a in node.names:
                name = f"{node.module}.{a.name}"
                transport = "db.pipeline" in (node.module, name)
                if transport or isinstance(getattr(module, a.name, None), TextClause):
                    found.append(name)
    return found


def test_the_stages_and_the_ending_reach_sql_through_named_functions_only() -> None:
    found = {m: sql_reaches((ROOT / m).read_text()) for m in SQL_FREE}
    assert {m: f for m, f in found.items() if f} == {}


def test_the_sql_check_flags_the_transport_and_a_statement() -> None:
    snippet = """
from db import pipeline
from db.jobs import GET, JobRow
from db.outbox import COMPLETED
"""
    assert sql_reaches(snippet) == ["db.pipeline", "db.jobs.GET"]
