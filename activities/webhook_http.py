"""The webhook deliverer's HTTP client (activities/webhooks.py): no redirects, no proxies from
the environment, and, unless private receivers are allowed, connections only to public
addresses, checked at connect time."""

from __future__ import annotations

from typing import Any

import httpcore
import httpx

from jobs.webhooks import Resolver, UrlRefused, public_addresses


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    """Connects only to public addresses: the host is resolved here, every address checked,
    and the connection made to a checked address (TLS still verifies the host name), so a DNS
    answer that changes after registration cannot point a delivery inward."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend, resolve: Resolver) -> None:
        self._inner = inner
        self._resolve = resolve

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            addresses = await public_addresses(host, port, self._resolve)
        except UrlRefused as exc:
            raise httpcore.ConnectError(exc.public_message) from None
        return await self._inner.connect_tcp(
            addresses[0],
            port,
            timeout=timeout,
            local_address=local_address,
            socket_options=socket_options,
        )

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def guarded_client(
    *, allow_private: bool, max_connections: int, timeout: httpx.Timeout, resolve: Resolver
) -> httpx.AsyncClient:
    """An HTTP client that never follows a redirect nor reads a proxy from the environment;
    unless `allow_private`, it connects only to public addresses (`_GuardedBackend`)."""
    transport = httpx.AsyncHTTPTransport(retries=0)
    if not allow_private:
        transport._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=max_connections,
            network_backend=_GuardedBackend(httpcore.AnyIOBackend(), resolve),
        )
    return httpx.AsyncClient(
        transport=transport, follow_redirects=False, trust_env=False, timeout=timeout
    )
