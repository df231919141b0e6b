"""EXECUTE is a thin stage: its SQL is spoken by db/ (db/attempts.py, the repositories), so the
stage and its use cases import neither the transport (db/pipeline.py) nor an upper-case
statement constant from db/. Checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STAGE = (
    "activities/execute.py",
    "activities/merge.py",
    "jobs/admission.py",
    "jobs/attempt_start.py",
    "jobs/calls.py",
    "jobs/output.py",
)
# Constants that are names, not statements.
NOT_STATEMENTS = {"PLATFORM_KEY_REF"}


def sql_imports(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("db"):
            for alias in node.names:
                if node.module == "db.pipeline" or alias.name == "pipeline":
                    found.append(f"{node.module}.{alias.name}")
                elif alias.name.isupper() and alias.name not in NOT_STATEMENTS:
                    found.append(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name == "db.pipeline"]
    return found


def test_the_stage_imports_no_transport_and_no_statement() -> None:
    found = {p: sql_imports((ROOT / p).read_text()) for p in STAGE}
    assert {p: f for p, f in found.items() if f} == {}


def test_the_check_sees_a_statement_import() -> None:
    snippet = "from db import pipeline\nfrom db.lifecycle import SETTLE_ATTEMPT, settled\n"
    assert sql_imports(snippet) == ["db.pipeline", "db.lifecycle.SETTLE_ATTEMPT"]
