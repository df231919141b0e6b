"""The admission rule of a provider limit's fair queue (db/limit_waiters.py `verdict`,
`fitting`): a call goes only with room for it after room for every waiter ahead of it."""

from __future__ import annotations

import math
import uuid

import pytest

from db.limit_waiters import Head, Room, fitting, verdict


def head(tokens: int = 100, claimed: bool = False) -> Head:
    return Head(uuid.uuid4(), -1, f"wf-{uuid.uuid4().hex[:6]}", tokens, claimed)


def test_concurrency_keeps_a_free_slot_for_each_waiter_ahead() -> None:
    room = Room(free_slots=2)
    assert verdict(room, 0, 0, 10).reason is None
    assert verdict(room, 1, 0, 10).reason is None
    assert verdict(room, 2, 0, 10).reason == "concurrency"
    assert verdict(Room(free_slots=0), 0, 0, 10).reason == "concurrency"


def test_rpm_and_tpm_waits_are_the_exact_refill_after_those_ahead() -> None:
    # 60 requests a minute (1/s), 2 available: the third in line waits 1 s for its own.
    rpm = Room(rpm=60, requests=2.0)
    assert verdict(rpm, 1, 0, 0).reason is None
    got = verdict(rpm, 2, 0, 0)
    assert got.reason == "rpm" and got.wait_s == pytest.approx(1.0)
    # 6000 tokens a minute (100/s), 500 available, 300 needed ahead: 400 more take 4 s... or
    # exactly (300 + 600 - 500) / 100.
    tpm = Room(tpm=6000, tokens=500.0)
    assert verdict(tpm, 0, 0, 500).reason is None
    got = verdict(tpm, 1, 300, 600)
    assert got.reason == "tpm" and got.wait_s == pytest.approx(4.0)


def test_a_need_larger_than_the_bucket_counts_as_the_whole_bucket() -> None:
    tpm = Room(tpm=6000, tokens=6000.0)
    assert verdict(tpm, 0, 0, 50_000).reason is None  # goes when the bucket is full
    assert verdict(Room(tpm=6000, tokens=5999.0), 0, 0, 50_000).reason == "tpm"


def test_an_announced_block_holds_everyone_until_its_reset() -> None:
    got = verdict(Room(blocked_s=2.5, free_slots=5), 0, 0, 1)
    assert (got.reason, got.wait_s) == ("announced", 2.5)


def test_fitting_walks_the_fair_order_and_stops_at_the_first_that_does_not_fit() -> None:
    big, small = head(5000), head(10)
    # 1000 tokens now: the big head does not fit, so the small one behind it may not pass.
    assert fitting(Room(tpm=6000, tokens=1000.0), [big, small]) == []
    assert fitting(Room(tpm=6000, tokens=6000.0), [big, small]) == [big, small]
    a, b, c = head(), head(), head()
    assert fitting(Room(free_slots=2), [a, b, c]) == [a, b]
    assert fitting(Room(), [a, b, c]) == [a, b, c]  # nothing limits: all may go
    assert fitting(Room(rpm=60, requests=math.inf), [a]) == [a]
