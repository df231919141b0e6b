"""COMPLETE (a local activity): the end of a succeeded job."""

from __future__ import annotations

import dataclasses
import uuid

from temporalio import activity

from activities.deps import StageDeps, log
from db import pipeline
from db.usage import SUMMARY, summary_of
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
        commit that ended it), passed in by the workflow; without it (runs recorded before, a
        PROJECT retry that found the job already ended) COMPLETE reads it."""
        if inp.usage is not None:
            return inp.usage  # PROJECT logged these figures ("job completed") after its commit
        # One round trip: BEGIN, the read, ROLLBACK pipelined (db/pipeline.py).
        [rows] = await pipeline.run(
            self._d.sessionmaker, [(SUMMARY, {"id": uuid.UUID(inp.job_id)})], commit=False
        )
        usage = summary_of(rows[0])
        result = CompleteResult(
            calls=usage.calls,
            tokens_in=usage.tokens_in,
            tokens_out=usage.tokens_out,
            cost_micros=int(usage.cost_usd * 1_000_000),
        )
        log.info("job usage", extra={"job_id": inp.job_id, **dataclasses.asdict(result)})
        return result
