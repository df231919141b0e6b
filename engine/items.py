"""The complete items of an answer that is still being written.

A job type's answer is a JSON object whose items sit in one list field (a quiz's `questions`,
a deck's `cards`). While the model streams the answer, `complete_items` says which of those items
are already whole, so that each can be validated and shown before the call ends.

The text is parsed by `jiter` (the pydantic team's JSON parser) in its partial mode, which reads
a prefix of a JSON document as the document so far; nothing here parses JSON by hand. An item is
complete when a later item has started (the parse shows one more element after it: its values
can no longer change) or when the list has closed, which shows as a later field of the object
having a value, or as the whole document parsing. So the last item of a list that ends its
object is seen when the object closes, a few bytes later than its own last byte.

`ItemStream` hands an item out sooner, with its own last byte: when the text so far ends right
after an item (its `}`, or the comma after it) and closing the list and its object there makes
a whole document, every item of that document is complete. Each item handed out stays handed
out, so its stream keeps the invariant below.

Invariants: the items returned for a prefix of an answer are a prefix of the items returned for
any longer prefix of it (an item once returned never changes or disappears), and for the whole
answer they are its list. A text that is no prefix of a JSON document has no complete items;
`ItemStream` then hands out nothing more, and keeps what it handed out (the final validation of
the whole answer decides, and retracts).
"""

from __future__ import annotations

from typing import Any

import jiter

__all__ = ["ItemStream", "complete_items"]

_MISSING = object()


def _parse(data: bytes, *, partial: bool) -> Any:
    """The document so far (`partial`), or the whole document; `_MISSING` when it is not
    JSON (or, not partial, not yet whole)."""
    try:
        return jiter.from_json(data, partial_mode="trailing-strings" if partial else "off")
    except ValueError:
        return _MISSING


def _list_of(doc: Any, list_field: str | None) -> tuple[list[Any] | None, bool]:
    """The item list of a parsed document, and whether a later field of its object shows the
    list closed."""
    if list_field is None:
        return (doc if isinstance(doc, list) else None), False
    if not isinstance(doc, dict):
        return None, False
    items = doc.get(list_field)
    if not isinstance(items, list):
        return None, False
    keys = list(doc)
    return items, keys.index(list_field) < len(keys) - 1


def complete_items(text: str, list_field: str | None) -> list[Any]:
    """The items of `list_field` (None: the document is itself the list) that are complete in
    `text`, a prefix of a JSON answer, in order (module docstring)."""
    data = text.encode()
    doc = _parse(data, partial=True)
    items, closed = _list_of(doc, list_field)
    if items is None:
        return []
    if closed:
        return items
    stripped = data.rstrip()
    if stripped.endswith((b"}", b"]")):
        whole = _parse(data, partial=False)
        if whole is not _MISSING:
            items_whole, _ = _list_of(whole, list_field)
            return items_whole if items_whole is not None else []
    return items[:-1]


def _closed_at_end(text: str, list_field: str | None) -> list[Any] | None:
    """The items of `text` when it ends right after the list's last item (its closing `}`, or
    the comma after it): closing the list and its object there (`]}`, or `]` for a bare list)
    makes a whole document. A `}` inside a string, or closing a nested object, leaves the text
    at another depth, and that document does not parse: None."""
    data = text.encode().rstrip()
    last = data[:-1].rstrip() if data.endswith(b",") else data
    if last is data and not last.endswith(b"}"):
        return None
    closed = _parse(last + (b"]}" if list_field is not None else b"]"), partial=False)
    if closed is _MISSING:
        return None
    items, _ = _list_of(closed, list_field)
    return items


class ItemStream:
    """Feeds an answer's pieces as they arrive and hands out each item once, when it becomes
    complete. Cheap enough to run on every piece of a stream (one partial parse of the text so
    far); not thread-safe (one per call)."""

    def __init__(self, list_field: str | None) -> None:
        self.list_field = list_field
        self._parts: list[str] = []
        self._emitted = 0

    @property
    def text(self) -> str:
        """The answer so far."""
        return "".join(self._parts)

    @property
    def emitted(self) -> int:
        """How many items `feed` has handed out."""
        return self._emitted

    def feed(self, piece: str) -> list[Any]:
        """Append `piece` to the answer; the items that became complete with it, in order."""
        if not piece:
            return []
        self._parts.append(piece)
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        found = complete_items(self._parts[0], self.list_field)
        # An item is also whole with its own last byte (`_closed_at_end`), a few bytes before
        # the next one starts: handed out then, so a reader sees it that much sooner.
        eager = _closed_at_end(self._parts[0], self.list_field)
        if eager is not None and len(eager) > len(found):
            found = eager
        fresh = found[self._emitted :]
        self._emitted = max(self._emitted, len(found))
        return fresh
