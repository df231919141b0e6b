"""Webhook rules that need no server: which URLs production refuses (by name and by what the name
resolves to, at registration and again at connection time) and the retry backoff. Delivery itself
is tests/e2e/test_webhooks.py."""

from __future__ import annotations

import httpx
import pytest

from activities.webhooks import WebhookConfig, WebhookDeliverer, http_client
from jobs.webhooks import UrlRefused, address_is_public, check_url
from tests.webhook_helpers import receiver

DNS = {
    "localhost": ["127.0.0.1", "::1"],
    "hooks.example.com": ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"],
    "mixed.example.com": ["93.184.216.34", "10.1.2.3"],
    "v6private.example.com": ["2606:2800:220:1:248:1893:25c8:1946", "fd00::1"],
    "metadata.example.com": ["169.254.169.254"],
    "mapped.example.com": ["::ffff:127.0.0.1"],
}


async def stub_resolver(host: str, port: int) -> list[str]:
    if host not in DNS:
        raise OSError("no such host")
    return DNS[host]


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/hook",
        "http://hooks.example.com/hook",  # http, even to a public host
        "https://10.0.0.1/hook",
        "https://localhost/hook",
        "https://[::1]/hook",
        "https://mixed.example.com/hook",  # every address must be public
        "https://v6private.example.com/hook",
        "https://metadata.example.com/hook",
        "https://mapped.example.com/hook",
        "https://unknown.example.com/hook",
        "https://100.64.0.1/hook",
        "https://224.0.0.1/hook",
        "https://0.0.0.0/hook",
        "https://[fe80::1]/hook",
        "https://[ff02::1]/hook",
        "https://192.168.1.1:8443/hook",
    ],
)
async def test_production_url_rule_refuses(url: str) -> None:
    with pytest.raises(UrlRefused):
        await check_url(url, allow_private=False, resolve=stub_resolver)


async def test_production_url_rule_accepts_public_https() -> None:
    url = "https://hooks.example.com/hook?x=1"
    assert await check_url(url, allow_private=False, resolve=stub_resolver) == url
    assert await check_url("https://93.184.216.34/h", allow_private=False, resolve=stub_resolver)
    # Development: http and loopback are fine.
    assert await check_url("http://127.0.0.1:9/h", allow_private=True, resolve=stub_resolver)
    assert address_is_public("2606:2800:220:1:248:1893:25c8:1946")
    assert not address_is_public("::ffff:10.0.0.1")


async def test_the_delivery_connection_refuses_a_host_that_now_resolves_inward() -> None:
    """DNS rebinding: at delivery time the connection re-resolves and checks every address."""

    async def rebound(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    with receiver() as rec:
        port = rec.url.split(":")[2].split("/")[0]
        async with http_client(WebhookConfig(allow_private=False), rebound) as client:
            with pytest.raises(httpx.ConnectError):
                await client.post(f"https://hooks.example.com:{port}/hook", content=b"{}")
            with pytest.raises(httpx.ConnectError):
                await client.post(f"https://127.0.0.1:{port}/hook", content=b"{}")
        assert rec.requests == []


def test_backoff_doubles_with_jitter_up_to_its_cap() -> None:
    # The backoff needs neither a database nor an HTTP client.
    d = WebhookDeliverer(None, None, WebhookConfig())  # type: ignore[arg-type]
    for attempt, nominal in ((1, 30), (2, 60), (3, 120), (7, 1920), (8, 3600), (30, 3600)):
        delays = [d.backoff_s(attempt) for _ in range(50)]
        assert all(0.75 * nominal <= x < 1.25 * nominal for x in delays), (attempt, delays)
        assert len(set(delays)) > 1
