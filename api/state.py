"""What the app holds for its lifetime: settings, the session factory, the job service and a
lazily connected Temporal client (the API starts, and reports not-ready, while Temporal is down)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from temporalio.client import Client

from api.events import JobEventHub
from db.session import SessionMaker
from engine.payloads import DATA_CONVERTER
from engine.settings import Settings
from jobs.credentials import CredentialService
from jobs.service import JobService
from jobs.spec import Catalog
from jobs.webhooks import WebhookService


@dataclass
class AppState:
    settings: Settings
    sessionmaker: SessionMaker
    catalog: Catalog
    jobs: JobService
    credentials: CredentialService
    # Job change streams: the process's one LISTEN connection, started on first use.
    events: JobEventHub
    # Webhook endpoints (api/routes/webhooks.py), under the same keyring as `credentials`.
    webhooks: WebhookService
    temporal: Client | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def temporal_client(self, timeout_s: float = 3.0) -> Client:
        if self.temporal is not None:
            return self.temporal
        async with self._lock:
            if self.temporal is None:
                self.temporal = await asyncio.wait_for(
                    Client.connect(
                        self.settings.require_temporal_address(),
                        namespace=self.settings.temporal_namespace,
                        data_converter=DATA_CONVERTER,
                    ),
                    timeout_s,
                )
        return self.temporal

    async def cancel_workflow(self, workflow_id: str) -> None:
        client = await self.temporal_client()
        await client.get_workflow_handle(workflow_id).cancel()
