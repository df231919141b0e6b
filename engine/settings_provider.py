"""The settings of the AI provider the platform calls: its key, endpoint and model, prices,
streaming, limits and fallbacks, and the service tiers' batch and off-peak settings.

A base of `engine.settings.Settings` (which holds the model configuration: environment
variables by alias), kept in a module of its own so each stays small; read them
through `Settings` like any other setting.
"""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings

from engine.capacity import parse_capacity_reserve


class ProviderSettings(BaseSettings):
    deepseek_api_key: SecretStr | None = Field(default=None, alias="DEEPSEEK_API_KEY")
    ai_base_url: str | None = Field(default=None, alias="AI_BASE_URL")
    ai_model: str = Field(default="deepseek-chat", alias="AI_MODEL")
    # Prices per model (JSON, merged over the built-in table of providers/pricing.py) and the
    # price of a model the table does not know (JSON; unset: the table's most expensive).
    ai_model_prices: str = Field(default="", alias="AI_MODEL_PRICES")
    ai_model_fallback_price: str = Field(default="", alias="AI_MODEL_FALLBACK_PRICE")
    # Models whose server cannot stream an answer with its usage (`stream_options`): comma-
    # separated names (case-insensitive, `*` for all); their calls are never asked to stream.
    ai_stream_disabled_models: str = Field(default="", alias="AI_STREAM_DISABLED_MODELS")
    # Provider limits per model (JSON: model, "provider/model" or "*" -> {"rpm", "tpm",
    # "concurrency"}), enforced per (provider, model, key) across workers (db/provider_limits.py,
    # docs/limits.md). Empty: only what providers announce in their rate-limit headers.
    ai_model_limits: str = Field(default="", alias="AI_MODEL_LIMITS")
    # The share of every limited key's concurrency, rpm and tpm kept for a class of calls while
    # one of its calls waits (JSON: {"interactive": 0.25}; `{}`: no reserve), docs/limits.md.
    ai_capacity_reserve: str = Field(default="{}", alias="AI_CAPACITY_RESERVE")
    # Platform-key fallback chain (JSON list of {"model", "baseUrl" ending in /v1, "apiKey"}):
    # a call moves down it on a health failure of its provider (providers/fallback.py,
    # docs/fallback.md). A secret as a whole: it holds keys.
    ai_fallbacks: SecretStr | None = Field(default=None, alias="AI_FALLBACKS")
    # The batch tier (docs/batch.md): how long a batch gathers jobs before it is submitted,
    # and how often a submitted batch is polled (durable timers of its workflow).
    ai_batch_window_s: float = Field(60.0, gt=0, alias="AI_BATCH_WINDOW_S")
    ai_batch_poll_s: float = Field(60.0, gt=0, alias="AI_BATCH_POLL_S")
    # The most lines, and JSONL bytes, one batch's file holds (a batch that would pass either
    # is closed and submitted at once; a job whose one line passes the bytes is refused).
    ai_batch_max_lines: int = Field(10_000, gt=0, alias="AI_BATCH_MAX_LINES")
    ai_batch_max_bytes: int = Field(100_000_000, gt=0, alias="AI_BATCH_MAX_BYTES")
    # The off-peak tier (docs/money.md, "Off-peak"): the discount windows per provider (JSON;
    # unset: DeepSeek's published window at half price).
    ai_offpeak_windows: str = Field(default="", alias="AI_OFFPEAK_WINDOWS")
    # Structured output (docs/fallback.md, "Structured output"): the form each model is asked
    # to answer in (JSON object: model name -> "json_schema" | "json_object" | "none", "*" for
    # any other model; unset: deepseek* json_object, others json_schema), and how long a form
    # a (base URL, model) refused stays lowered for every process.
    ai_structured_output: str = Field(default="", alias="AI_STRUCTURED_OUTPUT")
    ai_structured_downgrade_ttl_s: int = Field(
        default=86_400, ge=1, alias="AI_STRUCTURED_DOWNGRADE_TTL_S"
    )
    # Guardrails (docs/operations.md, "Guardrails"): the region phone numbers written without
    # a country code are read in when a job type masks PII; the moderation model (empty: no
    # moderation), its endpoint (unset: AI_BASE_URL) and key (unset: the platform's key).
    ai_pii_phone_region: str = Field(default="US", alias="AI_PII_PHONE_REGION")
    ai_moderation_model: str = Field(default="", alias="AI_MODERATION_MODEL")
    ai_moderation_base_url: str | None = Field(default=None, alias="AI_MODERATION_BASE_URL")
    ai_moderation_api_key: SecretStr | None = Field(default=None, alias="AI_MODERATION_API_KEY")

    @field_validator("ai_capacity_reserve")
    @classmethod
    def _capacity_reserve(cls, v: str) -> str:
        parse_capacity_reserve(v)  # a malformed reserve stops every process at start
        return v
