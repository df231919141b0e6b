"""The batch workflow's names agree with its activities' (a workflow imports no activity
module: its type is spelled on each side, its activities are stubs named as they run), and an
answered line is charged at the batch price: half the standard price of the built-in OpenAI
models, nothing when the provider billed nothing."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from activities import batch as acts
from activities.batch import BatchCharge, batch_charge, usage_row
from activities.deps import StageDeps
from db.batch_results import Settled
from db.batches import BatchRow, custom_id_of, workflow_id_of
from jobs.gateway import Gateway
from jobs.spec import Catalog
from providers.base import Usage
from providers.batch import LineResult
from providers.pricing import PriceTable
from providers.synthetic import SyntheticProvider
from workflows import batch as wf


def deps() -> StageDeps:
    gateway = Gateway(provider=SyntheticProvider(), model="gpt-4o-mini", prices=PriceTable())
    return StageDeps(sessionmaker=None, catalog=Catalog([]), gateway=gateway)  # type: ignore[arg-type]


def test_the_workflow_and_its_activities_use_the_same_names() -> None:
    assert wf.BATCH_WORKFLOW == acts.BATCH_WORKFLOW
    stubs: dict[str, Any] = {
        acts.BATCH_TIMING: wf.batch_timing,
        acts.BATCH_SUBMIT: wf.batch_submit,
        acts.BATCH_POLL: wf.batch_poll,
    }
    for name, stub in stubs.items():
        assert stub.__temporal_activity_definition.name == name
    assert wf.BatchWorkflow.__temporal_workflow_definition.name == "ai_batch"  # type: ignore[attr-defined]


def test_ids_of_a_batch_and_an_item() -> None:
    job, batch = uuid.uuid4(), uuid.uuid4()
    assert custom_id_of(job, 2) == f"job-{job}-a2"
    assert workflow_id_of(batch) == f"ai-batch:{batch}"


def test_an_answered_line_is_charged_half_the_standard_price() -> None:
    body = {"model": "gpt-4o-mini-2024-07-18", "choices": []}
    line = LineResult("c", 200, body, Usage(2000, 1000, cached_input_tokens=0))
    charge = batch_charge(deps(), "gpt-4o-mini", line)
    assert charge is not None and charge.priced_as == "gpt-4o-mini"
    assert charge.model == "gpt-4o-mini-2024-07-18"
    assert charge.cost_usd * 2 == PriceTable().call_cost("gpt-4o-mini", 2000, 1000)
    assert batch_charge(deps(), "gpt-4o-mini", LineResult("c", 500, None, None, "X")) is None


def test_the_usage_row_says_batch() -> None:
    now = datetime.now(UTC)
    batch = BatchRow(
        uuid.uuid4(),
        "openai_compatible",
        "gpt-4o-mini",
        "platform",
        "q",
        "submitted",
        "b1",
        "f1",
        "ai-batch:x",
        1,
        now,
        now,
    )
    settled = Settled(uuid.uuid4(), uuid.uuid4(), 1, "succeeded", "u", "t", "platform_key")
    charge = BatchCharge(
        "gpt-4o-mini",
        "gpt-4o-mini",
        Usage(10, 5),
        PriceTable().call_cost("gpt-4o-mini", 10, 5, tier="batch"),
    )
    row = usage_row(batch, settled, charge, None, 3)
    assert (row.service_tier, row.call_no, row.tokens_in, row.attempt_no) == ("batch", 3, 10, 1)
    assert row.cost_usd == charge.cost_usd and row.error_code is None
