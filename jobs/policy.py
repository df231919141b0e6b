"""The create policy: the limits, prices and keys that every create-side use case reads.

One frozen value built once from the settings (runtime/wiring.py `create_policy`) and shared by
the request checks (jobs/requests.py), the quotas (jobs/quotas.py) and the create itself
(jobs/creation.py), so that a quote and a create of the same request decide alike.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from engine.definition import PLATFORM_KEY
from jobs import chunked
from jobs.spec import AnyJobType
from providers.pricing import PriceTable


@dataclass(frozen=True)
class CreatePolicy:
    max_active_jobs: int = 50  # 0 = unlimited
    max_jobs_per_day: int = 1000  # 0 = unlimited
    max_jobs_per_month: int = 20_000  # 0 = unlimited
    max_cost_usd_per_day: float = 0.0  # 0 = unlimited
    max_cost_usd_per_month: float = 0.0  # 0 = unlimited
    synthetic_public: bool = True  # "dev" job types may be created over REST
    platform_key_available: bool = True
    snapshot_ttl_days: int = 30
    # The key for the pseudonymous fairness key (HMAC of the user id); weights per user.
    fairness_secret: bytes = b"aijobs-fairness"
    fairness_weights: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # Tokens the configured model accepts (prompt and answer); None: unknown, no check.
    context_window: int | None = None
    # What a job's calls will cost (jobs/costs.py): the configured model (AI_MODEL), whether the
    # platform's calls go to the synthetic provider (no key and no base URL: model "synthetic"),
    # the prices, and the margin a worst case adds to the token estimate.
    model: str = "synthetic"
    platform_synthetic: bool = True
    prices: PriceTable = dataclasses.field(default_factory=PriceTable)
    estimate_margin: float = 0.25
    # The models of AI_FALLBACKS, in order: a job's worst case is priced over its chain's.
    fallback_models: tuple[str, ...] = ()
    # A long source's per-call input budget (AI_CHUNK_INPUT_TOKENS): past it, chunks.
    chunking: chunked.ChunkPolicy = dataclasses.field(default_factory=chunked.ChunkPolicy)

    def model_for(self, jt: AnyJobType, mode: str) -> str:
        """The model a job's calls use (as jobs/gateway.py chooses it for EXECUTE)."""
        if jt.always_synthetic or (mode == PLATFORM_KEY and self.platform_synthetic):
            return "synthetic"
        return self.model

    def fairness_key(self, user_id: str) -> str:
        """The user's fairness key on Temporal's task queues: stable per user, not reversible
        without the secret, short (Temporal keys are at most 64 bytes)."""
        digest = hmac.new(self.fairness_secret, user_id.encode(), hashlib.sha256).hexdigest()
        return f"u-{digest[:24]}"
