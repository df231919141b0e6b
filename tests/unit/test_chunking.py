"""The pure core of chunked jobs (engine/chunking.py): chunk plans over long sources, the split
of a requested item count over chunks, and the merge of the chunks' items. No I/O.

The plan's rules are checked as properties over generated texts that mix prose, CRLF, blank
lines, CJK with and without punctuation, emoji sequences and combining marks, then pinned on
examples (paragraph and sentence cuts, a CJK run, one 100,000-character word, CRLF, empty
paragraphs, a 400,000-character source)."""

from __future__ import annotations

import itertools
import random
import time
import unicodedata
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.chunking import (
    MIN_MAX_TOKENS,
    Chunk,
    merge_items,
    normalise,
    plan_chunks,
    spread_count,
)
from engine.tokens import count_tokens

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

FRAGMENTS = [
    "The cell makes ATP in its mitochondria.",
    "Why does it matter?",
    "It matters!",
    "Mr. Smith paid 3.14 dollars.",
    " ",
    "  ",
    "\n",
    "\r\n",
    "\n\n",
    "\r\n\r\n",
    "\n \n\n\n",
    "\t",
    "光合作用发生在叶绿体中。",
    "没有标点的中文文本也要能切开",
    "\u300c\u5f15\u7528\u300d\uff01",  # a quotation in corner brackets, full-width !
    "e\u0301",  # e + combining acute accent
    "\u0915\u094d\u0937",  # Devanagari conjunct: letter, virama, letter
    "\U0001f468\u200d\U0001f469\u200d\U0001f467",  # family: three emoji joined by ZWJ
    "\U0001f1eb\U0001f1f7",  # a flag: two regional indicators
    "\U0001f44d\U0001f3fd",  # thumbs up + skin tone
    "supercalifragilisticexpialidocious" * 3,
    "x",
    "\ud800",  # a lone surrogate, as escaped JSON can carry
    "\ud83d\ude00",  # a surrogate pair the str never joined
]

texts = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=12)), max_size=80).map(
    "".join
)


@st.composite
def budgets(draw: st.DrawFn) -> tuple[int, int]:
    max_tokens = draw(st.integers(MIN_MAX_TOKENS, 48))
    return max_tokens, draw(st.integers(0, max_tokens // 2))


def assert_plan_rules(text: str, plan: list[Chunk], max_tokens: int, overlap: int) -> None:
    """Every rule a plan keeps, whatever the text."""
    assert plan, "a plan has at least one chunk"
    assert [c.index for c in plan] == list(range(len(plan)))
    assert plan[0].start == 0
    assert plan[-1].end == len(text)
    for chunk in plan:
        assert chunk.tokens == count_tokens(chunk.of(text)) <= max_tokens
        assert chunk.end > chunk.start or text == ""
    for prev, nxt in itertools.pairwise(plan):
        assert prev.start < nxt.start <= prev.end < nxt.end, (prev, nxt)  # in order, no gap
        assert count_tokens(text[nxt.start : prev.end]) <= overlap
    for before, _, after in zip(plan, plan[1:], plan[2:], strict=False):
        assert after.start >= before.end, "a character is in at most two chunks"


# ---- plan_chunks: properties ---------------------------------------------------------------


@PROPERTY
@given(text=texts, budget=budgets())
def test_a_plan_covers_the_text_in_order_within_the_token_and_overlap_bounds(
    text: str, budget: tuple[int, int]
) -> None:
    max_tokens, overlap = budget
    plan = plan_chunks(text, max_tokens=max_tokens, overlap_tokens=overlap)
    assert_plan_rules(text, plan, max_tokens, overlap)
    # Deterministic: the same input gives the same plan.
    assert plan_chunks(text, max_tokens=max_tokens, overlap_tokens=overlap) == plan


@PROPERTY
@given(text=texts, budget=budgets())
def test_a_text_within_the_budget_is_one_chunk_and_a_longer_one_is_not(
    text: str, budget: tuple[int, int]
) -> None:
    max_tokens, overlap = budget
    plan = plan_chunks(text, max_tokens=max_tokens, overlap_tokens=overlap)
    total = count_tokens(text)
    if total <= max_tokens:
        assert plan == [Chunk(0, 0, len(text), total)]
    else:
        assert len(plan) >= 2


@PROPERTY
@given(
    text=st.lists(st.sampled_from(FRAGMENTS[:4]), min_size=30, max_size=60).map(" ".join),
    max_tokens=st.integers(40, 120),
)
def test_consecutive_chunks_overlap_by_about_the_overlap(text: str, max_tokens: int) -> None:
    """In prose whose sentences are shorter than the overlap, every overlap holds at least half
    of `overlap_tokens` (minus a token or two where a word straddles the edge) and at most all."""
    overlap = max_tokens // 2
    plan = plan_chunks(text, max_tokens=max_tokens, overlap_tokens=overlap)
    assert len(plan) >= 2
    for prev, nxt in itertools.pairwise(plan):
        shared = count_tokens(text[nxt.start : prev.end])
        assert overlap // 2 - 2 <= shared <= overlap, (prev, nxt, shared)


def test_no_overlap_means_chunks_meet_end_to_start() -> None:
    text = "A short sentence that repeats. " * 400
    plan = plan_chunks(text, max_tokens=100, overlap_tokens=0)
    assert len(plan) > 10
    assert all(a.end == b.start for a, b in itertools.pairwise(plan))
    assert "".join(c.of(text) for c in plan) == text


# ---- plan_chunks: where the cuts fall ------------------------------------------------------


def paragraphs(count: int, sentences: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = "cells energy light water carbon leaves plants sugar oxygen roots".split()
    return [
        " ".join(
            " ".join(rng.choice(words) for _ in range(rng.randint(6, 14))).capitalize() + "."
            for _ in range(sentences)
        )
        for _ in range(count)
    ]


def test_cuts_fall_after_blank_lines_and_overlaps_start_on_a_sentence() -> None:
    paras = paragraphs(40, 4, seed=1)  # about 60 tokens a paragraph
    text = "\n\n".join(paras)
    plan = plan_chunks(text, max_tokens=300, overlap_tokens=40)
    assert_plan_rules(text, plan, 300, 40)
    assert len(plan) >= 8
    starts_of_paragraphs = {text.index(p) for p in paras}
    for chunk in plan[:-1]:
        assert chunk.end in starts_of_paragraphs, chunk.of(text)[-40:]
        assert chunk.of(text).endswith("\n\n")
    for chunk in plan[1:]:
        assert text[: chunk.start].endswith((". ", "\n\n")), text[chunk.start - 20 : chunk.start]
    # Even shares: no chunk is a sliver next to the others.
    sizes = [c.tokens for c in plan]
    assert min(sizes) >= max(sizes) // 2, sizes


def test_without_blank_lines_cuts_fall_after_a_sentence() -> None:
    text = " ".join(paragraphs(1, 200, seed=2))  # one paragraph of 200 sentences
    plan = plan_chunks(text, max_tokens=250, overlap_tokens=30)
    assert_plan_rules(text, plan, 250, 30)
    assert len(plan) >= 8
    for chunk in plan[:-1]:
        assert chunk.of(text).endswith(". "), chunk.of(text)[-30:]


def test_without_sentences_cuts_fall_after_white_space() -> None:
    text = " ".join(["lowercase words without any stop"] * 500)
    plan = plan_chunks(text, max_tokens=64, overlap_tokens=16)
    assert_plan_rules(text, plan, 64, 16)
    for chunk in plan[:-1]:
        assert chunk.of(text).endswith(" ") and not text[chunk.end].isspace()


def test_cjk_is_cut_after_its_full_stops_and_without_any_is_still_cut() -> None:
    punctuated = "光合作用是植物利用光能把二氧化碳和水转化为有机物的过程。" * 300
    plan = plan_chunks(punctuated, max_tokens=500, overlap_tokens=50)
    assert_plan_rules(punctuated, plan, 500, 50)
    assert len(plan) >= 5
    assert all(c.of(punctuated).endswith("。") for c in plan[:-1])
    assert all(punctuated[: c.start].endswith("。") for c in plan[1:])

    run = "没有标点的中文文本也要能切开" * 1500  # 21,000 characters, no space, no stop
    plan = plan_chunks(run, max_tokens=1000, overlap_tokens=100)
    assert_plan_rules(run, plan, 1000, 100)
    assert len(plan) >= 10


def test_one_100k_character_word_is_cut_into_even_chunks_within_the_budget() -> None:
    rng = random.Random(3)
    word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(100_000))
    started = time.perf_counter()
    plan = plan_chunks(word, max_tokens=2000, overlap_tokens=100)
    elapsed = time.perf_counter() - started
    assert_plan_rules(word, plan, 2000, 100)
    assert len(plan) >= count_tokens(word) // 2000
    sizes = [c.tokens for c in plan]
    assert max(sizes) - min(sizes) <= 200, sizes
    assert elapsed < 5, elapsed  # a regression to quadratic work takes minutes


def test_crlf_text_is_never_cut_between_cr_and_lf() -> None:
    paras = paragraphs(30, 3, seed=4)
    text = "\r\n\r\n".join(p.replace(". ", ".\r\n") for p in paras)
    plan = plan_chunks(text, max_tokens=200, overlap_tokens=30)
    assert_plan_rules(text, plan, 200, 30)
    for chunk in plan:
        assert not chunk.of(text).startswith("\n")
        assert chunk.end == len(text) or not text[: chunk.end].endswith("\r")
    for chunk in plan[:-1]:
        assert chunk.of(text).endswith("\r\n\r\n")


def test_empty_paragraphs_stay_with_the_chunk_before_them() -> None:
    paras = paragraphs(30, 3, seed=5)
    text = "\n\n\n \n\t\n\n".join(paras) + "\n\n\n"
    plan = plan_chunks(text, max_tokens=150, overlap_tokens=20)
    assert_plan_rules(text, plan, 150, 20)
    for chunk in plan[1:]:
        assert not text[chunk.start].isspace(), repr(text[chunk.start - 5 : chunk.start + 5])
    for chunk in plan[:-1]:
        assert chunk.of(text).endswith("\n\n\n \n\t\n\n")


def test_hard_cuts_keep_combining_marks_and_emoji_sequences_whole() -> None:
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"
    accented = "e\u0301\u0323"  # e with two combining marks
    for unit in (family, accented, "\U0001f1eb\U0001f1f7", "\U0001f44d\U0001f3fd"):
        text = unit * (4000 // len(unit))  # flags pair within the pairing's lookback
        plan = plan_chunks(text, max_tokens=100, overlap_tokens=20)
        assert_plan_rules(text, plan, 100, 20)
        assert len(plan) > 5
        for chunk in plan:
            # Every chunk starts and ends on a whole unit.
            assert chunk.start % len(unit) == 0 and chunk.end % len(unit) == 0, (unit, chunk)
            assert unicodedata.category(text[chunk.start]) not in ("Mn", "Mc", "Me")


@pytest.mark.parametrize("max_tokens", [8, 40, 10_000])
def test_surrogates_in_a_str_are_measured_as_the_characters_they_are(max_tokens: int) -> None:
    """A lone surrogate (escaped JSON) or a pair the str never joined: offsets stay str
    indices and every count is the exact count of the chunk's own text."""
    text = "Some text \ud83d\ude00 and a lone \ud800 one. " * 40
    plan = plan_chunks(text, max_tokens=max_tokens, overlap_tokens=max_tokens // 4)
    assert_plan_rules(text, plan, max_tokens, max_tokens // 4)
    assert (len(plan) == 1) == (count_tokens(text) <= max_tokens)


def test_a_400k_character_source_plans_in_well_under_a_second() -> None:
    text = "\n\n".join(paragraphs(1500, 5, seed=6))[:400_000]
    assert len(text) == 400_000
    plan_chunks(text[:1000], max_tokens=100, overlap_tokens=10)  # tokenizer loaded
    started = time.perf_counter()
    plan = plan_chunks(text, max_tokens=4000, overlap_tokens=200)
    elapsed = time.perf_counter() - started
    assert_plan_rules(text, plan, 4000, 200)
    # Measured at about 0.06 s; the bound leaves room for a loaded 2-core machine.
    assert elapsed < 2, elapsed


def test_short_and_empty_texts_are_one_chunk() -> None:
    assert plan_chunks("", max_tokens=8, overlap_tokens=0) == [Chunk(0, 0, 0, 0)]
    text = "Two short sentences. Nothing more. " * 3
    assert plan_chunks(text, max_tokens=count_tokens(text), overlap_tokens=2) == [
        Chunk(0, 0, len(text), count_tokens(text))
    ]


@pytest.mark.parametrize(("max_tokens", "overlap"), [(7, 0), (100, 51), (100, -1)])
def test_impossible_budgets_are_refused(max_tokens: int, overlap: int) -> None:
    with pytest.raises(ValueError):
        plan_chunks("text", max_tokens=max_tokens, overlap_tokens=overlap)


# ---- spread_count --------------------------------------------------------------------------

weights_lists = st.lists(st.integers(0, 5000), min_size=1, max_size=30)


@PROPERTY
@given(total=st.integers(0, 500), weights=weights_lists, at_least=st.integers(0, 3))
def test_spread_count_always_sums_to_the_total_and_keeps_the_floor(
    total: int, weights: list[int], at_least: int
) -> None:
    parts = spread_count(total, weights, at_least=at_least)
    assert len(parts) == len(weights)
    assert sum(parts) == total
    assert all(p >= 0 for p in parts)
    if total >= len(weights) * at_least:
        assert all(p >= at_least for p in parts)
    assert spread_count(total, weights, at_least=at_least) == parts


@PROPERTY
@given(total=st.integers(0, 500), weights=weights_lists)
def test_spread_count_without_a_floor_is_within_one_of_the_exact_share(
    total: int, weights: list[int]
) -> None:
    parts = spread_count(total, weights, at_least=0)
    weight = sum(weights) or len(weights)
    for part, w in zip(parts, weights if sum(weights) else [1] * len(weights), strict=True):
        assert abs(part - Fraction(total * w, weight)) < 1


@PROPERTY
@given(weights=weights_lists, data=st.data())
def test_fewer_items_than_chunks_go_one_each_to_the_largest(
    weights: list[int], data: st.DataObject
) -> None:
    total = data.draw(st.integers(0, len(weights) - 1))
    parts = spread_count(total, weights)
    assert sorted(set(parts)) in ([0], [0, 1], [1])
    served = [i for i, p in enumerate(parts) if p]
    largest_first = sorted(range(len(weights)), key=lambda i: (-weights[i], i))
    assert served == sorted(largest_first[:total])


@pytest.mark.parametrize(
    ("total", "weights", "at_least", "expected"),
    [
        (10, [1, 1, 1], 1, [4, 3, 3]),  # equal remainders: the lower index first
        (10, [100, 100, 1], 1, [5, 4, 1]),  # the floor, then the rest in proportion
        (100, [1, 1, 98], 1, [1, 1, 98]),  # the floor takes nothing from a fair share
        (2, [5, 1, 9], 1, [1, 0, 1]),  # fewer items than chunks: the largest get one
        (1, [3, 3], 1, [1, 0]),  # a tie goes to the lower index
        (5, [4, 2, 1], 3, [5, 0, 0]),  # below one floor: the largest chunk takes it all
        (6, [0, 0, 0], 1, [2, 2, 2]),  # no sizes known: equal weights
        (0, [7, 8], 1, [0, 0]),
        (0, [], 1, []),
    ],
)
def test_spread_count_examples(
    total: int, weights: list[int], at_least: int, expected: list[int]
) -> None:
    assert spread_count(total, weights, at_least=at_least) == expected


@pytest.mark.parametrize(
    ("total", "weights", "at_least"), [(-1, [1], 1), (1, [-1], 1), (1, [1], -1), (1, [], 1)]
)
def test_spread_count_refuses_what_cannot_be_spread(
    total: int, weights: list[int], at_least: int
) -> None:
    with pytest.raises(ValueError):
        spread_count(total, weights, at_least=at_least)


# ---- merge_items and normalise -------------------------------------------------------------

VARIANTS = [
    "What is ATP?",
    "what is atp",
    "  WHAT  is\tATP ",
    "«What is ATP»",
    "\uff37\uff48\uff41\uff54 \uff49\uff53 \uff21\uff34\uff30\uff1f",
]


def test_normalise_folds_case_width_space_and_end_punctuation() -> None:
    assert {normalise(v) for v in VARIANTS} == {"what is atp"}
    assert normalise("Straße") == normalise("STRASSE") == "strasse"
    assert normalise("e\u0301") == normalise("\u00e9")  # NFKC composes
    assert normalise("a.b, c") == "a.b, c"  # inner punctuation is kept
    assert normalise("?!") == ""


@PROPERTY
@given(st.text(max_size=40))
def test_normalise_is_idempotent(text: str) -> None:
    assert normalise(normalise(text)) == normalise(text)


items_per_chunk = st.lists(
    st.lists(st.sampled_from([*VARIANTS, "Why?", "why", "How so", "ATP", "atp.", ""]), max_size=8),
    max_size=6,
)


@PROPERTY
@given(per_chunk=items_per_chunk, limit=st.integers(0, 12))
def test_merge_keeps_first_occurrences_in_chunk_order_without_duplicates(
    per_chunk: list[list[str]], limit: int
) -> None:
    merged = merge_items(per_chunk, key=lambda s: s, limit=limit)
    keys = [normalise(m) for m in merged]
    assert len(keys) == len(set(keys)), "no duplicates"
    # Exactly the first occurrence of each distinct key, in concatenation order, cut at limit.
    firsts: list[str] = []
    for item in (i for chunk in per_chunk for i in chunk):
        if normalise(item) not in {normalise(f) for f in firsts}:
            firsts.append(item)
    assert merged == firsts[:limit]


def test_merge_by_a_key_of_structured_items() -> None:
    per_chunk = [
        [{"q": "What is ATP?", "n": 1}, {"q": "Where is the nucleus?", "n": 2}],
        [{"q": "what is atp", "n": 3}, {"q": "What does RNA carry?", "n": 4}],
        [{"q": "Where is the nucleus ", "n": 5}, {"q": "How do cells divide?", "n": 6}],
    ]
    merged = merge_items(per_chunk, key=lambda item: str(item["q"]), limit=3)
    assert [m["n"] for m in merged] == [1, 2, 4]
    # Fewer distinct items than asked: all of them, no padding.
    assert [m["n"] for m in merge_items(per_chunk, key=lambda i: str(i["q"]), limit=9)] == [
        1,
        2,
        4,
        6,
    ]
    with pytest.raises(ValueError):
        merge_items(per_chunk, key=lambda i: str(i["q"]), limit=-1)
