"""EXECUTE: the one expensive step, a provider call, and the only stage that holds a worker slot.

A thin stage over its use cases; `Execute.execute` runs one `_Attempt`, in steps:
1. `begin`: the first transaction (`jobs/attempt_start.py` `start`): the job taken (the CAS
   queued → running, or this workflow's own lock on a retry), then its provider admission
   (`jobs/admission.py`: the gate, the cost cover, the key, the limits). A `Wait` rolls it back
   and returns how long to wait (a limit's wait enters its key's fair queue). A job that ended
   while it waited ends here without a call; an output already stored is reused, not bought.
2. `call`: the prompt and the provider call (`jobs/calls.py`) under the job's timeout,
   heartbeating on its own clock while a separate task extends the SQL lock and reads a cancel
   recorded in SQL; then the output's validation (`jobs/output.py`).
3. `fail`: the failed call's usage row, bookkeeping and what it tells the key's gate and limits,
   in one transaction; then the failure the taxonomy names (a 429 is waited out for free).
4. `finish`: the last transaction (`db/attempts.py` `settle`), still holding the slot and
   heartbeating: the usage row, the gate and limits settled, then (unless a cancel arrived) the
   validated output, which PROJECT projects next. Only its hash goes back to Temporal.

A long source's chunk (`ExecuteInput.chunk_no`) is the same attempt over one chunk (its row
locked, its tokens admitted, its prompt, its output stored); MERGE makes the job's output. The
admission's probe and lease (`Ticket`) are settled on every exit path. A closed gate or a
limit's wait rolls the first transaction back and goes back to the workflow as `gate_wait_s`:
the workflow waits on its own timer, holding no slot and spending no attempt.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pydantic import BaseModel
from temporalio import activity

from activities import call as call_step
from activities import fallback, held
from activities.deps import EngineConfig, StageDeps, lock_owner, log
from activities.failures import (
    fail_attempt,
    fail_final,
    fail_over_budget,
    private_strings,
    unexpected_failure,
)
from activities.flow import expired_at_start, wait_place
from activities.heartbeat import db_retry, heartbeating
from activities.telemetry import observe_call, retry_follows, seconds_since
from db import attempts as attempts_db
from db.attempts import Settlement
from db.chunks import ChunkRow
from db.jobs import JobRow
from engine.contracts import EXECUTE, ExecuteInput, ExecuteResult
from engine.errors import ExecutionFailure
from engine.hashing import output_hash
from jobs import attempt_start, calls, guardrails, limit_wake, stream_items
from jobs.admission import Refused, Ticket
from jobs.stream_items import Progress
from jobs.waits import Wait
from providers.base import Provider, ProviderRequest, ProviderResponse

WORKER_SHUTDOWN = "INTERNAL_WORKER_SHUTDOWN"


@dataclass
class Begun:
    """What the first transaction found."""

    ended: str | None = None  # the job ended before it could run: its state
    reuse_hash: str | None = None  # an output this job already stored
    started: attempt_start.Started | None = None  # the call may go
    gate_wait_s: float = 0.0  # > 0: the gate is closed; nothing was taken or spent
    gate_reason: str = ""  # why (engine/contracts.py ExecuteResult.gate_reason)
    held: attempt_start.Held | None = None  # a paid answer waiting for its moderation


class _Waiting(Exception):
    """Admission said wait: rolls the first transaction back (the job stays `queued`)."""

    def __init__(self, wait: Wait) -> None:
        super().__init__(f"wait {wait.wait_s:.1f}s ({wait.reason})")
        self.wait = wait


class _Expiring(Exception):
    """The job's start-by time or deadline passed: rolls the first transaction back."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class Execute:
    """The EXECUTE stage of one worker; each activity attempt is one `_Attempt`."""

    def __init__(self, deps: StageDeps) -> None:
        self._d = deps

    @activity.defn(name=EXECUTE)
    async def execute(self, inp: ExecuteInput) -> ExecuteResult:
        info = activity.info()
        # The job's attempt number: earlier EXECUTE activities of this job (before a wait on
        # its gate) spent `attempt_offset`; Temporal counts this activity's own.
        attempt = _Attempt(
            self._d,
            inp,
            number=inp.attempt_offset + info.attempt,
            owner=lock_owner(),
            run_id=info.workflow_run_id,
        )
        begun = await attempt.begin()
        if begun.gate_wait_s > 0:
            return ExecuteResult(
                output_hash="",
                attempt=attempt.number,
                gate_wait_s=begun.gate_wait_s,
                gate_reason=begun.gate_reason,
            )
        return fallback.noted(attempt, await attempt.run(begun))


class _Attempt:
    """One EXECUTE attempt of one job, from its first transaction to its last."""

    def __init__(
        self, deps: StageDeps, inp: ExecuteInput, *, number: int, owner: str, run_id: str | None
    ) -> None:
        self._d = deps
        self._cfg: EngineConfig = deps.config
        self.inp = inp
        self.number = number
        self.owner = owner
        self.run_id = run_id
        self.job_id = uuid.UUID(inp.job_id)
        self.ticket = Ticket()  # what admission granted, not yet settled
        self.chunk_no = inp.chunk_no
        self.chunk: ChunkRow | None = None  # read (and locked) by the first transaction
        self.started: attempt_start.Started | None = None  # its fence and call number
        self.call_no: int | None = None  # the call's number: its usage row's identity
        self.began = time.monotonic()
        self.route = fallback.Route()  # where the call went (activities/fallback.py)

    # ---- the first transaction ---------------------------------------------------------

    async def begin(self) -> Begun:
        """The first transaction, heartbeating while the database is slow or away. A closed
        gate rolls it back (the job stays `queued`); a limit's wait enters its fair queue."""
        budget_s = self._cfg.db_retry_budget_s
        async with heartbeating():
            for _ in range(limit_wake.LOOKS_PER_ATTEMPT):
                try:
                    return await db_retry(self._begin_transaction, budget_s=budget_s)
                except _Waiting as waiting:
                    w = waiting.wait
                except _Expiring as late:  # its start-by time or deadline passed: no call
                    return Begun(ended=await expired_at_start(self._d, self.job_id, late.code))
                wf = activity.info().workflow_id or ""
                if not await wait_place(self._d, w, self.job_id, wf):  # a pause's or a limit's
                    break
            return Begun(gate_wait_s=w.wait_s, gate_reason=w.reason)

    async def _begin_transaction(self) -> Begun:
        d = self._d
        start = attempt_start.Start(
            self.job_id,
            self.owner,
            self._cfg.identity,
            # The workflow type is the job type: its lock, before the row is read.
            d.lock_policy(activity.info().workflow_type or "")[0],
            self.run_id,
            self.chunk_no,
            self.number,
            self.inp.timeout_ms,
        )
        async with d.sessionmaker.begin() as s:
            got = await attempt_start.start(s, d.gateway, d.catalog, self._cfg, start)
            if isinstance(got, Wait):
                raise _Waiting(got)  # rolls the CAS back: still queued
            if isinstance(got, attempt_start.Expire):
                raise _Expiring(got.code)  # rolls back; the job ends without a call
            if isinstance(got, Refused):  # rolls the CAS back; no other call
                fail_over_budget(self.inp.job_id, got.limit, self.number)
            if isinstance(got, attempt_start.Stop):
                fail_final(got.code)  # rolls back
            if isinstance(got, attempt_start.Ended):
                return Begun(ended=got.status)
            if isinstance(got, attempt_start.Reused):
                return Begun(reuse_hash=got.output_hash)
            if isinstance(got, attempt_start.Held):
                self.chunk = got.chunk
                return Begun(held=got)
            self.chunk, self.started, self.call_no = got.chunk, got, got.call_no
            return Begun(started=got)

    async def run(self, begun: Begun) -> ExecuteResult:
        """The steps after the first transaction. A probe or lease no outcome settled (an error
        in the bookkeeping itself) is released on the way out, so the next caller probes
        instead of waiting for the probe's TTL."""
        if begun.started is not None:
            self.ticket = begun.started.ticket
        try:
            return await self._steps(begun)
        finally:
            lease = self.ticket.lease
            if self.ticket.probe_held or (lease is not None and lease.lease_id is not None):
                await asyncio.shield(self.ticket.release(self._d.sessionmaker))

    async def _steps(self, begun: Begun) -> ExecuteResult:
        if begun.ended is not None:
            activity.logger.info(
                "job ended before it ran", extra={"job_id": self.inp.job_id, "status": begun.ended}
            )
            return ExecuteResult(output_hash="", attempt=self.number, lifecycle_status=begun.ended)
        if begun.reuse_hash is not None:
            activity.logger.info("output already stored; reused", extra={"job_id": self.inp.job_id})
            return ExecuteResult(output_hash=begun.reuse_hash, attempt=self.number)
        if begun.held is not None:
            return await held.moderate_again(self, begun.held)
        started = begun.started
        assert started is not None
        row = started.row
        if self.number == 1 and self.chunk_no in (None, 0):  # the job just left the queue
            self._d.metrics.waited(row.job_type, row.queue_name, seconds_since(row.created_at))
        # Recorded after the first transaction ended: it held the row lock the CAS took, and
        # the failure is written from another connection.
        key_failure = self.ticket.key_failure
        if key_failure is not None:
            nothing = calls.Called("none", "none")
            await self.record_failure(row, key_failure, nothing, asked=False)
            fail_attempt(key_failure.code, attempt=self.number)
        called = await self.call(
            calls.Attempt(
                row,
                started.snapshot,
                started.jt,
                self.number,
                self.chunk,
                self.inp.timeout_ms,
                started.downgrades,
            )
        )
        if called.failure is not None:
            return await self.fail(row, called, called.failure)
        return await self.finish(row, called)

    # ---- the call ----------------------------------------------------------------------

    async def call(self, a: calls.Attempt) -> calls.Called:
        """The prompt, its content-safety check, the provider call and the output's validation.
        Every way it can end becomes a failure code, except a cancellation (a workflow cancel,
        or a drained worker's grace running out), which is recorded and then goes on."""
        d = self._d
        provider, model_name = self.route.start(d, a, self.ticket)
        started = time.monotonic()
        response: ProviderResponse | None = None
        failure: ExecutionFailure | None = None
        out: dict[str, Any] | None = None
        model_out: BaseModel | None = None
        called = False  # the provider was asked (a refused prompt is no call)
        request: ProviderRequest | None = None
        items: stream_items.ItemPublisher | stream_items.NoItems = stream_items.NoItems()
        guarded = guardrails.Guarded((None, None, None))
        try:
            # mask -> call -> moderate -> restore -> validate (jobs/guardrails.py)
            guard, items, request = await call_step.prepared(self, a, provider, model_name)
            self.ticket.api_key = None  # the decrypted key moved into the request
            called = True
            response = await items.during(fallback.call(self, a, provider, request, items.progress))
            guarded = await guard.answer(response.content)
            out, model_out, failure = guarded.validated
        except TimeoutError:
            failure = ExecutionFailure(
                "TIMEOUT", internal_message=f"provider call exceeded {self.inp.timeout_ms} ms"
            )
        except ExecutionFailure as f:
            failure = f
        except calls.SelfCancelled:
            failure = ExecutionFailure("CANCELLED", internal_message="cancel requested (SQL)")
        except asyncio.CancelledError:
            request = self.route.final(provider, request, model_name)[1]  # a moved call's
            await asyncio.shield(self._record_aborted(a, request, started, called))
            await asyncio.shield(items.settle(None))
            raise
        except Exception as exc:  # a bug or an unexpected library error: INTERNAL, retried once
            private = private_strings(
                a.snapshot,
                a.row.input,
                response.content if response else None,
                self.ticket.api_key or None,
            )
            failure = unexpected_failure(exc, self.inp.job_id, self.number, private)
        # Rejected items retracted; the kept ones matched by their place in the answer.
        await items.settle(out if failure is None else None, guarded.kept)
        latency_ms = int((time.monotonic() - started) * 1000)
        provider, request, model_name = self.route.final(provider, request, model_name)
        # Priced once (an unknown echo is reported once per call), for the metric and the row.
        charged = calls.charged(d.gateway.prices, a, request, response, self._cfg.estimate_margin)
        d.metrics.money.charged(provider.name, model_name, charged)
        cost = charged.cost_usd if charged is not None else Decimal(0)
        if called:
            code = failure.code if failure is not None else None
            observe_call(
                d.metrics,
                provider.name,
                model_name,
                latency_ms / 1000,
                error_code=code,
                response=response,
                cost_usd=cost,
            )
        call_step.estimate_checked(d, a, model_name, response)
        return calls.Called(
            provider.name,
            model_name,
            latency_ms,
            cost,
            response,
            failure,
            out,
            model_out,
            charged,
            request.structured_output if request is not None else None,
            guarded.flagged,
        )

    async def _record_aborted(
        self, a: calls.Attempt, request: ProviderRequest | None, started: float, called: bool
    ) -> None:
        """A workflow cancel, or a worker shutdown whose grace period ran out, stopped the
        attempt: the aborted call is recorded under what really happened, charged for what it
        may have cost (the caller then lets the cancellation go)."""
        d, row = self._d, a.row
        provider = d.gateway.provider_for(a.jt, row.credential_mode).name
        model = d.gateway.model_for(a.jt, row.credential_mode)
        code = WORKER_SHUTDOWN if activity.is_worker_shutdown() else "CANCELLED"
        charged = calls.charged(d.gateway.prices, a, request, None, self._cfg.estimate_margin)
        d.metrics.money.charged(provider, model, charged)
        elapsed = time.monotonic() - started
        cost = charged.cost_usd if charged is not None else Decimal(0)
        if called:
            observe_call(
                d.metrics, provider, model, elapsed, error_code=code, response=None, cost_usd=cost
            )
        aborted = calls.Called(provider, model, int(elapsed * 1000), cost, charged=charged)
        await self.record_failure(row, ExecutionFailure(code), aborted, asked=called)

    async def _provider_call(
        self, provider: Provider, request: ProviderRequest, progress: Progress | None = None
    ) -> ProviderResponse:
        """The call with this attempt's heartbeat and lock checks (activities/call.py)."""
        return await call_step.provider_call(self, provider, request, progress)

    # ---- a failed call -----------------------------------------------------------------

    async def fail(
        self, row: JobRow, called: calls.Called, failure: ExecutionFailure
    ) -> ExecuteResult:
        """Record the failed call, then fail the attempt as the taxonomy says; a 429 while the
        job may still wait for free returns the pause for the workflow to wait out instead."""
        await self.record_failure(row, failure, called)
        retry_after = failure.retry_after_float
        if retry_after is not None:
            retry_after = min(retry_after, self._cfg.retry_after_max_s)
        if failure.code == "PROVIDER_RATE_LIMITED" and await calls.rate_limit_is_free(
            self._d.sessionmaker, self.job_id, self.number, self.chunk_no
        ):
            # The key is paused now (recorded above); the job waits on its workflow's
            # timer, and the attempt is not spent.
            return ExecuteResult(
                output_hash="", attempt=self.number, gate_wait_s=retry_after or 1.0
            )
        abort_strategy = self.inp.abort_strategy
        if retry_follows(failure.code, attempt=self.number, abort_strategy=abort_strategy):
            self._d.metrics.execute_retry(row.job_type, failure.code)
        fail_attempt(
            failure.code,
            attempt=self.number,
            abort_strategy=abort_strategy,
            retry_after_s=retry_after,
        )

    async def record_failure(
        self, row: JobRow, failure: ExecutionFailure, called: calls.Called, *, asked: bool = True
    ) -> None:
        """The failed attempt's usage row and bookkeeping, and what the failure tells the job's
        gate and its provider limits, in one transaction (heartbeating: a slow database is not
        a dead worker). `asked`: the provider was asked (else the reserved tokens go back)."""
        usage = called.usage(row, self.number, self.chunk_no, failure.code, call_no=self.call_no)
        response = called.response
        async with heartbeating(), self._d.sessionmaker.begin() as s:
            await calls.record_failure(
                s, self.ticket, self._cfg, usage, failure, response=response, called=asked
            )
        self.ticket.settled()
        log.info(
            "provider attempt failed",
            extra={
                "job_id": str(row.id),
                "attempt": self.number,
                "chunk_no": self.chunk_no,
                "error_code": failure.code,
                "fault": failure.fault.value,
            },
        )

    # ---- the last transaction ----------------------------------------------------------

    async def finish(self, row: JobRow, called: calls.Called) -> ExecuteResult:
        """The provider answered with a valid output: store it with the call's usage, still
        holding the slot. A database outage now must not cost another provider call, so the
        transaction is retried through it; heartbeats go on until it commits: a slow or locked
        database while saving a paid answer must never look like a dead worker to Temporal
        (which would start a second attempt, and a second call)."""
        out, model_out, response = called.out, called.model_out, called.response
        assert out is not None and model_out is not None and response is not None
        st = Settlement(
            usage=called.usage(row, self.number, self.chunk_no, None, call_no=self.call_no),
            gate=self.ticket.gate,
            limits=self.ticket.limit_settle(
                response, called=True, max_block_s=self._cfg.retry_after_max_s
            ),
            job_id=row.id,
            owner=self.owner,
            attempt=self.number,
            ttl_s=self._d.lock_policy(row.job_type)[0],
            output=out,
            output_hash=output_hash(out),
            chunk_no=self.chunk_no,
            token=self.started.fence.token if self.started and self.started.fence else None,
            flagged=called.flagged,
        )
        async with heartbeating():
            settled = await db_retry(
                lambda: attempts_db.settle(self._d.sessionmaker, st),
                budget_s=self._cfg.db_retry_budget_s,
            )
        self.ticket.settled()  # settled in that commit: the key answered
        if not settled.owned:
            fail_final("INTERNAL_NOT_LOCK_OWNER")
        if settled.cancel_requested:
            fail_final("CANCELLED")  # seen in SQL after the call: nothing is projected
        return ExecuteResult(output_hash=st.output_hash, attempt=self.number)  # PROJECT is next
