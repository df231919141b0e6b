"""Choice of the provider implementation from configuration.

Construction performs no network I/O: the HTTP client connects on the first request.
"""

from __future__ import annotations

from collections.abc import Iterable

from providers.base import Provider
from providers.openai_compat import DEFAULT_BASE_URL, OpenAICompatibleProvider
from providers.synthetic import SyntheticProvider

# The longest job timeout a definition may declare: each job's own timeoutMs then
# bounds its calls, instead of a provider-wide cap cutting long generations short.
MAX_CALL_TIMEOUT_S = 600.0


def build_provider(
    *,
    api_key: str | None,
    base_url: str | None,
    timeout_s: float = MAX_CALL_TIMEOUT_S,
    stream_disabled_models: Iterable[str] = (),
) -> Provider:
    """OpenAI-compatible provider when a key or a base URL is configured, else synthetic.

    The key itself is not stored in the provider: it reaches it per call in `ProviderRequest`.
    A missing base URL means DeepSeek; a base URL naming DeepSeek keeps the name "deepseek",
    any other is "openai_compatible". `stream_disabled_models` (AI_STREAM_DISABLED_MODELS,
    parsed by `providers.openai_compat.parse_model_set`) are never asked to stream.
    """
    if api_key or base_url:
        name = "deepseek" if not base_url or "deepseek" in base_url else "openai_compatible"
        return OpenAICompatibleProvider(
            base_url or DEFAULT_BASE_URL,
            name=name,
            timeout_s=timeout_s,
            stream_disabled_models=stream_disabled_models,
        )
    return SyntheticProvider()
