"""The database a single-purpose bench script measures on: `DATABASE_URL` (which must be
disposable: the scripts truncate it), else a fresh embedded PostgreSQL, migrated, stopped when
the script is done (`bench.stages`, `bench.claim_plan`)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def scratch_database(prefix: str) -> Iterator[str]:
    """The database URL to measure on, for the duration of the block."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    from db.migrate import upgrade
    from runtime.embedded import start_postgres

    base = Path(tempfile.mkdtemp(prefix=prefix))
    base.chmod(0o755)  # the embedded server may run as its own system user
    pg = start_postgres(base / "pg")
    try:
        upgrade(pg.uri)
        yield pg.uri
    finally:
        pg.stop()
