"""A create request, checked: everything create decides before it touches the database.

The job type (visible to the caller?), the input (strictly valid, finite), the priority, the
credential mode and key, the cost cap, the target type, a long source's chunk plan, whether the
prompt can fit the model at all, the estimate (jobs/costs.py) and the request's fingerprint. A
quote stops after these checks; a create goes on with the result (jobs/creation.py). Nothing
here does I/O, so a refused request has cost no round trip.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ValidationError

from db.chunks import PlannedChunk
from engine.definition import PLATFORM_KEY, USER_DEEPSEEK_KEY
from engine.errors import CostCapTooLow, RequestTooLarge, UnknownJobType, ValidationFailed
from engine.flow import Concurrency
from engine.hashing import request_fingerprint
from engine.scopes import JobScopes
from engine.tiers import BATCH, OFFPEAK, SERVICE_TIERS, STANDARD
from engine.tokens import count_chat_tokens, estimate_prompt_tokens
from jobs import chunked, fallback, flow, offpeak, tiers
from jobs.costs import JobEstimate, TierPrice, chain_price, estimate_job
from jobs.flow import FlowPlan
from jobs.guardrails import masked_input
from jobs.policy import CreatePolicy
from jobs.rollouts import ArmChoice
from jobs.spec import AnyJobType, Catalog
from jobs.tiers import checked_tier, tier_fingerprint
from providers.pricing import Price

# A delayed job's start must leave its snapshot this long to live: RESOLVE reads the snapshot
# when the job starts, and a job that started on an expired one fails SNAPSHOT_EXPIRED.
RUN_AT_SNAPSHOT_MARGIN = timedelta(hours=1)


@dataclass(frozen=True)
class CreateJobRequest:
    user_id: str
    job_type: str
    target_type: str
    target_id: str
    input: dict[str, Any]
    priority: int | None = None
    idempotency_key: str | None = None
    credential_mode: str | None = None
    # One of the caller's own active keys (user_deepseek_key only); None: the newest.
    credential_id: uuid.UUID | None = None
    retried_from_job_id: uuid.UUID | None = None
    # The most this job may cost in all (USD); its answer budget is cut to fit. None: no cap.
    max_cost_usd: Decimal | None = None
    # Admin retry and internal callers bypass visibility and quotas.
    internal: bool = False
    # The client's own references, stored with the job and never sent to Temporal or the
    # provider; the versions a client pinned (any the job type publishes; None: its defaults);
    # a delayed job's start (None: at once).
    metadata: dict[str, str] = field(default_factory=dict)
    prompt_version: str | None = None
    output_schema_version: str | None = None
    run_at: datetime | None = None
    # The service tier (None: the job type's default), result reuse, and an off-peak job's
    # deadline and what it does there (None: the defaults, engine/tiers.py).
    service_tier: str | None = None
    reuse: bool = False
    offpeak_deadline_at: datetime | None = None
    offpeak_on_deadline: str | None = None
    # Whose money it is beyond the user's (engine/scopes.py): the creating token's organisation
    # and teams, and the create's tags (never sent to the provider).
    scopes: JobScopes = field(default_factory=JobScopes)
    # The arm of the job type's rollout the job runs on (jobs/rollouts.py): chosen by the
    # create for its user, or an original's kept by its retry; None: no rollout.
    arm: ArmChoice | None = None
    # Flow control (jobs/flow.py): keyed concurrency, the start-by TTL in seconds (None: the
    # defaults; 0: none) and the whole job's deadline.
    concurrency: Concurrency | None = None
    ttl_seconds: int | None = None
    deadline: datetime | None = None


@dataclass(frozen=True)
class CheckedRequest:
    job_type: AnyJobType
    normalized: dict[str, Any]
    priority: int
    mode: str
    estimate: JobEstimate
    fingerprint: str
    chunks: list[PlannedChunk] | None = None  # a long source's plan; None: one call
    service_tier: str = STANDARD  # the effective tier (the request's, or the type's default)
    # What the job would cost on each tier, and whether it may ask for it (the quote's).
    tier_prices: tuple[TierPrice, ...] = ()
    # The prompt version it runs on (its arm's, else the type's) and its arm.
    prompt_version: str = ""
    arm: ArmChoice | None = None
    # Its concurrency, effective TTL and deadline (jobs/flow.py).
    flow: FlowPlan = field(default_factory=FlowPlan)


def validation_errors(exc: ValidationError) -> list[dict[str, object]]:
    """Pydantic errors without the offending input values (they may be sensitive)."""
    return [
        {"loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg", ""), "type": e.get("type")}
        for e in exc.errors(include_url=False, include_input=False)
    ]


class RequestChecker:
    """Checks create requests against the catalog and the create policy; pure (no I/O)."""

    def __init__(self, catalog: Catalog, policy: CreatePolicy) -> None:
        self._catalog = catalog
        self._policy = policy

    def check(self, req: CreateJobRequest) -> CheckedRequest:
        """Everything create decides before it touches the database: the type, the validated
        input, priority, credential mode, the estimate and the request's fingerprint. A quote
        stops here; create goes on. The checks run in this order, so a request that breaks
        several is refused for the first."""
        jt = self.job_type_for_create(req.job_type, internal=req.internal)
        # The versions the job runs with on every attempt: its rollout arm's prompt version,
        # else the pinned one, else the defaults; its prompt is counted with them.
        version = (req.arm.prompt_version if req.arm else None) or req.prompt_version
        jt = jt.at(version, req.output_schema_version)
        model = self.validate_input(jt, req.input)
        normalized = model.model_dump(mode="json", by_alias=True, exclude_none=True)
        priority, mode = _checked_options(req, jt)
        self._check_run_at(req)
        tier = checked_tier(req, jt)
        refusal = self._policy.tier_refusal(jt, mode, tier)
        if refusal is not None:
            errors: list[dict[str, object]] = [
                {"loc": ["serviceTier"], "msg": refusal, "type": "value"}
            ]
            raise ValidationFailed(refusal, errors=errors)
        offpeak.check_create(req, jt, self._policy, mode, tier)  # 422: no window, too late
        # What the prompts are built from: the input with its PII masked when the type masks
        # it (jobs/guardrails.py), so the plan and the estimate are of what is sent.
        prompt_model = masked_input(jt, model, self._policy.pii_region)[0]
        flow_plan = flow.plan(req, jt, self._policy.default_ttl_s)  # 422: sure to expire
        chunks = self._plan(jt, prompt_model)
        tiers.check_batch_source(tier, chunks)  # a long source is several calls: not a line
        self._check_fits_the_model(jt, prompt_model, chunks)
        if jt.target_types is not None and req.target_type not in jt.target_types:
            raise ValidationFailed(
                f"targetType must be one of: {', '.join(jt.target_types)}",
                errors=[{"loc": ["targetType"], "msg": "unsupported targetType", "type": "enum"}],
            )
        tokens = self._tokens(jt, prompt_model, chunks)
        discount = self._reserved_discount(req, jt, mode, tier)
        arm_model = arm_model_of(req.arm, mode)
        estimate = self._priced(jt, mode, tokens, req.max_cost_usd, tier, discount, arm_model)
        tiers.check_batch_line(
            tier,
            jt,
            prompt_model,
            estimate.model,
            estimate.output_budget,
            self._policy.batch_max_bytes,
        )
        # The effective priority and credential mode: omitting them and sending the defaults
        # are the same request.
        fingerprint = request_fingerprint(
            jt.definition.job_type,
            req.target_type,
            req.target_id,
            normalized,
            priority,
            mode,
            str(req.credential_id) if req.credential_id is not None else None,
            str(req.max_cost_usd) if req.max_cost_usd is not None else None,
            metadata=req.metadata,
            prompt_version=req.prompt_version,
            output_schema_version=req.output_schema_version,
            run_at=req.run_at.astimezone(UTC).isoformat() if req.run_at is not None else None,
            service=tier_fingerprint(req, jt),
            tags=list(req.scopes.tags),
            flow=flow.fingerprint(req),
        )
        tier_prices = self._tier_prices(jt, mode, tokens, req.max_cost_usd, arm_model)
        return CheckedRequest(
            jt,
            normalized,
            priority,
            mode,
            estimate,
            fingerprint,
            chunks,
            tier,
            tier_prices,
            version or jt.definition.prompt_version,
            req.arm,
            flow_plan,
        )

    def _check_run_at(self, req: CreateJobRequest, now: datetime | None = None) -> None:
        """A delayed job starts while its snapshot lives: its `runAt` is at least
        RUN_AT_SNAPSHOT_MARGIN before create + DATA_RETENTION_DAYS, the snapshot's expiry. A
        later one would hold its reservation (and a slot) until then, and fail SNAPSHOT_EXPIRED
        at its start: refused now, located in the body as the schema's own checks are."""
        if req.run_at is None:
            return
        days = self._policy.snapshot_ttl_days
        latest = (now or datetime.now(UTC)) + timedelta(days=days) - RUN_AT_SNAPSHOT_MARGIN
        if req.run_at > latest:
            msg = (
                f"runAt must be at least one hour before the job's input expires: the server "
                f"keeps a job's input DATA_RETENTION_DAYS ({days}) days after its create, so "
                f"runAt may be at most {latest.isoformat(timespec='seconds')}"
            )
            errors: list[dict[str, object]] = [
                {"loc": ["body", "runAt"], "msg": msg, "type": "value_error"}
            ]
            raise ValidationFailed(msg + ".", errors=errors)

    def job_type_for_create(self, job_type: str, *, internal: bool = False) -> AnyJobType:
        jt = self._catalog.get(job_type)
        if not internal and not jt.definition.creatable(development=self._policy.synthetic_public):
            raise UnknownJobType(job_type)
        return jt

    def validate_input(self, jt: AnyJobType, raw: Any) -> BaseModel:
        if not _finite(raw):
            # JSON has no NaN/Infinity; PostgreSQL jsonb would silently change them.
            raise ValidationFailed("The input contains a non-finite number.")
        try:
            # Strict: the input is JSON, and its types are what the schema says (`true` is not
            # a count, "5" is not a number); a stored input is re-read laxly by EXECUTE.
            model: BaseModel = jt.input_model.model_validate(
                raw if raw is not None else {}, strict=True
            )
            return model
        except ValidationError as exc:
            raise ValidationFailed(
                "The input does not match the job type's input schema.",
                errors=validation_errors(exc),
            ) from None

    def plan_chunks(self, jt: AnyJobType, model: BaseModel) -> list[PlannedChunk] | None:
        """A long source's chunks (jobs/chunked.py), or None: one call. Each chunk's prompt fits
        the per-call budget, and never more than the model's window leaves beside the answer.
        Planned over the masked input when the type masks PII, as EXECUTE cuts it."""
        return self._plan(jt, masked_input(jt, model, self._policy.pii_region)[0])

    def _plan(self, jt: AnyJobType, model: BaseModel) -> list[PlannedChunk] | None:
        if jt.chunking is None:
            return None
        window = None if jt.always_synthetic else self._policy.context_window
        leaves = window - jt.definition.execution.max_output_tokens if window is not None else None
        return chunked.plan(
            jt, model, self._policy.chunking, window_budget=max(leaves, 1) if leaves else None
        )

    def _check_fits_the_model(
        self, jt: AnyJobType, model: BaseModel, chunks: list[PlannedChunk] | None
    ) -> None:
        """Refuse (422 REQUEST_TOO_LARGE, naming the limit) a job whose prompt, by a lower-bound
        estimate, plus its output budget cannot fit the model's context window: no provider
        call could succeed, so nothing is queued, retried or paid for. A chunked job's calls are
        its chunks', each planned within the window."""
        window = self._policy.context_window
        if window is None or jt.always_synthetic or chunks:
            return
        prompt = jt.prompt(model, None)
        needed = estimate_prompt_tokens(prompt.system, prompt.user)
        budget = jt.definition.execution.max_output_tokens
        if needed + budget > window:
            raise RequestTooLarge(
                f"The input is too long for the AI model: at least {needed} prompt tokens plus "
                f"an answer budget of {budget} exceed its context window of {window} tokens. "
                "Shorten the input."
            )

    def _chain_price(
        self,
        jt: AnyJobType,
        mode: str,
        model_name: str,
        tier: str,
        discount: Decimal | None,
        arm_model: str | None = None,
    ) -> Price:
        """The price a job is reserved at: the dearest of its primary (at its tier), its arm's
        model and its fallback chain (at standard). A batch job has no chain: its calls go to
        its provider's Batch API or nowhere, so its price is the primary's batch price."""
        p = self._policy
        synthetic = model_name == "synthetic"
        models = fallback.chain_models(model_name, p.fallback_models, jt, mode, synthetic=synthetic)
        if arm_model is not None and not synthetic and arm_model not in models:
            models = (*models, arm_model)
        return chain_price(
            p.prices, models[:1] if tier == BATCH else models, tier=tier, discount=discount
        )

    def estimate(
        self,
        jt: AnyJobType,
        model: BaseModel,
        mode: str,
        max_cost_usd: Decimal | None,
        chunks: list[PlannedChunk] | None = None,
        *,
        tier: str = STANDARD,
        discount: Decimal | None = None,
    ) -> JobEstimate:
        """The job's tokens and cost before any call (jobs/costs.py), over all its chunks' calls
        for a long source, at `tier`'s price (`discount`: an off-peak window's price factor); a
        cap too low for it raises CostCapTooLow."""
        return self._priced(jt, mode, self._tokens(jt, model, chunks), max_cost_usd, tier, discount)

    def _tokens(
        self, jt: AnyJobType, model: BaseModel, chunks: list[PlannedChunk] | None
    ) -> tuple[list[int], int]:
        """Each call's prompt tokens and the answer tokens all calls are expected to take."""
        budget = jt.definition.execution.max_output_tokens
        inputs = [chunked.chunk_model(jt, model, c) for c in chunks] if chunks else [model]
        expected = sum(
            jt.expected_output_tokens(i) if jt.expected_output_tokens else budget // 4
            for i in inputs
        )
        if jt.always_synthetic:
            # A synthetic job type's calls are free and never reach a provider: no prompt is
            # built for it here (EXECUTE builds it, and a failure there is the job's own).
            return [], expected
        if chunks:
            # The plan counted each chunk's prompt already; a long source is not counted twice.
            return [c.input_tokens for c in chunks], expected
        prompt = jt.prompt(model, None)
        return [count_chat_tokens(prompt.system, prompt.user)], expected

    def _priced(
        self,
        jt: AnyJobType,
        mode: str,
        tokens: tuple[list[int], int],
        max_cost_usd: Decimal | None,
        tier: str,
        discount: Decimal | None,
        arm_model: str | None = None,
    ) -> JobEstimate:
        model_name = self._policy.model_for(jt, mode)
        return estimate_job(
            tokens[0],
            model=arm_model if arm_model is not None and model_name != "synthetic" else model_name,
            price=self._chain_price(jt, mode, model_name, tier, discount, arm_model),
            output_budget=jt.definition.execution.max_output_tokens,
            expected_output_tokens=tokens[1],
            margin=self._policy.estimate_margin,
            max_cost_usd=max_cost_usd,
        )

    def _reserved_discount(
        self, req: CreateJobRequest, jt: AnyJobType, mode: str, tier: str
    ) -> Decimal | None:
        """The price factor an off-peak job is reserved at: its window's only when it can
        never run outside a window (its deadline fails it, the default); one that runs at the
        standard price at its deadline, or whose provider has no window, at the standard price
        (None)."""
        if tier != OFFPEAK or req.offpeak_on_deadline == STANDARD:
            return None
        return self._policy.offpeak_discount(jt, mode)

    def _tier_prices(
        self,
        jt: AnyJobType,
        mode: str,
        tokens: tuple[list[int], int],
        max_cost_usd: Decimal | None,
        arm_model: str | None = None,
    ) -> tuple[TierPrice, ...]:
        """The job at each tier's price (off-peak at its window's, the standard price when its
        provider has none), and whether a create may ask for that tier: the type accepts it,
        the provider serves it, and a cap leaves a useful answer at its price (when it does
        not, the figures are the uncapped job's)."""
        p, out = self._policy, []
        for tier in SERVICE_TIERS:
            discount = p.offpeak_discount(jt, mode) if tier == OFFPEAK else None
            available = jt.definition.service.accepts(tier) and (
                p.tier_refusal(jt, mode, tier) is None and (tier != OFFPEAK or discount is not None)
            )
            try:
                e = self._priced(jt, mode, tokens, max_cost_usd, tier, discount, arm_model)
            except CostCapTooLow:
                e = self._priced(jt, mode, tokens, None, tier, discount, arm_model)
                available = False
            out.append(TierPrice(tier, e.estimated_cost_usd, e.worst_case_cost_usd, available))
        return tuple(out)


def arm_model_of(arm: ArmChoice | None, mode: str) -> str | None:
    """The model an arm tries first, for a job on the platform's key (a user's own key runs on
    its own model)."""
    return arm.model if arm is not None and mode == PLATFORM_KEY else None


def _checked_options(req: CreateJobRequest, jt: AnyJobType) -> tuple[int, str]:
    """The effective priority and credential mode of `req`, after the checks of its options
    (priority range, credential mode allowed, a named key only with the user's key mode, a
    positive cost cap), in that order."""
    d = jt.definition
    priority = d.queue.default_priority if req.priority is None else req.priority
    if not 0 <= priority <= 100:
        raise ValidationFailed("priority must be between 0 and 100")
    mode = req.credential_mode or d.credential.default_mode
    if mode not in d.credential.allowed_modes:
        raise ValidationFailed("credentialMode is not allowed for this job type")
    if req.credential_id is not None and mode != USER_DEEPSEEK_KEY:
        raise ValidationFailed(
            "credentialId is only accepted with credentialMode user_deepseek_key",
            errors=[{"loc": ["credentialId"], "msg": "needs user_deepseek_key", "type": "value"}],
        )
    if req.max_cost_usd is not None and not (req.max_cost_usd.is_finite() and req.max_cost_usd > 0):
        raise ValidationFailed(
            "maxCostUsd must be a positive number",
            errors=[{"loc": ["maxCostUsd"], "msg": "must be > 0", "type": "value"}],
        )
    return priority, mode


def _finite(value: Any, depth: int = 0) -> bool:
    if depth > 64:
        return False
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v, depth + 1) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_finite(v, depth + 1) for v in value)
    return True
