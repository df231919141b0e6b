"""A job's ending has one home (jobs/lifecycle.py): it writes the terminal state and its outbox
event together, so no ending can go without its event. Checked on the source: a terminal CAS,
a job event or an SQL write of `lifecycle_status` anywhere else fails here.

The engine's packages are scanned (tests and bench seed states on purpose and are not)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from db import outbox as outbox_db

ROOT = Path(__file__).resolve().parents[2]
OURS = ("engine", "db", "providers", "jobs", "workflows", "activities", "api", "runtime")
HOME = Path("jobs/lifecycle.py")
# The repositories whose CAS the home calls: db/endings.py's terminal transitions, and
# db/lifecycle.py's lock (queued -> running) and cancel request.
WRITERS = (Path("db/endings.py"), Path("db/lifecycle.py"))
# db/endings.py's terminal transitions. db/outbox.py's `mark_failed` (an outbox row's) shares a
# name with one of them: a call whose receiver names the outbox is that one.
TERMINAL_CAS = {
    "mark_succeeded",
    "mark_succeeded_statement",  # the same CAS, for a caller that pipelines it (db/pipeline.py)
    "mark_failed",
    "mark_cancelled",
    "mark_cancelled_if_queued",
}
# The one job-event writer, and its statement for a pipelined transaction.
JOB_EVENT_WRITERS = {"insert_job_event", "job_event_statement"}
JOB_EVENT_NAMES = {"COMPLETED", "FAILED", "CANCELLED"}
# An SQL assignment to lifecycle_status: between SET and the WHERE (or end) of a statement.
SQL_SETS_STATUS = re.compile(r"\bSET\b(?:(?!\bWHERE\b).)*?\blifecycle_status\s*=", re.I | re.S)


@functools.cache
def sources() -> list[tuple[Path, str, ast.Module]]:
    """Every module of the engine's packages, parsed once for the whole module's tests."""
    found = []
    for package in OURS:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue  # the schema's history, not a writer of jobs
            text = path.read_text()
            found.append((path.relative_to(ROOT), text, ast.parse(text, filename=str(path))))
    return found


def receiver_text(text: str, node: ast.expr) -> str:
    """The source of a call's receiver (`ast.get_source_segment` splits the whole module's
    text at each call: asked only for the one name that needs it)."""
    return ast.get_source_segment(text, node) or ""


def terminal_writes(path: Path, text: str, tree: ast.Module) -> list[str]:
    """Every terminal transition, job event and SQL status write in one module."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            if name in TERMINAL_CAS and not (
                name == "mark_failed" and "outbox" in receiver_text(text, node.func.value)
            ):
                found.append(f"{path}:{node.lineno} {name}")
            if name in JOB_EVENT_WRITERS:
                found.append(f"{path}:{node.lineno} {name}")
            for kw in node.keywords:
                # A job event written by hand through the generic insert.
                value = kw.value
                named = (
                    value.id
                    if isinstance(value, ast.Name)
                    else value.value
                    if isinstance(value, ast.Constant)
                    else None
                )
                if kw.arg == "event_type" and (
                    named in JOB_EVENT_NAMES or named in outbox_db.JOB_EVENTS
                ):
                    found.append(f"{path}:{node.lineno} event_type={named}")
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and SQL_SETS_STATUS.search(node.value)
        ):
            found.append(f"{path}:{node.lineno} SQL sets lifecycle_status")
    return found


def test_only_the_home_ends_a_job() -> None:
    elsewhere = sorted(
        w
        for path, text, tree in sources()
        if path != HOME and path not in WRITERS
        for w in terminal_writes(path, text, tree)
    )
    assert elsewhere == [], f"a job ends through {HOME} only: {elsewhere}"


def test_the_checker_sees_the_home_writing() -> None:
    # Guards the tests above: the home's own writes (every terminal CAS, the job event) are what
    # the checker finds, so it cannot pass by seeing nothing.
    (home,) = [(p, t, tree) for p, t, tree in sources() if p == HOME]
    names = {w.split()[-1] for w in terminal_writes(*home)}
    # Every ending's CAS (succeeded's as a pipelined statement) and every job-event writer.
    assert names >= (TERMINAL_CAS - {"mark_succeeded"}) | JOB_EVENT_WRITERS
    writers = [(p, t, tree) for p, t, tree in sources() if p in WRITERS]
    assert len(writers) == len(WRITERS)
    for writer in writers:
        assert any(w.endswith("SQL sets lifecycle_status") for w in terminal_writes(*writer))


def test_the_checker_flags_a_hand_written_ending() -> None:
    # What a second ending site would look like: each of its three writes is found.
    snippet = """
async def end(s, d, job_id):
    await lifecycle_db.mark_cancelled(s, job_id)
    await outbox_db.insert(s, event_type=CANCELLED, aggregate_id=str(job_id))
    await s.execute(text("UPDATE ai_job SET lifecycle_status = 'failed' WHERE id = :id"))
    await outbox_db.mark_failed(s, 1, owner="relay", error="x")
"""
    found = terminal_writes(Path("x.py"), snippet, ast.parse(snippet))
    assert sorted(found) == [
        "x.py:3 mark_cancelled",
        "x.py:4 event_type=CANCELLED",
        "x.py:5 SQL sets lifecycle_status",
    ]


# The transitions that do not end a job: taking it (queued -> running, or a retried attempt's
# takeover of its own lock) and the cancel request (`cancel_requested_at` on a running job). The
# repository calls behind them, by receiver and name: only the home makes them.
NON_TERMINAL = {
    ("attempts_db", "take"),
    ("lifecycle_db", "lock"),
    ("lifecycle_db", "request_cancel"),
}


def non_terminal_transitions(path: Path, tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and (node.func.value.id, node.func.attr) in NON_TERMINAL
        ):
            found.append(f"{path}:{node.lineno} {node.func.value.id}.{node.func.attr}")
    return found


def test_only_the_home_takes_a_job_or_records_a_cancel_request() -> None:
    everywhere = [w for path, _, tree in sources() for w in non_terminal_transitions(path, tree)]
    elsewhere = [w for w in everywhere if not w.startswith(f"{HOME}:")]
    assert elsewhere == [], f"a job is taken and a cancel requested through {HOME} only"
    # The check sees the home making each of them, so it cannot pass by finding nothing.
    assert {w.split()[-1] for w in everywhere} == {f"{r}.{n}" for r, n in NON_TERMINAL}


def test_the_checker_flags_a_take_outside_the_home() -> None:
    snippet = """
async def start(s, job_id):
    await attempts_db.take(s, job_id, owner="w")
    await lifecycle_db.request_cancel(s, job_id)
    await jobs_db.get(s, job_id)
"""
    found = non_terminal_transitions(Path("x.py"), ast.parse(snippet))
    assert found == ["x.py:3 attempts_db.take", "x.py:4 lifecycle_db.request_cancel"]
