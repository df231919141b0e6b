"""Which provider, model, key and provider gate a job's calls use: a use case of the job
stages (RESOLVE checks the key before the job asks for a slot, EXECUTE calls with it). The
decrypted key lives only in those activities' stack frames; it never reaches a return value, a
log line or Temporal."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncSession

from db import credentials as credentials_db
from db.credentials import CredentialRow
from db.provider_gate import PLATFORM_KEY_REF, GateKey
from engine.definition import PLATFORM_KEY, USER_DEEPSEEK_KEY
from engine.errors import ExecutionFailure
from engine.offpeak import Windows, default_windows
from jobs.guardrails import GuardrailConfig
from jobs.spec import AnyJobType
from providers.base import Provider
from providers.crypto import CredentialCipher, decrypt_credential
from providers.fallback import Fallbacks
from providers.pricing import PriceTable
from providers.safety import ContentSafety, RuleBasedContentSafety
from providers.structured import FormPolicy
from providers.synthetic import SyntheticProvider

USER_KEY_PROVIDER = "deepseek"


@dataclass
class Gateway:
    provider: Provider  # the configured provider (real, or synthetic when no key is set)
    model: str
    platform_api_key: str | None = field(default=None, repr=False)
    cipher: CredentialCipher | None = None
    safety: ContentSafety = field(default_factory=lambda: RuleBasedContentSafety([]))
    synthetic: Provider = field(default_factory=SyntheticProvider)
    # A user's own DeepSeek key always goes to a real OpenAI-compatible endpoint (AI_BASE_URL or
    # DeepSeek's), even when the platform runs offline on the synthetic provider.
    user_provider: Provider | None = None
    # What a call costs, per model (the usage row's cost_usd).
    prices: PriceTable = field(default_factory=PriceTable)
    # The platform's fallback chain (AI_FALLBACKS; providers/fallback.py, jobs/fallback.py).
    fallbacks: Fallbacks = field(default_factory=Fallbacks)
    # Each provider's off-peak discount windows (AI_OFFPEAK_WINDOWS; jobs/offpeak.py).
    offpeak_windows: Windows = field(default_factory=default_windows)
    # The structured-output form each model is asked in (AI_STRUCTURED_OUTPUT, the entries'
    # own) and how long a refused form stays lowered (jobs/structured_output.py).
    forms: FormPolicy = field(default_factory=FormPolicy)
    downgrade_ttl_s: int = 86_400
    # PII masking's phone region and the moderation endpoint (jobs/guardrails.py).
    guardrails: GuardrailConfig = field(default_factory=GuardrailConfig)

    async def aclose(self) -> None:
        """Close the providers' HTTP connections (a stopping worker leaves no socket open)."""
        providers = (self.provider, self.user_provider, self.synthetic)
        for p in {id(p): p for p in providers if p is not None}.values():
            close = getattr(p, "aclose", None)
            if close is not None:
                await close()
        await self.fallbacks.aclose()
        close_moderation = getattr(self.guardrails.moderator, "aclose", None)
        if close_moderation is not None:
            await close_moderation()

    def provider_for(self, jt: AnyJobType, mode: str = PLATFORM_KEY) -> Provider:
        if jt.always_synthetic:
            return self.synthetic
        if mode == USER_DEEPSEEK_KEY and self.user_provider is not None:
            return self.user_provider
        return self.provider

    def model_for(self, jt: AnyJobType, mode: str = PLATFORM_KEY) -> str:
        # Any synthetic provider (also the offline default built when no key/base URL is set)
        # answers as model "synthetic": its calls are free and must not be priced as AI_MODEL.
        return "synthetic" if self.provider_for(jt, mode).name == "synthetic" else self.model

    def gate_key(
        self, jt: AnyJobType, mode: str, user_id: str, credential_id: uuid.UUID | None
    ) -> GateKey | None:
        """The provider gate a job's calls go through: one per (provider, key), so one key's
        429, balance or outage never holds another key's jobs. None: the synthetic provider,
        which no gate guards."""
        provider = self.provider_for(jt, mode)
        if provider.name == "synthetic":
            return None
        if mode == USER_DEEPSEEK_KEY:
            ref = f"key:{credential_id}" if credential_id else f"user:{user_id}"[:80]
            return GateKey(provider.name, ref)
        return GateKey(provider.name, PLATFORM_KEY_REF)

    async def _user_key_row(
        self, session: AsyncSession, user_id: str, credential_id: uuid.UUID | None
    ) -> CredentialRow | None:
        """The key pinned on the job at create (revoked or someone else's → None); jobs created
        before keys were pinned use the user's current key."""
        if credential_id is None:
            return await credentials_db.active_for_user(session, user_id, USER_KEY_PROVIDER)
        row = await credentials_db.get(session, credential_id)
        if row is None or row.user_id != user_id or row.revoked_at is not None:
            return None
        return row

    async def api_key(
        self,
        session: AsyncSession,
        jt: AnyJobType,
        user_id: str,
        mode: str,
        credential_id: uuid.UUID | None = None,
    ) -> str | None:
        """Decrypt the job's key (RESOLVE checks it, EXECUTE uses it). Revoked or missing →
        CREDENTIAL_MISSING."""
        if self.provider_for(jt, mode).name == "synthetic":
            return None
        if mode == PLATFORM_KEY:
            if self.platform_api_key is None and self.provider.name != "synthetic":
                # A custom AI_BASE_URL without a key: send none (local servers accept that).
                return ""
            return self.platform_api_key
        row = await self._user_key_row(session, user_id, credential_id)
        if row is None:
            raise ExecutionFailure("CREDENTIAL_MISSING", internal_message="no active user key")
        if self.cipher is None:
            raise ExecutionFailure("CREDENTIAL_INVALID", internal_message="no encryption key set")
        plain, _ = decrypt_credential(
            self.cipher,
            credential_id=row.id,
            user_id=user_id,
            provider=row.provider,
            key_id=row.key_id,
            blob=bytes(row.ciphertext),
        )
        return plain
