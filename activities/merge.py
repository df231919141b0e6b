"""MERGE (a local activity): a long source's chunks become the job's one output.

Runs after every chunk's EXECUTE succeeded, before PROJECT. One transaction: the succeeded
chunks' outputs in chunk order, merged by `jobs.chunked.merge_outputs` (items whose key
normalises the same as an earlier one dropped, cut at the requested count), validated by the
job type's output model (`jobs.output.validated_output`, the rule a one-call answer
meets) and stored as the job's output and hash by `job_output.store_output`, the lock owner's
write of an output (listeners notified). PROJECT then projects it like any output.

A local activity, not a regular one: it reads PostgreSQL and writes one row, never calls a
provider, so it must not wait for a worker slot behind provider calls (the slots are the
queue's concurrency); like PREPARE, RESOLVE, PROJECT and COMPLETE it is retried by the
bookkeeping policy until the database answers. Idempotent: a retry after a commit whose answer
was lost finds the output stored and returns its hash.
"""

from __future__ import annotations

import uuid

from temporalio import activity

from activities.deps import StageDeps, lock_owner, log
from activities.failures import fail_final
from db import chunks as chunks_db
from db import job_output as job_output_db
from db import jobs as jobs_db
from engine.contracts import MERGE, MergeInput, MergeResult
from engine.errors import ExecutionFailure
from engine.hashing import output_hash
from engine.lifecycle import LifecycleStatus
from jobs.chunked import merge_outputs
from jobs.output import validated_output


class Merge:
    def __init__(self, deps: StageDeps) -> None:
        self._d = deps

    @activity.defn(name=MERGE)
    async def merge(self, inp: MergeInput) -> MergeResult:
        """The chunks' outputs merged, validated and stored as the job's output; only its hash
        and the number of items kept go back to Temporal."""
        d = self._d
        job_id = uuid.UUID(inp.job_id)
        async with d.sessionmaker.begin() as s:
            row = await jobs_db.get_for_update(s, job_id)
            if row is None:
                fail_final("INTERNAL_JOB_MISSING")
            if row.lifecycle_status != LifecycleStatus.RUNNING:
                # Ended meanwhile (a cancel won): the workflow's PROJECT reports the state.
                fail_final("CANCELLED" if row.cancel_requested_at else "INTERNAL_NOT_LOCK_OWNER")
            try:
                jt = d.catalog.for_job(row)  # validated with the versions it was created with
            except ExecutionFailure as f:
                fail_final(f.code)
            spec = jt.chunking
            if spec is None or not row.chunk_count:
                fail_final("INTERNAL_NOT_CHUNKED")
            done = await chunks_db.succeeded_chunks(s, job_id)
            if len(done) != row.chunk_count:
                fail_final("INTERNAL_CHUNK_MISSING")  # the workflow merges after every chunk
            count = int(getattr(jt.input_model.model_validate(row.input), spec.count_field))
            merged = merge_outputs(jt, [c.output for c in done], count)
            out, _, failure = validated_output(jt, merged)
            if failure is not None or out is None:
                # No item survived (every chunk answered the same, or nothing): the job fails
                # like an invalid answer would, with the chunks kept for a look.
                fail_final("VALIDATION_OUTPUT_INVALID")
            digest = output_hash(out)
            if row.output_hash == digest:
                return MergeResult(output_hash=digest, item_count=len(out[spec.items_field]))
            stored = await job_output_db.store_output(
                s, job_id, owner=lock_owner(), output=out, output_hash=digest, progress=90
            )
            if not stored:
                fail_final("INTERNAL_NOT_LOCK_OWNER")
        kept = len(out[spec.items_field])
        log.info(
            "chunks merged",
            extra={"job_id": inp.job_id, "chunks": len(done), "items": kept, "asked": count},
        )
        return MergeResult(output_hash=digest, item_count=kept)
