"""Service tiers: names shared by the job workflow and the batch workflow (pure, no I/O)."""

from __future__ import annotations

# Sent (no payload) by the batch workflow to each job workflow whose batch item has its outcome
# recorded: the job reads it from PostgreSQL (db/batches.py `item_for`).
BATCH_RESULT_SIGNAL = "batch-result"
# Sent (no payload) to a batch workflow to make it poll now instead of at its next timer (a job
# that left its batch: a batch whose every item left is cancelled at the provider).
BATCH_POKE_SIGNAL = "batch-poke"
