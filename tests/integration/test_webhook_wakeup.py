"""A deliverer does not poll for new work: a committed new delivery wakes it (`NOTIFY
ai_webhook`, sent by the fan-out), so a delivery goes out within moments even when the poll
interval (the backstop for retries coming due) is an hour. Real PostgreSQL, a real HTTP
receiver on 127.0.0.1."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from activities.metrics import WorkerMetrics
from activities.webhooks import WebhookConfig, WebhookDeliverer
from db.session import SessionMaker
from tests.integration.engine_helpers import insert_job, scalar
from tests.support import eventually
from tests.webhook_helpers import CIPHER, publish_completed, receiver, running, service


async def test_a_new_delivery_wakes_an_idle_deliverer(db: SessionMaker, database_url: str) -> None:
    config = WebhookConfig(allow_private=True, poll_interval_s=3600.0, listen_url=database_url)
    d = WebhookDeliverer(db, CIPHER, config, metrics=WorkerMetrics(CollectorRegistry()))
    with receiver() as rec:
        await service(db).create("wake-user", rec.url, None)
        await publish_completed(db, await insert_job(db, "wake-user"))
        async with running(d):
            # The first delivery is claimed at start; after it the deliverer idles on its
            # (hour-long) poll, LISTENing for the next.
            await rec.wait_for(1, timeout=10)

            async def listening() -> bool:
                n = await scalar(
                    db,
                    "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN ai_webhook'",
                )
                return bool(n)

            await eventually(listening, timeout=10)
            await publish_completed(db, await insert_job(db, "wake-user"))
            requests = await rec.wait_for(2, timeout=10)
            assert len(requests) == 2
