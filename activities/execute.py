"""EXECUTE: the one expensive step, a provider call, and the only stage that holds a worker slot.

`Execute.execute` runs one `_Attempt`, in small steps:
1. `begin`: one transaction, once the job's (provider, key) gate admits a call: the CAS
   queued → running (or this workflow's own lock, on a retry), the job row, its snapshot and
   its credential. A closed gate rolls it back and returns how long to wait (the workflow waits
   on a timer). A job that ended while it waited (cancelled) ends here without a call; an output
   a previous attempt already stored is reused, not bought again.
2. `call`: the prompt, the content-safety check and the provider call, under the job's timeout,
   heartbeating to Temporal on its own clock (never waiting on the database) while a separate
   task extends the SQL lock and reads a cancel recorded in SQL; then the output's validation.
3. `fail` (`record_failure`): the failed call's usage row, the attempt's bookkeeping and what it
   tells the key's gate, in one transaction; then the failure the taxonomy names. A 429 is
   waited out under the same attempt number.
4. `finish`: one transaction, still holding the slot and still heartbeating: the usage row,
   then (unless a cancel arrived meanwhile) the validated output. PROJECT projects it next.
   Only the output's hash goes back to Temporal.

A long source's chunk (`ExecuteInput.chunk_no`) is the same attempt over one chunk: its row is
locked and marked running in the first transaction (its own attempt counted), the gate, the
limits and the cost cover count the chunk's tokens, the prompt is the chunk's
(`jobs.chunked.chunk_model`), and the last transaction stores the chunk's output
(`db/chunks.py` `settle`) instead of the job's; MERGE makes the job's output from the chunks.
All chunk activities of one workflow share its lock owner (the workflow id).

The gate's half-open probe, when this attempt holds it, is settled on every exit path.
So a job is `running` while a slot works on it and while PROJECT and COMPLETE finish it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError
from sqlalchemy.ext.asyncio import AsyncSession
from temporalio import activity

from activities.deps import EngineConfig, StageDeps, lock_owner, log
from activities.failures import (
    fail_attempt,
    fail_final,
    internal_message,
    loggable,
    private_strings,
    summarise_validation,
)
from activities.project import log_completed, project_output
from activities.telemetry import observe_call, retry_follows, seconds_since
from db import chunks as chunks_db
from db import jobs as jobs_db
from db import lifecycle as lifecycle_db
from db import pipeline
from db import provider_gate as provider_gate_db
from db import provider_limits as provider_limits_db
from db import usage as usage_db
from db.chunks import ChunkRow
from db.errors import is_unavailable
from db.jobs import JobRow
from db.lifecycle import SETTLE_ATTEMPT, ExtendResult, settle_attempt_params, settled
from db.provider_gate import PLATFORM_KEY_REF, GateKey
from db.provider_gate import REACHABLE as GATE_REACHABLE
from db.provider_limits import LimitKey, Limits
from db.usage import INSERT as USAGE_INSERT
from db.usage import UsageRow
from engine.contracts import EXECUTE, ExecuteInput, ExecuteResult, ProjectResult
from engine.errors import ExecutionFailure, Fault, IllegalTransition, JobNotFound, LockConflict
from engine.hashing import output_hash
from engine.redaction import redact
from jobs.chunked import chunk_model
from jobs.costs import budget_windows, call_worst_case_usd, cover_next_call, padded
from jobs.spec import AnyJobType
from providers.base import Provider, ProviderRequest, ProviderResponse, SyntheticBehaviour

T = TypeVar("T")
WORKER_SHUTDOWN = "INTERNAL_WORKER_SHUTDOWN"
# A 429 is the provider asking the key to wait, not a failed attempt: the job waits out the pause
# in its workflow and calls again under the same attempt number, this many times per attempt
# (a key that answers 429 forever must still end its jobs).
FREE_RATE_LIMITS_PER_ATTEMPT = 5


@dataclass
class _Begun:
    """What the first transaction found."""

    ended: str | None = None  # the job ended before it could run: its state
    reuse_hash: str | None = None  # an output this job already stored
    row: JobRow | None = None
    snapshot: dict[str, Any] | None = None
    job_type: AnyJobType | None = None
    api_key: str | None = None
    key_failure: ExecutionFailure | None = None
    gate: GateKey | None = None  # the (provider, key) gate this job's call goes through
    gate_wait_s: float = 0.0  # > 0: the gate is closed; nothing was taken or spent
    gate_reason: str = ""  # why (engine/contracts.py ExecuteResult.gate_reason)
    probe: bool = False  # this attempt holds the gate's half-open probe
    lease: _Lease | None = None  # what the provider limits granted this call
    chunk: ChunkRow | None = None  # the long source's chunk this call is for


@dataclass
class _Lease:
    """What the key's provider limits granted this call, settled (lease ended, unused tokens
    given back, the answer's rate-limit headers recorded) with the call's end."""

    key: LimitKey
    limits: Limits
    tokens: int  # reserved: estimated input + the answer's budget
    lease_id: uuid.UUID | None = None  # held under a concurrency limit
    metered: bool = False  # the token bucket took `tokens`


@dataclass
class _Probe:
    """A half-open probe this attempt holds until one outcome settles it."""

    gate: GateKey | None = None
    held: bool = False


@dataclass
class _Called:
    """What the provider call came to: an output that validated, or the failure to record."""

    provider: str
    model: str
    latency_ms: int
    cost: Decimal  # priced once: the metric and the usage row agree
    response: ProviderResponse | None = None
    failure: ExecutionFailure | None = None
    out: dict[str, Any] | None = None  # the output as stored
    model_out: BaseModel | None = None  # the same, as the projector takes it


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
        if inp.yield_on_gate:
            begun = await attempt.begin()
            if begun.gate_wait_s > 0:
                return ExecuteResult(
                    output_hash="",
                    attempt=attempt.number,
                    gate_wait_s=begun.gate_wait_s,
                    gate_reason=begun.gate_reason,
                )
        else:  # a run recorded before the workflow waited on the gate itself
            begun = await attempt.begin_when_admitted()
        return await attempt.run(begun)


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
        self.probe = _Probe()
        self.lease: _Lease | None = None  # granted by the provider limits, not yet settled
        self.chunk_no = inp.chunk_no
        self.chunk: ChunkRow | None = None  # read (and locked) by the first transaction

    # ---- the first transaction ---------------------------------------------------------

    async def begin(self) -> _Begun:
        """The first transaction, heartbeating while the database is slow or away. A closed
        gate rolls it back (the job stays `queued`) and says how long to wait."""
        async with _heartbeating(self._cfg):
            try:
                return await db_retry(self._begin_transaction, budget_s=self._cfg.db_retry_budget_s)
            except _ProviderClosed as closed:
                self._d.metrics.limiter_waited(
                    closed.provider, closed.model, closed.reason, closed.wait_s
                )
                return _Begun(gate_wait_s=closed.wait_s, gate_reason=closed.reason)

    async def begin_when_admitted(self) -> _Begun:
        """The first transaction, once the job's provider admits a call. While it is paused
        (a 429's Retry-After) or its breaker is open, the transaction is rolled back (the job
        stays `queued`), the attempt is not spent, and this slot waits, heartbeating."""
        announced = False
        while True:
            begun = await self.begin()
            if begun.gate_wait_s <= 0:
                return begun
            if not announced:
                log.info(
                    "provider paused; the job waits without spending an attempt",
                    extra={"job_id": self.inp.job_id},
                )
                announced = True
            deadline = time.monotonic() + min(max(begun.gate_wait_s, 0.2), 5.0)
            while time.monotonic() < deadline:
                activity.heartbeat()
                await asyncio.sleep(min(0.5, max(deadline - time.monotonic(), 0.01)))

    async def _begin_transaction(self) -> _Begun:
        d, job_id = self._d, self.job_id
        async with d.sessionmaker.begin() as s:
            # The CAS and the read of the job and its snapshot go in one round trip: the read
            # sees the CAS's update, and it is not used when the CAS matched no row.
            locked, read = await pipeline.in_session(
                s,
                [
                    (
                        lifecycle_db.LOCK,
                        lifecycle_db.lock_params(
                            job_id,
                            owner=self.owner,
                            identity=self._cfg.identity,
                            # The workflow type is the job type: its lock, before the row is read.
                            ttl_s=d.lock_policy(activity.info().workflow_type or "")[0],
                            run_id=self.run_id,
                        ),
                    ),
                    (jobs_db.GET_WITH_SNAPSHOT, {"id": job_id}),
                ],
            )
            try:
                await lifecycle_db.locked_of(s, job_id, locked[0] if locked else None)
            except IllegalTransition as exc:
                return _Begun(ended=str(exc.from_status))  # cancelled while it waited, or done
            except LockConflict:
                fail_final("INTERNAL_NOT_LOCK_OWNER")
            except JobNotFound:
                fail_final("INTERNAL_JOB_MISSING")
            found = jobs_db.with_snapshot_of(read[0] if read else None)
            if found is None:
                fail_final("INTERNAL_JOB_MISSING")
            row, snapshot = found
            if row.cancel_requested_at is not None:
                fail_final("CANCELLED")
            if self.chunk_no is not None:
                # Locked until the commit: a retry racing a lost attempt of the same chunk
                # decides on its status after this one.
                self.chunk = await chunks_db.get_for_update(s, job_id, self.chunk_no)
                if self.chunk is None:
                    fail_final("INTERNAL_CHUNK_MISSING")
                if self.chunk.status == "succeeded" and self.chunk.output_hash is not None:
                    return _Begun(reuse_hash=self.chunk.output_hash)  # paid for already
            elif row.output_hash is not None and row.output is not None:
                return _Begun(reuse_hash=row.output_hash)
            if snapshot is None:
                fail_final("INTERNAL_SNAPSHOT_MISSING")
            jt = d.catalog.get(row.job_type)
            gate = d.gateway.gate_key(jt, row.credential_mode, row.user_id, row.credential_id)
            admission = None
            if gate is not None:
                admission = await provider_gate_db.admit(
                    s, gate, probe_ttl_s=jt.definition.execution.timeout_ms / 1000 + 30
                )
                if admission.wait_s > 0:  # rolls the CAS back: still queued
                    raise _ProviderClosed(
                        admission.wait_s,
                        admission.reason or "pause",
                        gate.provider,
                        d.gateway.model_for(jt, row.credential_mode),
                    )
            begun = _Begun(
                row=row,
                snapshot=snapshot,
                job_type=jt,
                gate=gate,
                probe=bool(admission and admission.probe),
                chunk=self.chunk,
            )
            if row.estimated_input_tokens is not None and await self._refused_by_budget(s, row, jt):
                # Rolls the CAS back; the job ends failed without another call.
                fail_final("BUDGET_EXHAUSTED")
            try:
                begun.api_key = await d.gateway.api_key(
                    s, jt, row.user_id, row.credential_mode, row.credential_id
                )
            except ExecutionFailure as f:
                begun.key_failure = f
            if begun.key_failure is None:
                # Last in the transaction: the key's limit row stays locked until the commit.
                begun.lease = await self._admit_limits(s, row, jt, gate)
            if self.chunk is not None:
                # After every check that rolls back: only an attempt that runs is counted.
                await chunks_db.start_attempt(s, job_id, self.chunk.chunk_no, self.number)
            return begun

    async def _refused_by_budget(self, s: AsyncSession, row: JobRow, jt: AnyJobType) -> bool:
        """Whether this call would take the job past its cost cap, or its user past a budget,
        beyond what create reserved (jobs/costs.py `cover_next_call`): only a call after a paid
        one can. Covered calls grow the job's reservation in this transaction."""
        cfg = self._cfg
        model = self._d.gateway.model_for(jt, row.credential_mode)
        price = self._d.gateway.prices.price_for(model)
        budget = row.max_output_tokens or jt.definition.execution.max_output_tokens
        if self.chunk is not None:
            # A chunked job's reservation holds every chunk not yet succeeded (this one and
            # those in flight included), each padded as create padded it and priced once as
            # create priced the whole: with nothing spent, exactly what create reserved.
            unfinished = await chunks_db.unfinished_input_tokens(s, row.id)
            worst = call_worst_case_usd(
                sum(padded(t, cfg.estimate_margin) for t in unfinished),
                budget * len(unfinished),
                price=price,
                margin=0.0,
            )
        else:
            worst = call_worst_case_usd(
                row.estimated_input_tokens or 0, budget, price=price, margin=cfg.estimate_margin
            )
        refused = await cover_next_call(
            s,
            job_id=row.id,
            user_id=row.user_id,
            reserved_usd=row.reserved_cost_usd,
            spent_usd=row.spent_cost_usd,
            max_cost_usd=row.max_cost_usd,
            call_worst_usd=worst,
            windows=budget_windows(
                cfg.budget_per_day_usd, cfg.budget_per_month_usd, dt.datetime.now(dt.UTC)
            ),
        )
        if refused is not None:
            log.info(
                "another call would exceed a cost limit; the job stops",
                extra={"job_id": self.inp.job_id, "limit": refused, "attempt": self.number},
            )
        return refused is not None

    async def _admit_limits(
        self, s: AsyncSession, row: JobRow, jt: AnyJobType, gate: GateKey | None
    ) -> _Lease | None:
        """The provider limits of the call's (provider, model, key): its request and tokens
        are taken, or `_ProviderClosed` says how long to wait (the caller's transaction rolls
        back: nothing taken, no attempt spent). The synthetic provider is limited only when
        AI_MODEL_LIMITS names its model; otherwise it costs no statement."""
        d = self._d
        provider = d.gateway.provider_for(jt, row.credential_mode).name
        model = d.gateway.model_for(jt, row.credential_mode)
        limits = self._cfg.model_limits.for_model(provider, model)
        if gate is None and not limits.configured:
            return None  # the synthetic provider announces nothing
        key = LimitKey(provider, model, gate.key_ref if gate is not None else PLATFORM_KEY_REF)
        # What OpenAI counts against TPM: the prompt and the whole answer budget. Jobs created
        # before the estimate was stored: the type's budget and no input. A chunk: its prompt.
        prompt_tokens = (
            self.chunk.input_tokens if self.chunk is not None else row.estimated_input_tokens
        )
        tokens = (prompt_tokens or 0) + (
            row.max_output_tokens or jt.definition.execution.max_output_tokens
        )
        got = await provider_limits_db.admit(
            s,
            key,
            limits,
            tokens=tokens,
            job_id=row.id,
            # A dead worker's lease frees the slot once the call could no longer be running.
            lease_ttl_s=self.inp.timeout_ms / 1000 + 30,
        )
        if got.wait_s > 0:
            raise _ProviderClosed(got.wait_s, got.reason or "announced", provider, model)
        return _Lease(key, limits, tokens, got.lease_id, got.metered)

    # ---- the steps after it ------------------------------------------------------------

    async def run(self, begun: _Begun) -> ExecuteResult:
        """The steps after the first transaction. A probe no outcome settled (an error in the
        bookkeeping itself) is released on the way out, so the next caller probes instead of
        waiting for the probe's TTL."""
        self.probe = _Probe(begun.gate, begun.probe)
        self.lease = begun.lease
        try:
            return await self._steps(begun)
        finally:
            if self.probe.held:
                await asyncio.shield(self._release_probe())
            if self.lease is not None and self.lease.lease_id is not None:
                await asyncio.shield(self._release_lease(self.lease.lease_id))

    async def _steps(self, begun: _Begun) -> ExecuteResult:
        if begun.ended is not None:
            activity.logger.info(
                "job ended before it ran", extra={"job_id": self.inp.job_id, "status": begun.ended}
            )
            return ExecuteResult(output_hash="", attempt=self.number, lifecycle_status=begun.ended)
        if begun.reuse_hash is not None:
            activity.logger.info("output already stored; reused", extra={"job_id": self.inp.job_id})
            return ExecuteResult(output_hash=begun.reuse_hash, attempt=self.number)
        row, snapshot, jt = begun.row, begun.snapshot, begun.job_type
        assert row is not None and snapshot is not None and jt is not None
        if self.number == 1 and self.chunk_no in (None, 0):  # the job just left the queue
            self._d.metrics.waited(row.job_type, row.queue_name, seconds_since(row.created_at))
        # Recorded after the first transaction ended: it held the row lock the CAS took, and
        # the failure is written from another connection.
        if begun.key_failure is not None:
            await self.record_failure(
                row, begun.key_failure, provider="none", model="none", called=False
            )
            fail_attempt(begun.key_failure.code, attempt=self.number)
        called = await self.call(row, snapshot, jt, begun)
        if called.failure is not None:
            return await self.fail(row, called, called.failure)
        return await self.finish(row, called)

    # ---- the call ----------------------------------------------------------------------

    async def call(
        self, row: JobRow, snapshot: dict[str, Any], jt: AnyJobType, begun: _Begun
    ) -> _Called:
        """The prompt, its content-safety check, the provider call and the output's validation.
        Every way it can end becomes a failure code, except a cancellation (a workflow cancel,
        or a drained worker's grace running out), which is recorded and then goes on."""
        d = self._d
        provider = d.gateway.provider_for(jt, row.credential_mode)
        model_name = d.gateway.model_for(jt, row.credential_mode)
        started = time.monotonic()
        response: ProviderResponse | None = None
        failure: ExecutionFailure | None = None
        out: dict[str, Any] | None = None
        model_out: BaseModel | None = None
        called = False  # the provider was asked (a refused prompt is no call)
        try:
            request = self._request(row, snapshot, jt, model_name, begun)
            called = True
            response = await self._provider_call(provider, request)
            out, model_out, failure = _validated_output(jt, response)
        except TimeoutError:
            failure = ExecutionFailure(
                "TIMEOUT", internal_message=f"provider call exceeded {self.inp.timeout_ms} ms"
            )
        except ExecutionFailure as f:
            failure = f
        except _SelfCancelled:
            failure = ExecutionFailure("CANCELLED", internal_message="cancel requested (SQL)")
        except asyncio.CancelledError:
            await asyncio.shield(
                self._record_aborted(row, provider.name, model_name, started, called)
            )
            raise
        except Exception as exc:  # a bug or an unexpected library error: INTERNAL, retried once
            log.warning(
                "EXECUTE failed with an unexpected error",
                extra={"job_id": self.inp.job_id, "attempt": self.number},
                exc_info=loggable(exc),
            )
            private = private_strings(
                snapshot, row.input, response.content if response is not None else None
            )
            if begun.api_key:
                private.append(begun.api_key)
            failure = ExecutionFailure(
                "INTERNAL_ERROR", internal_message=internal_message(exc, private=private)
            )

        latency_ms = int((time.monotonic() - started) * 1000)
        # Priced once (an unknown model is reported once per call), for the metric and the row.
        cost = (
            d.gateway.prices.cost_usd(response.model, response.tokens_in, response.tokens_out)
            if response is not None
            else Decimal(0)
        )
        if called:
            observe_call(
                d.metrics,
                provider.name,
                model_name,
                latency_ms / 1000,
                error_code=failure.code if failure is not None else None,
                response=response,
                cost_usd=cost,
            )
        # A retry with a correction sends more than was estimated: only first prompts count.
        estimated = (
            self.chunk.input_tokens if self.chunk is not None else row.estimated_input_tokens
        )
        if response is not None and estimated and not row.correction_hint:
            d.metrics.estimate_checked(row.job_type, model_name, estimated, response.tokens_in)
        return _Called(
            provider=provider.name,
            model=model_name,
            latency_ms=latency_ms,
            cost=cost,
            response=response,
            failure=failure,
            out=out,
            model_out=model_out,
        )

    async def _record_aborted(
        self, row: JobRow, provider: str, model: str, started: float, called: bool
    ) -> None:
        """A workflow cancel, or a worker shutdown whose grace period ran out, stopped the
        attempt: the aborted call is recorded under what really happened (the caller then lets
        the cancellation go)."""
        code = WORKER_SHUTDOWN if activity.is_worker_shutdown() else "CANCELLED"
        if called:
            observe_call(
                self._d.metrics,
                provider,
                model,
                time.monotonic() - started,
                error_code=code,
                response=None,
            )
        await self.record_failure(
            row,
            ExecutionFailure(code),
            provider=provider,
            model=model,
            latency_ms=int((time.monotonic() - started) * 1000),
            called=called,
        )

    def _request(
        self, row: JobRow, snapshot: dict[str, Any], jt: AnyJobType, model: str, begun: _Begun
    ) -> ProviderRequest:
        """The provider request: the prompt (with the correction after an invalid answer),
        checked for content safety when the job type asks. The decrypted key moves into the
        request and leaves `begun`."""
        model_in = jt.input_model.model_validate(snapshot["input"])
        if self.chunk is not None:
            model_in = chunk_model(jt, model_in, self.chunk.planned())  # its text, its share
        correction = None
        if self.number > 1 and row.correction_hint:
            correction = (
                f"Your previous answer was rejected: {row.correction_hint}. "
                "Answer again with JSON that matches the schema exactly."
            )
        prompt = jt.prompt(model_in, correction)
        if jt.definition.security.content_safety_check:
            self._d.gateway.safety.check([prompt.system, prompt.user])
        output_model: type[BaseModel] = jt.output_model
        request = ProviderRequest(
            job_id=self.inp.job_id,
            job_type=row.job_type,
            attempt=self.number,
            model=model,
            system_prompt=prompt.system,
            user_prompt=prompt.user,
            output_schema=_output_schema(output_model),
            timeout_s=self.inp.timeout_ms / 1000,
            # The budget fixed at create (cut to fit a per-job cost cap); older jobs: the type's.
            max_tokens=row.max_output_tokens or jt.definition.execution.max_output_tokens,
            api_key=begun.api_key,
            synthetic=(
                jt.synthetic_behaviour(model_in)
                if jt.synthetic_behaviour is not None
                else SyntheticBehaviour(output=jt.synthetic_output(model_in))
            ),
        )
        begun.api_key = None
        return request

    async def _provider_call(
        self, provider: Provider, request: ProviderRequest
    ) -> ProviderResponse:
        """The provider call under the definition's timeout. Heartbeats go to Temporal on their
        own clock (so a workflow cancel arrives within about a second, and a slow database can
        never starve them); the SQL lock is extended by a separate task, which also aborts the
        call when SQL says the job was cancelled or is no longer ours."""
        d, job_id, owner = self._d, self.job_id, self.owner
        ttl_s, extend_every_s = d.lock_policy(request.job_type)
        call = asyncio.ensure_future(provider.generate(request))
        self_cancelled = False

        async def extend_once() -> ExtendResult:
            async with d.sessionmaker.begin() as s:
                return await lifecycle_db.extend_lock(s, job_id, owner=owner, ttl_s=ttl_s)

        async def beat() -> None:
            interval = _beat_interval_s()
            while not call.done():
                await asyncio.sleep(interval)  # a call that ends first costs no heartbeat
                activity.heartbeat()

        async def extend() -> None:
            nonlocal self_cancelled
            while not call.done():
                await asyncio.sleep(extend_every_s)
                try:
                    ext = await asyncio.wait_for(extend_once(), timeout=extend_every_s)
                except Exception:
                    continue  # a lost extension is survivable; the TTL has slack
                if ext.cancel_requested or not ext.extended:
                    self_cancelled = True
                    call.cancel()
                    return

        helpers = [asyncio.ensure_future(beat()), asyncio.ensure_future(extend())]
        try:
            async with asyncio.timeout(self.inp.timeout_ms / 1000):
                return await call
        except asyncio.CancelledError:
            if self_cancelled and not _current_task_cancelling():
                raise _SelfCancelled() from None
            raise
        finally:
            for h in helpers:
                h.cancel()
            if not call.done():
                call.cancel()

    # ---- a failed call -----------------------------------------------------------------

    async def fail(self, row: JobRow, called: _Called, failure: ExecutionFailure) -> ExecuteResult:
        """Record the failed call, then fail the attempt as the taxonomy says; a 429 while the
        job may still wait for free returns the pause for the workflow to wait out instead."""
        await self.record_failure(
            row,
            failure,
            provider=called.provider,
            model=called.model,
            latency_ms=called.latency_ms,
            response=called.response,
            cost=called.cost,
        )
        retry_after = failure.retry_after_float
        if retry_after is not None:
            retry_after = min(retry_after, self._cfg.retry_after_max_s)
        if (
            failure.code == "PROVIDER_RATE_LIMITED"
            and self.inp.yield_on_gate
            and await self._rate_limit_is_free()
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
        self,
        row: JobRow,
        failure: ExecutionFailure,
        *,
        provider: str,
        model: str,
        latency_ms: int = 0,
        response: ProviderResponse | None = None,
        cost: Decimal = Decimal(0),
        called: bool = True,
    ) -> None:
        """The failed attempt's usage row and bookkeeping, and what the failure tells the job's
        gate and its provider limits, in one transaction (heartbeating: a slow database is not
        a dead worker). `called`: the provider was asked (else the reserved tokens go back)."""
        d = self._d
        async with _heartbeating(self._cfg), d.sessionmaker.begin() as s:
            await usage_db.insert(
                s,
                _usage_row(
                    row,
                    self.number,
                    response,
                    failure.code,
                    latency_ms,
                    provider,
                    model,
                    cost=cost,
                    chunk_no=self.chunk_no,
                ),
            )
            if self.probe.gate is not None:
                await self._note_provider_failure(s, row, failure)
            await lifecycle_db.record_attempt(
                s,
                row.id,
                attempt=self.number,
                internal_error=failure.internal_message or failure.code,
                correction_hint=failure.correction_hint,
            )
            if self.chunk_no is not None:
                await chunks_db.record_failure(s, row.id, self.chunk_no, self.number, failure.code)
            await self._settle_lease(s, response, called=called)
        self.probe.held = False
        self.lease = None
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

    async def _note_provider_failure(
        self, s: AsyncSession, row: JobRow, failure: ExecutionFailure
    ) -> None:
        """What this failure tells every worker about the job's (provider, key): a 429 pauses
        that key's calls for the Retry-After; only health failures (5xx, transport errors,
        timeouts) count towards its breaker; any other answer shows the provider reachable.
        A request's own error (400, 413, 422...) and a key's (401/403, 402) touch no other
        job. A probe that learned nothing (no call, a cancel) is released."""
        cfg, gate = self._cfg, self.probe.gate
        assert gate is not None
        if failure.code == "PROVIDER_RATE_LIMITED":
            pause_s = min(failure.retry_after_float or 1.0, cfg.retry_after_max_s)
            await provider_gate_db.pause(s, gate, pause_s)
            log.warning(
                "provider rate limited this key; its calls pause on every worker",
                extra={
                    "job_id": str(row.id),
                    "provider": gate.provider,
                    "key_kind": gate.key_ref.partition(":")[0],
                    "pause_s": pause_s,
                    "alert": "AIJOBS_PROVIDER_PAUSED",
                },
            )
        elif failure.fault is Fault.PROVIDER:
            opened = await provider_gate_db.failed(
                s, gate, threshold=cfg.breaker_failures, cooldown_s=cfg.breaker_cooldown_s
            )
            if opened:
                log.warning(
                    "provider keeps failing for this key; its circuit breaker is open",
                    extra={
                        "job_id": str(row.id),
                        "provider": gate.provider,
                        "key_kind": gate.key_ref.partition(":")[0],
                        "cooldown_s": cfg.breaker_cooldown_s,
                        "alert": "AIJOBS_PROVIDER_BREAKER_OPEN",
                    },
                )
        elif failure.answered:
            await provider_gate_db.reachable(s, gate)
        elif self.probe.held:
            await provider_gate_db.release_probe(s, gate)

    async def _rate_limit_is_free(self) -> bool:
        async with self._d.sessionmaker() as s:
            seen = await usage_db.calls_with(
                s, self.job_id, self.number, "PROVIDER_RATE_LIMITED", chunk_no=self.inp.chunk_no
            )
        return seen <= FREE_RATE_LIMITS_PER_ATTEMPT

    async def _settle_lease(
        self, s: AsyncSession, response: ProviderResponse | None, *, called: bool
    ) -> None:
        """The call's end, for its key's provider limits, in the caller's transaction: the
        lease ends, the tokens it reserved and did not use go back, and the answer's
        rate-limit headers are recorded (even for a key no limit is configured for: what the
        provider announces paces the next calls). A call without an answer is taken to have
        used what it reserved (the provider may have counted it)."""
        # Every call through a provider gate (every real provider) has a `_Lease`, limited or
        # not, so its headers land in the row its next admission reads (the configured model's
        # name, not the one the provider echoes).
        lease, headers = self.lease, response.rate_limit if response is not None else None
        if lease is None or not self._lease_to_settle(response):
            return  # nothing was taken and nothing announced: no statement
        if response is not None:
            used = response.tokens_in + response.tokens_out
        else:
            used = lease.tokens if called else 0
        await provider_limits_db.settle(
            s,
            lease.key,
            lease.lease_id,
            tokens_reserved=lease.tokens if lease.metered else 0,
            tokens_used=used,
            headers=headers,
            limits=lease.limits,
            max_block_s=self._cfg.retry_after_max_s,
        )

    def _lease_to_settle(self, response: ProviderResponse | None) -> bool:
        """Whether `_settle_lease` has a statement to run: a lease was taken, tokens metered,
        or the answer announced its rate limits."""
        lease, headers = self.lease, response.rate_limit if response is not None else None
        return lease is not None and (
            lease.lease_id is not None or lease.metered or headers is not None
        )

    async def _release_lease(self, lease_id: uuid.UUID) -> None:
        try:
            async with self._d.sessionmaker.begin() as s:
                await provider_limits_db.release(s, lease_id)
            self.lease = None
        except Exception:  # the lease's TTL still bounds it
            log.warning("could not release a provider call lease", exc_info=True)

    async def _release_probe(self) -> None:
        gate = self.probe.gate
        if gate is None:
            return
        try:
            async with self._d.sessionmaker.begin() as s:
                await provider_gate_db.release_probe(s, gate)
            self.probe.held = False
        except Exception:  # the probe's TTL still bounds it
            log.warning("could not release a provider probe", exc_info=True)

    # ---- the last transaction ----------------------------------------------------------

    async def finish(self, row: JobRow, called: _Called) -> ExecuteResult:
        """The provider answered with a valid output: store it with the call's usage, still
        holding the slot. A database outage now must not cost another provider call, so the
        transaction is retried through it; heartbeats go on until it commits: a slow or locked
        database while saving a paid answer must never look like a dead worker to Temporal
        (which would start a second attempt, and a second call)."""
        out, model_out, response = called.out, called.model_out, called.response
        assert out is not None and model_out is not None and response is not None
        digest = output_hash(out)
        usage = _usage_row(
            row,
            self.number,
            response,
            None,
            called.latency_ms,
            cost=called.cost,
            chunk_no=self.chunk_no,
        )
        async with _heartbeating(self._cfg):
            outcome, projected = await db_retry(
                lambda: self._last_transaction(row, model_out, usage, out, digest, response),
                budget_s=self._cfg.db_retry_budget_s,
            )
        self.probe.held = False  # settled in that commit: the key answered
        self.lease = None  # and the call's provider limits
        if outcome == "cancelled":
            fail_final("CANCELLED")  # seen in SQL after the call: nothing is projected
        if outcome == "not_owner":
            fail_final("INTERNAL_NOT_LOCK_OWNER")
        if projected is not None:
            self._d.metrics.job_finished(row.job_type, "succeeded")
            log_completed(self.inp.job_id, projected)
            return ExecuteResult(
                output_hash=digest, attempt=self.number, lifecycle_status="succeeded"
            )
        return ExecuteResult(output_hash=digest, attempt=self.number)  # PROJECT takes it from here

    async def _last_transaction(
        self,
        row: JobRow,
        validated: BaseModel,
        usage: UsageRow,
        out: dict[str, Any],
        digest: str,
        response: ProviderResponse | None = None,
    ) -> tuple[Literal["projected", "stored", "cancelled", "not_owner"], ProjectResult | None]:
        """One transaction while the slot is still held: the paid call's usage row always;
        then, while the job is still ours and nobody asked to cancel it, the output (which the
        PROJECT stage projects next). Runs recorded before the five-stage shape also project it
        here, in a savepoint (a projector that fails leaves the stored output for PROJECT). A
        cancel seen here is honoured."""
        d, owner = self._d, self.owner
        if (
            self.chunk_no is None
            and not self.inp.project_in_slot
            and not self._lease_to_settle(response)
        ):
            return await self._last_transaction_pipelined(row, usage, out, digest)
        async with d.sessionmaker.begin() as s:
            await usage_db.insert(s, usage)
            if self.probe.gate is not None:
                await provider_gate_db.reachable(s, self.probe.gate)
            if self.chunk_no is not None:
                # The chunk's output, its job's lock, attempts and progress (MERGE makes the
                # job's output once every chunk succeeded).
                owned, cancel_requested = await chunks_db.settle(
                    s,
                    row.id,
                    self.chunk_no,
                    owner=owner,
                    attempt=self.number,
                    ttl_s=d.lock_policy(row.job_type)[0],
                    output=out,
                    output_hash=digest,
                )
                await self._settle_lease(s, response, called=True)
                if not owned:
                    return "not_owner", None
                return ("cancelled" if cancel_requested else "stored"), None
            # The attempt recorded, the lock extended and the output stored: one statement.
            owned, cancel_requested = await lifecycle_db.settle_attempt(
                s,
                settle_attempt_params(
                    row.id,
                    owner=owner,
                    attempt=self.number,
                    ttl_s=d.lock_policy(row.job_type)[0],
                    output=out,
                    output_hash=digest,
                    progress=60,
                ),
            )
            await self._settle_lease(s, response, called=True)
            if not owned:
                return "not_owner", None
            if cancel_requested:
                return "cancelled", None  # the commit still settles the probe
            if not self.inp.project_in_slot:
                return "stored", None
            try:
                async with s.begin_nested():
                    return "projected", await project_output(d, s, row, validated, digest, owner)
            except Exception as exc:
                if is_unavailable(exc):
                    raise
                log.warning(
                    "projection inside EXECUTE failed; PROJECT will retry it",
                    extra={"job_id": str(row.id), "error_type": type(exc).__name__},
                    exc_info=loggable(exc),
                )
                await lifecycle_db.record_attempt(
                    s,
                    row.id,
                    attempt=self.number,
                    internal_error=internal_message(
                        exc,
                        private=private_strings(row.input, out),
                        context="projection failed",
                    ),
                )
                return "stored", None

    async def _last_transaction_pipelined(
        self, row: JobRow, usage: UsageRow, out: dict[str, Any], digest: str
    ) -> tuple[Literal["stored", "cancelled", "not_owner"], None]:
        """`_last_transaction` of a one-call job whose call left no provider limit to settle
        (the synthetic provider; a real provider whose answer announced no limits and took no
        lease): the same statements in the same order (the usage row, the gate's `reachable`,
        `settle_attempt`) in one transaction that commits in every outcome, so BEGIN, the
        statements and COMMIT go in one round trip (db/pipeline.py)."""
        d = self._d
        statements: list[pipeline.Statement] = [(USAGE_INSERT, usage.__dict__)]
        if self.probe.gate is not None:
            statements.append((GATE_REACHABLE, self.probe.gate.params()))
        statements.append(
            (
                SETTLE_ATTEMPT,
                settle_attempt_params(
                    row.id,
                    owner=self.owner,
                    attempt=self.number,
                    ttl_s=d.lock_policy(row.job_type)[0],
                    output=out,
                    output_hash=digest,
                    progress=60,
                ),
            )
        )
        results = await pipeline.run(d.sessionmaker, statements, commit=True)
        settled_rows = results[-1]
        owned, cancel_requested = settled(settled_rows[0] if settled_rows else None)
        if not owned:
            return "not_owner", None
        return ("cancelled" if cancel_requested else "stored"), None


def _usage_row(
    row: JobRow,
    attempt: int,
    response: ProviderResponse | None,
    error_code: str | None,
    latency_ms: int,
    provider: str | None = None,
    model: str | None = None,
    *,
    cost: Decimal = Decimal(0),
    chunk_no: int | None = None,
) -> UsageRow:
    """One call's ai_usage_log row; `cost` was priced once by the caller."""
    return UsageRow(
        job_id=row.id,
        user_id=row.user_id,
        job_type=row.job_type,
        attempt_no=attempt,
        credential_mode=row.credential_mode,
        provider=response.provider if response else (provider or "unknown"),
        model=response.model if response else (model or "unknown"),
        tokens_in=response.tokens_in if response else 0,
        tokens_out=response.tokens_out if response else 0,
        cost_usd=cost if response else Decimal(0),
        latency_ms=latency_ms,
        error_code=error_code,
        chunk_no=chunk_no,
    )


async def db_retry(op: Callable[[], Awaitable[T]], *, budget_s: float) -> T:
    """EXECUTE's own transactions ride out a database outage (heartbeating meanwhile) instead of
    failing the attempt: a lost connection must not spend one of the job's provider attempts."""
    delay = 0.5
    deadline = time.monotonic() + budget_s
    while True:
        try:
            return await op()
        except Exception as exc:
            if not is_unavailable(exc) or time.monotonic() > deadline:
                raise
            log.warning("database unavailable in EXECUTE; retrying in %.1fs", delay)
            activity.heartbeat()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 4.0)


def _validated_output(
    jt: AnyJobType, response: ProviderResponse
) -> tuple[dict[str, Any] | None, BaseModel | None, ExecutionFailure | None]:
    """The output as stored (validated, redacted when the job type asks) and as the model the
    projector takes, or why it is not valid."""
    try:
        data = json.loads(response.content)
    except ValueError:
        data = _NOT_JSON
    return validated_output(jt, data)


_NOT_JSON = object()  # an answer that did not parse: reported as such, never validated


def validated_output(
    jt: AnyJobType, data: Any
) -> tuple[dict[str, Any] | None, BaseModel | None, ExecutionFailure | None]:
    """`data` as the job's output: validated by the type's output model, redacted when the type
    asks (as stored, and as the model the projector takes), or why it is not valid. The one
    rule for a provider's answer and for MERGE's merged chunks alike."""
    try:
        if data is _NOT_JSON:
            raise ValueError("not JSON")
        validated = jt.output_model.model_validate(data)
    except (ValueError, ValidationError) as exc:
        detail = (
            summarise_validation(exc)
            if isinstance(exc, ValidationError)
            else "output is not valid JSON"
        )
        return (
            None,
            None,
            ExecutionFailure(
                "VALIDATION_OUTPUT_INVALID",
                internal_message=f"VALIDATION_OUTPUT_INVALID: {detail}",
                correction_hint=detail,
                answered=True,  # a 200: the provider is reachable, the answer was not usable
            ),
        )
    if jt.definition.security.output_redaction:
        # Redacted before it is stored: the stored output, the projected rows and the hash all
        # see the masked text, still in the output model's shape.
        validated = jt.output_model.model_validate(redact(validated.model_dump(mode="json")))
    return validated.model_dump(mode="json"), validated, None


@functools.cache
def _output_schema(model: type[BaseModel]) -> dict[str, Any]:
    """JSON schema of an output model; built once per job type, not per call."""
    return model.model_json_schema()


class _ProviderClosed(Exception):
    """The job's (provider, key) is paused, its breaker is open or one of its provider limits
    is used up (`reason`): wait, then ask again."""

    def __init__(self, wait_s: float, reason: str, provider: str, model: str) -> None:
        super().__init__(f"wait {wait_s:.1f}s ({reason})")
        self.wait_s = wait_s
        self.reason = reason
        self.provider = provider
        self.model = model


@contextlib.asynccontextmanager
async def _heartbeating(cfg: EngineConfig) -> AsyncIterator[None]:
    """Heartbeat to Temporal on its own clock while the body runs (a transaction that waits on
    a lock or a reconnect), so only a dead worker, never a slow database, times EXECUTE out."""
    interval = _beat_interval_s()

    async def beat() -> None:
        while True:
            # After the first interval, not at once: a transaction that commits within it (nearly
            # all do) costs no heartbeat, which Temporal would record in the run's state.
            await asyncio.sleep(interval)
            activity.heartbeat()

    task = asyncio.ensure_future(beat())
    try:
        yield
    finally:
        task.cancel()


def _beat_interval_s() -> float:
    """A quarter of this attempt's heartbeat timeout (its job type's or queue's lock), between
    0.2 s and 0.5 s: several beats always land inside the timeout."""
    timeout = activity.info().heartbeat_timeout
    timeout_s = timeout.total_seconds() if timeout else 10.0
    return max(0.2, min(0.5, timeout_s / 4))


class _SelfCancelled(Exception):
    """EXECUTE aborted its own call because SQL says the job was cancelled."""


def _current_task_cancelling() -> bool:
    task = asyncio.current_task()
    return bool(task and task.cancelling())
