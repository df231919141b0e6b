"""The one Settings object (environment names are part of the contract, docs/operations.md).

It lives in `engine` so every layer can type its parameter, but it is only *built* in entry points
(`runtime/`) and passed down; nothing reads the environment at import time.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from engine.definition import QUEUE_NAMES, SYSTEM_QUEUE
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
    # An empty variable is unset: compose's `${X:-}` must not read as an empty secret.
    model_config = SettingsConfigDict(
        env_prefix="", extra="ignore", case_sensitive=False, env_ignore_empty=True
    )

    # ---- contract names: operators set these, do not rename them ----
    database_url: str | None = Field(default=None, alias="DATABASE_URL")
    # A connection that needs a session of its own (LISTEN, migrations and their advisory lock)
    # goes here when DATABASE_URL is a transaction pooler (PgBouncer); unset: DATABASE_URL.
    database_direct_url: str | None = Field(default=None, alias="DATABASE_DIRECT_URL")
    # Whether DATABASE_URL is a transaction pooler: no server-side prepared statement is then
    # sent through it. Unset: a pooler exactly when DATABASE_DIRECT_URL is set and differs.
    database_pooler: bool | None = Field(default=None, alias="DATABASE_POOLER")
    temporal_address: str | None = Field(default=None, alias="TEMPORAL_ADDRESS")
    temporal_namespace: str = Field(default="default", alias="TEMPORAL_NAMESPACE")
    temporal_ui_url: str = Field(default="http://127.0.0.1:8233", alias="TEMPORAL_UI_URL")
    # Unset means "the development secret" outside production; production refuses to start.
    jwt_secret: SecretStr | None = Field(default=None, alias="JWT_SECRET")
    jwt_issuer: str | None = Field(default=None, alias="JWT_ISSUER")
    jwt_audience: str | None = Field(default=None, alias="JWT_AUDIENCE")
    # Tokens whose lifetime (exp - iat) exceeds this are refused; `aijobs token --ttl` too.
    jwt_max_ttl_s: int = Field(default=30 * 86_400, ge=60, alias="JWT_MAX_TTL_S")
    jwt_leeway_s: int = Field(default=30, ge=0, le=300, alias="JWT_LEEWAY_S")
    credential_encryption_key: SecretStr | None = Field(
        default=None, alias="CREDENTIAL_ENCRYPTION_KEY"
    )
    quota_max_active_jobs: int = Field(default=50, ge=0, alias="QUOTA_MAX_ACTIVE_JOBS")
    quota_max_jobs_per_day: int = Field(default=1000, ge=0, alias="QUOTA_MAX_JOBS_PER_DAY")
    quota_max_jobs_per_month: int = Field(default=20_000, ge=0, alias="QUOTA_MAX_JOBS_PER_MONTH")
    # Past it: 413. Room for a long source of 400,000 characters, UTF-8 or \u-escaped.
    max_request_bytes: int = Field(default=3 * 1024 * 1024, ge=1024, alias="MAX_REQUEST_BYTES")
    # Seconds between keep-alive comments on the API's server-sent event streams.
    sse_ping_s: float = Field(default=15.0, gt=0, le=300, alias="SSE_PING_S")
    # Concurrent event streams: per user across all API processes (leases in PostgreSQL,
    # db/caps.py), and in all on one API process (past either: 429 TOO_MANY_STREAMS).
    sse_max_streams_per_user: int = Field(default=10, ge=1, alias="SSE_MAX_STREAMS_PER_USER")
    sse_max_streams: int = Field(default=1000, ge=1, alias="SSE_MAX_STREAMS")
    # Creates and quotes per user across all API processes (a token bucket in PostgreSQL,
    # db/rate_limits.py): this many a minute on average, up to the burst at once; past it 429
    # RATE_LIMITED with Retry-After. 0: no limit. Reads are never limited by it.
    api_rate_limit_per_minute: int = Field(default=600, ge=0, alias="API_RATE_LIMIT_PER_MINUTE")
    api_rate_limit_burst: int = Field(default=100, ge=1, alias="API_RATE_LIMIT_BURST")
    # Creates' and quotes' checks of long inputs (token counting of up to 400k characters) run
    # off the event loop on this many threads per API process; a request waits at most
    # API_TOKEN_COUNT_WAIT_S for one, then 429 RATE_LIMITED (jobs/token_count.py).
    api_token_count_concurrency: int = Field(default=1, ge=1, alias="API_TOKEN_COUNT_CONCURRENCY")
    api_token_count_wait_s: float = Field(default=10.0, gt=0, alias="API_TOKEN_COUNT_WAIT_S")
    # Browser origins allowed to call the API (CORS), comma-separated ("https://app.example.com");
    # empty: no CORS headers at all, so no web page of another origin can read an answer.
    cors_allow_origins: str = Field(default="", alias="CORS_ALLOW_ORIGINS")

    # ---- engine knobs (documented in the README) ----
    environment: Literal["development", "test", "production"] = Field(
        default="production", alias="AIJOBS_ENV"
    )
    # What a worst case adds to a token estimate (0.25: 25 %): budgets reserve and per-job caps
    # bound by it. docs/benchmarks.md measures the estimate's error per job type.
    token_estimate_margin: float = Field(default=0.25, ge=0, le=4, alias="TOKEN_ESTIMATE_MARGIN")
    # A long source's per-call prompt budget in tokens: a quiz or flashcard source past it runs
    # as chunks, one call each (never more than the model's window leaves beside the answer).
    ai_chunk_input_tokens: int = Field(
        default=16_000, ge=1_000, le=1_000_000, alias="AI_CHUNK_INPUT_TOKENS"
    )
    # How many chunks of one job are in flight at once (a window over the job's chunk calls; the
    # worker slots and provider limits still bound them).
    ai_chunk_concurrency: int = Field(default=4, ge=1, le=64, alias="AI_CHUNK_CONCURRENCY")
    quota_max_cost_usd_per_day: float = Field(default=0.0, ge=0, alias="QUOTA_MAX_COST_USD_PER_DAY")
    quota_max_cost_usd_per_month: float = Field(
        default=0.0, ge=0, alias="QUOTA_MAX_COST_USD_PER_MONTH"
    )
    # A user's own DeepSeek key is only ever sent to DeepSeek's endpoint or to one of these
    # (comma-separated base URLs an operator trusts); never to AI_BASE_URL by accident.
    user_key_allowed_base_urls: str = Field(default="", alias="USER_KEY_ALLOWED_BASE_URLS")
    # Appended to every task queue name; lets tests or tenants share one Temporal namespace.
    task_queue_suffix: str = Field(default="", alias="TASK_QUEUE_SUFFIX")
    # Provider calls at once per worker process; unset: the queue table's (engine/queues.py:
    # 2 interactive, 1 background).
    interactive_concurrency: int | None = Field(
        default=None, ge=1, alias="AI_INTERACTIVE_CONCURRENCY"
    )
    background_concurrency: int | None = Field(
        default=None, ge=1, alias="AI_BACKGROUND_CONCURRENCY"
    )
    # How long EXECUTE may go silent before Temporal retries it elsewhere (a dead worker), and
    # the SQL lock's TTL; unset: each queue's lock (30 s interactive, 60 s background; a job
    # type's `lock_ms` wins). Not the cancel latency: heartbeats are flushed every second.
    heartbeat_timeout_ms: int | None = Field(default=None, ge=500, alias="AI_HEARTBEAT_TIMEOUT_MS")
    lock_ttl_s: int | None = Field(default=None, ge=1, alias="AI_LOCK_TTL_S")
    # A stopping worker finishes its in-flight provider calls for up to this long (the longest
    # job timeout, 600 s, plus room) before it cancels them: a deploy never throws away a paid
    # attempt. Compose's stop_grace_period must be longer.
    worker_drain_s: float = Field(default=630.0, ge=0, alias="WORKER_DRAIN_S")
    # How many workflow tasks (each running its bookkeeping stages as local activities) one
    # job-queue worker takes at once. Tasks beyond it wait on the server, where they are
    # dispatched fairly across users; taken by the worker, they would be served in arrival order
    # and one user's burst would hold the database pool while another user's job waits.
    worker_workflow_tasks: int = Field(default=6, ge=1, le=1000, alias="WORKER_WORKFLOW_TASKS")
    # A bookkeeping stage's unexpected error ends the job after this many attempts
    # (activities/bounded.py); a database or Temporal outage is still waited out.
    stage_internal_attempts: int = Field(default=3, ge=1, le=100, alias="STAGE_INTERNAL_ATTEMPTS")
    # Fairness on the job task queues: per-user weights ("user=weight,..."; default weight 1).
    # A user's share of the provider slots when others wait is proportional to the weight.
    fairness_weights: str = Field(default="", alias="FAIRNESS_WEIGHTS")
    # Off: jobs carry no fairness key and wait in arrival order within a priority (the bench's
    # baseline for the fairness figure).
    fairness_enabled: bool = Field(default=True, alias="FAIRNESS_ENABLED")
    # A user's first few active jobs (at most FAIRNESS_LIGHT_JOBS, counted at create) carry
    # FAIRNESS_LIGHT_BOOST times the user's weight: a user with a few jobs is served ahead of
    # another user's backlog rather than in turns with it. FAIRNESS_LIGHT_JOBS=0 turns it off.
    fairness_light_jobs: int = Field(default=4, ge=0, le=1000, alias="FAIRNESS_LIGHT_JOBS")
    fairness_light_boost: float = Field(
        default=8.0, ge=1.0, le=1000.0, alias="FAIRNESS_LIGHT_BOOST"
    )
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
    # Provider calls per second across every worker of a job task queue (server-enforced by
    # Temporal's task-queue rate limit; 0 = unlimited).
    provider_calls_per_second: float = Field(default=0.0, ge=0, alias="PROVIDER_CALLS_PER_SECOND")
    # A provider's Retry-After is honoured up to this many seconds.
    retry_after_max_s: float = Field(default=300.0, ge=1, alias="RETRY_AFTER_MAX_S")
    # The circuit breaker of each (provider, key): this many consecutive health failures (5xx,
    # transport errors, timeouts) open it for the cooldown, then one probe call goes through.
    provider_breaker_failures: int = Field(default=5, ge=1, alias="PROVIDER_BREAKER_FAILURES")
    provider_breaker_cooldown_s: float = Field(
        default=30.0, gt=0, alias="PROVIDER_BREAKER_COOLDOWN_S"
    )
    # Published outbox rows are deleted after this many days.
    outbox_retention_days: int = Field(default=7, ge=1, alias="OUTBOX_RETENTION_DAYS")
    lock_grace_s: int = Field(default=30, ge=0, alias="AI_LOCK_GRACE_S")
    outbox_lock_ttl_s: int = Field(default=60, ge=1, alias="OUTBOX_LOCK_TTL_S")
    relay_poll_interval_s: float = Field(default=5.0, gt=0, alias="RELAY_POLL_INTERVAL_S")
    # Relay shard workflows (`outbox-relay-<k>`), each one heartbeating relay activity.
    relay_shards: int = Field(default=1, ge=1, le=32, alias="RELAY_SHARDS")
    reconcile_interval_s: int = Field(default=30, ge=1, alias="RECONCILE_INTERVAL_S")
    # One retention rule for every copy of a job's private data (input, output, snapshot):
    # removed this many days after the job was created (projected rows are the product's).
    data_retention_days: int = Field(
        default=30,
        ge=1,
        validation_alias=AliasChoices("DATA_RETENTION_DAYS", "SNAPSHOT_TTL_DAYS"),
    )
    # The engine's bookkeeping rows, each deleted (a page per reconciler pass) this many days
    # after it stopped mattering (docs/operations.md "Retention"): usage rows (billing; the
    # current month's rollup is always kept, budgets read it), idle provider rate-limit buckets
    # and closed provider gates, expired call leases, `dead`/`failed` outbox rows, revoked keys
    # (deleted when no job names them, else their ciphertext erased).
    usage_retention_days: int = Field(default=400, ge=1, alias="USAGE_RETENTION_DAYS")
    provider_limit_retention_days: int = Field(
        default=7, ge=1, alias="PROVIDER_LIMIT_RETENTION_DAYS"
    )
    provider_gate_retention_days: int = Field(default=7, ge=1, alias="PROVIDER_GATE_RETENTION_DAYS")
    provider_lease_retention_days: int = Field(
        default=1, ge=1, alias="PROVIDER_LEASE_RETENTION_DAYS"
    )
    outbox_dead_retention_days: int = Field(default=30, ge=1, alias="OUTBOX_DEAD_RETENTION_DAYS")
    revoked_key_retention_days: int = Field(default=90, ge=1, alias="REVOKED_KEY_RETENTION_DAYS")
    content_safety_blocklist: str = Field(default="", alias="CONTENT_SAFETY_BLOCKLIST")
    db_pool_size: int = Field(default=10, ge=1, alias="DB_POOL_SIZE")
    # How long a starting process waits for its database and Temporal to answer before it
    # refuses to start (runtime/startup.py); 0: one attempt.
    startup_wait_s: float = Field(default=15.0, ge=0, le=600, alias="STARTUP_WAIT_S")
    log_level: str = Field(default="INFO", alias="LOG_LEVEL")
    # `json` (one object per line) or `text` (readable); unset: json in production, text else.
    log_format: Literal["json", "text"] | None = Field(default=None, alias="LOG_FORMAT")
    # Prometheus endpoints of a worker (or relay) process: its own metrics, and the Temporal
    # SDK's (task slots, polls, latencies). 0 = not served. Unset: 9464 and 9465 in production,
    # not served in development and tests (`aijobs dev` gives each worker ports of its own).
    worker_metrics_port: int = Field(default=-1, ge=-1, le=65535, alias="WORKER_METRICS_PORT")
    temporal_metrics_port: int = Field(default=-1, ge=-1, le=65535, alias="TEMPORAL_METRICS_PORT")
    # Where those endpoints listen: every interface in a container, loopback for `aijobs dev`.
    metrics_host: str = Field(default="0.0.0.0", alias="METRICS_HOST")
    # Webhooks: unset = allowed outside production only (http and loopback/private receivers).
    webhook_allow_private: bool | None = Field(default=None, alias="WEBHOOK_ALLOW_PRIVATE")
    # After a rotation the previous secret keeps signing (a second signature) this long.
    webhook_rotation_grace_s: int = Field(default=86_400, ge=0, alias="WEBHOOK_ROTATION_GRACE_S")
    # Failed deliveries: backoff from the base, doubling, capped, with jitter; dead after
    # WEBHOOK_RETRY_FOR_S since the event (or since an admin's replay).
    webhook_retry_base_s: float = Field(default=30.0, gt=0, alias="WEBHOOK_RETRY_BASE_S")
    webhook_retry_max_s: float = Field(default=3600.0, gt=0, alias="WEBHOOK_RETRY_MAX_S")
    webhook_retry_for_s: float = Field(default=86_400.0, ge=0, alias="WEBHOOK_RETRY_FOR_S")
    webhook_poll_interval_s: float = Field(default=10.0, gt=0, alias="WEBHOOK_POLL_INTERVAL_S")
    webhook_max_in_flight: int = Field(default=16, ge=1, alias="WEBHOOK_MAX_IN_FLIGHT")
    # Fairness: of a deliverer's WEBHOOK_MAX_IN_FLIGHT slots one user's deliveries hold at most
    # this many (its receivers may all hang); a user registers at most this many endpoints.
    webhook_max_in_flight_per_user: int = Field(
        default=4, ge=1, alias="WEBHOOK_MAX_IN_FLIGHT_PER_USER"
    )
    webhook_max_endpoints_per_user: int = Field(
        default=10, ge=1, alias="WEBHOOK_MAX_ENDPOINTS_PER_USER"
    )
    # Recurring jobs (docs/schedules.md): the shortest interval, schedules per user, how late a
    # missed fire may still run (Temporal's catch-up window).
    schedule_min_interval_s: int = Field(default=60, ge=1, alias="SCHEDULE_MIN_INTERVAL_S")
    schedule_max_per_user: int = Field(default=20, ge=1, alias="SCHEDULE_MAX_PER_USER")
    schedule_catchup_window_s: int = Field(default=60, ge=10, alias="SCHEDULE_CATCHUP_WINDOW_S")
    # Delivered and dead deliveries are deleted this long after they finished.
    webhook_retention_days: float = Field(default=7.0, gt=0, alias="WEBHOOK_RETENTION_DAYS")
    # Bulk admin operations: a filter matching more jobs is refused (422 with the count); items
    # are acted on in pages of ADMIN_BULK_PAGE_SIZE, at most ADMIN_BULK_JOBS_PER_SECOND.
    admin_bulk_max_jobs: int = Field(default=5000, ge=1, alias="ADMIN_BULK_MAX_JOBS")
    admin_bulk_jobs_per_second: float = Field(
        default=50.0, gt=0, alias="ADMIN_BULK_JOBS_PER_SECOND"
    )
    admin_bulk_page_size: int = Field(default=100, ge=1, le=1000, alias="ADMIN_BULK_PAGE_SIZE")
    # The relay starts a bulk workflow from the outbox; an operation still not started this long
    # after its submission is started by the API when it is read (no relay running, a dead row).
    admin_bulk_start_after_s: float = Field(default=10.0, ge=0, alias="ADMIN_BULK_START_AFTER_S")
    # Admin audit entries are deleted this long after they were written.
    admin_audit_retention_days: int = Field(default=365, ge=1, alias="ADMIN_AUDIT_RETENTION_DAYS")
    # The operator console (/console): how long a sign-in lasts (never past the admin token's
    # `exp`). The console's only setting.
    console_session_ttl_s: int = Field(
        default=28_800, ge=60, le=30 * 86_400, alias="CONSOLE_SESSION_TTL_S"
    )

    @model_validator(mode="after")
    def _metrics_ports_by_environment(self) -> Settings:
        production = self.environment == "production"
        if self.worker_metrics_port < 0:
            self.worker_metrics_port = DEFAULT_WORKER_METRICS_PORT if production else 0
        if self.temporal_metrics_port < 0:
            self.temporal_metrics_port = DEFAULT_TEMPORAL_METRICS_PORT if production else 0
        return self

    @property
    def jwt_signing_secret(self) -> str:
        """The HS256 secret: JWT_SECRET, or the labelled development secret when it is unset
        outside production (production refuses to start without one)."""
        if self.jwt_secret is not None:
            return self.jwt_secret.get_secret_value()
        if self.environment == "production":
            raise RuntimeError("JWT_SECRET must be set in production")
        return DEV_JWT_SECRET

    def fairness_weight_map(self) -> dict[str, float]:
        """FAIRNESS_WEIGHTS parsed; a malformed entry is a configuration error."""
        weights: dict[str, float] = {}
        for entry in (e.strip() for e in self.fairness_weights.split(",")):
            if not entry:
                continue
            user, sep, value = entry.rpartition("=")
            try:
                weight = float(value)
            except ValueError:
                weight = 0.0
            if not sep or not user or not 0 < weight <= 1000:
                raise ValueError(f"FAIRNESS_WEIGHTS entry {entry[:40]!r}: want user=weight")
            weights[user] = weight
        return weights

    @property
    def webhooks_allow_private(self) -> bool:
        """http and loopback/private receivers: WEBHOOK_ALLOW_PRIVATE, else only outside
        production."""
        if self.webhook_allow_private is not None:
            return self.webhook_allow_private
        return self.environment != "production"

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
        """DATABASE_URL is a transaction pooler: DATABASE_POOLER, else whether a distinct
        DATABASE_DIRECT_URL is set. Its connections then never prepare a statement on the
        server (a prepared statement lives in one server session, which the pooler may give
        the next transaction to another client)."""
        if self.database_pooler is not None:
            return self.database_pooler
        return bool(self.database_direct_url) and self.database_direct_url != self.database_url

    def require_temporal_address(self) -> str:
        if not self.temporal_address:
            raise RuntimeError("TEMPORAL_ADDRESS is not set")
        return self.temporal_address
