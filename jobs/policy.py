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
from decimal import Decimal

from engine import offpeak
from engine.definition import PLATFORM_KEY
from engine.tiers import BATCH
from jobs import chunked
from jobs.costs import ESTIMATE_MARGIN
from jobs.spec import AnyJobType
from providers.pricing import PriceTable


@dataclass(frozen=True)
class ProviderTraits:
    """What a create needs to know of the provider a job's calls go to: its name (as in the
    usage rows) and whether it has a Batch API (providers/batch.py `has_batch_api`, decided
    once by the wiring, so the request checks stay pure)."""

    name: str
    batch_api: bool = False


SYNTHETIC = ProviderTraits("synthetic")
# A user's own key goes to DeepSeek's endpoint (runtime/wiring.py `user_key_base_url`): no
# Batch API; also what a mode the wiring did not describe is taken for.
DEEPSEEK = ProviderTraits("deepseek")


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
    estimate_margin: float = ESTIMATE_MARGIN
    # The models of AI_FALLBACKS, in order: a job's worst case is priced over its chain's.
    fallback_models: tuple[str, ...] = ()
    # A long source's per-call input budget (AI_CHUNK_INPUT_TOKENS): past it, chunks.
    chunking: chunked.ChunkPolicy = dataclasses.field(default_factory=chunked.ChunkPolicy)
    # The provider each credential mode's calls go to when they are not synthetic (built by
    # runtime/wiring.py from the same settings as the workers' gateway); a mode not listed:
    # DeepSeek's endpoint.
    providers: Mapping[str, ProviderTraits] = dataclasses.field(default_factory=dict)
    # Per provider name, the price factor an off-peak job is reserved at (the dearest of its
    # discount windows, AI_OFFPEAK_WINDOWS); a provider not listed has no window.
    offpeak_discounts: Mapping[str, Decimal] = dataclasses.field(default_factory=dict)
    # An off-peak job's deadline is at most this long after its create.
    offpeak_max_wait_s: int = offpeak.MAX_WAIT_S
    # A batch job's line is refused when larger than a batch file may be (AI_BATCH_MAX_BYTES).
    batch_max_bytes: int = 100_000_000
    # Where a masked input's phone numbers are read (AI_PII_PHONE_REGION): the estimate and
    # the chunk plan are of the masked prompt (jobs/guardrails.py).
    pii_region: str = "US"
    # Flow control (jobs/flow.py): a debounce chain's longest wait when the create names no
    # maxDelayMs (AI_DEBOUNCE_MAX_DELAY_MS); the TTL of a job whose create and type name none
    # (AI_DEFAULT_TTL_S, 0: none).
    debounce_max_delay_ms: int = 600_000
    default_ttl_s: int = 0

    def model_for(self, jt: AnyJobType, mode: str) -> str:
        """The model a job's calls use (as jobs/gateway.py chooses it for EXECUTE)."""
        if jt.always_synthetic or (mode == PLATFORM_KEY and self.platform_synthetic):
            return "synthetic"
        return self.model

    def provider_for(self, jt: AnyJobType, mode: str) -> ProviderTraits:
        """The provider a job's calls go to (as jobs/gateway.py chooses it for EXECUTE)."""
        if jt.always_synthetic or (mode == PLATFORM_KEY and self.platform_synthetic):
            return SYNTHETIC
        return self.providers.get(mode, DEEPSEEK)

    def offpeak_discount(self, jt: AnyJobType, mode: str) -> Decimal | None:
        """The price factor an off-peak job of this type and mode is reserved at; None: its
        provider has no discount window."""
        return self.offpeak_discounts.get(self.provider_for(jt, mode).name)

    def tier_refusal(self, jt: AnyJobType, mode: str, tier: str) -> str | None:
        """Why the provider of a job of this type and mode cannot serve `tier`, None when it
        can. Only `batch` needs a capability (a Batch API); a batch job is never run at the
        standard tier instead, so a provider without one refuses it at create."""
        provider = self.provider_for(jt, mode)
        if tier == BATCH and not provider.batch_api:
            return (
                f"serviceTier batch needs a provider with a batch API; this job's provider "
                f"({provider.name}) has none. Use serviceTier standard"
                + (" or offpeak" if self._offpeak_served(jt, provider) else "")
                + "."
            )
        return None

    def _offpeak_served(self, jt: AnyJobType, provider: ProviderTraits) -> bool:
        return jt.definition.service.offpeak and provider.name in self.offpeak_discounts

    def fairness_key(self, user_id: str) -> str:
        """The user's fairness key on Temporal's task queues: stable per user, not reversible
        without the secret, short (Temporal keys are at most 64 bytes)."""
        digest = hmac.new(self.fairness_secret, user_id.encode(), hashlib.sha256).hexdigest()
        return f"u-{digest[:24]}"
