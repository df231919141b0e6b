"""Which providers have a Batch API (the `batch` service tier's only route to a provider).

A batch job is never run at the standard tier instead: a provider without a Batch API refuses
the tier at create (jobs/policy.py), so what the job is reserved and charged at is what it was
quoted."""

from __future__ import annotations

from providers.base import Provider
from providers.openai_compat import OpenAICompatibleProvider


def has_batch_api(provider: Provider) -> bool:
    """Whether `provider` accepts OpenAI's Files and Batches endpoints: the generic
    OpenAI-compatible provider does; DeepSeek's endpoint (name "deepseek") and the synthetic
    provider do not."""
    return isinstance(provider, OpenAICompatibleProvider) and provider.name != "deepseek"
