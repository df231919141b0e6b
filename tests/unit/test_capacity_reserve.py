"""AI_CAPACITY_RESERVE: its parsing (a malformed value names the setting) and the arithmetic of
the reserved parts (db/limit_classes.py): rounded up to whole calls, requests and tokens, held
back from other classes only while a call of the class waits, beyond its waiters ahead."""

from __future__ import annotations

import uuid

import pytest
from pydantic import ValidationError

from db.limit_classes import Part, fitting, held_back, parts
from db.limit_config import Limits, LimitTable, parse_model_limits
from db.limit_waiters import ClassAhead, Head, HeldBack, Room
from engine.capacity import job_class, parse_capacity_reserve
from engine.settings import Settings

INTERACTIVE = (("interactive", 0.25),)


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("[0.2]", "want a JSON object"),
        ("{", "not valid JSON"),
        ('{"batch": 0.2}', "unknown class 'batch'"),
        ('{"interactive": 1}', "want a share in [0, 1)"),
        ('{"interactive": -0.1}', "want a share in [0, 1)"),
        ('{"interactive": true}', "want a share in [0, 1)"),
        ('{"interactive": "0.2"}', "want a share in [0, 1)"),
        ('{"interactive": 0.5, "background": 0.5}', "add up to less than 1"),
    ],
)
def test_a_malformed_reserve_is_refused_naming_the_setting(raw: str, says: str) -> None:
    with pytest.raises(ValueError, match="AI_CAPACITY_RESERVE") as info:
        parse_capacity_reserve(raw)
    assert says in str(info.value)
    with pytest.raises(ValidationError, match="AI_CAPACITY_RESERVE"):
        Settings.model_validate({"AI_CAPACITY_RESERVE": raw})


def test_a_reserve_parses_and_reaches_every_model_of_the_table() -> None:
    assert parse_capacity_reserve("") == {} == parse_capacity_reserve("{}")
    assert parse_capacity_reserve('{"interactive": 0.25, "background": 0}') == {
        "interactive": 0.25,
        "background": 0.0,
    }
    table = parse_model_limits('{"m": {"concurrency": 4}}', {"interactive": 0.25, "background": 0})
    assert table.for_model("p", "m") == Limits(concurrency=4, reserve=INTERACTIVE)
    assert table.for_model("p", "other").reserve == INTERACTIVE  # announced limits too
    assert LimitTable().for_model("p", "m") == Limits()
    assert (job_class("ai-interactive"), job_class("ai-background")) == (
        "interactive",
        "background",
    )


def test_reserved_parts_are_rounded_up_to_whole_calls_requests_and_tokens() -> None:
    # Concurrency 5 (one free, four in flight), 10 requests and 1001 tokens a minute.
    room = Room(rpm=10, tpm=1001, free_slots=1, in_flight={"background": 2, "interactive": 2})
    assert parts(room, INTERACTIVE)["interactive"] == Part(slots=2, requests=3, tokens=251)
    assert parts(Room(), INTERACTIVE)["interactive"] == Part()  # nothing limited


def test_only_a_waiting_class_is_held_for_and_only_beyond_its_waiters_ahead() -> None:
    room = Room(free_slots=1, in_flight={"background": 3})
    waiting = [ClassAhead("interactive", 0, 0.0, 1), ClassAhead("background", 5, 500.0, 20)]
    # A background caller leaves the interactive class its one slot.
    assert held_back(room, INTERACTIVE, "background", waiting) == HeldBack(slots=1)
    # Not when no interactive call waits, nor for an interactive caller itself.
    assert held_back(room, INTERACTIVE, "background", waiting[1:]) == HeldBack()
    assert held_back(room, INTERACTIVE, "interactive", waiting) == HeldBack()
    # An interactive waiter already ahead of the caller counts toward the part.
    ahead = [ClassAhead("interactive", 1, 100.0, 1)]
    assert held_back(room, INTERACTIVE, "background", ahead) == HeldBack()
    # The class's own call in flight uses its part: nothing more is kept.
    busy = Room(free_slots=0, in_flight={"interactive": 1, "background": 3})
    assert held_back(busy, INTERACTIVE, "background", waiting).slots == 0
    # Buckets: the part is kept in them while the class waits.
    buckets = Room(rpm=60, tpm=6000, requests=60.0, tokens=6000.0)
    assert held_back(buckets, INTERACTIVE, "background", waiting) == HeldBack(0, 15, 1500.0)


def head(klass: str) -> Head:
    return Head(uuid.uuid4(), -1, f"wf-{klass}-{uuid.uuid4().hex[:4]}", 100, False, klass)


def test_a_wake_up_goes_to_the_reserved_class_and_not_to_the_background_behind_it() -> None:
    flash, bg1, bg2 = head("interactive"), head("background"), head("background")
    one_free = Room(free_slots=1, in_flight={"background": 3})
    assert fitting(one_free, [flash, bg1, bg2], INTERACTIVE) == [flash]
    two_free = Room(free_slots=2, in_flight={"background": 2})
    assert fitting(two_free, [flash, bg1, bg2], INTERACTIVE) == [flash, bg1]
    # No reserved call waits: background takes what frees.
    assert fitting(one_free, [bg1, bg2], INTERACTIVE) == [bg1]
