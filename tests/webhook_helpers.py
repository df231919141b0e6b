"""Webhook test helpers shared by the webhook e2e tests and the deliverer's integration tests:
a receiver that records what it is sent; Standard Webhooks signature checks written from the spec
(not from our signer); and the deliverer's side written straight to SQL (endpoints, published
events fanned out as the relay does, the deliveries' statuses).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sqlalchemy import text

from activities.webhooks import WebhookDeliverer
from db import webhook_deliveries as webhooks_db
from db.outbox import COMPLETED
from db.session import SessionMaker
from jobs.credentials import credential_cipher
from jobs.webhooks import WebhookService
from tests.integration.engine_helpers import insert_job, rows
from tests.stack import make_settings
from tests.support import eventually

# ---- the receiver ---------------------------------------------------------------------------


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    """Answers each POST with the next scripted status (then 200) and records it."""

    statuses: list[int] = field(default_factory=list)
    requests: list[Received] = field(default_factory=list)
    url: str = ""

    async def wait_for(self, n: int, timeout: float = 15.0) -> list[Received]:
        async def arrived() -> bool:
            return len(self.requests) >= n

        await eventually(
            arrived,
            timeout=timeout,
            interval=0.02,
            what=lambda: f"{n} deliveries ({len(self.requests)} so far)",
        )
        return list(self.requests)


@contextlib.contextmanager
def receiver(*statuses: int) -> Iterator[Receiver]:
    rec = Receiver(list(statuses))
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            with lock:
                code = rec.statuses.pop(0) if rec.statuses else 200
                rec.requests.append(
                    Received({k.lower(): v for k, v in self.headers.items()}, body, time.time())
                )
            self.send_response(code)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    rec.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


# ---- Standard Webhooks verification, from the spec -------------------------------------------


def expected_signature(secret: str, msg_id: str, timestamp: str, body: bytes) -> str:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = msg_id.encode() + b"." + timestamp.encode() + b"." + body
    return base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def verified_by(secret: str, req: Received) -> bool:
    """True when one of the `v1,` signatures of the request is the secret's (constant-time)."""
    want = expected_signature(
        secret, req.headers["webhook-id"], req.headers["webhook-timestamp"], req.body
    )
    for entry in req.headers["webhook-signature"].split(" "):
        version, _, sig = entry.partition(",")
        if version == "v1" and hmac.compare_digest(sig, want):
            return True
    return False


def assert_fresh(req: Received) -> None:
    assert abs(int(req.headers["webhook-timestamp"]) - time.time()) < 60


# ---- the deliverer's side: endpoints, published events, deliveries (straight to SQL) ----------


CIPHER = credential_cipher(make_settings("postgresql://unused", "unused:7233"))


def service(db: SessionMaker, max_endpoints: int = 50) -> WebhookService:
    return WebhookService(
        db, CIPHER, allow_private=True, rotation_grace_s=3600.0, max_endpoints=max_endpoints
    )


async def publish_completed(db: SessionMaker, job_id: uuid.UUID) -> int:
    """A published `ai.job.completed` outbox row for the job, fanned out to its owner's webhooks
    the way the relay does it (in the transaction that publishes it)."""
    async with db.begin() as s:
        event_id = int(
            await s.scalar(
                text(
                    "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, "
                    "dedupe_key, payload, status, published_at) VALUES (:event, "
                    "'ai_job', :jid, :dk, '{}'::jsonb, 'published', now()) RETURNING id"
                ),
                {"event": COMPLETED, "jid": str(job_id), "dk": f"{COMPLETED}:{job_id}"},
            )
        )
        await webhooks_db.fan_out(s, [event_id])
    return event_id


async def statuses(db: SessionMaker, user_id: str) -> list[str]:
    found = await rows(
        db,
        "SELECT d.status FROM webhook_delivery d JOIN webhook_endpoint e ON e.id = d.endpoint_id "
        "WHERE e.user_id = :u ORDER BY d.id",
        u=user_id,
    )
    return [r.status for r in found]


@contextlib.asynccontextmanager
async def running(d: WebhookDeliverer) -> AsyncIterator[WebhookDeliverer]:
    stop = asyncio.Event()
    task = asyncio.create_task(d.run(stop))
    try:
        yield d
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def fanned_out(db: SessionMaker, user: str, endpoints: int, jobs: int) -> None:
    svc = service(db)
    for i in range(endpoints):
        await svc.create(user, f"http://127.0.0.1:9/{user}/{i}", None)
    for _ in range(jobs):
        await publish_completed(db, await insert_job(db, user))
