"""An answer PostgreSQL cannot store (a NUL, an unpaired surrogate) is an invalid output, found in
Python before any write (jobs/output.py `unstorable`): for a whole answer, and for a streamed
item, which is not published while the stream goes on."""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

import pytest

from jobs.output import UNSTORABLE_HINT, unstorable, validated_answer
from jobs.stream_items import ItemPublisher, publisher
from jobs.types import default_catalog
from tests.job_data import SCRIPTED

TYPE = "flashcard_generation"


def with_front(text: str) -> dict[str, Any]:
    out = copy.deepcopy(SCRIPTED[TYPE])
    out["flashcards"][1]["front"] = text
    return out


@pytest.mark.parametrize(
    ("escaped", "bad"),
    [
        ('"a\\u0000b"', True),
        ('"\\ud800"', True),
        ('"x\\udfff"', True),
        ('"\\ud83d\\ude00 paired"', False),
        ('"plain \\u00e9"', False),
    ],
)
def test_a_nul_or_a_lone_surrogate_is_unstorable(escaped: str, bad: bool) -> None:
    value = json.loads(escaped)
    assert unstorable({"k": [1, {"x": value}]}) is bad
    assert unstorable({value: 1}) is bad  # a key counts too


@pytest.mark.parametrize("escape", ["\\u0000", "\\ud800"])
def test_an_answer_holding_one_is_invalid_with_a_hint_that_can_be_stored(escape: str) -> None:
    jt = default_catalog().get(TYPE)
    content = json.dumps(with_front("x")).replace('"x"', f'"a{escape}b"')
    out, model, failure = validated_answer(jt, content)
    assert out is None and model is None and failure is not None
    assert failure.code == "VALIDATION_OUTPUT_INVALID"
    # pydantic refuses a lone surrogate in a string field itself; a NUL is ours to find.
    if escape == "\\u0000":
        assert failure.correction_hint == UNSTORABLE_HINT
    assert not unstorable([failure.correction_hint, failure.internal_message])
    assert validated_answer(jt, json.dumps(with_front("fine")))[2] is None


def test_a_streamed_item_holding_one_is_not_published_and_the_stream_goes_on() -> None:
    jt = default_catalog().get(TYPE)
    items = publisher(None, jt, uuid.uuid4(), 1)  # type: ignore[arg-type]
    assert isinstance(items, ItemPublisher)
    text = json.dumps(with_front("x")).replace('"x"', '"a\\u0000b"')
    for i in range(0, len(text), 7):
        items.on_delta(text[i : i + 7])
    assert (items.stats.items, items.stats.rejected) == (2, 1)
    assert [n for n, _, _, _ in items._pending] == [0, 2]
