"""The operator console's browser tests' helpers: Debian's chromium driven by Playwright (no
browser download), signing in through the form, and what every console answer must carry.

Where chromium is missing, the browser tests fail (never skip) naming the command that
installs it (`make chromium`, which `make install-dev` and `make test` run)."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import pytest
from playwright.async_api import Browser, BrowserContext, Page, async_playwright

CHROMIUM = "/usr/bin/chromium"
INSTALL = "DEBIAN_FRONTEND=noninteractive apt-get update && apt-get install -y chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
LOCAL_HOSTS = {"127.0.0.1"}


def chromium_path() -> str:
    found = shutil.which("chromium") or CHROMIUM
    if not os.access(found, os.X_OK):
        pytest.fail(f"chromium is missing: run `make chromium` ({INSTALL})", pytrace=False)
    return found


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    path = chromium_path()
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=path, args=ARGS, headless=True)
        try:
            yield browser
        finally:
            await browser.close()


@asynccontextmanager
async def tab(
    browser: Browser, base_url: str, viewport: dict[str, int] = DESKTOP
) -> AsyncIterator[tuple[BrowserContext, Page, list[str]]]:
    """A fresh browser context (no cookies) and page; every URL it requests is recorded."""
    context = await browser.new_context(base_url=base_url, viewport=viewport)  # type: ignore[arg-type]
    page = await context.new_page()
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    try:
        yield context, page, requested
    finally:
        await context.close()


async def sign_in(page: Page, token: str) -> None:
    """The form as a person uses it: the field labelled "Admin token", then Enter."""
    await page.goto("/console/login")
    field = page.get_by_label("Admin token")
    await field.fill(token)
    await field.press("Enter")
    await page.wait_for_url("**/console/jobs")


def script_policy(csp: str) -> str:
    """The directive that governs scripts: `script-src`, else `default-src`."""
    directives = {}
    for part in csp.split(";"):
        name, _, value = part.strip().partition(" ")
        if name:
            directives[name.lower()] = value
    return directives.get("script-src", directives.get("default-src", ""))


def off_host(urls: list[str]) -> list[str]:
    return [u for u in urls if urlsplit(u).hostname not in LOCAL_HOSTS]
