"""The estimate bench (`python -m bench.estimates`) on a tiny input set: every built-in job type
that calls a provider gets a row per language, both counts are real, and a reference the
margin does not cover is reported as such."""

from __future__ import annotations

from bench.estimates import (
    DEFAULT_MARGIN,
    JOB_TYPES,
    LANGUAGES,
    DeepSeekCounter,
    measure,
    measure_one,
    render,
    summarize,
)
from engine.tokens import count_tokens
from jobs.spec import AnyJobType


def _tiny(jt: AnyJobType) -> tuple[int, ...]:
    return (3,) if jt.job_type == "weak_point_analysis" else (300,)


def test_every_job_type_and_language_gets_a_row_with_real_counts() -> None:
    counter = DeepSeekCounter()
    samples = measure(counter, seeds=2, sizes=_tiny)
    rows = summarize(samples, DEFAULT_MARGIN)

    expected = {(jt.job_type, lang) for jt in JOB_TYPES for lang in LANGUAGES}
    assert {(r.job_type, r.language) for r in rows} == expected
    assert {"quiz_generation", "flashcard_generation", "weak_point_analysis"} <= {
        jt for jt, _ in expected
    }
    for s in samples:
        # Both counts cover at least the system prompt, which alone is hundreds of tokens.
        assert s.estimate > 200 and s.reference > 200, s
        assert s.expected_output > 0 and s.reference_output > 0, s
    for r in rows:
        assert r.samples == 2
        assert -1 < r.error_median < 10 and r.margin_p95 == r.margin_p95  # finite, not NaN
    table = render(rows, DEFAULT_MARGIN)
    for jt, lang in expected:
        assert f"| {jt} | {lang} |" in table


def test_deepseek_framing_is_four_special_tokens() -> None:
    # Begin-of-sentence, the user and assistant role tokens and </think>: each must encode as
    # one token, else the tokenizer does not know them and the reference counts their text.
    assert DeepSeekCounter().framing() == 4


def test_a_source_past_one_call_is_counted_over_its_chunks() -> None:
    quiz = next(jt for jt in JOB_TYPES if jt.job_type == "quiz_generation")
    one = measure_one(quiz, "zh", 2_000, 0, DeepSeekCounter())
    long = measure_one(quiz, "zh", 19_000, 0, DeepSeekCounter())
    assert one.calls == 1
    # 19,000 Chinese characters are about 22,000 estimated tokens, past one call's budget of
    # 16,000: two calls, each repeating the system prompt (~300 tokens) around its part.
    assert long.calls >= 2
    assert long.reference > 9_000 + long.calls * 300
    assert 1.5 < long.estimate / long.reference < 2.5  # cl100k's CJK count, as in one call


class _DoubleCounter:
    """A vocabulary that needs twice the estimate's tokens: no 25 % margin covers it."""

    def count(self, text: str) -> int:
        return 2 * count_tokens(text)

    def framing(self) -> int:
        return 0


def test_a_reference_above_the_margin_is_reported_uncovered() -> None:
    samples = measure(_DoubleCounter(), languages=("en",), seeds=1, sizes=_tiny)
    rows = summarize(samples, DEFAULT_MARGIN)
    assert rows and all(not r.covered for r in rows)
    assert all(0.9 < r.margin_p95 < 1.0 for r in rows)  # about 2x - 1, less the framing
    assert "does not cover p95" in render(rows, DEFAULT_MARGIN)
