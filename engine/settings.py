"""The one Settings object (environment names are part of the contract, docs/operations.md).

It lives in `engine` so every layer can type its parameter, but it is only *built* in entry points
(`runtime/`) and passed down; nothing reads the environment at import time.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from engine.definition import QUEUE_NAMES, SYSTEM_QUEUE
from engine.retention_days import (
    DEFAULT_RETENTION_DAYS,
    parse_retention_days,
    removed_setting_problem,
)
from engine.settings_provider import ProviderSettings

# Clearly labelled development defaults: `aijobs dev` and `aijobs token` agree on them when unset.
# Both are public, so a production process refuses to start with either.
DEV_JWT_SECRET = "dev-only-insecure-jwt-secret-change-me"
# The key is the ASCII text "DEVELOPMENT-ONLY-KEY-DO-NOT-USE!": anything encrypted with it is
# effectively plaintext. Keyring format as in providers/crypto.py ("kid:BASE64KEY").
DEV_ENCRYPTION_KEY = "dev:REVWRUxPUE1FTlQtT05MWS1LRVktRE8tTk9ULVVTRSE="

MIN_JWT_SECRET_BYTES = 32
# Where a production worker serves its metrics and the Temporal SDK's, unless told otherwise.
DEFAULT_WORKER_METRICS_PORT = 9464
DEFAULT_TEMPORAL_METRICS_PORT = 9465

# The process kinds a startup check knows; each names what that process needs in production.
Role = Literal[
    "api",
    "worker",
    "relay",
    "reconcile",
    "token",
    "migrate",
    "setup-temporal",
    "outbox-dead",
    "rotate-keys",
]
_SIGNS_OR_VERIFIES_TOKENS: frozenset[str] = frozenset({"api", "token"})
# The relay holds it too: it runs the webhook deliverer, which decrypts signing secrets.
_HOLDS_THE_KEYRING: frozenset[str] = frozenset({"api", "worker", "relay", "rotate-keys"})
# What each role connects to at start (database, Temporal), checked before it serves anything.
NEEDS_DATABASE: frozenset[str] = frozenset(
    {"api", "worker", "relay", "reconcile", "migrate", "outbox-dead", "rotate-keys"}
)
NEEDS_TEMPORAL: frozenset[str] = frozenset(
    {"api", "worker", "relay", "reconcile", "setup-temporal"}
)


class ConfigurationError(Exception):
    """A process must not start with this configuration; the message is one line naming the
    setting(s) and never contains a secret."""


def _key_bytes(encoded: str) -> bytes | None:
    text = encoded.strip().replace("-", "+").replace("_", "/")
    text += "=" * (-len(text) % 4)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


_DEV_KEY_BYTES = _key_bytes(DEV_ENCRYPTION_KEY.partition(":")[2])


def current_key_is_development(keyring: str) -> bool:
    """Whether the current (first) key of a CREDENTIAL_ENCRYPTION_KEY setting is the public
    development key, whatever its key id. A retired development key further down the ring is
    allowed: `aijobs rotate-keys` needs it to re-encrypt what it protected."""
    first = next((e.strip() for e in keyring.split(",") if e.strip()), "")
    return _key_bytes(first.partition(":")[2]) == _DEV_KEY_BYTES


class Settings(ProviderSettings):
    """Every setting an operator owns: connections, secrets, quotas, budgets, providers,
    models, prices, limits, concurrency, the environment. A new one is one field here (or in
    ProviderSettings) and one row of docs/operations.md "Settings"; `aijobs settings` lists
    them all (runtime/settings_report.py), a field typed SecretStr as a secret. Tuning knobs
    (page sizes, lock TTLs, backoffs, poll intervals) are constants beside the loop they tune.
    Only the process environment is read (no `.env` file); an empty variable is unset."""

    # An empty variable is unset: compose's `${X:-}` must not read as an empty secret.
    model_config = SettingsConfigDict(
        env_prefix="", extra="ignore", case_sensitive=False, env_ignore_empty=True
    )

    # First: the defaults of the metrics ports, webhooks and logs below depend on it.
    environment: Literal["development", "test", "production"] = Field(
        default="production", alias="AIJOBS_ENV"
    )

    # ---- connections ----
    database_url: str | None = Field(default=None, alias="DATABASE_URL")
    # A connection that needs a session of its own (LISTEN, migrations and their advisory lock)
    # goes here when DATABASE_URL is a transaction pooler (PgBouncer); unset: DATABASE_URL. Set
    # and different from DATABASE_URL, DATABASE_URL is taken for a pooler (`database_pooled`).
    database_direct_url: str | None = Field(default=None, alias="DATABASE_DIRECT_URL")
    db_pool_size: int = Field(default=10, ge=1, alias="DB_POOL_SIZE")
    temporal_address: str | None = Field(default=None, alias="TEMPORAL_ADDRESS")
    temporal_namespace: str = Field(default="default", alias="TEMPORAL_NAMESPACE")
    temporal_ui_url: str = Field(default="http://127.0.0.1:8233", alias="TEMPORAL_UI_URL")
    # Appended to every task queue name; lets tests or tenants share one Temporal namespace.
    task_queue_suffix: str = Field(default="", alias="TASK_QUEUE_SUFFIX")

    # ---- secrets and who may call ----
    # Unset means "the development secret" outside production; production refuses to start.
    jwt_secret: SecretStr | None = Field(default=None, alias="JWT_SECRET")
    jwt_issuer: str | None = Field(default=None, alias="JWT_ISSUER")
    jwt_audience: str | None = Field(default=None, alias="JWT_AUDIENCE")
    # The claims naming a user's organisation (a string) and teams (a list of strings): the
    # scopes whose budgets a job counts in (docs/money.md, "Organisations, teams and tags").
    jwt_org_claim: str = Field(default="org", min_length=1, max_length=64, alias="JWT_ORG_CLAIM")
    jwt_teams_claim: str = Field(
        default="teams", min_length=1, max_length=64, alias="JWT_TEAMS_CLAIM"
    )
    credential_encryption_key: SecretStr | None = Field(
        default=None, alias="CREDENTIAL_ENCRYPTION_KEY"
    )
    # Browser origins allowed to call the API (CORS), comma-separated ("https://app.example.com");
    # empty: no CORS headers at all, so no web page of another origin can read an answer.
    cors_allow_origins: str = Field(default="", alias="CORS_ALLOW_ORIGINS")
    # A user's own DeepSeek key is only ever sent to DeepSeek's endpoint or to one of these
    # (comma-separated base URLs an operator trusts); never to AI_BASE_URL by accident.
    user_key_allowed_base_urls: str = Field(default="", alias="USER_KEY_ALLOWED_BASE_URLS")
    # http and loopback/private webhook receivers; unset: allowed outside production only.
    webhook_allow_private: bool | None = Field(
        default=None, alias="WEBHOOK_ALLOW_PRIVATE", validate_default=True
    )

    # ---- quotas, budgets and request limits (per user) ----
    quota_max_active_jobs: int = Field(default=50, ge=0, alias="QUOTA_MAX_ACTIVE_JOBS")
    quota_max_jobs_per_day: int = Field(default=1000, ge=0, alias="QUOTA_MAX_JOBS_PER_DAY")
    quota_max_jobs_per_month: int = Field(default=20_000, ge=0, alias="QUOTA_MAX_JOBS_PER_MONTH")
    quota_max_cost_usd_per_day: float = Field(default=0.0, ge=0, alias="QUOTA_MAX_COST_USD_PER_DAY")
    quota_max_cost_usd_per_month: float = Field(
        default=0.0, ge=0, alias="QUOTA_MAX_COST_USD_PER_MONTH"
    )
    # Creates and quotes per user across all API processes (a token bucket in PostgreSQL,
    # db/rate_limits.py): this many a minute on average, up to the burst at once; past it 429
    # RATE_LIMITED with Retry-After. 0: no limit. Reads are never limited by it.
    api_rate_limit_per_minute: int = Field(default=600, ge=0, alias="API_RATE_LIMIT_PER_MINUTE")
    api_rate_limit_burst: int = Field(default=100, ge=1, alias="API_RATE_LIMIT_BURST")
    # Seconds between keep-alive comments on the API's server-sent event streams.
    sse_ping_s: float = Field(default=15.0, gt=0, le=300, alias="SSE_PING_S")
    # Recurring jobs (docs/schedules.md): the shortest interval a schedule may have.
    schedule_min_interval_s: int = Field(default=60, ge=1, alias="SCHEDULE_MIN_INTERVAL_S")
    # Bulk admin operations: a filter matching more jobs is refused (422 with the count).
    admin_bulk_max_jobs: int = Field(default=5000, ge=1, alias="ADMIN_BULK_MAX_JOBS")
    # The operator console (/console): how long a sign-in lasts (never past the admin token's
    # `exp`). The console's only setting.
    console_session_ttl_s: int = Field(
        default=28_800, ge=60, le=30 * 86_400, alias="CONSOLE_SESSION_TTL_S"
    )

    # ---- long sources ----
    # A long source's per-call prompt budget in tokens: a quiz or flashcard source past it runs
    # as chunks, one call each (never more than the model's window leaves beside the answer).
    ai_chunk_input_tokens: int = Field(
        default=16_000, ge=1_000, le=1_000_000, alias="AI_CHUNK_INPUT_TOKENS"
    )
    # How many chunks of one job are in flight at once (a window over the job's chunk calls; the
    # worker slots and provider limits still bound them).
    ai_chunk_concurrency: int = Field(default=4, ge=1, le=64, alias="AI_CHUNK_CONCURRENCY")

    # ---- workers: concurrency, failures, shutdown ----
    # Provider calls at once per worker process; unset: the queue table's (engine/queues.py:
    # 2 interactive, 1 background).
    interactive_concurrency: int | None = Field(
        default=None, ge=1, alias="AI_INTERACTIVE_CONCURRENCY"
    )
    background_concurrency: int | None = Field(
        default=None, ge=1, alias="AI_BACKGROUND_CONCURRENCY"
    )
    # How long EXECUTE may go silent before Temporal retries it elsewhere (a dead worker);
    # unset: each queue's lock (30 s interactive, 60 s background; a job type's `lock_ms` wins).
    # Not the cancel latency: heartbeats are flushed every second.
    heartbeat_timeout_ms: int | None = Field(default=None, ge=500, alias="AI_HEARTBEAT_TIMEOUT_MS")
    # A stopping worker finishes its in-flight provider calls for up to this long (the longest
    # job timeout, 600 s, plus room) before it cancels them: a deploy never throws away a paid
    # attempt. Compose's stop_grace_period must be longer.
    worker_drain_s: float = Field(default=630.0, ge=0, alias="WORKER_DRAIN_S")
    # A bookkeeping stage's unexpected error ends the job after this many attempts
    # (activities/bounded.py); a database or Temporal outage is still waited out.
    stage_internal_attempts: int = Field(default=3, ge=1, le=100, alias="STAGE_INTERNAL_ATTEMPTS")
    # A user's jobs dispatched to Temporal and not yet ended, at most: the user's further jobs
    # wait in the outbox (still `queued`) and are dispatched in the user's (priority, created
    # at) order as the user's jobs end. Priority thus orders a user's own jobs only; across
    # users the fairness keys decide. 4 is two interactive workers' calls (2 each): enough to
    # keep a lone user's calls going between relay polls, small enough that an urgent job waits
    # behind at most 4 of its user's older jobs.
    user_dispatch_window: int = Field(default=4, ge=1, le=1000, alias="USER_DISPATCH_WINDOW")
    # Flow control (docs/api.md "Flow control"): a debounce chain's longest wait when the create
    # names no `maxDelayMs`; the start-by TTL of a job whose create and type name none (0: none);
    # how many jobs an operator pause held are released a second once it ends, across the
    # cluster (docs/admin.md "Operator pauses").
    ai_debounce_max_delay_ms: int = Field(
        default=600_000, ge=100, le=86_400_000, alias="AI_DEBOUNCE_MAX_DELAY_MS"
    )
    ai_default_ttl_s: int = Field(default=0, ge=0, le=2_592_000, alias="AI_DEFAULT_TTL_S")
    ai_resume_rate: float = Field(default=20.0, gt=0, le=10_000, alias="AI_RESUME_RATE")
    # A provider's Retry-After is honoured up to this many seconds.
    retry_after_max_s: float = Field(default=300.0, ge=1, alias="RETRY_AFTER_MAX_S")
    # The circuit breaker of each (provider, key): this many consecutive health failures (5xx,
    # transport errors, timeouts) open it for the cooldown, then one probe call goes through.
    provider_breaker_failures: int = Field(default=5, ge=1, alias="PROVIDER_BREAKER_FAILURES")
    provider_breaker_cooldown_s: float = Field(
        default=30.0, gt=0, alias="PROVIDER_BREAKER_COOLDOWN_S"
    )
    # The relay's backstop poll (wake-ups are NOTIFYs: docs/architecture.md "Pollers"); the
    # reconciler's pass runs on its own interval.
    relay_poll_interval_s: float = Field(default=30.0, gt=0, alias="RELAY_POLL_INTERVAL_S")
    reconcile_interval_s: int = Field(default=30, ge=1, alias="RECONCILE_INTERVAL_S")

    # ---- retention ----
    # One retention rule for every copy of a job's private data (input, output, snapshot):
    # removed this many days after the job was created (projected rows are the product's).
    data_retention_days: int = Field(default=30, ge=1, alias="DATA_RETENTION_DAYS")
    # The engine's bookkeeping rows, days per kind (engine/retention_days.py, docs/operations.md
    # "Retention"): a JSON object merged over the defaults.
    retention_days: Annotated[dict[str, int], NoDecode] = Field(
        default_factory=lambda: dict(DEFAULT_RETENTION_DAYS),
        alias="RETENTION_DAYS",
        validate_default=True,
    )

    # ---- logs and metrics ----
    log_level: str = Field(default="INFO", alias="LOG_LEVEL")
    # Prometheus endpoints of a worker (or relay) process: its own metrics, and the Temporal
    # SDK's (task slots, polls, latencies). 0 = not served. Unset: 9464 and 9465 in production,
    # not served in development and tests (`aijobs dev` gives each worker ports of its own).
    worker_metrics_port: int = Field(
        default=-1, ge=-1, le=65535, alias="WORKER_METRICS_PORT", validate_default=True
    )
    temporal_metrics_port: int = Field(
        default=-1, ge=-1, le=65535, alias="TEMPORAL_METRICS_PORT", validate_default=True
    )
    # Where those endpoints listen: every interface in a container, loopback for `aijobs dev`.
    metrics_host: str = Field(default="0.0.0.0", alias="METRICS_HOST")

    @model_validator(mode="before")
    @classmethod
    def _no_removed_settings(cls, data: Any) -> Any:
        # Not a ValueError: it is not one value's fault, and an entry point reports it as is.
        problem = removed_setting_problem(k for k, v in os.environ.items() if v)
        if problem:
            raise ConfigurationError(problem)
        return data

    @field_validator("retention_days", mode="before")
    @classmethod
    def _retention_days(cls, value: Any) -> dict[str, int]:
        return parse_retention_days(value)

    @field_validator("worker_metrics_port", "temporal_metrics_port", mode="after")
    @classmethod
    def _metrics_port_by_environment(cls, port: int, info: ValidationInfo) -> int:
        if port >= 0:
            return port
        if info.data.get("environment") != "production":
            return 0
        if info.field_name == "worker_metrics_port":
            return DEFAULT_WORKER_METRICS_PORT
        return DEFAULT_TEMPORAL_METRICS_PORT

    @field_validator("webhook_allow_private", mode="after")
    @classmethod
    def _private_receivers_by_environment(cls, allow: bool | None, info: ValidationInfo) -> bool:
        if allow is not None:
            return allow
        return info.data.get("environment") != "production"

    @property
    def jwt_signing_secret(self) -> str:
        """The HS256 secret: JWT_SECRET, or the labelled development secret when it is unset
        outside production (production refuses to start without one)."""
        if self.jwt_secret is not None:
            return self.jwt_secret.get_secret_value()
        if self.environment == "production":
            raise RuntimeError("JWT_SECRET must be set in production")
        return DEV_JWT_SECRET

    @property
    def webhooks_allow_private(self) -> bool:
        """http and loopback/private receivers: WEBHOOK_ALLOW_PRIVATE, else only outside
        production (resolved when the settings are read)."""
        return bool(self.webhook_allow_private)

    @property
    def synthetic_public(self) -> bool:
        return self.environment in ("development", "test")

    @property
    def platform_key_configured(self) -> bool:
        """A platform credential exists: a real key or a custom base URL; outside production the
        synthetic provider stands in when neither is set, so the stack works offline. In
        production without either, platform-key jobs are refused (503 PLATFORM_UNAVAILABLE)."""
        return bool(self.deepseek_api_key or self.ai_base_url) or self.environment != "production"

    def production_problems(self, role: Role, *, queues: Sequence[str] = ()) -> list[str]:
        """What stops a process of this role from starting in production, one phrase per
        problem, each naming its setting; empty outside production. `queues` are a worker's
        task queues (empty: all of them, like `aijobs worker` without --queue)."""
        if self.environment != "production":
            return []
        problems: list[str] = []
        worker_queues = queues or (*QUEUE_NAMES, SYSTEM_QUEUE)
        # The ai-system worker's bulk retries are creates: their fairness key is derived from
        # JWT_SECRET as the API derives it (runtime/wiring.py `create_policy`).
        if role in _SIGNS_OR_VERIFIES_TOKENS or (
            role == "worker" and SYSTEM_QUEUE in worker_queues
        ):
            secret = self.jwt_secret.get_secret_value() if self.jwt_secret else None
            if secret is None:
                problems.append("JWT_SECRET is not set")
            elif secret == DEV_JWT_SECRET:
                problems.append("JWT_SECRET is the public development secret")
            elif len(secret.encode()) < MIN_JWT_SECRET_BYTES:
                problems.append(f"JWT_SECRET is shorter than {MIN_JWT_SECRET_BYTES} bytes")
        if role in _HOLDS_THE_KEYRING:
            # Unset is allowed for the API and workers: users' own keys are then refused (503)
            # and never decrypted. Rotation without a keyring has nothing to rotate to.
            keyring = self.credential_encryption_key
            if keyring is None:
                if role == "rotate-keys":
                    problems.append("CREDENTIAL_ENCRYPTION_KEY is not set")
            elif current_key_is_development(keyring.get_secret_value()):
                problems.append("CREDENTIAL_ENCRYPTION_KEY is the public development key")
        # A job-queue worker calls the provider; an ai-system worker's bulk retry decides
        # whether a job may use the platform key, which takes the provider settings too.
        if role == "worker" and not (self.deepseek_api_key or self.ai_base_url):
            problems.append(
                "neither DEEPSEEK_API_KEY nor AI_BASE_URL is set (a worker for "
                f"{', '.join(worker_queues)} would answer with the synthetic provider)"
            )
        return problems

    def check_startup(
        self, role: Role, *, queues: Sequence[str] = (), also: Sequence[str] = ()
    ) -> None:
        """Raise ConfigurationError (one line) when `production_problems` finds any, or `also`
        lists some (checks that need a layer this module cannot import, e.g. prices)."""
        problems = [*also, *self.production_problems(role, queues=queues)]
        if problems:
            raise ConfigurationError(
                f"refusing to start in production: {'; '.join(problems)} "
                "(set AIJOBS_ENV=development for a local stack)"
            )

    def task_queue(self, queue_name: str) -> str:
        return f"{queue_name}{self.task_queue_suffix}"

    def require_database_url(self) -> str:
        if not self.database_url:
            raise RuntimeError("DATABASE_URL is not set")
        return self.database_url

    @property
    def session_database_url(self) -> str:
        """Where a connection that needs its own session goes (LISTEN, migrations, session-level
        locks): DATABASE_DIRECT_URL, or DATABASE_URL when unset. A transaction pooler hands a
        server connection to another client after every transaction, so a LISTEN through it
        would hear nothing and an advisory lock would be held by someone else's session."""
        return self.database_direct_url or self.require_database_url()

    @property
    def database_pooled(self) -> bool:
        """DATABASE_URL is a transaction pooler: a DATABASE_DIRECT_URL is set and differs from
        it (behind a pooler LISTEN and migrations need that direct URL). Its connections then
        never prepare a statement on the server (a prepared statement lives in one server
        session, which the pooler may give the next transaction to another client)."""
        return bool(self.database_direct_url) and self.database_direct_url != self.database_url

    def require_temporal_address(self) -> str:
        if not self.temporal_address:
            raise RuntimeError("TEMPORAL_ADDRESS is not set")
        return self.temporal_address
