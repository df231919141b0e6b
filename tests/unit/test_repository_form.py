"""Every repository in db/ has one form: a module of functions whose first argument is the
caller's session. A class whose methods take a session (a repository object to build and hold)
fails here, as does a module-level function that reaches the database without being handed a
session. Checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DB = ROOT / "db"
# Modules that are not repositories: the schema, sessions and listen connections, migrations,
# the error edge, and db/pipeline.py, a transport (it sends the repositories' own statements in
# one round trip: `run` takes the sessionmaker and opens its own transaction, `in_session` the
# caller's session) that owns no SQL of its own.
NOT_REPOSITORIES = {
    "models.py",
    "session.py",
    "migrate.py",
    "errors.py",
    "pipeline.py",
    "__init__.py",
}
# A SessionMaker first: a one-round-trip transaction of its own (db/pipeline.py `run`).
SESSION_TYPES = {"AsyncSession", "AsyncConnection", "SessionMaker"}


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
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AsyncFunctionDef):
                    found.append(f"{path.name}:{item.lineno} {node.name}.{item.name} is a method")
        if isinstance(node, ast.AsyncFunctionDef) and not node.name.startswith("_"):
            args = node.args.posonlyargs + node.args.args
            if not args or annotation_name(args[0]) not in SESSION_TYPES:
                # A connection factory (a LISTEN connection) opens its own, by design.
                if not node.name.startswith("listen_connection"):
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
"""
    assert violations(Path("x.py"), snippet) == [
        "x.py:3 JobQueries.get is a method",
        "x.py:5 count takes no session first",
    ]
