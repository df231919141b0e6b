"""The one Settings object (environment names are part of the contract, DESIGN §10).

It lives in `engine` so every layer can type its parameter, but it is only *built* in entry points
(`runtime/`) and passed down; nothing reads the environment at import time.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

# Clearly labelled development defaults: `aijobs dev` and `aijobs token` agree on them when unset.
DEV_JWT_SECRET = "dev-only-insecure-jwt-secret-change-me"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="", extra="ignore", case_sensitive=False)

    # ---- contract names (DESIGN §10) ----
    database_url: str | None = Field(default=None, alias="DATABASE_URL")
    temporal_address: str | None = Field(default=None, alias="TEMPORAL_ADDRESS")
    temporal_namespace: str = Field(default="default", alias="TEMPORAL_NAMESPACE")
    temporal_ui_url: str = Field(default="http://127.0.0.1:8233", alias="TEMPORAL_UI_URL")
    jwt_secret: SecretStr = Field(default=SecretStr(DEV_JWT_SECRET), alias="JWT_SECRET")
    deepseek_api_key: SecretStr | None = Field(default=None, alias="DEEPSEEK_API_KEY")
    ai_base_url: str | None = Field(default=None, alias="AI_BASE_URL")
    ai_model: str = Field(default="deepseek-chat", alias="AI_MODEL")
    credential_encryption_key: SecretStr | None = Field(
        default=None, alias="CREDENTIAL_ENCRYPTION_KEY"
    )
    quota_max_active_jobs: int = Field(default=50, ge=0, alias="QUOTA_MAX_ACTIVE_JOBS")
    quota_max_jobs_per_day: int = Field(default=1000, ge=0, alias="QUOTA_MAX_JOBS_PER_DAY")

    # ---- engine knobs (documented in the README) ----
    environment: Literal["development", "test", "production"] = Field(
        default="development", alias="AIJOBS_ENV"
    )
    quota_max_cost_usd_per_day: float = Field(default=0.0, ge=0, alias="QUOTA_MAX_COST_USD_PER_DAY")
    # Appended to every task queue name; lets tests or tenants share one Temporal namespace.
    task_queue_suffix: str = Field(default="", alias="TASK_QUEUE_SUFFIX")
    interactive_concurrency: int = Field(default=2, ge=1, alias="AI_INTERACTIVE_CONCURRENCY")
    background_concurrency: int = Field(default=1, ge=1, alias="AI_BACKGROUND_CONCURRENCY")
    # How long EXECUTE may go silent before Temporal retries it elsewhere (a dead worker). Not
    # the cancel latency: heartbeats are flushed every second (runtime/worker.py).
    heartbeat_timeout_ms: int = Field(default=10_000, ge=500, alias="AI_HEARTBEAT_TIMEOUT_MS")
    lock_ttl_s: int = Field(default=60, ge=1, alias="AI_LOCK_TTL_S")
    lock_grace_s: int = Field(default=30, ge=0, alias="AI_LOCK_GRACE_S")
    outbox_lock_ttl_s: int = Field(default=60, ge=1, alias="OUTBOX_LOCK_TTL_S")
    relay_poll_interval_s: float = Field(default=1.0, gt=0, alias="RELAY_POLL_INTERVAL_S")
    reconcile_interval_s: int = Field(default=30, ge=1, alias="RECONCILE_INTERVAL_S")
    snapshot_ttl_days: int = Field(default=30, ge=1, alias="SNAPSHOT_TTL_DAYS")
    content_safety_blocklist: str = Field(default="", alias="CONTENT_SAFETY_BLOCKLIST")
    db_pool_size: int = Field(default=10, ge=1, alias="DB_POOL_SIZE")
    log_level: str = Field(default="INFO", alias="LOG_LEVEL")

    @property
    def synthetic_public(self) -> bool:
        return self.environment in ("development", "test")

    @property
    def platform_key_configured(self) -> bool:
        """A platform credential exists: a real key or a custom base URL; outside production the
        synthetic provider stands in when neither is set, so the stack works offline. In
        production without either, platform-key jobs are refused (503 PLATFORM_UNAVAILABLE)."""
        return bool(self.deepseek_api_key or self.ai_base_url) or self.environment != "production"

    def task_queue(self, queue_name: str) -> str:
        return f"{queue_name}{self.task_queue_suffix}"

    def require_database_url(self) -> str:
        if not self.database_url:
            raise RuntimeError("DATABASE_URL is not set")
        return self.database_url

    def require_temporal_address(self) -> str:
        if not self.temporal_address:
            raise RuntimeError("TEMPORAL_ADDRESS is not set")
        return self.temporal_address
