"""The off-peak tier's arithmetic (engine/offpeak.py) and decisions (jobs/offpeak.py): windows
that wrap past midnight, several windows, the setting's parsing, the deadline, EXECUTE's gate
and a call's tier."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import pytest

from db.jobs import JobRow, ResolveRefs
from engine.errors import ValidationFailed
from engine.offpeak import (
    Window,
    default_windows,
    hold_until,
    in_window,
    next_window,
    parse_windows,
    reserve_factor,
)
from jobs import offpeak
from jobs.gateway import Gateway
from jobs.policy import CreatePolicy, ProviderTraits
from jobs.requests import CreateJobRequest, RequestChecker
from jobs.types import default_catalog
from jobs.waits import Wait
from providers.openai_compat import OpenAICompatibleProvider

HALF = Decimal("0.5")
DEEPSEEK = default_windows()["deepseek"]  # 16:30 to 00:30 UTC at half price


def at(hh: int, mm: int, day: int = 10) -> datetime:
    return datetime(2026, 12, day, hh, mm, tzinfo=UTC)


# ---- windows ------------------------------------------------------------------------------


def test_the_default_is_deepseek_s_published_window_at_half_price() -> None:
    assert DEEPSEEK == (Window(time(16, 30), time(0, 30), HALF),)
    assert parse_windows("") == default_windows()
    assert parse_windows("{}") == {}


def test_a_window_that_wraps_past_midnight_holds_both_sides_of_it() -> None:
    assert in_window(at(16, 29), DEEPSEEK) is None
    inside = in_window(at(16, 30), DEEPSEEK)
    assert inside is not None and (inside.start, inside.end) == (at(16, 30), at(0, 30, 11))
    # After midnight: the window that opened yesterday.
    after = in_window(at(0, 10), DEEPSEEK)
    assert after is not None and (after.start, after.end) == (at(16, 30, 9), at(0, 30))
    assert in_window(at(0, 30), DEEPSEEK) is None  # the end is not inside


def test_the_next_window_is_the_current_one_or_the_next_to_open() -> None:
    assert next_window(at(20, 0), DEEPSEEK) == in_window(at(20, 0), DEEPSEEK)
    nxt = next_window(at(0, 31), DEEPSEEK)
    assert nxt is not None and (nxt.start, nxt.price) == (at(16, 30), HALF)
    # Late in the day, before it opens: today's; and across a month's end.
    assert next_window(at(16, 0, 31), DEEPSEEK).start == at(16, 30, 31)  # type: ignore[union-attr]
    assert next_window(at(0, 0), ()) is None


def test_several_windows_the_next_opens_first_and_overlaps_pay_the_cheapest() -> None:
    ws = parse_windows(
        '{"deepseek": [{"start": "02:00", "end": "04:00", "price": 0.25},'
        ' {"start": "22:00", "end": "03:00", "price": 0.5}]}'
    )["deepseek"]
    assert next_window(at(12, 0), ws).start == at(22, 0)  # type: ignore[union-attr]
    assert next_window(at(1, 0), ws).price == HALF  # type: ignore[union-attr]
    both = in_window(at(2, 30), ws)
    assert both is not None and both.price == Decimal("0.25")
    assert in_window(at(3, 30), ws).price == Decimal("0.25")  # type: ignore[union-attr]
    assert in_window(at(4, 0), ws) is None
    assert reserve_factor(ws) == HALF  # a job is reserved at the dearest window


def test_utc_has_no_daylight_saving_every_day_is_the_same_span() -> None:
    ws = parse_windows('{"deepseek": [{"start": "01:30", "end": "02:30", "price": 0.5}]}')[
        "deepseek"
    ]
    # The nights European and US clocks change: nothing moves in UTC.
    for day in (datetime(2026, 3, 29, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC)):
        o = next_window(day, ws)
        assert o is not None and o.end - o.start == timedelta(hours=1)
        assert (o.start.hour, o.start.minute) == (1, 30)


@pytest.mark.parametrize(
    "text, names",
    [
        ("[1]", "want an object"),
        ('{"deepsek": []}', "want one of deepseek, openai_compatible, synthetic"),
        ("{", "not valid JSON"),
        ('{"deepseek": {"start": "01:00"}}', "want a list"),
        ('{"deepseek": [{"start": "1:00", "end": "02:00", "price": 0.5}]}', "HH:MM"),
        ('{"deepseek": [{"start": "25:00", "end": "02:00", "price": 0.5}]}', "not a time"),
        ('{"deepseek": [{"start": "01:00", "end": "01:00", "price": 0.5}]}', "same time"),
        ('{"deepseek": [{"start": "01:00", "end": "02:00", "price": 1.5}]}', "from 0 to 1"),
        ('{"deepseek": [{"start": "01:00", "end": "02:00", "price": "x"}]}', "from 0 to 1"),
        ('{"deepseek": [{"start": "01:00", "end": "02:00"}]}', "start, end, price"),
    ],
)
def test_a_malformed_setting_names_itself_and_the_entry(text: str, names: str) -> None:
    with pytest.raises(ValueError, match="AI_OFFPEAK_WINDOWS") as info:
        parse_windows(text)
    assert names in str(info.value)


def test_seconds_may_be_given() -> None:
    [w] = parse_windows('{"deepseek": [{"start": "01:00:05", "end": "01:00:35", "price": 0}]}')[
        "deepseek"
    ]
    assert (w.start, w.end, w.price) == (time(1, 0, 5), time(1, 0, 35), Decimal(0))


# ---- the deadline -------------------------------------------------------------------------


def test_the_hold_ends_at_the_window_or_at_a_deadline_that_comes_first() -> None:
    assert hold_until(at(16, 30), at(18, 0)) == (at(16, 30), False)
    assert hold_until(at(16, 30), at(16, 30)) == (at(16, 30), False)
    assert hold_until(at(16, 30), at(12, 0)) == (at(12, 0), True)
    assert hold_until(None, at(12, 0)) == (at(12, 0), True)  # no window configured


def _row(**kw: Any) -> JobRow:
    """A job as EXECUTE reads it; only its tier, deadline, policy and mode matter here."""
    none = {f.name: None for f in dataclasses.fields(JobRow)}
    base: dict[str, Any] = none | {
        "id": uuid.uuid4(),
        "job_type": "flashcard_generation",
        "credential_mode": "platform_key",
        "service_tier": "standard",
        "metadata": {},
    }
    return JobRow(**(base | kw))


def _gateway() -> Gateway:
    provider = OpenAICompatibleProvider("https://api.deepseek.com", name="deepseek")
    return Gateway(provider=provider, model="deepseek-chat")


JT = default_catalog().get("flashcard_generation")


def test_execute_s_gate_waits_for_the_window_or_applies_the_deadline_policy() -> None:
    g = _gateway()
    fail = _row(service_tier="offpeak", offpeak_deadline_at=at(20, 0), offpeak_on_deadline="fail")
    assert offpeak.gate(g, JT, _row(), at(12, 0)) is None  # a standard job never waits
    wait = offpeak.gate(g, JT, fail, at(12, 0))
    assert isinstance(wait, Wait) and (wait.reason, wait.wait_s) == ("offpeak", 4.5 * 3600)
    assert offpeak.gate(g, JT, fail, at(17, 0)) is None  # inside the window
    # A window that closed, with a deadline before the next one: wait for the deadline...
    soon = dataclasses.replace(fail, offpeak_deadline_at=at(2, 0, 11))
    wait = offpeak.gate(g, JT, soon, at(0, 45, 11))
    assert isinstance(wait, Wait) and wait.wait_s == 75 * 60
    # ...and there, fail, or run at the standard price.
    assert offpeak.gate(g, JT, soon, at(2, 0, 11)) == "OFFPEAK_DEADLINE_PASSED"
    run = dataclasses.replace(soon, offpeak_on_deadline="standard")
    assert offpeak.gate(g, JT, run, at(2, 0, 11)) is None


def test_a_call_is_charged_at_the_window_s_price_only_inside_it() -> None:
    g, row = _gateway(), _row(service_tier="offpeak", offpeak_deadline_at=at(20, 0))
    assert offpeak.call_tier(g, JT, row, at(17, 0)) == ("offpeak", HALF)
    assert offpeak.call_tier(g, JT, row, at(12, 0)) == ("standard", None)
    assert offpeak.call_tier(g, JT, _row(), at(17, 0)) == ("standard", None)


def test_resolve_tells_the_workflow_its_hold_in_times_only() -> None:
    refs = ResolveRefs(
        job_type="flashcard_generation",
        user_id="u1",
        credential_mode="platform_key",
        prompt_version="v1",
        has_snapshot=True,
        service_tier="offpeak",
        offpeak_deadline_at=at(20, 0),
        offpeak_on_deadline="standard",
    )
    h = offpeak.hold(refs, "deepseek", default_windows(), at(12, 0))
    assert h is not None
    assert (h.window_at, h.deadline, h.then) == (
        at(16, 30).isoformat(),
        at(20, 0).isoformat(),
        "standard",
    )
    assert offpeak.hold(refs, "openai_compatible", default_windows(), at(12, 0)).window_at == ""  # type: ignore[union-attr]
    plain = dataclasses.replace(refs, service_tier="standard")
    assert offpeak.hold(plain, "deepseek", default_windows(), at(12, 0)) is None


# ---- create -------------------------------------------------------------------------------

CARDS = {"sourceText": "Ribosomes assemble proteins from amino acids.", "count": 2}


def _check(policy: CreatePolicy, **kw: Any) -> Any:
    req = CreateJobRequest(
        user_id="u1",
        job_type="flashcard_generation",
        target_type="t",
        target_id="1",
        input=CARDS,
        service_tier="offpeak",
        **kw,
    )
    return RequestChecker(default_catalog(), policy).check(req)


def _policy(**kw: Any) -> CreatePolicy:
    openai = {"platform_key": ProviderTraits("openai_compatible")}
    return CreatePolicy(model="gpt-4o-mini", platform_synthetic=False, providers=openai, **kw)


def test_a_provider_without_a_window_refuses_offpeak_naming_it() -> None:
    with pytest.raises(ValidationFailed) as info:
        _check(_policy(offpeak_discounts=offpeak.reserve_discounts(default_windows())))
    assert info.value.errors[0]["loc"] == ["serviceTier"]
    assert "openai_compatible" in str(info.value)
    windows = parse_windows(
        '{"openai_compatible": [{"start": "01:00", "end": "02:00", "price": 0.5}]}'
    )
    assert _check(_policy(offpeak_discounts=offpeak.reserve_discounts(windows))).service_tier == (
        "offpeak"
    )
    # The synthetic provider makes no paid call: it needs no window.
    assert offpeak.reserve_discounts({}) == {"synthetic": Decimal(1)}
    synthetic = CreatePolicy(model="synthetic")
    assert _check(synthetic).service_tier == "offpeak"


def test_the_deadline_defaults_to_the_max_wait_and_may_not_exceed_it() -> None:
    p = _policy(offpeak_discounts={"openai_compatible": HALF}, offpeak_max_wait_s=3600)
    now = datetime.now(UTC)
    req = CreateJobRequest(user_id="u1", job_type="x", target_type="t", target_id="1", input={})
    assert offpeak.deadline(req, "offpeak", 3600, now) == now + timedelta(hours=1)
    assert offpeak.deadline(req, "standard", 3600, now) is None
    given = dataclasses.replace(req, offpeak_deadline_at=now + timedelta(minutes=5))
    assert offpeak.deadline(given, "offpeak", 3600, now) == now + timedelta(minutes=5)
    with pytest.raises(ValidationFailed) as info:
        _check(p, offpeak_deadline_at=now + timedelta(hours=2))
    assert info.value.errors[0]["loc"] == ["offpeakDeadline"]


def test_a_malformed_setting_stops_the_api_and_the_workers_at_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from runtime import cli

    monkeypatch.setenv("AIJOBS_ENV", "development")
    monkeypatch.setenv("AI_OFFPEAK_WINDOWS", '{"deepseek": [{"start": "16:30"}]}')
    for role in ("api", "worker"):
        with pytest.raises(SystemExit) as info:
            cli._settings(role)
        assert info.value.code == 2
        line = capsys.readouterr().err
        assert f"aijobs {role}: invalid configuration: AI_OFFPEAK_WINDOWS: deepseek[0]" in line
