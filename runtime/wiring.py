"""Builds the engine's parts from Settings: the only place that turns configuration into objects."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import Client

from activities.gateway import Gateway
from activities.reconciler import ReconcilerConfig
from activities.relay import RelayConfig
from activities.stages import EngineConfig
from db.session import SessionMaker, make_engine, make_sessionmaker
from engine.settings import Settings
from jobs.service import CreatePolicy
from jobs.spec import Catalog
from jobs.types import default_catalog
from providers.crypto import DEV_ENCRYPTION_KEY, CredentialCipher
from providers.factory import MAX_CALL_TIMEOUT_S, build_provider
from providers.openai_compat import DEFAULT_BASE_URL, OpenAICompatibleProvider
from providers.safety import RuleBasedContentSafety, parse_blocklist


@dataclass
class Parts:
    settings: Settings
    engine: AsyncEngine
    sessionmaker: SessionMaker
    catalog: Catalog

    async def close(self) -> None:
        await self.engine.dispose()


def build_parts(settings: Settings) -> Parts:
    engine = make_engine(settings.require_database_url(), pool_size=settings.db_pool_size)
    return Parts(settings, engine, make_sessionmaker(engine), default_catalog())


def cipher(settings: Settings) -> CredentialCipher:
    raw = settings.credential_encryption_key
    if raw is None:
        if settings.environment == "production":
            raise RuntimeError("CREDENTIAL_ENCRYPTION_KEY must be set in production")
        return CredentialCipher.from_setting(DEV_ENCRYPTION_KEY)
    return CredentialCipher.from_setting(raw.get_secret_value())


def gateway(settings: Settings) -> Gateway:
    key = settings.deepseek_api_key.get_secret_value() if settings.deepseek_api_key else None
    return Gateway(
        provider=build_provider(api_key=key, base_url=settings.ai_base_url),
        user_provider=OpenAICompatibleProvider(
            settings.ai_base_url or DEFAULT_BASE_URL,
            name="deepseek",
            timeout_s=MAX_CALL_TIMEOUT_S,
        ),
        model=settings.ai_model,
        platform_api_key=key,
        cipher=cipher(settings),
        safety=RuleBasedContentSafety(parse_blocklist(settings.content_safety_blocklist)),
    )


def create_policy(settings: Settings) -> CreatePolicy:
    return CreatePolicy(
        max_active_jobs=settings.quota_max_active_jobs,
        max_jobs_per_day=settings.quota_max_jobs_per_day,
        max_cost_usd_per_day=settings.quota_max_cost_usd_per_day,
        synthetic_public=settings.synthetic_public,
        platform_key_available=settings.platform_key_configured,
        snapshot_ttl_days=settings.snapshot_ttl_days,
    )


def engine_config(settings: Settings) -> EngineConfig:
    return EngineConfig(
        lock_ttl_s=settings.lock_ttl_s,
        heartbeat_timeout_ms=settings.heartbeat_timeout_ms,
        lock_extend_every_s=settings.lock_ttl_s / 2,
    )


def relay_config(settings: Settings) -> RelayConfig:
    return RelayConfig(
        database_url=settings.require_database_url(),
        task_queue_suffix=settings.task_queue_suffix,
        poll_interval_s=settings.relay_poll_interval_s,
        lock_ttl_s=settings.outbox_lock_ttl_s,
    )


def reconciler_config(settings: Settings) -> ReconcilerConfig:
    return ReconcilerConfig(lock_grace_s=settings.lock_grace_s)


async def connect_temporal(settings: Settings) -> Client:
    return await Client.connect(
        settings.require_temporal_address(), namespace=settings.temporal_namespace
    )
