"""The metric of provider fallback (activities/fallback.py): calls moved from one model to the
next entry of their chain, and why. Part of `WorkerMetrics` (activities/metrics.py, as
`.fallbacks`). Both models come from configuration (AI_MODEL, AI_FALLBACKS) and the reason from
a fixed set, so the label set is bounded and holds no user data."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

REASONS = frozenset({"5xx", "timeout", "unavailable", "breaker"})


def _label(value: str, limit: int = 64) -> str:
    return value[:limit] if value else "unknown"


class FallbackMetrics:
    """`aijobs_provider_fallbacks_total{from_model,to_model,reason}`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.moves = Counter(
            "aijobs_provider_fallbacks_total",
            "Provider calls moved to the next model of their fallback chain: the primary (or "
            "an earlier entry) failed with a health failure (5xx, timeout, unavailable) or its "
            "breaker was open (breaker).",
            ["from_model", "to_model", "reason"],
            registry=registry,
        )

    def moved(self, from_model: str, to_model: str, reason: str) -> None:
        label = reason if reason in REASONS else "unavailable"
        self.moves.labels(_label(from_model), _label(to_model), label).inc()
