"""The operators' one-shot commands behind `aijobs outbox-dead` and `aijobs rotate-keys`
(runtime/cli.py parses their arguments and checks the process can start)."""

from __future__ import annotations

import sys

from db import outbox_admin as outbox_admin_db
from engine.settings import Settings


async def outbox_dead(settings: Settings, requeue: bool) -> None:
    """`aijobs outbox-dead [--requeue]`: the dead outbox rows, one line each; requeued."""
    from runtime.wiring import build_parts

    parts = build_parts(settings)
    try:
        async with parts.sessionmaker.begin() as s:
            dead = await outbox_admin_db.list_dead(s, limit=1000)
            for r in dead:
                print(
                    f"{r.id}\t{r.event_type}\t{r.aggregate_id}\tattempts={r.attempt_count}\t"
                    f"{(r.last_error or '')[:120]}"
                )
            if requeue and dead:
                n = len(await outbox_admin_db.requeue(s, [r.id for r in dead]))
                print(f"requeued {n} dead events")
    finally:
        await parts.close()


async def rotate_keys(s: Settings) -> int:
    """Every encrypted column (db/models/ marks them) under the keyring's current key; one
    summary line per column. Exit 1 when a required secret (a user's provider key, a webhook's
    signing secret) is not decryptable by the ring; a webhook's previous secret that is not is
    skipped and counted."""
    from jobs.credentials import credential_cipher
    from jobs.key_rotation import rotate_keys as rotate
    from runtime.wiring import build_parts

    keyring = credential_cipher(s)
    if keyring is None:  # production without a keyring: the startup check refuses it first
        print("aijobs rotate-keys: CREDENTIAL_ENCRYPTION_KEY is not set", file=sys.stderr)
        return 2
    parts = build_parts(s)
    try:
        summary = await rotate(parts.sessionmaker, keyring)
    finally:
        await parts.close()
    for column in summary.columns:
        print(column.line(keyring.current_key_id))
    return 1 if summary.failed else 0
