"""Service tiers: how soon, and at which price, a job's provider calls are made.

- `standard`: at once, one synchronous call per attempt, at the table's price.
- `batch`: grouped with other jobs into the provider's batch API (answered within 24 h, at its
  batch price); only for job types that accept it and providers that have one (docs/batch.md).
- `offpeak`: held `queued` on a durable timer until the provider's next discount window, and run
  there at the window's price (docs/money.md).

Pure names only: the job type's flags are `engine.definition.ServiceSpec`, the prices
`providers.pricing`, the batch machinery `workflows/batch.py`.
"""

from __future__ import annotations

from typing import Literal

ServiceTier = Literal["standard", "batch", "offpeak"]
SERVICE_TIERS: tuple[ServiceTier, ...] = ("standard", "batch", "offpeak")
STANDARD: ServiceTier = "standard"
BATCH: ServiceTier = "batch"
OFFPEAK: ServiceTier = "offpeak"

# What an off-peak job does when its deadline comes before a discount window: run at once at
# the standard price, or fail (OFFPEAK_DEADLINE_PASSED).
OffpeakOnDeadline = Literal["standard", "fail"]
OFFPEAK_ON_DEADLINE: tuple[OffpeakOnDeadline, ...] = ("standard", "fail")

# Sent (no payload) by the batch workflow to each job workflow whose batch item has its outcome
# recorded: the job reads it from PostgreSQL (db/batches.py `item_for`).
BATCH_RESULT_SIGNAL = "batch-result"
# Sent (no payload) to a batch workflow to make it poll now instead of at its next timer (a job
# that left its batch: a batch whose every item left is cancelled at the provider).
BATCH_POKE_SIGNAL = "batch-poke"
