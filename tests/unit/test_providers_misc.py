"""Synthetic provider, content safety, credential encryption, pricing, factory and redaction."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from decimal import Decimal
from typing import Any

import pytest

from engine.errors import ExecutionFailure
from engine.redaction import REDACTION_VERSION, redact
from providers import pricing
from providers.base import Provider, ProviderRequest, SyntheticBehaviour
from providers.crypto import (
    DEV_ENCRYPTION_KEY,
    CredentialCipher,
    generate_key_setting,
    mask_key,
)
from providers.factory import build_provider
from providers.openai_compat import OpenAICompatibleProvider
from providers.pricing import PRICES, Price, PriceTable, cost_usd
from providers.safety import ContentSafety, RuleBasedContentSafety, parse_blocklist
from providers.synthetic import SyntheticProvider


def synthetic_request(
    behaviour: SyntheticBehaviour | None, *, attempt: int = 1, **overrides: Any
) -> ProviderRequest:
    fields: dict[str, Any] = {
        "job_id": "job-1",
        "job_type": "echo",
        "attempt": attempt,
        "model": "synthetic-model",
        "system_prompt": "s" * 10,
        "user_prompt": "u" * 30,
        "output_schema": {},
        "timeout_s": 5.0,
        "synthetic": behaviour,
    }
    fields.update(overrides)
    return ProviderRequest(**fields)


# --- synthetic provider ------------------------------------------------------------------


async def test_synthetic_returns_output_with_token_estimates() -> None:
    provider = SyntheticProvider()
    assert isinstance(provider, Provider)
    response = await provider.generate(
        synthetic_request(SyntheticBehaviour(output={"answer": 42, "tags": ["a"]}))
    )
    assert json.loads(response.content) == {"answer": 42, "tags": ["a"]}
    assert response.provider == "synthetic"
    assert response.model == "synthetic-model"
    assert response.tokens_in == (10 + 30) // 4 + 1
    assert response.tokens_out == len(response.content) // 4 + 1
    assert 0 <= response.latency_ms < 100


async def test_synthetic_without_behaviour_returns_empty_object() -> None:
    response = await SyntheticProvider().generate(synthetic_request(None))
    assert response.content == "{}"
    assert response.tokens_out == 1


async def test_synthetic_is_deterministic() -> None:
    behaviour = SyntheticBehaviour(output={"b": 2, "a": 1})
    first = await SyntheticProvider().generate(synthetic_request(behaviour))
    second = await SyntheticProvider().generate(synthetic_request(behaviour))
    assert first.content == second.content
    assert (first.tokens_in, first.tokens_out) == (second.tokens_in, second.tokens_out)


async def test_synthetic_fails_until_attempt_exceeds_fail_times() -> None:
    provider = SyntheticProvider()
    behaviour = SyntheticBehaviour(output={"ok": True}, fail_times=2, fail_code="PROVIDER_TIMEOUT")
    for attempt in (1, 2):
        with pytest.raises(ExecutionFailure) as info:
            await provider.generate(synthetic_request(behaviour, attempt=attempt))
        assert info.value.code == "PROVIDER_TIMEOUT"
        assert info.value.internal_message == f"synthetic failure on attempt {attempt}"
    response = await provider.generate(synthetic_request(behaviour, attempt=3))
    assert json.loads(response.content) == {"ok": True}


async def test_synthetic_default_fail_code_is_provider_unavailable() -> None:
    with pytest.raises(ExecutionFailure) as info:
        await SyntheticProvider().generate(
            synthetic_request(SyntheticBehaviour(output={}, fail_times=1))
        )
    assert info.value.code == "PROVIDER_UNAVAILABLE"


async def test_synthetic_invalid_output() -> None:
    response = await SyntheticProvider().generate(
        synthetic_request(SyntheticBehaviour(output={"answer": 1}, invalid_output=True))
    )
    assert json.loads(response.content) == {"unexpected": True}


async def test_synthetic_delay_is_waited() -> None:
    started = time.monotonic()
    response = await SyntheticProvider().generate(
        synthetic_request(SyntheticBehaviour(output={}, delay_ms=150))
    )
    assert time.monotonic() - started >= 0.14
    assert response.latency_ms >= 140


@pytest.mark.parametrize(
    "behaviour",
    [SyntheticBehaviour(output={}, hang=True), SyntheticBehaviour(output={}, delay_ms=60_000)],
    ids=["hang", "long-delay"],
)
async def test_synthetic_waits_are_cancellable(behaviour: SyntheticBehaviour) -> None:
    task = asyncio.create_task(SyntheticProvider().generate(synthetic_request(behaviour)))
    await asyncio.sleep(0.1)
    assert not task.done()  # it really waits
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert time.monotonic() - started < 0.5


async def test_synthetic_hang_never_answers_by_itself() -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await SyntheticProvider().generate(
                synthetic_request(SyntheticBehaviour(output={}, hang=True))
            )


# --- content safety ----------------------------------------------------------------------


def test_parse_blocklist_strips_blanks() -> None:
    assert parse_blocklist(" bomb, ,Bad Phrase ,,  ") == ["bomb", "Bad Phrase"]
    assert parse_blocklist("") == []


def test_safety_blocks_whole_words_case_insensitively() -> None:
    safety = RuleBasedContentSafety(["kill", "bad phrase"])
    assert isinstance(safety, ContentSafety)
    with pytest.raises(ExecutionFailure) as info:
        safety.check(["fine text", "please KILL the process"])
    assert info.value.code == "CONTENT_SAFETY_BLOCKED"
    assert info.value.internal_message == "blocked by rule 0"
    with pytest.raises(ExecutionFailure) as info:
        safety.check(["this is a Bad   Phrase."])
    assert info.value.internal_message == "blocked by rule 1"


def test_safety_does_not_match_inside_words() -> None:
    safety = RuleBasedContentSafety(["kill", "bad phrase"])
    safety.check(["new skills", "killer app", "bad phrases", "badphrase", ""])  # no raise


def test_safety_escapes_regex_characters() -> None:
    safety = RuleBasedContentSafety(["a.b", "c++"])
    safety.check(["axb", "abc++ and c+ only"])  # "." literal; "c++" needs a boundary
    with pytest.raises(ExecutionFailure) as info:
        safety.check(["I write c++ daily"])
    assert info.value.internal_message == "blocked by rule 1"


def test_safety_never_echoes_matched_text() -> None:
    safety = RuleBasedContentSafety(["forbiddenword"])
    with pytest.raises(ExecutionFailure) as info:
        safety.check(["some forbiddenword here"])
    exc = info.value
    for text in (str(exc), repr(exc), exc.public_message, exc.internal_message or ""):
        assert "forbiddenword" not in text.lower()


def test_safety_empty_blocklist_allows_everything_and_blank_rule_is_refused() -> None:
    RuleBasedContentSafety([]).check(["anything at all"])
    with pytest.raises(ValueError, match="entry 1 is blank"):
        RuleBasedContentSafety(["ok", "  "])


# --- credential encryption ---------------------------------------------------------------


def key_b64(byte: int, *, urlsafe: bool = False) -> str:
    raw = bytes([byte]) * 32
    return (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(raw).decode()


def test_cipher_roundtrip_and_blob_layout() -> None:
    cipher = CredentialCipher.from_setting(generate_key_setting("k1"))
    key_id, blob = cipher.encrypt("sk-live-abcdef123456", aad="user:1")
    assert key_id == "k1" == cipher.current_key_id
    assert len(blob) == 12 + len("sk-live-abcdef123456") + 16
    assert b"sk-live" not in blob
    assert cipher.decrypt(key_id, blob, aad="user:1") == "sk-live-abcdef123456"
    _, other = cipher.encrypt("sk-live-abcdef123456", aad="user:1")
    assert other[:12] != blob[:12]  # fresh nonce every time


@pytest.mark.parametrize("position", [0, 11, 12, -1])
def test_cipher_tampering_is_credential_invalid(position: int) -> None:
    cipher = CredentialCipher.from_setting(generate_key_setting())
    key_id, blob = cipher.encrypt("secret", aad="user:1")
    tampered = bytearray(blob)
    tampered[position] ^= 0x01
    with pytest.raises(ExecutionFailure) as info:
        cipher.decrypt(key_id, bytes(tampered), aad="user:1")
    assert info.value.code == "CREDENTIAL_INVALID"
    assert info.value.internal_message == "credential could not be decrypted"
    assert info.value.__context__ is None or info.value.__suppress_context__


def test_cipher_wrong_aad_unknown_kid_and_short_blob_fail() -> None:
    cipher = CredentialCipher.from_setting(generate_key_setting())
    key_id, blob = cipher.encrypt("secret", aad="user:1")
    for kid, data, aad in (
        (key_id, blob, "user:2"),
        ("nope", blob, "user:1"),
        (key_id, b"x", "user:1"),
    ):
        with pytest.raises(ExecutionFailure) as info:
            cipher.decrypt(kid, data, aad=aad)
        assert info.value.code == "CREDENTIAL_INVALID"


def test_rotation_keeps_old_keys_and_reencrypt_moves_to_current() -> None:
    old = CredentialCipher.from_setting(f"k1:{key_b64(1)}")
    old_kid, old_blob = old.encrypt("sk-user-key", aad="cred:9")

    rotated = CredentialCipher.from_setting(f"k2:{key_b64(2)},k1:{key_b64(1)}")
    assert rotated.current_key_id == "k2"
    assert rotated.key_ids == ("k2", "k1")
    assert rotated.decrypt(old_kid, old_blob, aad="cred:9") == "sk-user-key"
    assert rotated.needs_rotation("k1") is True
    assert rotated.needs_rotation("k2") is False

    new_kid, new_blob = rotated.reencrypt(old_kid, old_blob, aad="cred:9")
    assert new_kid == "k2"
    only_new = CredentialCipher.from_setting(f"k2:{key_b64(2)}")
    assert only_new.decrypt(new_kid, new_blob, aad="cred:9") == "sk-user-key"
    with pytest.raises(ExecutionFailure):
        only_new.decrypt(old_kid, old_blob, aad="cred:9")  # k1 retired


def test_urlsafe_and_standard_base64_keys_are_equivalent() -> None:
    raw = bytes(range(224, 256))  # encodes with "+" / "/" (standard) or "-" / "_" (urlsafe)
    standard = base64.b64encode(raw).decode()
    urlsafe = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    assert standard != urlsafe
    a = CredentialCipher.from_setting(f"k:{standard}")
    b = CredentialCipher.from_setting(f"k:{urlsafe}")
    kid, blob = a.encrypt("x", aad="")
    assert b.decrypt(kid, blob, aad="") == "x"


@pytest.mark.parametrize(
    ("setting", "secret", "message"),
    [
        ("", None, "empty"),
        ("k1", None, "kid:BASE64KEY"),
        (f":{key_b64(3)}", key_b64(3), "kid:BASE64KEY"),
        ("k1:!!!not-base64!!!", "!!!not-base64!!!", "not valid base64"),
        (
            f"k1:{base64.b64encode(b'S' * 16).decode()}",
            base64.b64encode(b"S" * 16).decode(),
            "32 bytes",
        ),
        (f"k1:{key_b64(4)},k1:{key_b64(5)}", key_b64(4), "more than once"),
    ],
)
def test_bad_settings_raise_without_key_material(
    setting: str, secret: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message) as info:
        CredentialCipher.from_setting(setting)
    if secret is not None:
        assert secret not in str(info.value)
        assert secret[:8] not in str(info.value)


def test_dev_key_is_labelled_and_usable() -> None:
    cipher = CredentialCipher.from_setting(DEV_ENCRYPTION_KEY)
    assert cipher.current_key_id == "dev"
    assert base64.b64decode(DEV_ENCRYPTION_KEY.split(":", 1)[1]) == (
        b"DEVELOPMENT-ONLY-KEY-DO-NOT-USE!"
    )
    kid, blob = cipher.encrypt("k", aad="a")
    assert cipher.decrypt(kid, blob, aad="a") == "k"


def test_generate_key_setting_is_random_and_validates_kid() -> None:
    first, second = generate_key_setting("a"), generate_key_setting("a")
    assert first.startswith("a:") and first != second
    with pytest.raises(ValueError):
        generate_key_setting("bad:kid")


def test_mask_key() -> None:
    assert mask_key("sk-1234567890abcd") == "sk-…abcd"
    assert mask_key("plainkey9876") == "…9876"
    assert mask_key("sk-abc") == "****"
    assert mask_key("") == "****"
    assert "1234567890" not in mask_key("sk-1234567890abcd")


# --- pricing -----------------------------------------------------------------------------


def test_price_table() -> None:
    assert PRICES["deepseek-chat"] == Price(Decimal("0.27"), Decimal("1.10"), 65_536)
    assert PRICES["deepseek-reasoner"] == Price(Decimal("0.55"), Decimal("2.19"), 65_536)
    assert PRICES["gpt-4o-mini"] == Price(Decimal("0.15"), Decimal("0.60"), 128_000)
    assert PRICES["gpt-4o"] == Price(Decimal("2.50"), Decimal("10.00"), 128_000)
    assert PRICES["synthetic"] == Price(Decimal(0), Decimal(0), None)


def test_cost_arithmetic() -> None:
    assert cost_usd("deepseek-chat", 1_000_000, 1_000_000) == Decimal("1.37")
    assert cost_usd("deepseek-chat", 1000, 500) == Decimal("0.00082")
    assert cost_usd("deepseek-reasoner", 0, 1) == Decimal("0.00000219")
    assert cost_usd("gpt-4o-mini", 2_000, 3_000) == Decimal("0.0021")
    assert str(cost_usd("deepseek-chat", 1000, 500)) == "0.00082000"  # always 8 places


def test_unknown_models_cost_the_fallback_and_synthetic_is_free() -> None:
    # Never silently zero: an unknown model is charged the most expensive known price.
    assert cost_usd("mystery-model", 10**6, 10**6) == Decimal("12.5")
    assert pricing.price_for("mystery-model") == pricing.most_expensive(PRICES)
    assert cost_usd("synthetic", 5_000, 5_000) == Decimal(0)


def test_cost_rounds_half_up() -> None:
    table = PriceTable({"half": Price(Decimal("0.005"), Decimal("0.004"))})
    assert table.cost_usd("half", 1, 0) == Decimal("0.00000001")  # 0.000000005 -> up
    assert table.cost_usd("half", 0, 1) == Decimal("0.00000000")  # 0.000000004 -> down


def test_cost_rejects_negative_tokens() -> None:
    with pytest.raises(ValueError):
        cost_usd("deepseek-chat", -1, 0)


# --- factory -----------------------------------------------------------------------------


async def test_factory_without_key_or_url_is_synthetic() -> None:
    assert isinstance(build_provider(api_key=None, base_url=None), SyntheticProvider)


@pytest.mark.parametrize(
    ("api_key", "base_url", "name", "url"),
    [
        ("sk-x", None, "deepseek", "https://api.deepseek.com"),
        (None, "https://api.deepseek.com/v1/", "deepseek", "https://api.deepseek.com/v1"),
        ("sk-x", "http://127.0.0.1:9/v1", "openai_compatible", "http://127.0.0.1:9/v1"),
    ],
)
async def test_factory_builds_openai_compatible(
    api_key: str | None, base_url: str | None, name: str, url: str
) -> None:
    provider = build_provider(api_key=api_key, base_url=base_url, timeout_s=12.5)
    assert isinstance(provider, OpenAICompatibleProvider)
    try:
        assert provider.name == name
        assert provider.base_url == url
        assert provider.timeout_s == 12.5
    finally:
        await provider.aclose()


# --- redaction ---------------------------------------------------------------------------


def test_redaction_version() -> None:
    assert REDACTION_VERSION == "r1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mail jane.doe+x@example.co.uk now", "mail [email] now"),
        ("call +1 (555) 123-4567.", "call [phone]."),
        ("call 555.123.4567", "call [phone]"),
        ("+33 6 12 34 56 78", "[phone]"),
        ("5551234567", "[phone]"),
        ("a@b.io or 020 7946 0958", "[email] or [phone]"),
    ],
)
def test_redaction_masks(text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "42",
        "answer is 42 in 2026",
        "2026",
        "2026-12-02",
        "due 2026-12-02T10:30:00Z",
        "orders 12 2026-12-02",
        "between 2025 2026",
        "pi 3.14159265",
        "id 550e8400-e29b-41d4-a716-446655440000",
        "version v1.2.3",
        "123456",
        "not an email: user@ or @host",
    ],
)
def test_redaction_leaves_non_personal_text(text: str) -> None:
    assert redact(text) == text


def test_redaction_walks_structures_without_touching_keys_or_scalars() -> None:
    value = {
        "owner@example.com": "reach me at owner@example.com",
        "nested": [{"phone": "555-123-4567"}, 42, 3.5, None, True, ("x@y.org",)],
        "count": 2026,
    }
    original = json.dumps(value, default=list)
    result = redact(value)
    assert result == {
        "owner@example.com": "reach me at [email]",
        "nested": [{"phone": "[phone]"}, 42, 3.5, None, True, ("[email]",)],
        "count": 2026,
    }
    assert json.dumps(value, default=list) == original  # input not mutated


async def test_factory_passes_the_models_that_do_not_stream() -> None:
    provider = build_provider(api_key="sk-x", base_url=None, stream_disabled_models={"Local-Model"})
    assert isinstance(provider, OpenAICompatibleProvider)
    try:
        assert not provider.streams("local-model") and provider.streams("deepseek-chat")
    finally:
        await provider.aclose()
