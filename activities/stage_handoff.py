"""What PREPARE read for RESOLVE, handed over inside the worker process.

PREPARE and RESOLVE are local activities of the same workflow task, so they run in one worker
process, milliseconds apart. PREPARE's one round trip reads RESOLVE's rows too (the job's
references and its chunks, `db/stage_reads.py` `prepare_read`) and leaves them here; RESOLVE
takes them instead of opening a read-only transaction of its own. A hand-over is taken once,
only by the same run and job, and only while fresh (`MAX_AGE_S`): a run that slept between the
two (a delayed job's `runAt`), a worker restarted between them, or a RESOLVE retried later reads
the rows again, as before."""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass

from db.stage_reads import ResolveRead

# Older than this, RESOLVE reads the rows itself (the two stages are milliseconds apart).
MAX_AGE_S = 1.0
# At most this many hand-overs wait (a PREPARE whose RESOLVE never ran leaves one behind).
MAX_WAITING = 1024


@dataclass(frozen=True)
class _Left:
    at: float
    job_id: uuid.UUID
    read: ResolveRead


class Handoff:
    """PREPARE's reads for RESOLVE, by workflow run."""

    def __init__(self) -> None:
        self._left: OrderedDict[str, _Left] = OrderedDict()

    def put(self, run: str, job_id: uuid.UUID, read: ResolveRead) -> None:
        now = time.monotonic()
        self._left.pop(run, None)
        self._left[run] = _Left(now, job_id, read)
        while self._left:  # the oldest first: drop the stale and any beyond the cap
            oldest = next(iter(self._left.values()))
            if len(self._left) <= MAX_WAITING and now - oldest.at <= MAX_AGE_S:
                break
            self._left.popitem(last=False)

    def take(self, run: str, job_id: uuid.UUID) -> ResolveRead | None:
        left = self._left.pop(run, None)
        if left is None or left.job_id != job_id or time.monotonic() - left.at > MAX_AGE_S:
            return None
        return left.read
