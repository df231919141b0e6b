"""The operator console: server-rendered HTML pages at /console, served by the API process.

An admin signs in with an admin token (a session in PostgreSQL, `sessions.py`); the pages
(`pages.py`) and the actions (`actions.py`, CSRF-checked by `csrf.py`) call the admin API's own
use cases, so the console shows what the admin API answers and acts as it does. Templates and
the stylesheet are package data (`templates/`, `static/`): nothing is loaded from another host
and nothing is built; the pages carry no script at all. docs/console.md describes it.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from api.console import actions, pages, signin
from api.console.render import ConsoleHeaders

STATIC = Path(__file__).parent / "static"


def install(app: FastAPI) -> None:
    """Every /console answer gets the console's headers (CSP, no-store); its static files are
    served under /console/static; the routes are left out of the OpenAPI document."""
    app.add_middleware(ConsoleHeaders)
    app.mount("/console/static", StaticFiles(directory=STATIC), name="console-static")
    app.include_router(signin.router)
    app.include_router(actions.router)
    # Last: its catch-all answers the console's unknown pages.
    app.include_router(pages.router)
