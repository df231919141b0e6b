"""Record the workflow histories that `test_replay.py` replays.

    make replay-baseline                       # record v8 again, then replay everything
    .venv/bin/python -m tests.replay.record --tag v8

Starts what the test session starts (embedded PostgreSQL and a Temporal dev server from the pip
wheels, `engine_stack` workers and relay on `make_settings` test settings), runs real jobs and
writes each closed run's history to `tests/replay/histories/<workflow>-<tag>-<case>.json`:

- every job type of the default catalog, succeeding (the non-synthetic ones on the synthetic
  provider, as everywhere in test settings without a key);
- synthetic: a retry then success (`failTimes: 1`), a failure after its retries (`failTimes: 5`)
  and a cancel while EXECUTE runs (a long `delayMs`, cancelled through `JobService.cancel`);
- quiz_generation over a long source (`chunked`, from v5): its chunks' EXECUTEs, MERGE, PROJECT
  (the per-call budget is cut to AI_CHUNK_INPUT_TOKENS=1000 so a short text makes 3 chunks);
- synthetic held back by a provider limit (`limit_wait`), on an engine of its own with
  `AI_MODEL_LIMITS={"synthetic": {"concurrency": 1}}`: a slow job holds the one slot, the
  recorded job's EXECUTE returns a `concurrency` wait, the workflow waits for room (a timer of
  that wait, not the growing backoff of a pause), and the next EXECUTE succeeds;
- one reconciler run;
- the branch cases of `record_cases.py` (a delayed job, a limit's wake-up, result reuse, an
  off-peak hold, a batch-tier job and its `ai_batch` workflow, a provider fallback), each on an
  engine of its own;
- the flow-control cases of `record_flow.py` (a deadline passing while the job waits for room,
  a start-by time passing after the job was admitted, an operator pause then its lifting), each
  on an engine of its own.

`--only <workflow>-<case>` (repeatable, e.g. `--only synthetic-limit_wait`) records just those
cases and replaces just their files, leaving the tag's other histories alone.

The baseline is v8 (docs/versioning.md): until a deployed run can be open, a change to the
workflows records v8 again (it replaces that tag's files). Once one can, a change to the commands
records a new tag next to the older ones, which stay for as long as runs started by their code
can still be open.

Every job input carries `SENTINEL`; the script checks that PostgreSQL got it and the replay test
checks that no history contains it (only ids, hashes and codes may pass through Temporal).
Takes about a minute (the flow-control cases wait on their timers).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import sys
import tempfile
import time
import traceback
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Worker

from activities.reconciler import Reconciler
from db.migrate import upgrade
from engine.contracts import (
    RECONCILER_WORKFLOW,
    ReconcileResult,
)
from engine.definition import SYSTEM_QUEUE
from engine.settings import Settings
from jobs.types import default_catalog
from runtime.embedded import free_port, start_postgres, start_temporal
from runtime.wiring import reconciler_config
from runtime.worker import sandbox_runner
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.engine_helpers import (
    wait_activity_started,
    wait_jobs,
    wait_workflow_closed,
    workflow_canceller,
)
from tests.replay import HISTORIES, SENTINEL
from tests.replay.record_cases import BRANCH_CASES, Fakes
from tests.replay.record_flow import FLOW_CASES
from tests.stack import JOB_QUEUES, Stack, engine_stack, make_settings
from workflows.system import ReconcilerWorkflow

TAG = re.compile(r"^v[0-9]+$")
SOURCE = f"Photosynthesis converts light into chemical energy ({SENTINEL}). It needs water."
# Three chunks at CHUNK_SETTINGS' per-call budget: distinct sentences, the sentinel in the first.
LONG_SOURCE = "\n\n".join(
    [SOURCE]
    + [
        f"Paragraph {i} explains that enzyme catalysts{i} accelerate reactions{i} inside cells. "
        f"Researchers measured temperature{i} effects on molecules{i} carefully. "
        f"Observation{i} shows membranes{i} transport nutrients efficiently."
        for i in range(40)
    ]
)
CHUNK_SETTINGS = {"AI_CHUNK_INPUT_TOKENS": 1000}
# The limit_wait case's engine: the synthetic provider's model under a concurrency limit of 1,
# and worker slots enough that only the limit holds a job.
LIMIT_SETTINGS: dict[str, Any] = {
    "AI_MODEL_LIMITS": json.dumps({"synthetic": {"concurrency": 1}}),
    "AI_INTERACTIVE_CONCURRENCY": 4,
    "AI_BACKGROUND_CONCURRENCY": 4,
}
# How long the job holding the one slot keeps it: at least one 1 s look of the recorded job
# finds the slot taken.
HOLD_MS = 2500
LIMIT_WAIT = "synthetic-limit_wait"
SYSTEM_CASES = ("reconciler-run",)
# The cases each on an engine of its own settings: the branches, then flow control's.
ENGINE_CASES = (*BRANCH_CASES, *FLOW_CASES)


@dataclass(frozen=True)
class Case:
    job_type: str
    case: str
    input: dict[str, Any]
    expect: str  # the job's lifecycle status at the end


def cases() -> list[Case]:
    echo = {"note": SENTINEL}
    out = [
        Case("synthetic", "success", {"echo": echo}, "succeeded"),
        Case("synthetic", "retry", {"failTimes": 1, "echo": echo}, "succeeded"),
        Case("synthetic", "fail", {"failTimes": 5, "echo": echo}, "failed"),
        Case("synthetic", "cancel", {"delayMs": 120_000, "echo": echo}, "cancelled"),
        Case("quiz_generation", "chunked", {"sourceText": LONG_SOURCE, "count": 4}, "succeeded"),
    ]
    inputs: dict[str, dict[str, Any]] = {
        "quiz_generation": {"sourceText": SOURCE, "count": 2},
        "flashcard_generation": {"sourceText": SOURCE, "count": 2},
        "weak_point_analysis": {
            "answers": [
                {
                    "question": f"Where does photosynthesis happen? {SENTINEL}",
                    "givenAnswer": "mitochondria",
                    "correctAnswer": "chloroplasts",
                    "isCorrect": False,
                    "topic": "cell biology",
                }
            ]
        },
    }
    for jt in default_catalog():
        if jt.job_type != "synthetic":
            # A job type added to the catalog without an input here fails loudly.
            out.append(Case(jt.job_type, "success", inputs[jt.job_type], "succeeded"))
    return out


def case_names() -> list[str]:
    """Every case the recorder records, as `--only` names them (`<workflow>-<case>`)."""
    branches = [b.name for b in ENGINE_CASES]
    return [f"{c.job_type}-{c.case}" for c in cases()] + [LIMIT_WAIT, *branches, *SYSTEM_CASES]


# ---- jobs ----------------------------------------------------------------------------------


async def run_jobs(st: Stack, all_cases: list[Case]) -> dict[str, WorkflowHistory]:
    """The cases as real jobs through relay, workflow and stages; the closed histories."""
    job_ids = [await st.create(job_type=c.job_type, input=c.input) for c in all_cases]
    for c, job_id in zip(all_cases, job_ids, strict=True):
        if c.case == "cancel":
            row = await st.wait_status(job_id, "running")
            await wait_activity_started(st.client, row.workflow_id, "execute")
            res = await st.service.cancel(
                job_id, "u1", cancel_workflow=workflow_canceller(st.client)
            )
            assert res.outcome == "cancel_requested", res
    final = await wait_jobs(st.parts.sessionmaker, job_ids, timeout=60)

    out: dict[str, WorkflowHistory] = {}
    for c, job_id in zip(all_cases, job_ids, strict=True):
        row = await st.job(job_id)
        assert final[job_id] == c.expect, (c, row.error_code, row.internal_error_message)
        if c.case == "retry":
            assert row.attempt_count == 2, row.attempt_count
        if c.case == "chunked":
            assert row.chunk_count == 3, row.chunk_count
        # The sentinel really went in, so its absence from the histories means something.
        assert SENTINEL in json.dumps(row.input), row.input
        await wait_workflow_closed(st.client, row.workflow_id)
        history = await st.client.get_workflow_handle(row.workflow_id).fetch_history()
        out[f"{c.job_type}-{{tag}}-{c.case}"] = history
    return out


async def run_limit_wait(st: Stack) -> dict[str, WorkflowHistory]:
    """A synthetic job held back by the provider limit, then succeeding (`LIMIT_SETTINGS`).

    A slow job takes the one concurrency slot (its EXECUTE's first commit moves it to `running`
    and inserts the lease); the recorded job, created after that, finds the slot taken, waits on
    its workflow's timer and asks again until the slow call has ended."""
    echo = {"note": SENTINEL}
    holder = await st.create(job_type="synthetic", input={"delayMs": HOLD_MS, "echo": echo})
    await st.wait_status(holder, "running")
    waiter = await st.create(job_type="synthetic", input={"echo": echo})
    final = await wait_jobs(st.parts.sessionmaker, [holder, waiter], timeout=60)
    assert set(final.values()) == {"succeeded"}, final
    row = await st.job(waiter)
    assert SENTINEL in json.dumps(row.input), row.input
    assert row.attempt_count == 1, row.attempt_count  # a limit's wait spends no attempt
    await wait_workflow_closed(st.client, row.workflow_id)
    history = await st.client.get_workflow_handle(row.workflow_id).fetch_history()
    timers = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
    executes = [
        e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "execute"
    ]
    assert timers and len(executes) >= 2, f"the job did not wait on the limit: {summary(history)}"
    return {"synthetic-{tag}-limit_wait": history}


# ---- system workflows ----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def system_worker(st: Stack) -> AsyncIterator[Worker]:
    s = st.settings
    reconciler = Reconciler(st.parts.sessionmaker, st.client, reconciler_config(s))
    async with Worker(
        st.client,
        task_queue=s.task_queue(SYSTEM_QUEUE),
        workflows=[ReconcilerWorkflow],
        activities=[reconciler.reconcile_once],
        workflow_runner=sandbox_runner(),
    ) as worker:
        yield worker


async def run_system(st: Stack) -> dict[str, WorkflowHistory]:
    s = st.settings
    queue = s.task_queue(SYSTEM_QUEUE)
    out: dict[str, WorkflowHistory] = {}
    async with system_worker(st):
        rec = await st.client.start_workflow(
            RECONCILER_WORKFLOW,
            id=f"ai-system:reconcile{s.task_queue_suffix}",
            task_queue=queue,
            result_type=ReconcileResult,
        )
        await rec.result()
        out["reconciler-{tag}-run"] = await rec.fetch_history()
    return out


async def run_branches(
    db_uri: str, address: str, client: Client, wanted: Callable[[str], bool]
) -> dict[str, WorkflowHistory]:
    """The branch cases (record_cases.py) and the flow-control ones (record_flow.py), each on an
    engine of its own settings; the fake OpenAI-compatible servers for those that need them."""
    out: dict[str, WorkflowHistory] = {}
    todo = [b for b in ENGINE_CASES if wanted(b.name)]
    with contextlib.ExitStack() as es:
        fakes = None
        if any(b.fake for b in todo):
            fakes = Fakes(
                es.enter_context(FakeOpenAIServer()), es.enter_context(FakeOpenAIServer())
            )
        for b in todo:
            if fakes is not None:
                await fakes.primary.areset()
                await fakes.second.areset()
            case_fakes = fakes if b.fake else None
            settings = make_settings(db_uri, address, **b.settings(case_fakes))
            async with engine_stack(settings, client, queues=JOB_QUEUES) as st:
                out.update(await b.run(st, case_fakes))
    return out


# ---- main ----------------------------------------------------------------------------------


def summary(history: WorkflowHistory) -> str:
    markers = [
        e.marker_recorded_event_attributes.marker_name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
    ]
    acts = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    return f"{len(history.events)} events, activities {acts}, markers {markers}"


async def record(tag: str, out_dir: Path, only: frozenset[str] | None = None) -> list[Path]:
    """Record every case, or the cases named in `only` (`case_names()`), under `tag`."""

    def wanted(name: str) -> bool:
        return only is None or name in only

    job_cases = [c for c in cases() if wanted(f"{c.job_type}-{c.case}")]
    histories: dict[str, WorkflowHistory] = {}
    with tempfile.TemporaryDirectory(prefix="aijobs-replay-") as tmp:
        base = Path(tmp)
        base.chmod(0o755)  # the embedded server may run as its own user
        pg = start_postgres(base / "pg")
        temporal = None
        try:
            upgrade(pg.uri)
            temporal = start_temporal(
                port=free_port(),
                ui_port=None,
                db_file=None,
                extra_args=[
                    "--dynamic-config-value",
                    "frontend.enableUpdateWorkflowExecution=true",
                ],
            )
            client = await Client.connect(temporal.address, namespace="default")
            settings: Settings = make_settings(pg.uri, temporal.address, **CHUNK_SETTINGS)
            if job_cases or any(wanted(n) for n in SYSTEM_CASES):
                async with engine_stack(settings, client, queues=JOB_QUEUES) as st:
                    if job_cases:
                        histories.update(await run_jobs(st, job_cases))
                    if any(wanted(n) for n in SYSTEM_CASES):
                        histories.update(await run_system(st))
            if wanted(LIMIT_WAIT):
                # Its own engine: under its limit the other cases' jobs would wait too.
                limited = make_settings(pg.uri, temporal.address, **LIMIT_SETTINGS)
                async with engine_stack(limited, client, queues=JOB_QUEUES) as st:
                    histories.update(await run_limit_wait(st))
            histories.update(await run_branches(pg.uri, temporal.address, client, wanted))
        finally:
            if temporal is not None:
                temporal.stop()
            pg.stop()

    out_dir.mkdir(parents=True, exist_ok=True)
    if only is None:  # the whole tag is recorded again; with `only`, just its files are replaced
        for stale in out_dir.glob(f"*-{tag}-*.json"):
            stale.unlink()
    written = []
    for name, history in sorted(histories.items()):
        path = out_dir / f"{name.format(tag=tag)}.json"
        path.write_text(history.to_json() + "\n")
        written.append(path)
        print(f"{path.name}: {summary(history)}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tag", required=True, help="version tag of the workflow code, e.g. v8")
    parser.add_argument("--out", type=Path, default=HISTORIES)
    parser.add_argument(
        "--only",
        action="append",
        metavar="WORKFLOW-CASE",
        help="record just this case (repeatable), e.g. synthetic-limit_wait; "
        "the tag's other files stay",
    )
    args = parser.parse_args(argv)
    if not TAG.match(args.tag):
        parser.error("--tag must look like v1, v2, ...")
    unknown = sorted(set(args.only or ()) - set(case_names()))
    if unknown:
        parser.error(f"--only: no case {unknown}; the cases: {', '.join(case_names())}")
    # The fail and retry cases fail EXECUTE on purpose; the SDK logs each such attempt.
    logging.getLogger("temporalio.activity").setLevel(logging.ERROR)
    t0 = time.monotonic()
    only = frozenset(args.only) if args.only else None
    written = asyncio.run(record(args.tag, args.out, only))
    size = sum(p.stat().st_size for p in args.out.glob("*.json"))
    print(
        f"{len(written)} histories for {args.tag} in {time.monotonic() - t0:.1f}s; "
        f"all histories: {size / 1024:.0f} KiB"
    )
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    # The SDK's native runtime can abort the interpreter at exit after all work is done; leave
    # with our own status instead.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
