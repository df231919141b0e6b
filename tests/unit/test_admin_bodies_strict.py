"""The admin bodies read their booleans and date-times as OpenAPI states them: `0` is not a
boolean and a JSON number is not an RFC 3339 date-time (pydantic's lax mode would read them as
False and as a Unix time; schemathesis's coverage phase sends both)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from api.routes.admin_bulk import BulkBody, BulkRetryBody
from api.schemas import RetryBody


@pytest.mark.parametrize(
    ("model", "body"),
    [
        (BulkBody, {"dryRun": 0}),
        (BulkBody, {"createdTo": 0}),
        (BulkBody, {"createdFrom": 1.5}),
        (BulkRetryBody, {"overrideBudget": 0}),
        (RetryBody, {"overrideBudget": 1}),
    ],
)
def test_a_number_is_neither_a_boolean_nor_a_date_time(model: Any, body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        model.model_validate(body)


def test_the_documented_forms_are_read() -> None:
    b = BulkRetryBody.model_validate(
        {"dryRun": True, "overrideBudget": False, "createdTo": "2026-01-01T00:00:00Z"}
    )
    assert b.dry_run is True and b.override_budget is False and b.created_to is not None
