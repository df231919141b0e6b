"""Whose money a job is beyond its user's: its organisation, its teams and its tags.

An organisation and teams come from the token that creates the job (its `org` and `teams`
claims, named by JWT_ORG_CLAIM and JWT_TEAMS_CLAIM), tags from the create's body. Each id is
1-64 characters of `[A-Za-z0-9_.:-]`, so it is safe in a URL path, a log line and a key. A job
keeps the scopes it was created with; a budget of each applies to it (docs/money.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal, get_args

SCOPE_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,64}$"
_SCOPE_ID = re.compile(SCOPE_ID_PATTERN)
MAX_TAGS = 10
# A token's teams: more than this is not a token this platform issues.
MAX_TEAMS = 100

Scope = Literal["org", "team", "tag"]
SCOPES: tuple[str, ...] = get_args(Scope)
# A budget's period: UTC days or months.
Period = Literal["day", "month"]


def is_scope_id(value: object) -> bool:
    """An organisation, team or tag id: 1-64 characters of `[A-Za-z0-9_.:-]`."""
    return isinstance(value, str) and _SCOPE_ID.fullmatch(value) is not None


@dataclass(frozen=True)
class JobScopes:
    """A job's organisation (None: none), teams and tags, in the order they were given."""

    org_id: str | None = None
    team_ids: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.org_id is not None or bool(self.team_ids) or bool(self.tags)

    def pairs(self) -> Iterator[tuple[str, str]]:
        """Every (scope, id) the job counts in, without repeats."""
        seen: set[tuple[str, str]] = set()
        found: list[tuple[str, str]] = []
        if self.org_id is not None:
            found.append(("org", self.org_id))
        found += [("team", t) for t in self.team_ids]
        found += [("tag", t) for t in self.tags]
        for pair in found:
            if pair not in seen:
                seen.add(pair)
                yield pair


def unique(values: Iterable[str]) -> tuple[str, ...]:
    """`values` without repeats, first occurrence kept, in order."""
    return tuple(dict.fromkeys(values))
