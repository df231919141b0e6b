"""AI_MODEL_LIMITS: the provider limits configured per model (rpm, tpm, concurrency), and
AI_CAPACITY_RESERVE: the share of them kept for a class of calls while one of its calls waits;
parsed once per process; db/provider_limits.py applies them per (provider, model, key)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_MAX_NAME = 128
_FIELDS = ("rpm", "tpm", "concurrency")


@dataclass(frozen=True)
class Limits:
    """Per-minute requests and tokens and calls at once; None: unlimited. `reserve`: the
    share of each kept for a class while one of its calls waits (AI_CAPACITY_RESERVE), as
    (class, share) pairs with a share > 0; empty: no reserve."""

    rpm: int | None = None
    tpm: int | None = None
    concurrency: int | None = None
    reserve: tuple[tuple[str, float], ...] = ()

    @property
    def configured(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.concurrency is not None


class LimitTable:
    """AI_MODEL_LIMITS: the limits of each model, looked up as "provider/model", then "model",
    then "*" (every model); names are case-insensitive; each with AI_CAPACITY_RESERVE's
    shares. Built once per process."""

    def __init__(
        self,
        entries: Mapping[str, Limits] | None = None,
        reserve: Mapping[str, float] | None = None,
    ) -> None:
        shares = tuple(sorted((c, v) for c, v in (reserve or {}).items() if v > 0))
        self._entries = {
            name.strip().lower(): dataclasses.replace(v, reserve=shares)
            for name, v in (entries or {}).items()
        }
        self._none = Limits(reserve=shares)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def for_model(self, provider: str, model: str) -> Limits:
        p, m = provider.strip().lower(), model.strip().lower()
        for name in (f"{p}/{m}", m, "*"):
            found = self._entries.get(name)
            if found is not None:
                return found
        return self._none


def _limit(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 1:
        raise ValueError(f"{where}: want a positive integer or null")
    return value


def parse_model_limits(raw_text: str, reserve: Mapping[str, float] | None = None) -> LimitTable:
    """AI_MODEL_LIMITS: a JSON object of model name ("deepseek-chat"), "provider/model" or "*"
    -> {"rpm": int, "tpm": int, "concurrency": int}, each optional (null or absent:
    unlimited). Empty: no limits. Each entry carries `reserve` (AI_CAPACITY_RESERVE, parsed).
    Raises ValueError naming the setting and the entry."""
    if not raw_text.strip():
        return LimitTable(reserve=reserve)
    try:
        raw = json.loads(raw_text)
    except ValueError:
        raise ValueError("AI_MODEL_LIMITS: not valid JSON") from None
    if not isinstance(raw, dict):
        raise ValueError("AI_MODEL_LIMITS: want a JSON object of model name -> limits")
    out: dict[str, Limits] = {}
    for name, entry in raw.items():
        model = name.strip().lower()
        if not model or len(model) > _MAX_NAME:
            raise ValueError(f"AI_MODEL_LIMITS: a model name must have 1-{_MAX_NAME} characters")
        where = f"AI_MODEL_LIMITS[{model[:40]!r}]"
        if not isinstance(entry, dict) or not set(entry) <= set(_FIELDS):
            raise ValueError(f"{where}: want an object with rpm, tpm and/or concurrency")
        out[model] = Limits(
            rpm=_limit(entry.get("rpm"), f"{where}.rpm"),
            tpm=_limit(entry.get("tpm"), f"{where}.tpm"),
            concurrency=_limit(entry.get("concurrency"), f"{where}.concurrency"),
        )
    return LimitTable(out, reserve)
