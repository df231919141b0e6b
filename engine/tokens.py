"""How many tokens a prompt takes, estimated without a tokenizer, for refusals before any call.

The estimate is a *lower bound* for natural language: one token per five UTF-8 bytes (English
prose runs at about four bytes a token in the GPT and DeepSeek vocabularies, CJK text at one to
three bytes a token), plus a few tokens per chat message. A request is refused at create only
when even this lower bound, plus the job type's output budget, exceeds the model's context
window: the check never refuses a request the provider would have taken, and what slips past
it is refused by the provider as `REQUEST_TOO_LARGE`, an error that stays with its request.
"""

from __future__ import annotations

BYTES_PER_TOKEN_AT_MOST = 5
MESSAGE_OVERHEAD_TOKENS = 4  # role and separators of one chat message


def estimate_prompt_tokens(*messages: str) -> int:
    """A lower bound of the tokens `messages` take as one chat request."""
    return sum(
        -(-len(m.encode("utf-8")) // BYTES_PER_TOKEN_AT_MOST) + MESSAGE_OVERHEAD_TOKENS
        for m in messages
    )
