"""A database error must not carry statement parameters (job input, outputs, key ciphertext)
into exception text, which ends up in logs and internal error messages."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from db.session import SessionMaker

SENTINEL = "SENTINEL-PARAM-7f3a"


async def test_db_errors_do_not_echo_parameters(db: SessionMaker) -> None:
    with pytest.raises(DBAPIError) as info:
        async with db.begin() as s:
            # A foreign-key violation (no such job), with a sentinel in the parameters.
            await s.execute(
                text(
                    "INSERT INTO ai_job_snapshot (job_id, content, redaction_version, expires_at) "
                    "VALUES (gen_random_uuid(), CAST(:c AS jsonb), 'r1', now())"
                ),
                {"c": f'{{"secret": "{SENTINEL}"}}'},
            )
    assert SENTINEL not in str(info.value)
    assert SENTINEL not in repr(info.value)
