"""A finished batch's results recorded: its output and error files read line by line (never whole
in memory), each line's outcome stored and, for an answered line, its usage row written at the
batch price, a page of lines per transaction and each line in a savepoint of its own.

One line can never hold back another: an answer that cannot be stored (a NUL, an unpaired
surrogate: jobs/output.py `unstorable`) is found in Python first and recorded as a failed
`VALIDATION_OUTPUT_INVALID` line, without its answer, and still charged (the provider billed
it); should the database refuse a line's value anyway, that savepoint alone is rolled back and
the line is recorded the same way. A line's outcome is recorded once (db/batch_results.py), so
a page retried after a lost commit, or a whole read retried after a broken download, charges
nothing twice. The items no line names fail `PROVIDER_UNAVAILABLE` at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from sqlalchemy.ext.asyncio import AsyncSession

from activities.deps import StageDeps
from db import batch_results as results_db
from db import fallback_calls as calls_db
from db import usage as usage_db
from db.batch_results import Settled
from db.batches import BatchRow
from db.errors import is_refused_value
from db.usage import UsageRow
from engine.errors import ExecutionFailure, UnknownJobType
from engine.tiers import BATCH
from jobs.output import unstorable, validated_answer
from providers.base import Usage
from providers.batch import BatchClient, LineResult, ProviderBatch
from providers.openai_compat import chat_answer

# What an item that got no answer fails with (the batch failed, expired or was cancelled).
NO_ANSWER = "PROVIDER_UNAVAILABLE"
INVALID = "VALIDATION_OUTPUT_INVALID"
PAGE = 200  # lines per transaction


@dataclass(frozen=True)
class BatchCharge:
    """What one answered line is charged: the model as echoed, the model priced as, its
    reported usage and its cost at the batch price."""

    model: str
    priced_as: str
    usage: Usage
    cost_usd: Decimal


def batch_charge(deps: StageDeps, requested: str, line: LineResult) -> BatchCharge | None:
    """The charge of an answered line; None when the provider reported no usage (nothing
    billed: an error answer). An echoed model that could not be stored as the row's model is
    recorded as the requested one."""
    if line.usage is None:
        return None
    echoed = line.body.get("model") if line.body is not None else None
    usable = isinstance(echoed, str) and 0 < len(echoed) <= 128 and not unstorable(echoed)
    model = echoed if usable and isinstance(echoed, str) else requested
    prices = deps.gateway.prices
    priced = prices.priced_as(model, requested)
    u = line.usage
    cost = prices.call_cost(priced, u.tokens_in, u.tokens_out, u.cached_input_tokens, tier=BATCH)
    return BatchCharge(model, priced, u, cost)


def usage_row(
    batch: BatchRow,
    settled: Settled,
    charge: BatchCharge,
    error_code: str | None,
    call_no: int | None,
) -> UsageRow:
    """The usage row of one answered item: at the batch price, `service_tier` batch; its
    latency is the batch's, from submission to the results."""
    latency = datetime.now(UTC) - (batch.submitted_at or batch.created_at)
    u = charge.usage
    return UsageRow(
        job_id=settled.job_id,
        user_id=settled.user_id,
        job_type=settled.job_type,
        attempt_no=settled.attempt,
        credential_mode=settled.credential_mode,
        provider=batch.provider,
        model=charge.model,
        tokens_in=u.tokens_in,
        tokens_out=u.tokens_out,
        cost_usd=charge.cost_usd,
        latency_ms=min(int(latency.total_seconds() * 1000), 2**31 - 1),
        error_code=error_code,
        call_no=call_no,
        priced_as=charge.priced_as,
        cached_input_tokens=u.cached_input_tokens,
        reasoning_tokens=u.reasoning_tokens,
        service_tier=BATCH,
        structured_output=settled.structured_output,
    )


@dataclass
class Counts:
    recorded: int = 0
    charged: int = 0


class Results:
    """The results of one ended batch, recorded (module docstring)."""

    def __init__(self, deps: StageDeps, batch: BatchRow) -> None:
        self._d = deps
        self._batch = batch
        self.counts = Counts()

    async def record(self, client: BatchClient, remote: ProviderBatch) -> Counts:
        """Every line of the output file, then of the error file (an answer read first wins
        over an error line of the same request), then the items no line named."""
        for file_id in (remote.output_file_id, remote.error_file_id):
            if file_id:
                await self._file(client, file_id)
        async with self._d.sessionmaker.begin() as s:
            await results_db.fail_items(s, self._batch.id, NO_ANSWER)
        return self.counts

    async def _file(self, client: BatchClient, file_id: str) -> None:
        page: list[LineResult] = []
        lines = client.content_lines(file_id)
        try:
            async for line in lines:
                page.append(line)
                if len(page) >= PAGE:
                    await self._page(page)
                    page = []
        finally:
            await lines.aclose()  # the download's connection, even when a page failed
        if page:
            await self._page(page)

    async def _page(self, lines: list[LineResult]) -> None:
        async with self._d.sessionmaker.begin() as s:
            for line in lines:
                try:
                    async with s.begin_nested():
                        recorded, charged = await self._line(s, line)
                except Exception as exc:
                    if not is_refused_value(exc):
                        raise
                    async with s.begin_nested():  # the line again, without what was refused
                        recorded, charged = await self._line(s, line, refused=True)
                self.counts.recorded += recorded
                self.counts.charged += charged

    async def _line(
        self, s: AsyncSession, line: LineResult, *, refused: bool = False
    ) -> tuple[int, int]:
        """One line's outcome and, when the provider reported usage, its charge: how many of
        each were written (0 or 1)."""
        ok = line.succeeded and not refused and not unstorable(line.body)
        code: str | None = None
        if not ok:  # answered but not storable, or not answered
            code = INVALID if line.succeeded else line.error_code or NO_ANSWER
        settled = await results_db.settle(
            s,
            self._batch.id,
            line.custom_id,
            status="succeeded" if ok else "failed",
            response=line.body if ok else None,
            error_code=code,
        )
        if settled is None:
            return 0, 0  # recorded already, or not an item of this batch: charged once, or never
        charge = batch_charge(self._d, self._batch.model, line)
        if charge is None:
            return 1, 0
        if ok and settled.status == "succeeded":
            code = self._validation(settled.job_type, line)
        call_no = await calls_db.next_call(s, settled.job_id)
        await usage_db.insert(s, usage_row(self._batch, settled, charge, code, call_no))
        return 1, 1

    def _validation(self, job_type: str, line: LineResult) -> str | None:
        """The code the job's collect will find its answer failing with (the usage row records
        it, as a call's row does), None when it validates."""
        try:
            jt = self._d.catalog.get(job_type)
        except UnknownJobType:  # not this worker's type: its collect decides
            return None
        try:
            failure = validated_answer(jt, chat_answer(line.body))[2]
        except ExecutionFailure as exc:
            return exc.code
        return failure.code if failure is not None else None
