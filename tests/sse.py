"""Reading a server-sent event stream in tests: the events and comments of a response."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class Event:
    id: str | None
    event: str | None
    data: dict[str, Any]


async def events_of(response: httpx.Response) -> AsyncIterator[Event | str]:
    """Parses an event stream: yields Events, and comments as their text."""
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line == "":
            if "data" in fields:
                yield Event(fields.get("id"), fields.get("event"), json.loads(fields["data"]))
            fields = {}
        elif line.startswith(":"):
            yield line[1:].strip()
        else:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
