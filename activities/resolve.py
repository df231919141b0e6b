"""RESOLVE (a local activity): everything EXECUTE will need, checked before the job asks for a
provider slot. A job that cannot run (its key revoked, its snapshot expired) fails here, with
its code, and never takes a slot."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from temporalio import activity

from activities.deps import StageDeps
from activities.failures import fail_final
from db.stage_reads import resolve_read
from engine.contracts import RESOLVE, ResolveResult, StageInput
from engine.errors import ExecutionFailure
from jobs import offpeak


class Resolve:
    def __init__(self, deps: StageDeps) -> None:
        self._d = deps

    @activity.defn(name=RESOLVE)
    async def resolve(self, inp: StageInput) -> ResolveResult:
        """The snapshot (present, unexpired), the credential (pinned, active, decryptable:
        decrypted here and dropped at once), the prompt version, the provider and model, and
        the limits; for an off-peak job, its hold (the next window's start, its deadline and
        its policy there: times and a word). Only names, ids, numbers and times leave: the
        result is what an operator reads in the Temporal UI."""
        d = self._d
        job_id = uuid.UUID(inp.job_id)
        # The job's references and its chunks (numbers and counts only: the ranges stay in SQL):
        # as PREPARE read them a moment ago in this process, else in one round trip of its own
        # (db/stage_reads.py).
        run = activity.info().workflow_run_id or ""
        read = d.handoff.take(run, job_id) or await resolve_read(d.sessionmaker, job_id)
        row = read.refs
        if row is None:
            fail_final("INTERNAL_JOB_MISSING")
        try:
            # The versions it was created with must still be published: it never runs others.
            jt = d.catalog.for_job(row)
        except ExecutionFailure as f:
            fail_final(f.code)
        if not row.has_snapshot:
            # Expired: the job waited longer than its input is kept (DATA_RETENTION_DAYS).
            expired = row.snapshot_stored
            fail_final("SNAPSHOT_EXPIRED" if expired else "INTERNAL_SNAPSHOT_MISSING")
        # A session of its own: only a user's key is read from SQL (the synthetic provider and
        # the platform key take no statement, so no round trip either).
        async with d.sessionmaker() as s:
            try:
                key = await d.gateway.api_key(
                    s, jt, row.user_id, row.credential_mode, row.credential_id
                )
            except ExecutionFailure as f:
                fail_final(f.code)  # revoked, missing or undecryptable: no slot, no call
        del key  # only its availability was in question
        chunks = read.chunks
        definition = jt.definition
        provider = d.gateway.provider_for(jt, row.credential_mode).name
        return ResolveResult(
            prompt_version=row.prompt_version,
            credential_mode=row.credential_mode,
            provider=provider,
            model=d.gateway.model_for(jt, row.credential_mode),
            credential_id=str(row.credential_id) if row.credential_id else None,
            timeout_ms=definition.execution.timeout_ms,
            max_output_tokens=row.max_output_tokens or definition.execution.max_output_tokens,
            max_attempts=d.execution_policy(definition).max_attempts,
            chunk_count=len(chunks),
            chunk_concurrency=d.config.chunk_concurrency if chunks else 0,
            chunks_done=[c.chunk_no for c in chunks if c.status == "succeeded"],
            chunk_attempts=[c.attempt_count for c in chunks],
            reuses=row.reused_from_job_id is not None,
            # An off-peak job's wait for its window, which the workflow holds it `queued` for.
            offpeak=offpeak.hold(row, provider, d.gateway.offpeak_windows, datetime.now(UTC)),
            service_tier=row.service_tier,
        )
