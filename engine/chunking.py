"""The pure core of chunked jobs: split a long source into chunks that each fit one provider
call, spread a requested item count over the chunks, merge the chunks' items into one list.

Everything here is deterministic (the same input gives the same answer, on every worker and
in every replay) and does no I/O. A plan holds character offsets, never text: the plan is
stored in PostgreSQL beside the job's snapshot, and only chunk indexes and counts may reach
Temporal.

Token counts are those of `engine.tokens.count_tokens` (tiktoken's cl100k, offline): a chunk's
`tokens` is exactly `count_tokens(text[start:end])`, the figure budgets reserve by.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol, TypeVar

from engine.tokens import ENCODING_NAME, count_tokens

T = TypeVar("T")

# The smallest chunk budget: one code point is at most 4 UTF-8 bytes, hence at most 4 tokens
# of a byte-level vocabulary, so any text can be cut into chunks of 8 tokens.
MIN_MAX_TOKENS = 8
# How far the offset-based estimate of a span's tokens may be off at the span's two ends (a
# token split by a cut, a space that joins the next word); within this margin the exact count
# is asked before the remaining text is cut again.
_EDGE_SLACK_TOKENS = 8
# How far a hard cut steps back to avoid splitting a grapheme (a letter and its combining
# marks, an emoji sequence, CR LF) before it gives up and cuts where the budget ends.
_GRAPHEME_LOOKBACK = 32
# How far back the pairing of regional indicators (flags) is counted; a longer run of flags may
# be cut inside a flag, which keeps a hard cut's cost bounded.
_REGIONAL_LOOKBACK = 4096

# Cut points are where the next piece of text starts: after the blank lines, after the
# sentence's end and its spaces, after the line break, after the spaces. A chunk thus ends
# with its trailing white space and the next one starts on text, and no character is skipped.
_PARAGRAPH = re.compile(r"\n[^\S\n]*\n\s*")
_SENTENCE = re.compile(
    # Latin, Greek, Cyrillic, Arabic, Indic stops count only before white space or the end
    # ("3.14", "e.g.x" are not ends); CJK stops end a sentence wherever they are.
    r"[.!?\u2026\u203c\u2047\u2048\u2049\u061f\u06d4\u0964\u0965]+"
    r"[\"'\u2019\u201d\u00bb)\]\u300d\u300f]*(?:\s+|\Z)"
    r"|[\u3002\uff01\uff1f\uff0e\uff61]+[\u300d\u300f\u201d\u2019\uff09\"')\]]*\s*"
)
_LINE = re.compile(r"\n\s*")
_SPACE = re.compile(r"\s+")

_CONTINUATION_BYTES = bytes(range(0x80, 0xC0))
_SURROGATE = re.compile("[\ud800-\udfff]")
_ZWJ = "\u200d"


def _is_regional(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


class _Encoding(Protocol):
    def encode_ordinary(self, text: str) -> list[int]: ...

    def decode_tokens_bytes(self, tokens: list[int]) -> list[bytes]: ...


@functools.cache
def _encoding() -> _Encoding:
    import tiktoken  # loaded on first use, as in engine.tokens (same vocabulary, same cache)

    enc: _Encoding = tiktoken.get_encoding(ENCODING_NAME)
    return enc


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk of a source: `text[start:end]` (Python str indices), `tokens` its exact count.
    The plan never holds the text itself."""

    index: int
    start: int
    end: int
    tokens: int

    def of(self, text: str) -> str:
        """This chunk's text, cut from the source it was planned on."""
        return text[self.start : self.end]


def plan_chunks(text: str, *, max_tokens: int, overlap_tokens: int) -> list[Chunk]:
    """Cut `text` into chunks of at most `max_tokens` tokens each, overlap included.

    - A text of at most `max_tokens` tokens (the empty text too) is one chunk covering it all.
    - Otherwise each cut falls, by preference, after a paragraph (a blank line), after a
      sentence's end (. ! ? … and the like before white space; the CJK full stop,
      exclamation and question marks anywhere), after a line break, after white space, and
      only when the budget holds none of these, between tokens
      (a giant word or a CJK run without punctuation is still cut, never past `max_tokens`);
      a hard cut steps back so as not to split a letter from its combining marks, an emoji
      sequence or CR LF. Among the cut points of the best kind, the one nearest an even share
      of the remaining text is taken, so chunks come out about the same size.
    - Chunk i+1 starts inside chunk i's tail, at most `overlap_tokens` before its end (at a
      sentence or line start when one lies in the back half of that tail, else after white
      space, else between tokens), and never before chunk i's own new text: every character is
      in one or two chunks.
    - Chunks are in order (starts and ends strictly increase), non-empty, and cover the text.

    Cost: the text is tokenised once (offsets are estimated from that), then each chunk once
    more to check its exact count.
    """
    if max_tokens < MIN_MAX_TOKENS:
        raise ValueError(f"max_tokens must be at least {MIN_MAX_TOKENS}")
    if not 0 <= overlap_tokens <= max_tokens // 2:
        raise ValueError("overlap_tokens must be between 0 and half of max_tokens")
    enc = _encoding()
    # A str may hold surrogates (a lone one from escaped JSON); the tokenizer works on UTF-8 and
    # would merge a pair into one character, so offsets are measured on a copy where each is
    # the replacement character: the same length, the same indices.
    scan = _SURROGATE.sub("\ufffd", text)
    ids = enc.encode_ordinary(scan) if text else []
    total = len(ids) if scan == text else count_tokens(text)
    if total <= max_tokens:
        return [Chunk(0, 0, len(text), total)]
    return _Planner(text, enc.decode_tokens_bytes(ids), max_tokens, overlap_tokens).plan()


class _Planner:
    """One planning run. `starts[k]` is the character offset where token k starts (rounded up
    to the next character when a token starts inside a multi-byte character), and
    `starts[-1] == len(text)`: spans are measured in tokens by bisecting it."""

    def __init__(self, text: str, pieces: list[bytes], max_tokens: int, overlap: int) -> None:
        self.text = text
        self.max_tokens = max_tokens
        self.overlap = overlap
        sizes: Iterable[int]
        if text.isascii():
            sizes = map(len, pieces)
        else:  # characters whose first byte lies in each token's bytes
            sizes = (len(p.translate(None, _CONTINUATION_BYTES)) for p in pieces)
        self.starts = list(itertools.accumulate(sizes, initial=0))
        assert self.starts[-1] == len(text), "token bytes do not spell the text"
        self.n = len(pieces)
        found = [
            [m.end() for m in rx.finditer(text) if 0 < m.end() < len(text)]
            for rx in (_PARAGRAPH, _SENTENCE, _LINE, _SPACE)
        ]
        self.cut_levels = found  # best kind first
        # Where an overlap may start: a paragraph, sentence or line start.
        self.sentence_starts = sorted(set(itertools.chain(*found[:3])))
        self.space_ends = found[3]

    # ---- token arithmetic on offsets (estimates; exact counts are taken on the result) ----

    def _token_at(self, pos: int) -> int:
        """The token that holds character `pos` (`n` at the end of the text)."""
        return bisect.bisect_right(self.starts, pos) - 1

    def _after(self, pos: int, tokens: int) -> int:
        """The offset about `tokens` tokens after `pos` (a token start, or the end)."""
        return self.starts[max(min(self._token_at(pos) + tokens, self.n), 0)]

    def _before(self, pos: int, tokens: int) -> int:
        """The offset about `tokens` tokens before `pos` (a token start)."""
        return self.starts[max(bisect.bisect_left(self.starts, pos) - tokens, 0)]

    def _span(self, start: int, end: int) -> int:
        """About how many tokens `text[start:end]` takes."""
        return self._token_at(end - 1) - self._token_at(start) + 1 if end > start else 0

    def _safe(self, pos: int) -> bool:
        """Whether a cut at `pos` keeps every grapheme whole (as far as cheap rules tell)."""
        if pos <= 0 or pos >= len(self.text):
            return True
        prev, ch = self.text[pos - 1], self.text[pos]
        if (prev == "\r" and ch == "\n") or prev == _ZWJ or ch == _ZWJ:
            return False
        if unicodedata.category(ch) in ("Mn", "Mc", "Me"):
            return False
        code = ord(ch)
        if 0xFE00 <= code <= 0xFE0F or 0xE0100 <= code <= 0xE01EF:  # variation selectors
            return False
        if 0x1F3FB <= code <= 0x1F3FF or 0xE0020 <= code <= 0xE007F:  # skin tones, emoji tags
            return False
        if _is_regional(ch) and _is_regional(prev):
            # Regional indicators pair up into flags from the start of their run: a cut between
            # two is safe after an even number of them (counted back a bounded way).
            run = 0
            while (
                run < _REGIONAL_LOOKBACK
                and pos - run > 0
                and _is_regional(self.text[pos - run - 1])
            ):
                run += 1
            return run % 2 == 0
        return True

    # ---- the plan ----

    def plan(self) -> list[Chunk]:
        chunks: list[Chunk] = []
        length = len(self.text)
        start = fresh = 0  # this chunk's start, and where its text not in the last one begins
        while True:
            if self._span(start, length) <= self.max_tokens + _EDGE_SLACK_TOKENS:
                rest = count_tokens(self.text[start:])
                if rest <= self.max_tokens:
                    chunks.append(Chunk(len(chunks), start, length, rest))
                    return chunks
            start, end, tokens = self._cut(start, fresh)
            chunks.append(Chunk(len(chunks), start, end, tokens))
            if end == length:
                return chunks
            start, fresh = self._overlap_start(max(fresh, start + 1), end), end

    def _cut(self, start: int, fresh: int) -> tuple[int, int, int]:
        """The chunk that starts at `start` and ends after `fresh`: (start, end, tokens). The
        start moves up to `fresh` (the overlap is dropped) only if the budget left no room for
        new text, which the overlap bound of half the budget makes a corner case."""
        budget = self.max_tokens
        while True:
            limit = self._after(start, budget)
            if limit <= fresh and start < fresh:
                start, budget = fresh, self.max_tokens
                continue
            if limit <= fresh:  # not one token fits: one code point does (MIN_MAX_TOKENS)
                limit = fresh + 1
            end = self._choose_end(start, fresh, limit)
            tokens = count_tokens(self.text[start:end])
            if tokens <= self.max_tokens:
                return start, end, tokens
            # The estimate was off at the edges: ask for fewer tokens and cut again. The budget
            # shrinks every round, so this ends (at worst with `fresh + 1`).
            budget = max(min(budget - 1, budget - (tokens - self.max_tokens)), 0)

    def _choose_end(self, start: int, fresh: int, limit: int) -> int:
        """The best cut point in (fresh, limit]: of the best kind present, the one nearest an
        even share of what is left; a hard cut at that share when there is none."""
        room = self.max_tokens - self._span(start, fresh)
        remaining = self._span(fresh, len(self.text))
        share = math.ceil(remaining / math.ceil(remaining / max(room, 1)))
        target = max(min(self._after(fresh, share), limit), fresh + 1)
        low = min(self._after(fresh, max(share // 2, 1)), target)
        low = low if low < limit else fresh
        for points in self.cut_levels:
            i = bisect.bisect_right(points, low)
            j = bisect.bisect_right(points, limit, lo=i)
            if i == j:
                continue
            k = bisect.bisect_left(points, target, i, j)
            near = [points[m] for m in (k - 1, k) if i <= m < j]
            best = min(near, key=lambda p: (abs(p - target), -p))
            if self._safe(best):
                return best
        for back in range(min(_GRAPHEME_LOOKBACK, target - fresh - 1) + 1):
            if self._safe(target - back):
                return target - back
        return target

    def _overlap_start(self, floor: int, end: int) -> int:
        """Where the chunk after [.., end) starts: at most `overlap` tokens before `end`, never
        before `floor` (the current chunk's new text, and past its start), preferring a
        sentence start in the back half of that window so the overlap is neither a torn
        sentence nor a sliver."""
        if self.overlap == 0:
            return end
        earliest = max(self._before(end, self.overlap), floor)
        half = max(self._before(end, self.overlap // 2), earliest)
        if earliest >= end:
            return end
        pos = self._first_in(self.sentence_starts, earliest, min(half, end - 1))
        if pos is None:
            pos = self._first_in(self.space_ends, earliest, min(half, end - 1))
        if pos is None:
            pos = earliest
            while pos < end and not self._safe(pos):
                pos += 1
        # The estimate may be off at the edges: the overlap bound is exact.
        while pos < end and (excess := count_tokens(self.text[pos:end]) - self.overlap) > 0:
            pos = max(self._after(pos, excess), pos + 1)
        return min(pos, end)

    @staticmethod
    def _first_in(points: list[int], low: int, high: int) -> int | None:
        i = bisect.bisect_left(points, low)
        return points[i] if i < len(points) and points[i] <= high else None


def spread_count(total: int, weights: Sequence[int], *, at_least: int = 1) -> list[int]:
    """Split `total` items over chunks in proportion to `weights` (their sizes); the parts
    always sum to `total`.

    Each part is at least `at_least` when `total` allows it (`total >= len(weights) *
    at_least`): parts whose share falls below the floor get the floor, and the rest is shared
    again among the others, in proportion. Shares are exact fractions, rounded by largest
    remainder, ties to the lower index. Otherwise only the `total // at_least` largest chunks
    (ties to the lower index; at least one when `total > 0`) get a part, spread over them by
    the same rule, and the others get 0: with `at_least=1`, the `total` largest chunks get one
    item each. The caller may skip the chunks whose part is 0. All-zero weights count as equal.
    """
    if total < 0 or at_least < 0 or any(w < 0 for w in weights):
        raise ValueError("total, weights and at_least must not be negative")
    count = len(weights)
    if count == 0:
        if total:
            raise ValueError("a positive total needs at least one chunk")
        return []
    if total == 0:
        return [0] * count
    if total >= count * at_least:
        return _apportion(total, list(weights), at_least)
    served = max(total // at_least, 1)
    largest = sorted(range(count), key=lambda i: (-weights[i], i))[:served]
    chosen = sorted(largest)
    parts = _apportion(total, [weights[i] for i in chosen], at_least)
    spread = [0] * count
    for i, part in zip(chosen, parts, strict=True):
        spread[i] = part
    return spread


def _apportion(total: int, weights: list[int], at_least: int) -> list[int]:
    """`total` over `weights` by largest remainder, every part at least `at_least` when
    `total >= len(weights) * at_least` (otherwise the one part takes all)."""
    if not any(weights):
        weights = [1] * len(weights)
    floored: set[int] = set()
    while True:
        free = [i for i in range(len(weights)) if i not in floored]
        left = total - at_least * len(floored)
        weight = sum(weights[i] for i in free)
        if weight == 0:  # only zero weights are left: they share what is left evenly
            shares = {i: Fraction(left, len(free)) for i in free}
        else:
            shares = {i: Fraction(left * weights[i], weight) for i in free}
        low = {i for i in free if shares[i] < at_least}
        if not low or len(low) == len(free):
            break
        floored |= low
    parts = [at_least] * len(weights)
    for i in free:
        parts[i] = math.floor(shares[i])
    short = total - sum(parts)
    by_remainder = sorted(free, key=lambda i: (-(shares[i] - parts[i]), i))
    for i in by_remainder[:short]:
        parts[i] += 1
    return parts


_PUNCTUATION_CATEGORIES = frozenset({"Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po"})


def normalise(text: str) -> str:
    """The form two items are compared in: Unicode NFKC, case folded, white space collapsed to
    single spaces, punctuation and white space stripped at both ends. `"What is ATP?"` and
    `"  what is atp"` (or the same in full-width letters) are the same item."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    words = " ".join(folded.split())
    lo, hi = 0, len(words)
    while lo < hi and (
        words[lo].isspace() or unicodedata.category(words[lo]) in _PUNCTUATION_CATEGORIES
    ):
        lo += 1
    while hi > lo and (
        words[hi - 1].isspace() or unicodedata.category(words[hi - 1]) in _PUNCTUATION_CATEGORIES
    ):
        hi -= 1
    return words[lo:hi]


def merge_items(
    per_chunk: Sequence[Sequence[T]], *, key: Callable[[T], str], limit: int
) -> list[T]:
    """The chunks' items in chunk order, then item order, each first occurrence of a
    `normalise(key(item))` kept and later duplicates dropped, cut at `limit` items. The
    merged order is the output's order (ordinals follow it). Fewer than `limit` items come back
    when fewer distinct ones exist; whether that is enough is the caller's call."""
    if limit < 0:
        raise ValueError("limit must not be negative")
    merged: list[T] = []
    seen: set[str] = set()
    for item in itertools.chain.from_iterable(per_chunk):
        if len(merged) >= limit:
            break
        norm = normalise(key(item))
        if norm not in seen:
            seen.add(norm)
            merged.append(item)
    return merged
