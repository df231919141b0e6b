"""The job workflow's patch ids: each one gates a change of the commands a run issues, so runs
recorded before the change replay through their own commands (docs/versioning.md). Ids are
never reused or removed while a run that asked for one may still be open.
"""

from __future__ import annotations

SKIP_COMPLETE_STAGE = "skip-complete-stage"
# EXECUTE does the CAS queued -> running when a worker slot starts it; RESOLVE no longer runs.
EXECUTE_OWNS_RUNNING = "execute-owns-running"
# The five stages, each under its own name: resolve before the slot, project and complete after
# it; a closed provider gate is waited out on a workflow timer.
FIVE_STAGES = "five-stages"
# A provider limit's wait (its bucket's exact refill time) is waited as it is, not backed off.
EXACT_LIMIT_WAITS = "exact-limit-waits"
# A long source runs as its chunks: one EXECUTE per chunk (a window of them in flight), then
# MERGE, then PROJECT. Runs before it called one EXECUTE over the whole source.
CHUNKED_FAN_OUT = "chunked-fan-out"
# A call that moved down its provider fallback chain is upserted as the run's memo `fallback`.
FALLBACK_MEMO = "provider-fallback-memo"
# A delayed job (`runAt`) waits on a durable timer after PREPARE (only such a job asks). The
# relay now dispatches a delayed job at its runAt and starts it without one: only runs started
# before (and a row dispatched early) still take this branch.
DELAYED_START = "delayed-start"
# A provider limit's wait ends at its exact time or at a wake-up signal (workflows/limit_wait.py).
LIMIT_WAKE = "limit-wake"
# A job that reuses another job's answer runs the `reuse` stage instead of EXECUTE, waiting for
# its source's end on a signal (workflows/reuse_wait.py; only such a job asks).
RESULT_REUSE = "result-reuse"
# An off-peak job waits `queued` on a durable timer for its provider's discount window (or its
# deadline) after RESOLVE, and an EXECUTE that found the window closed is waited out exactly.
OFFPEAK_HOLD = "offpeak-hold"
# A batch-tier job's attempts go through its provider's Batch API (workflows/batch_tier.py);
# only such a job asks.
BATCH_TIER = "batch-tier"
