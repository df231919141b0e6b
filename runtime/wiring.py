"""Builds the engine's parts from Settings: the composition root, the only place that turns
configuration into objects. `aijobs api`, the workers, the relay and the reconciler get theirs
here (`api_app`, `build_parts` and the builders below)."""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import Client
from temporalio.runtime import Runtime

from activities.deps import EngineConfig
from activities.metrics import WorkerMetrics, worker_metrics
from activities.reconciler import ReconcilerConfig
from activities.relay import RelayConfig
from activities.retention import retention_config
from activities.webhooks import POLL_INTERVAL_S as WEBHOOK_POLL_INTERVAL_S
from activities.webhooks import WebhookConfig, WebhookDeliverer
from db.batches import BatchCaps
from db.listener import Listener
from db.provider_limits import parse_model_limits
from db.session import DEFAULT_APPLICATION_NAME, SessionMaker, make_engine, make_sessionmaker
from engine.capacity import parse_capacity_reserve
from engine.definition import PLATFORM_KEY, QUEUE_NAMES, USER_DEEPSEEK_KEY
from engine.offpeak import parse_windows
from engine.payloads import DATA_CONVERTER
from engine.pii import valid_region
from engine.settings import DEV_JWT_SECRET, Role, Settings
from jobs.chunked import ChunkPolicy
from jobs.credentials import credential_cipher
from jobs.gateway import Gateway
from jobs.guardrails import GuardrailConfig
from jobs.offpeak import reserve_discounts
from jobs.policy import CreatePolicy, ProviderTraits
from jobs.spec import Catalog
from jobs.types import default_catalog
from providers.base import Provider
from providers.batch import has_batch_api
from providers.factory import MAX_CALL_TIMEOUT_S, build_provider
from providers.fallback import FallbackEntry, Fallbacks, fallback_models, parse_fallbacks
from providers.moderation import OpenAIModeration
from providers.openai_compat import DEFAULT_BASE_URL, OpenAICompatibleProvider, parse_model_set
from providers.pricing import PriceTable
from providers.safety import BLOCKLIST, RuleBasedContentSafety
from providers.structured import FormPolicy, parse_forms
from runtime.telemetry import Telemetry

if TYPE_CHECKING:
    from fastapi import FastAPI


@dataclass
class Parts:
    settings: Settings
    engine: AsyncEngine
    sessionmaker: SessionMaker
    catalog: Catalog
    application_name: str = DEFAULT_APPLICATION_NAME

    async def close(self) -> None:
        await self.engine.dispose()


def build_parts(settings: Settings, *, application_name: str = DEFAULT_APPLICATION_NAME) -> Parts:
    """The process's pool (its connections named `application_name`: runtime/names.py) and
    catalog."""
    engine = make_engine(
        settings.require_database_url(),
        pool_size=settings.db_pool_size,
        pooled=settings.database_pooled,
        application_name=application_name,
    )
    return Parts(settings, engine, make_sessionmaker(engine), default_catalog(), application_name)


def process_listener(parts: Parts) -> Listener:
    """The process's one LISTEN connection (`<its name>-listener`, on a session of its own:
    DATABASE_DIRECT_URL behind a pooler). Its handlers: the relay's wake-ups, the webhook
    deliverer's, the limit and reuse wakers' (each registers itself where it is built)."""
    return Listener(parts.settings.session_database_url, application_name=parts.application_name)


def api_app(
    settings: Settings,
    *,
    policy: CreatePolicy | None = None,
    catalog: Catalog | None = None,
    temporal: Client | None = None,
    application_name: str = "aijobs-api",
) -> FastAPI:
    """The API application as `aijobs api` serves it: the create policy of `settings` and the
    default catalog unless given (tests pass their own)."""
    from api.app import create_app  # not at import time: workers never build the app

    return create_app(
        settings,
        policy=policy or create_policy(settings),
        catalog=catalog or default_catalog(),
        temporal=temporal,
        application_name=application_name,
    )


def price_table(settings: Settings, metrics: WorkerMetrics | None = None) -> PriceTable:
    """The process's prices (AI_MODEL_PRICES over the built-in table); a call charged the
    fallback price counts in `aijobs_unpriced_calls_total` of `metrics` (default: the process's
    registry), an echo it does not know in `aijobs_unknown_model_echoes_total`. Raises
    ValueError naming the setting when the prices are malformed."""
    m = metrics if metrics is not None else worker_metrics()
    return PriceTable.from_settings(
        settings, on_unpriced=m.unpriced_call, on_unknown_echo=m.money.unknown_echo
    )


def price_problems(settings: Settings, role: Role, queues: Sequence[str] = ()) -> list[str]:
    """What the prices forbid in production: a worker that calls the provider (a job queue,
    or all queues) for an AI_MODEL the table cannot price would charge every call the fallback
    price. The startup check adds these to `Settings.production_problems`."""
    if settings.environment != "production" or role != "worker":
        return []
    if not [q for q in (queues or QUEUE_NAMES) if q in QUEUE_NAMES]:
        return []
    if PriceTable.from_settings(settings).canonical(settings.ai_model) is None:
        return [
            f"AI_MODEL {settings.ai_model[:64]!r} has no price (add it to AI_MODEL_PRICES, "
            "with a price of 0 if it is free)"
        ]
    return []


def gateway(
    settings: Settings,
    telemetry: Telemetry | None = None,
    metrics: WorkerMetrics | None = None,
    *,
    blocklist: Sequence[str] = BLOCKLIST,
) -> Gateway:
    """The workers' gateway to the providers; `blocklist` is the content safety rules' (a
    test's own, else the engine's)."""
    key = settings.deepseek_api_key.get_secret_value() if settings.deepseek_api_key else None
    no_stream = parse_model_set(settings.ai_stream_disabled_models)  # never asked to stream
    # Raises ValueError naming AI_FALLBACKS and the entry (never its key): no start.
    chain = parse_fallbacks(settings.ai_fallbacks)
    built = Gateway(
        provider=build_provider(
            api_key=key, base_url=settings.ai_base_url, stream_disabled_models=no_stream
        ),
        user_provider=OpenAICompatibleProvider(
            user_key_base_url(settings),
            name="deepseek",
            timeout_s=MAX_CALL_TIMEOUT_S,
            stream_disabled_models=no_stream,
        ),
        model=settings.ai_model,
        platform_api_key=key,
        cipher=credential_cipher(settings),
        safety=RuleBasedContentSafety(blocklist),
        prices=price_table(settings, metrics),
        fallbacks=Fallbacks(chain, timeout_s=MAX_CALL_TIMEOUT_S),
        offpeak_windows=parse_windows(settings.ai_offpeak_windows),
        forms=form_policy(settings, chain),
        downgrade_ttl_s=settings.ai_structured_downgrade_ttl_s,
        guardrails=guardrail_config(settings),
    )
    if telemetry is not None:
        telemetry.instrument_provider(built.provider)
        telemetry.instrument_provider(built.user_provider)
        for fallback_provider in built.fallbacks.providers.values():
            telemetry.instrument_provider(fallback_provider)
    return built


def pii_region(settings: Settings) -> str:
    """AI_PII_PHONE_REGION, upper-cased; ValueError naming it when phonenumbers does not know
    the region."""
    region = settings.ai_pii_phone_region.strip().upper()
    if not valid_region(region):
        raise ValueError(f"AI_PII_PHONE_REGION: {region[:8]!r} is not a region (e.g. US, GB)")
    return region


def guardrail_config(settings: Settings) -> GuardrailConfig:
    """The guardrails' deployment side: the phone region, and the moderation endpoint when
    AI_MODERATION_MODEL is set (AI_MODERATION_BASE_URL, else AI_BASE_URL; its key
    AI_MODERATION_API_KEY, else the platform's)."""
    model = settings.ai_moderation_model.strip()
    moderator = None
    if model:
        key = settings.ai_moderation_api_key or settings.deepseek_api_key
        moderator = OpenAIModeration(
            settings.ai_moderation_base_url or settings.ai_base_url or DEFAULT_BASE_URL,
            model,
            key.get_secret_value() if key is not None else None,
        )
    return GuardrailConfig(pii_region(settings), moderator)


def form_policy(settings: Settings, chain: Sequence[FallbackEntry] = ()) -> FormPolicy:
    """The structured-output form of each model (AI_STRUCTURED_OUTPUT, raising ValueError
    naming it when malformed) and the AI_FALLBACKS entries' own (`structuredOutput`)."""
    return FormPolicy(
        parse_forms(settings.ai_structured_output),
        {e.model.lower(): e.structured_output for e in chain if e.structured_output},
    )


def _fairness_secret(settings: Settings) -> bytes:
    """Derived from the API's signing secret (which every API process has), under its own label:
    the fairness key never reveals the secret or the user id."""
    # Without JWT_SECRET a production API refuses to start; other processes never sign
    # fairness keys, so the labelled development secret is only a placeholder for them.
    secret = settings.jwt_secret.get_secret_value() if settings.jwt_secret else DEV_JWT_SECRET
    return hmac.new(secret.encode(), b"aijobs-fairness", "sha256").digest()


def user_key_base_url(settings: Settings) -> str:
    """Where a user's own DeepSeek key may be sent: DeepSeek's endpoint, or AI_BASE_URL only
    when an operator listed it in USER_KEY_ALLOWED_BASE_URLS. A generic AI_BASE_URL (a local
    model server, a proxy) never receives users' keys by accident."""
    allowed = {
        u.strip().rstrip("/") for u in settings.user_key_allowed_base_urls.split(",") if u.strip()
    }
    if settings.ai_base_url and settings.ai_base_url.rstrip("/") in allowed:
        return settings.ai_base_url
    return DEFAULT_BASE_URL


def _traits(provider: Provider) -> ProviderTraits:
    return ProviderTraits(provider.name, batch_api=has_batch_api(provider))


def provider_traits(settings: Settings) -> dict[str, ProviderTraits]:
    """The provider of each credential mode, as the workers' gateway builds it from the same
    settings (`gateway`), and whether it has a Batch API: what a create needs to refuse a
    tier its provider cannot serve. Building a provider does no I/O."""
    key = settings.deepseek_api_key.get_secret_value() if settings.deepseek_api_key else None
    platform = build_provider(api_key=key, base_url=settings.ai_base_url)
    user = OpenAICompatibleProvider(user_key_base_url(settings), name="deepseek")
    return {PLATFORM_KEY: _traits(platform), USER_DEEPSEEK_KEY: _traits(user)}


def create_policy(settings: Settings) -> CreatePolicy:
    return CreatePolicy(
        max_active_jobs=settings.quota_max_active_jobs,
        max_jobs_per_day=settings.quota_max_jobs_per_day,
        max_jobs_per_month=settings.quota_max_jobs_per_month,
        max_cost_usd_per_day=settings.quota_max_cost_usd_per_day,
        max_cost_usd_per_month=settings.quota_max_cost_usd_per_month,
        synthetic_public=settings.synthetic_public,
        platform_key_available=settings.platform_key_configured,
        snapshot_ttl_days=settings.data_retention_days,
        fairness_secret=_fairness_secret(settings),
        context_window=PriceTable.from_settings(settings).context_window(settings.ai_model),
        model=settings.ai_model,
        platform_synthetic=not (settings.deepseek_api_key or settings.ai_base_url),
        prices=PriceTable.from_settings(settings),
        fallback_models=fallback_models(settings.ai_fallbacks),
        chunking=ChunkPolicy(max_input_tokens=settings.ai_chunk_input_tokens),
        providers=provider_traits(settings),
        offpeak_discounts=reserve_discounts(parse_windows(settings.ai_offpeak_windows)),
        batch_max_bytes=settings.ai_batch_max_bytes,
        pii_region=pii_region(settings),
        debounce_max_delay_ms=settings.ai_debounce_max_delay_ms,
        default_ttl_s=settings.ai_default_ttl_s,
    )


def engine_config(settings: Settings) -> EngineConfig:
    return EngineConfig(
        heartbeat_timeout_ms=settings.heartbeat_timeout_ms,
        retry_after_max_s=settings.retry_after_max_s,
        breaker_failures=settings.provider_breaker_failures,
        breaker_cooldown_s=settings.provider_breaker_cooldown_s,
        # Raises ValueError naming AI_MODEL_LIMITS and the entry: a worker does not start.
        model_limits=parse_model_limits(
            settings.ai_model_limits, parse_capacity_reserve(settings.ai_capacity_reserve)
        ),
        budget_per_day_usd=settings.quota_max_cost_usd_per_day,
        budget_per_month_usd=settings.quota_max_cost_usd_per_month,
        chunk_concurrency=settings.ai_chunk_concurrency,
        batch_caps=BatchCaps(settings.ai_batch_max_lines, settings.ai_batch_max_bytes),
    )


def relay_config(settings: Settings) -> RelayConfig:
    return RelayConfig(
        database_url=settings.session_database_url,  # its LISTEN needs a session
        task_queue_suffix=settings.task_queue_suffix,
        poll_interval_s=settings.relay_poll_interval_s,
        user_window=settings.user_dispatch_window,
    )


def reconciler_config(settings: Settings) -> ReconcilerConfig:
    return ReconcilerConfig(
        retention_days=settings.data_retention_days,
        outbox_retention_days=settings.retention_days["outbox"],
        audit_retention_days=settings.retention_days["admin_audit"],
        retention=retention_config(settings),
    )


async def connect_temporal(
    settings: Settings, *, telemetry: Telemetry | None = None, runtime: Runtime | None = None
) -> Client:
    """The process's Temporal client: with the tracing interceptors when tracing is on (workers
    built from it inherit them), on `runtime` when the SDK's metrics are served."""
    return await Client.connect(
        settings.require_temporal_address(),
        namespace=settings.temporal_namespace,
        data_converter=DATA_CONVERTER,
        interceptors=telemetry.client_interceptors() if telemetry is not None else [],
        runtime=runtime,
    )


def webhook_config(settings: Settings) -> WebhookConfig:
    return WebhookConfig(
        allow_private=settings.webhooks_allow_private,
        poll_interval_s=WEBHOOK_POLL_INTERVAL_S,
        listen_url=settings.session_database_url,
        retention_s=settings.retention_days["webhook"] * 86_400,
    )


def webhook_deliverer(parts: Parts, listener: Listener | None = None) -> WebhookDeliverer:
    """The deliverer that runs beside the relay (ai-system workers, `aijobs relay`), woken
    through the process's `listener`."""
    return WebhookDeliverer(
        parts.sessionmaker,
        credential_cipher(parts.settings),
        webhook_config(parts.settings),
        listener=listener,
    )
