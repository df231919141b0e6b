"""Content safety checks applied to prompts (and outputs) before they leave or enter the engine.

Invariant: a block never echoes what matched. The raised `ExecutionFailure` names only the
index of the rule, so neither logs nor the job's stored error reveal the offending text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from engine.errors import ExecutionFailure


@runtime_checkable
class ContentSafety(Protocol):
    def check(self, texts: Sequence[str]) -> None:
        """Return if every text is acceptable; raise CONTENT_SAFETY_BLOCKED otherwise."""
        ...


# The engine's own rules: none. What a deployment must not send or accept is its provider's
# moderation to decide; a rule here blocks for every user and every job type alike.
BLOCKLIST: tuple[str, ...] = ()


def parse_blocklist(raw: str) -> list[str]:
    """Split a comma-separated list into entries, dropping blanks and outer whitespace."""
    return [entry.strip() for entry in raw.split(",") if entry.strip()]


def _compile_rule(entry: str) -> re.Pattern[str]:
    # Words are escaped and joined by "any whitespace"; the lookarounds act as word boundaries
    # that also work for entries starting/ending with punctuation (e.g. "c++"), where `\b` fails.
    words = entry.split()
    body = r"\s+".join(re.escape(word) for word in words)
    return re.compile(rf"(?<!\w){body}(?!\w)", re.IGNORECASE)


class RuleBasedContentSafety:
    """Blocks texts containing any blocklist entry as a whole word or phrase, ignoring case.

    "kill" blocks "Kill it" but not "skills"; "bad phrase" also matches "BAD   phrase".
    Rule indices are positions in the blocklist given to the constructor.
    """

    def __init__(self, blocklist: Sequence[str]) -> None:
        rules: list[re.Pattern[str]] = []
        for index, entry in enumerate(blocklist):
            if not entry.strip():
                # A blank rule would match everywhere; refuse it instead of blocking everything.
                raise ValueError(f"blocklist entry {index} is blank")
            rules.append(_compile_rule(entry))
        self._rules: tuple[re.Pattern[str], ...] = tuple(rules)

    def __len__(self) -> int:
        return len(self._rules)

    def check(self, texts: Sequence[str]) -> None:
        for text in texts:
            for index, rule in enumerate(self._rules):
                if rule.search(text):
                    raise ExecutionFailure(
                        "CONTENT_SAFETY_BLOCKED", internal_message=f"blocked by rule {index}"
                    )
