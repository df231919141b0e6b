"""The process's one LISTEN connection (db/listener.py) on a real PostgreSQL: one backend for
every channel, named `<process>-listener`; each handler hears its channel's notifications and
MISSED once its channel is listened on and again after a reconnect (a dropped connection is
re-established on its own)."""

from __future__ import annotations

import uuid

from db.listener import Listener
from db.session import SessionMaker
from tests.integration.engine_helpers import execute, rows
from tests.support import eventually


async def test_one_named_connection_for_every_channel_and_missed_after_each_connect(
    db: SessionMaker, database_url: str
) -> None:
    name = f"aijobs-test-{uuid.uuid4().hex[:8]}"
    listener = Listener(database_url, application_name=name, tick_s=0.05)
    a: list[str | None] = []
    b: list[str | None] = []
    listener.on("test_listener_a", a.append)
    listener.on("test_listener_b", b.append)
    try:
        assert await listener.listening(10)
        await eventually(lambda: _async(a == [None] and b == [None]), what="MISSED at connect")

        backends = await rows(
            db,
            "SELECT application_name, query FROM pg_stat_activity WHERE application_name LIKE :n",
            n=f"{name}%",
        )
        assert [r.application_name for r in backends] == [f"{name}-listener"]
        assert backends[0].query.startswith("LISTEN")

        await execute(db, "SELECT pg_notify('test_listener_a', 'one')")
        await execute(db, "SELECT pg_notify('test_listener_b', 'two')")
        await execute(db, "SELECT pg_notify('test_listener_c', 'nobody')")
        await eventually(lambda: _async(a == [None, "one"] and b == [None, "two"]), what="both")

        # A handler added later is told MISSED once its channel is listened on.
        c: list[str | None] = []
        off = listener.on("test_listener_c", c.append)
        assert await listener.listening(10)
        await eventually(lambda: _async(c == [None]), what="MISSED for the new channel")
        await execute(db, "SELECT pg_notify('test_listener_c', 'three')")
        await eventually(lambda: _async(c == [None, "three"]), what="the new channel")
        off()

        await listener.drop_connection_for_tests()
        await eventually(lambda: _async(listener.connects == 2), what="a reconnect", timeout=15)
        await eventually(lambda: _async(a[-1] is None and b[-1] is None), what="MISSED again")
        await execute(db, "SELECT pg_notify('test_listener_a', 'after')")
        await execute(db, "SELECT pg_notify('test_listener_c', 'unheard')")
        await eventually(lambda: _async(a[-1] == "after"), what="notifications after it")
        assert c == [None, "three"]  # unregistered: nothing more
        still = await rows(
            db,
            "SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = :n",
            n=f"{name}-listener",
        )
        assert still[0].n == 1
    finally:
        await listener.close()


async def _async(value: bool) -> bool:
    return value
