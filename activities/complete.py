"""COMPLETE (a local activity): the end of a succeeded job."""

from __future__ import annotations

import dataclasses
import uuid

from temporalio import activity

from activities.deps import StageDeps, log
from db.stage_reads import usage_summary
from engine.contracts import COMPLETE, CompleteInput, CompleteResult


class Complete:
    def __init__(self, deps: StageDeps) -> None:
        self._d = deps

    @activity.defn(name=COMPLETE)
    async def complete(self, inp: CompleteInput) -> CompleteResult:
        """The job's usage summary (every call of every attempt, as ai_usage_log holds it),
        logged and returned. It writes nothing: the completion event was written by PROJECT in
        the transaction that ended the job (event streams were woken by that commit; the relay
        publishes it to the owner's webhooks), so nothing here can be done twice.

        The summary is the one PROJECT summed in that transaction (the job's usage as of the
        commit that ended it), passed in by the workflow; without it (a PROJECT retry that found
        the job already ended) COMPLETE reads it."""
        if inp.usage is not None:
            return inp.usage  # PROJECT logged these figures ("job completed") after its commit
        # One round trip (db/stage_reads.py).
        usage = await usage_summary(self._d.sessionmaker, uuid.UUID(inp.job_id))
        result = CompleteResult(
            calls=usage.calls,
            tokens_in=usage.tokens_in,
            tokens_out=usage.tokens_out,
            cost_micros=int(usage.cost_usd * 1_000_000),
        )
        log.info("job usage", extra={"job_id": inp.job_id, **dataclasses.asdict(result)})
        return result
