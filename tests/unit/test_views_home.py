"""A job's public JSON has one home (jobs/views.py) and the API holds no repository for its
lifetime. Checked on the source: a hand-built copy of the job JSON, or a module-level
repository in api/, fails here before it can drift from the view."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OURS = ("engine", "db", "providers", "jobs", "workflows", "activities", "api", "runtime")
HOME = Path("jobs/views.py")
# Keys only the public job JSON has (an event payload has jobId/jobType, never these).
JOB_JSON_KEYS = {"publicErrorMessage", "startedAt", "finishedAt"}


def sources() -> list[tuple[Path, ast.Module]]:
    found = []
    for package in OURS:
        for path in sorted((ROOT / package).rglob("*.py")):
            found.append((path.relative_to(ROOT), ast.parse(path.read_text(), filename=str(path))))
    return found


def test_only_the_view_spells_the_job_json() -> None:
    # The view itself writes the keys through its camelCase alias generator: the literal
    # spellings below must then appear nowhere at all.
    spelled = sorted(
        f"{path}:{node.lineno} {node.value}"
        for path, tree in sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in JOB_JSON_KEYS
    )
    assert spelled == [], f"the job JSON is built in {HOME} only: {spelled}"


def test_the_view_has_the_fields_the_check_looks_for() -> None:
    # Guards the test above: were the fields renamed, it would pass vacuously.
    from jobs.views import JobStatusResponse

    aliases = {f.alias for f in JobStatusResponse.model_fields.values()}
    assert aliases >= JOB_JSON_KEYS


def _is_repository_call(node: ast.expr | None) -> bool:
    if not isinstance(node, ast.Call):
        return False
    name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
    return name.endswith(("Queries", "Repository"))


def test_no_repository_lives_at_module_level_in_api() -> None:
    held = sorted(
        f"{path}:{stmt.lineno}"
        for path, tree in sources()
        if path.parts[0] == "api"
        for stmt in tree.body
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and _is_repository_call(stmt.value)
    )
    assert held == [], f"build repositories in the use case or a dependency: {held}"
