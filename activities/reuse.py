"""REUSE (a local activity): the stage a job that reuses another job's answer runs instead of
EXECUTE (`ResolveResult.reuses`). One transaction (`jobs/reuse.py` `step`): a source that
succeeded gives the job its stored answer and hash (the job taken queued → running, as
EXECUTE's take; no provider call, no usage row; PROJECT next writes the job's own business rows
and artifacts); a source still queued or running answers `wait` (nothing taken: the workflow
waits for the `reuse-source-ended` signal); a source that ended without an answer is
forgotten and the answer is `run` (EXECUTE makes the job's own call).

A local activity, like MERGE: it reads and writes PostgreSQL only, never a provider, so it must
not wait for a worker slot behind provider calls; it is retried by the bookkeeping policy until
the database answers, and is idempotent (a retry finds the copy under its own lock).
"""

from __future__ import annotations

import uuid

from temporalio import activity

from activities.deps import StageDeps, lock_owner, log
from activities.failures import fail_final
from engine.contracts import REUSE, ReuseInput, ReuseResult
from engine.errors import ExecutionFailure
from engine.tiers import REUSE_LOOK_AGAIN_S
from jobs import reuse


class Reuse:
    def __init__(self, deps: StageDeps) -> None:
        self._d = deps

    @activity.defn(name=REUSE)
    async def reuse(self, inp: ReuseInput) -> ReuseResult:
        """The job's answer copied from its source, or what the workflow does instead (wait,
        run its own call, stop: it ended). Only the action, a hash and a state go back."""
        d = self._d
        info = activity.info()
        ttl_s, _ = d.lock_policy(info.workflow_type or "")  # a job workflow is its type's name
        try:
            async with d.sessionmaker.begin() as s:
                found = await reuse.step(
                    s,
                    uuid.UUID(inp.job_id),
                    owner=lock_owner(),
                    identity=f"reuse@{d.config.identity}",
                    ttl_s=ttl_s,
                    run_id=info.workflow_run_id,
                )
        except ExecutionFailure as f:
            fail_final(f.code)
        if found is None:
            fail_final("INTERNAL_JOB_MISSING")
        if found.action == "copied":
            log.info("answer reused", extra={"job_id": inp.job_id})
        look_again_s = REUSE_LOOK_AGAIN_S if found.look_again else 0.0
        return ReuseResult(found.action, found.output_hash, found.lifecycle_status, look_again_s)
