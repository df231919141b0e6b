"""Settings as the unit tests build them: production settings from a few variables, the names
of every setting (to clear them from the caller's environment), a JWT secret production accepts.
"""

from __future__ import annotations

from typing import Any

from engine.settings import Settings

GOOD_SECRET = "a-production-jwt-secret-of-at-least-32-bytes"


def setting_names() -> set[str]:
    """Every environment name a `Settings` field reads (its alias and alternative names)."""
    names: set[str] = set()
    for field in Settings.model_fields.values():
        if field.alias:
            names.add(field.alias)
        choices = getattr(field.validation_alias, "choices", ())
        names.update(c for c in choices if isinstance(c, str))
    return names


def prod(**env: Any) -> Settings:
    return Settings.model_validate({"AIJOBS_ENV": "production", **env})
