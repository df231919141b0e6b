"""Signed webhooks (Standard Webhooks): endpoints, their secrets, the receiver-URL rule, the
signature and the event body. See docs/webhooks.md.

A signing secret is `whsec_` + base64 of 32 random bytes. It is shown once, when it is created
(registration or rotation); at rest it is AES-GCM under CREDENTIAL_ENCRYPTION_KEY's current key
with the AAD bound to the endpoint's row id. No log line, list or error carries it.

Receiver URLs: outside production (or with WEBHOOK_ALLOW_PRIVATE) any http(s) URL; otherwise
https only, and every address the host resolves to (IPv4 and IPv6) must be public. The same check
runs when the endpoint is registered and again at each connection (DNS may change in between).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy.ext.asyncio import AsyncSession

from db import webhooks as webhooks_db
from db.session import SessionMaker
from db.webhooks import JOB_EVENTS, EndpointRow
from engine.errors import (
    CredentialStorageUnavailable,
    EngineError,
    ExecutionFailure,
    ValidationFailed,
    WebhookNotFound,
)
from jobs.views import JobStatusResponse
from providers.crypto import CredentialCipher

log = logging.getLogger(__name__)

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
MAX_URL_CHARS = 2048
# After a rotation the previous secret keeps signing (a second signature) this long: a day for
# a receiver's operators to roll out the new secret.
ROTATION_GRACE_S = 86_400.0
# Live endpoints per user: each gets a delivery per job, so the cap bounds what one user's jobs
# ask of the deliverers (a user with many hanging receivers is also bounded per delivery slot).
MAX_ENDPOINTS_PER_USER = 10

Resolver = Callable[[str, int], Awaitable[list[str]]]
# Runs in the transaction of an endpoint's create, delete or rotation (an audit entry).
Within = Callable[[AsyncSession, uuid.UUID], Awaitable[None]]


# ---- secrets and signatures -------------------------------------------------------------------


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(os.urandom(SECRET_BYTES)).decode()


def secret_key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signature_header(secrets: Sequence[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """One `v1,...` per valid secret, space-separated (two during a rotation's grace period)."""
    return " ".join(sign(s, msg_id, timestamp, body) for s in secrets)


def endpoint_aad(endpoint_id: object) -> str:
    return f"webhook_endpoint:{endpoint_id}"


def signing_secrets(
    cipher: CredentialCipher, row: EndpointRow, *, now: datetime | None = None
) -> list[str]:
    """The current secret, then the previous one while its grace period lasts. The current one
    must decrypt (CREDENTIAL_INVALID otherwise: the delivery is retried); a previous one that no
    key of the ring opens any more (its key was dropped before rotate-keys re-encrypted it) is
    left out, so the delivery still goes out with the current signature."""
    aad = endpoint_aad(row.id)
    secrets = [cipher.decrypt(row.key_id, bytes(row.secret_ciphertext), aad=aad)]
    now = now or datetime.now(UTC)
    if (
        row.previous_secret_ciphertext is not None
        and row.previous_key_id is not None
        and row.previous_valid_until is not None
        and row.previous_valid_until > now
    ):
        try:
            secrets.append(
                cipher.decrypt(row.previous_key_id, bytes(row.previous_secret_ciphertext), aad=aad)
            )
        except ExecutionFailure:
            log.warning(
                "previous webhook secret not decryptable; signing with the current one only",
                extra={"webhook_id": str(row.id), "key_id": row.previous_key_id},
            )
    return secrets


# ---- receiver URLs ------------------------------------------------------------------------------


class UrlRefused(ValidationFailed):
    """A receiver URL the rule refuses; the message names the rule, never an address."""


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def address_is_public(address: str) -> bool:
    """False for loopback, private, link-local, multicast, reserved, unspecified, shared
    (100.64/10) and documentation ranges, also behind an IPv4-mapped or 6to4/Teredo IPv6."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is not None and not address_is_public(str(embedded)):
            return False
    return not (
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or not ip.is_global
    )


async def public_addresses(host: str, port: int, resolve: Resolver = system_resolver) -> list[str]:
    """Every address `host` resolves to, all public; raises UrlRefused otherwise."""
    try:
        literal = ipaddress.ip_address(host.strip("[]"))
        addresses = [str(literal)]
    except ValueError:
        try:
            addresses = await resolve(host, port)
        except (OSError, UnicodeError):
            raise UrlRefused("The webhook URL's host does not resolve.") from None
    if not addresses:
        raise UrlRefused("The webhook URL's host does not resolve.")
    if not all(address_is_public(a) for a in addresses):
        raise UrlRefused("The webhook URL must point to a public address.")
    return addresses


async def check_url(
    url: str, *, allow_private: bool, resolve: Resolver | None = system_resolver
) -> str:
    """The receiver URL rule (module docstring); returns the URL or raises UrlRefused.
    `resolve=None` checks the URL's shape only (the caller checks addresses when it connects)."""
    if len(url) > MAX_URL_CHARS or any(ch <= " " or ch == "\x7f" for ch in url):
        raise UrlRefused("The webhook URL is invalid.")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise UrlRefused("The webhook URL is invalid.") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UrlRefused("The webhook URL must be an http(s) URL with a host.")
    if parts.username is not None or parts.password is not None:
        raise UrlRefused("The webhook URL must not carry credentials.")
    if allow_private:
        return url
    if parts.scheme != "https":
        raise UrlRefused("The webhook URL must use https.")
    if resolve is not None:
        await public_addresses(parts.hostname, port or 443, resolve)
    return url


# ---- the event body --------------------------------------------------------------------------


def _ts(value: datetime | None) -> str | None:
    if value is None:
        return None
    text = value.astimezone(UTC).isoformat() if value.tzinfo else value.isoformat()
    return text.replace("+00:00", "Z")


def event_body(event_type: str, occurred_at: datetime, job: JobStatusResponse) -> dict[str, Any]:
    """`{type, timestamp, data}`: `data` is the job's public view (jobs/views.py), the same JSON
    as `GET /api/ai/jobs/{jobId}` returns."""
    return {
        "type": event_type,
        "timestamp": _ts(occurred_at),
        "data": job.model_dump(mode="json", by_alias=True),
    }


# ---- endpoints (the API's use cases) ---------------------------------------------------------


class WebhookLimitReached(EngineError):
    """A user has as many live endpoints as MAX_ENDPOINTS_PER_USER allows: each endpoint
    gets a delivery per job, so the cap bounds what one user's jobs ask of the deliverers."""

    code = "WEBHOOK_LIMIT_REACHED"
    http_status = 409
    title = "Webhook limit reached"


class WebhookService:
    def __init__(
        self,
        sessionmaker: SessionMaker,
        cipher: CredentialCipher | None,
        *,
        allow_private: bool,
        rotation_grace_s: float = ROTATION_GRACE_S,
        max_endpoints: int = MAX_ENDPOINTS_PER_USER,
        resolve: Resolver = system_resolver,
    ) -> None:
        self._sm = sessionmaker
        self._max_endpoints = max_endpoints
        self._cipher = cipher
        self._allow_private = allow_private
        self._grace_s = rotation_grace_s
        self._resolve = resolve

    def _require_cipher(self) -> CredentialCipher:
        if self._cipher is None:
            raise CredentialStorageUnavailable(
                "Webhooks cannot be registered: no encryption key is set."
            )
        return self._cipher

    async def create(
        self,
        user_id: str,
        url: str,
        event_types: Sequence[str] | None,
        *,
        default_events: Sequence[str] = JOB_EVENTS,
        within: Within | None = None,
    ) -> tuple[EndpointRow, str]:
        """Returns the endpoint and its secret (the only time the secret leaves). At most
        `max_endpoints` live endpoints per user (WebhookLimitReached), checked under a per-user
        lock so concurrent registrations cannot overshoot it. `within` runs in the insert's
        transaction (an admin webhook's audit entry)."""
        cipher = self._require_cipher()
        await check_url(url, allow_private=self._allow_private, resolve=self._resolve)
        types = list(dict.fromkeys(event_types)) if event_types else list(default_events)
        endpoint_id = uuid.uuid4()
        secret = new_secret()
        key_id, blob = cipher.encrypt(secret, aad=endpoint_aad(endpoint_id))
        async with self._sm.begin() as s:
            if await webhooks_db.lock_user_endpoints(s, user_id) >= self._max_endpoints:
                raise WebhookLimitReached(
                    f"A user can register at most {self._max_endpoints} webhooks; delete one first."
                )
            row = await webhooks_db.insert_endpoint(
                s,
                endpoint_id=endpoint_id,
                user_id=user_id,
                url=url,
                event_types=types,
                key_id=key_id,
                ciphertext=blob,
            )
            if within is not None:
                await within(s, row.id)
        log.info("webhook registered", extra={"webhook_id": str(row.id)})
        return row, secret

    async def list(self, user_id: str) -> list[EndpointRow]:
        async with self._sm() as s:
            return await webhooks_db.list_endpoints(s, user_id)

    async def delete(
        self, user_id: str, endpoint_id: uuid.UUID, *, within: Within | None = None
    ) -> None:
        async with self._sm.begin() as s:
            if not await webhooks_db.delete_endpoint(s, user_id, endpoint_id):
                raise WebhookNotFound("Webhook not found.")
            if within is not None:
                await within(s, endpoint_id)
        log.info("webhook deleted", extra={"webhook_id": str(endpoint_id)})

    async def rotate(
        self, user_id: str, endpoint_id: uuid.UUID, *, within: Within | None = None
    ) -> tuple[EndpointRow, str]:
        """A new secret; the current one keeps signing, as a second signature, for the grace
        period (a previous secret still in its grace is replaced)."""
        cipher = self._require_cipher()
        secret = new_secret()
        key_id, blob = cipher.encrypt(secret, aad=endpoint_aad(endpoint_id))
        async with self._sm.begin() as s:
            current = await webhooks_db.get_endpoint(s, endpoint_id, for_update=True)
            if current is None or current.user_id != user_id or current.deleted_at is not None:
                raise WebhookNotFound("Webhook not found.")
            row = await webhooks_db.rotate_secret(
                s,
                endpoint_id,
                key_id=key_id,
                ciphertext=blob,
                previous_key_id=current.key_id,
                previous_ciphertext=bytes(current.secret_ciphertext),
                grace_s=self._grace_s,
            )
            if within is not None:
                await within(s, endpoint_id)
        log.info("webhook secret rotated", extra={"webhook_id": str(endpoint_id)})
        return row, secret
