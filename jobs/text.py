"""Text helpers the job types share when they build synthetic output from a user's text."""

from __future__ import annotations

import re

# Sentence ends: ". ! ?" before whitespace, or the CJK full stop, exclamation and question marks.
SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|(?<=[\u3002\uff01\uff1f])|\n+")
# A word: a letter then three or more word characters, apostrophes or hyphens.
WORD = re.compile(r"[^\W\d_][\w'-]{3,}")


def clip(text: str, limit: int) -> str:
    """`text` with its white space folded, cut to `limit` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
