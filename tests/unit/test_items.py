"""The complete items of an answer still being written (engine/items.py), checked on answers
cut at every offset: no item is handed out before its last byte, none changes once handed out,
and each is handed out by the time the next one starts (the last one by the object's end)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.items import ItemStream, complete_items

TRICKY = [
    {"q": "What is a[1] in {x}?", "a": 'the "second" one, not ]', "n": 1},
    {"q": "nested", "options": [[1, 2], {"k": [3]}], "ok": True, "none": None},
    {"q": "é ü 漢字 \\ / \t", "score": -1.5e3},
    {"q": "", "a": "}", "tags": []},
]


def _document(
    items: list[Any], field: str | None, before: str, after: str
) -> tuple[str, list[int], list[int]]:
    """The answer text, and where each item starts and ends (exclusive) in it."""
    pieces = [json.dumps(item, ensure_ascii=False) for item in items]
    head = json.dumps(field) + ": [" if field is not None else "["
    text = ("{" + before + head) if field is not None else head
    starts, ends = [], []
    for n, piece in enumerate(pieces):
        if n:
            text += ", "
        starts.append(len(text))
        text += piece
        ends.append(len(text))
    text += "]"
    if field is not None:
        text += after + "}"
    return text, starts, ends


@pytest.mark.parametrize(
    ("field", "before", "after"),
    [
        ("questions", "", ""),
        ("questions", '"title": "a [quiz] {1}", ', ', "count": 4'),
        ("cards", '"meta": {"cards": [9]}, ', ""),
        (None, "", ""),
    ],
)
def test_every_offset(field: str | None, before: str, after: str) -> None:
    text, starts, ends = _document(TRICKY, field, before, after)
    assert complete_items(text, field) == TRICKY
    previous: list[Any] = []
    for offset in range(len(text) + 1):
        got = complete_items(text[:offset], field)
        # A prefix of the items, each complete in the text read so far.
        assert got == TRICKY[: len(got)], offset
        assert all(ends[i] <= offset for i in range(len(got))), offset
        # Never fewer than before; every item whose successor has started is out.
        assert len(got) >= len(previous), offset
        started = sum(1 for s in starts[1:] if s < offset)
        assert len(got) >= started, offset
        previous = got
    assert previous == TRICKY


def test_the_last_item_is_out_once_a_later_field_has_a_value() -> None:
    text = '{"cards": [{"a": 1}, {"b": 2}], "note": "wri'
    assert complete_items(text, "cards") == [{"a": 1}, {"b": 2}]
    assert complete_items('{"cards": [{"a": 1}, {"b": 2}]', "cards") == [{"a": 1}]
    assert complete_items('{"cards": [{"a": 1}, {"b": 2}]}', "cards") == [{"a": 1}, {"b": 2}]


def test_lists_of_strings_and_numbers() -> None:
    assert complete_items('{"items": ["ab", "c', "items") == ["ab"]
    assert complete_items('{"items": [1, 2', "items") == [1]
    assert complete_items('{"items": [1, 23]}', "items") == [1, 23]


@pytest.mark.parametrize(
    "text",
    ["", "   ", "not json", '{"other": [1, 2, 3]}', '{"items": 5}', "[1, 2]", '{"items": [1, x'],
)
def test_nothing_to_hand_out(text: str) -> None:
    assert complete_items(text, "items") == []


def test_a_stream_hands_out_each_item_once_in_order() -> None:
    text, _, _ = _document(TRICKY, "questions", '"title": "t", ', "")
    for size in (1, 3, 7, 64, len(text)):
        stream = ItemStream("questions")
        got: list[Any] = []
        for i in range(0, len(text), size):
            got.extend(stream.feed(text[i : i + size]))
        assert got == TRICKY and stream.emitted == len(TRICKY) and stream.text == text
    stream = ItemStream("questions")
    assert stream.feed("") == []
    assert stream.feed('{"questions": [{"a": 1}, {"b"') == [{"a": 1}]
    # Garbage afterwards hands out nothing more and takes nothing back.
    assert stream.feed(" ]]] nonsense") == []
    assert stream.emitted == 1


@pytest.mark.parametrize(
    ("field", "before"), [("questions", ""), ("questions", '"title": "a {x}", '), (None, "")]
)
def test_a_stream_hands_out_an_object_item_with_its_last_byte(
    field: str | None, before: str
) -> None:
    text, _, ends = _document(TRICKY, field, before, ', "more": 1')
    stream = ItemStream(field)
    out_at: list[int] = []
    for offset, char in enumerate(text, start=1):
        out_at.extend(offset for _ in stream.feed(char))
    assert out_at == ends  # not a byte later, not a byte sooner (a "}" in a string is no end)
