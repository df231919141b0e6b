"""What the OpenAPI document says an event of the job event streams is.

A `text/event-stream` response is a sequence of events, and before OpenAPI 3.2 the media type's
`schema` describes one event as a client's parser reads it: an object with `event` (its name),
`data` (its text) and `id`. Each event is one of three, told apart by `event`
(api/routes/events.py):

- `status`: `data` is the job's view as JSON (`JobStatusResponse`, the same as `GET
  /api/ai/jobs/{jobId}`);
- `item`: one item of a long source's succeeded chunk, or of a one-call job's streamed answer
  (`StreamItem`);
- `item_retracted`: a streamed item taken back (`StreamItemRetracted`).

`data` is declared as JSON text (`contentMediaType: application/json`) whose `contentSchema` is
that event's, so a validator reads it as a client does. Keep-alive comments are no events.
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import Field

from jobs.views import Camel

EVENT_ID_PATTERN = r"^[0-9]{1,19}$"


class StreamItem(Camel):
    """`data` of an `item` event."""

    job_id: uuid.UUID
    chunk: int = Field(ge=0, description="The chunk the item came from (0: a one-call job)")
    ordinal: int = Field(ge=0, description="The item's position within its chunk (0-based)")
    content: dict[str, Any] | None = Field(
        description="The item, its fields in camelCase, as the artifacts route shows it"
    )


class StreamItemRetracted(Camel):
    """`data` of an `item_retracted` event: the item of that chunk and ordinal is withdrawn."""

    job_id: uuid.UUID
    chunk: int = Field(ge=0)
    ordinal: int = Field(ge=0)


# Event name → the component its `data` holds.
EVENTS: dict[str, str] = {
    "status": "JobStatusResponse",
    "item": StreamItem.__name__,
    "item_retracted": StreamItemRetracted.__name__,
}


def _event(name: str, component: str) -> dict[str, Any]:
    return {
        "type": "object",
        "title": f"`{name}` event",
        "required": ["event", "data"],
        "properties": {
            "id": {
                "type": "string",
                "pattern": EVENT_ID_PATTERN,
                "title": "Id",
                "description": "The event's id: pass it back as Last-Event-ID to resume",
            },
            "event": {
                "type": "string",
                "const": name,
                "title": "Event",
                "description": "Which event it is",
            },
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": {"$ref": f"#/components/schemas/{component}"},
                "title": "Data",
                "description": f"The event's data: a {component} as JSON",
            },
            "retry": {
                "type": "integer",
                "minimum": 0,
                "title": "Retry",
                "description": "How long to wait before reconnecting, in milliseconds",
            },
        },
    }


def event_schema() -> dict[str, Any]:
    """One event of a job event stream (see the module's docstring)."""
    return {
        "oneOf": [_event(name, component) for name, component in EVENTS.items()],
        "description": "One server-sent event, as an EventSource reads it: `event` says which, "
        "`data` is its JSON.",
    }


def components() -> dict[str, dict[str, Any]]:
    """The schemas of the item events' `data`, for `components/schemas`."""
    out = {}
    for model in (StreamItem, StreamItemRetracted):
        schema = model.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
        out[model.__name__] = schema
    return out
