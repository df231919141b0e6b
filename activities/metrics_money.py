"""The metrics of what provider calls are charged (jobs/charging.py): calls charged on the
engine's estimate, and echoed model ids the price table does not know.

Part of `WorkerMetrics` (activities/metrics.py, as `.money`), on the same registry. The echoed
model is a provider's text, so its label set is bounded like `aijobs_unpriced_calls_total`'s:
the first UNKNOWN_ECHO_LABELS distinct ids, then `other`.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter

from jobs.charging import Charged

# Distinct echoed ids `aijobs_unknown_model_echoes_total` labels before it says `other`.
UNKNOWN_ECHO_LABELS = 10


def _label(value: str, limit: int = 64) -> str:
    return value[:limit] if value else "unknown"


class MoneyMetrics:
    """`aijobs_provider_calls_estimated_total{provider,model}` (provider and model from
    configuration) and `aijobs_unknown_model_echoes_total{model}` (bounded)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.estimated_calls = Counter(
            "aijobs_provider_calls_estimated_total",
            "Provider calls charged on the engine's estimate (cost_basis 'estimated'): the "
            "answer was not read to its end (a cancel, a timeout, a drain, a broken "
            "connection) or carried no usage.",
            ["provider", "model"],
            registry=registry,
        )
        self.unknown_echoes = Counter(
            "aijobs_unknown_model_echoes_total",
            "Answers whose echoed model id the price table does not know, priced as the "
            "requested model; past a few distinct ids, `other`.",
            ["model"],
            registry=registry,
        )
        self._echoes: set[str] = set()
        self._lock = threading.Lock()

    def charged(self, provider: str, model: str, charged: Charged | None) -> None:
        """One call's charge: counted when it was estimated."""
        if charged is not None and charged.basis == "estimated":
            self.estimated_calls.labels(_label(provider), _label(model)).inc()

    def unknown_echo(self, model: str) -> None:
        """An echoed id the table does not know (the `PriceTable.on_unknown_echo` hook)."""
        label = _label(model)
        with self._lock:
            if label not in self._echoes:
                if len(self._echoes) >= UNKNOWN_ECHO_LABELS:
                    label = "other"
                else:
                    self._echoes.add(label)
        self.unknown_echoes.labels(label).inc()
