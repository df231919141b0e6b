"""One error root for the whole engine, and the error-code taxonomy (docs/contracts.md, errors).

Every domain error carries a public `code`, an HTTP status and a public message that is safe to
show anyone: no stack trace, path, host, SQL or provider body. Details for operators travel
separately (`internal_message`) and end up only in `ai_job.internal_error_message`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import StrEnum


class Retry(StrEnum):
    YES = "yes"
    NO = "no"
    ONCE = "once"  # INTERNAL_*: retried a single time
    PER_DEFINITION = "per_definition"  # TIMEOUT: abortStrategy decides


@dataclass(frozen=True)
class CodeRule:
    prefix: str
    retry: Retry


# Longest prefix wins; order does not matter.
_RULES: tuple[CodeRule, ...] = (
    CodeRule("PROVIDER_", Retry.YES),
    CodeRule("VALIDATION_", Retry.YES),
    CodeRule("CONTENT_SAFETY_", Retry.NO),
    # The moderation endpoint did not answer: the provider's answer is kept and moderated
    # again by the next attempt (no new call).
    CodeRule("MODERATION_", Retry.YES),
    CodeRule("TIMEOUT", Retry.PER_DEFINITION),
    CodeRule("CREDENTIAL_", Retry.NO),
    # The provider refused this request as it was written (too long, malformed, unknown model):
    # sending it again changes nothing, and it says nothing about the provider's health.
    CodeRule("REQUEST_", Retry.NO),
    # The job's input outlived its retention before it ran: nothing can bring it back.
    CodeRule("SNAPSHOT_EXPIRED", Retry.NO),
    # An off-peak job's deadline came before its provider's discount window (`then: "fail"`).
    CodeRule("OFFPEAK_DEADLINE_PASSED", Retry.NO),
    # The prompt or output schema version the job was created with is no longer published: it
    # never runs on another one.
    CodeRule("PROMPT_VERSION_UNAVAILABLE", Retry.NO),
    CodeRule("CANCELLED", Retry.NO),
    # Flow control ended the job before (or instead of) a call: a newer create with its key
    # replaced it, its start-by TTL or its deadline passed (engine/flow.py).
    CodeRule("SUPERSEDED", Retry.NO),
    CodeRule("JOB_EXPIRED", Retry.NO),
    CodeRule("JOB_DEADLINE_EXCEEDED", Retry.NO),
    # Another call would take the job past its cost cap or its user past a budget: a retry
    # would only be refused again (a budget resets with its window; create the job again).
    CodeRule("BUDGET_", Retry.NO),
    CodeRule("INTERNAL_", Retry.ONCE),
)


def retry_rule(code: str) -> Retry:
    """Whether and how an error code is retried; unknown codes are treated as INTERNAL."""
    best: CodeRule | None = None
    for rule in _RULES:
        if code.startswith(rule.prefix) and (best is None or len(rule.prefix) > len(best.prefix)):
            best = rule
    return best.retry if best else Retry.ONCE


def is_retryable(code: str, *, attempt: int, abort_strategy: str = "retry") -> bool:
    """Whether an execution failure with `code` on attempt `attempt` (1-based) may be retried."""
    rule = retry_rule(code)
    if rule is Retry.YES:
        return True
    if rule is Retry.NO:
        return False
    if rule is Retry.ONCE:
        return attempt < 2
    return abort_strategy == "retry"


# Public messages per code: what a user may read. Never interpolate request data into them.
PUBLIC_MESSAGES: dict[str, str] = {
    "PROVIDER_UNAVAILABLE": "The AI provider is unavailable. Please try again later.",
    "PROVIDER_RATE_LIMITED": "The AI provider is rate limiting requests. Please try again later.",
    "PROVIDER_TIMEOUT": "The AI provider did not answer in time.",
    "VALIDATION_OUTPUT_INVALID": "The AI provider returned an invalid result.",
    "CONTENT_SAFETY_BLOCKED": "The request was blocked by the content safety policy.",
    "MODERATION_UNAVAILABLE": (
        "The content moderation service did not answer; the result will be checked again."
    ),
    "TIMEOUT": "The job took too long and was stopped.",
    "CREDENTIAL_INVALID": "The AI provider rejected the credential.",
    "CREDENTIAL_MISSING": (
        "No usable AI provider credential is configured for this job. Add your key with "
        "POST /api/ai/credentials, then create the job again."
    ),
    "CREDENTIAL_INSUFFICIENT_BALANCE": (
        "The AI provider account behind this credential has insufficient balance. "
        "Top it up or use another key, then create the job again."
    ),
    "REQUEST_TOO_LARGE": (
        "The input is too long for the AI model. Shorten it and create the job again."
    ),
    "REQUEST_REJECTED": (
        "The AI provider rejected the request as invalid. Check the job's input and create "
        "the job again; if it keeps happening, contact support."
    ),
    "CANCELLED": "The job was cancelled.",
    "SUPERSEDED": "A newer job with the same concurrency key replaced this one.",
    "JOB_EXPIRED": "The job did not start before its time to live (ttlSeconds) ran out.",
    "JOB_DEADLINE_EXCEEDED": "The job did not finish before its deadline and was stopped.",
    "BUDGET_EXHAUSTED": (
        "Another attempt would exceed the job's cost cap or your AI cost budget, so the job "
        "stopped. Create it again when the budget allows, or with a higher maxCostUsd."
    ),
    "SNAPSHOT_EXPIRED": (
        "The job waited longer than its input is kept and can no longer run. Create it again."
    ),
    "OFFPEAK_DEADLINE_PASSED": (
        "The job's off-peak deadline passed before the AI provider's discount window opened, "
        "so it did not run. Create it again, or allow it to run at the standard price."
    ),
    "PROMPT_VERSION_UNAVAILABLE": (
        "The prompt or output schema version this job was created with is no longer "
        "available, so it did not run. Create it again with a listed version."
    ),
    "INTERNAL_ERROR": "The job failed because of an internal error.",
    "INTERNAL_DATABASE_UNAVAILABLE": "The job's database was unavailable; it will be retried.",
    "INTERNAL_LOCK_EXPIRED": "The job's worker stopped responding and the job was abandoned.",
}


@functools.cache
def non_retryable_codes() -> tuple[str, ...]:
    """Every known code no retry can change (a retry policy's non-retryable types)."""
    return tuple(sorted(c for c in PUBLIC_MESSAGES if retry_rule(c) is Retry.NO))


def public_message_for(code: str) -> str:
    if code in PUBLIC_MESSAGES:
        return PUBLIC_MESSAGES[code]
    for prefix, text in (
        ("PROVIDER_", PUBLIC_MESSAGES["PROVIDER_UNAVAILABLE"]),
        ("VALIDATION_", PUBLIC_MESSAGES["VALIDATION_OUTPUT_INVALID"]),
        ("CONTENT_SAFETY_", PUBLIC_MESSAGES["CONTENT_SAFETY_BLOCKED"]),
        ("CREDENTIAL_", PUBLIC_MESSAGES["CREDENTIAL_INVALID"]),
        ("REQUEST_", PUBLIC_MESSAGES["REQUEST_REJECTED"]),
    ):
        if code.startswith(prefix):
            return text
    return PUBLIC_MESSAGES["INTERNAL_ERROR"]


class Fault(StrEnum):
    """Whose problem a failed provider call is. Only PROVIDER faults are health signals that a
    breaker counts; the others stay with their request or their key."""

    PROVIDER = "provider"  # 5xx, transport errors, timeouts, a 429 on that key
    REQUEST = "request"  # 400/404/413/422, a content filter, an answer that was not usable
    KEY = "key"  # 401/403 (revoked, wrong), 402 (no balance): that key's jobs only


def fault_of(code: str) -> Fault:
    """The default fault of a code; a provider client may say more (see ExecutionFailure)."""
    if code.startswith("CREDENTIAL_"):
        return Fault.KEY
    if code.startswith("PROVIDER_") or code == "TIMEOUT":
        return Fault.PROVIDER
    return Fault.REQUEST


class EngineError(Exception):
    """Root of every domain error. `code` and `public_message` are safe for any audience."""

    code: str = "INTERNAL_ERROR"
    http_status: int = 500
    title: str = "Internal error"

    def __init__(
        self,
        public_message: str | None = None,
        *,
        internal_message: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        self.public_message = public_message or self.title
        self.internal_message = internal_message
        self.retry_after_s = retry_after_s
        super().__init__(f"{self.code}: {self.public_message}")


class ValidationFailed(EngineError):
    code = "VALIDATION_FAILED"
    http_status = 422
    title = "Validation failed"

    def __init__(self, public_message: str, *, errors: list[dict[str, object]] | None = None):
        super().__init__(public_message)
        self.errors = errors or []


class UnknownJobType(ValidationFailed):
    def __init__(self, job_type: str) -> None:
        super().__init__("Unknown or non-public job type.")
        self.job_type = job_type


class VersionUnavailable(ValidationFailed):
    """A prompt or output schema version the job type does not publish (GET /api/ai/job-types
    lists those it does). At create a 422; for a job recorded with it, `PROMPT_VERSION_UNAVAILABLE`
    (the job never runs on another version)."""


class IdempotencyKeyReused(EngineError):
    code = "IDEMPOTENCY_KEY_REUSED"
    http_status = 422
    title = "Idempotency key reused with a different request"


class JobNotFound(EngineError):
    code = "JOB_NOT_FOUND"
    http_status = 404
    title = "Job not found"


class JobNotCancellable(EngineError):
    code = "JOB_NOT_CANCELLABLE"
    http_status = 409
    title = "Job is in a terminal state and cannot be cancelled"


class JobAlreadyCancelled(EngineError):
    code = "JOB_ALREADY_CANCELLED"
    http_status = 409
    title = "Job is already cancelled"


class JobNotRetryable(EngineError):
    code = "JOB_NOT_RETRYABLE"
    http_status = 409
    title = "Only failed or cancelled jobs can be retried"


class JobNotTerminal(EngineError):
    code = "JOB_NOT_TERMINAL"
    http_status = 409
    title = "Only a job that has ended (succeeded, failed or cancelled) can be purged"


class JobNotSucceeded(EngineError):
    code = "JOB_NOT_SUCCEEDED"
    http_status = 409
    title = "Only a succeeded job can be given feedback"


class TooManyJobs(EngineError):
    code = "TOO_MANY_JOBS"
    http_status = 429
    title = "Too many active jobs"


class QuotaExceeded(EngineError):
    code = "QUOTA_EXCEEDED"
    http_status = 429
    title = "Job quota exceeded"

    def __init__(self, public_message: str | None = None, *, retry_after_s: int | None = None):
        super().__init__(public_message, retry_after_s=retry_after_s)
        # A cost budget's refusal names it beside `code` (`named`); a job quota's does not.
        self.problem_extra: dict[str, object] = {}

    def named(self, scope: str, scope_id: str, period: str) -> QuotaExceeded:
        """This refusal as the budget's: `scope` (user, org, team, tag), its id and its period
        (day, month) become members of the problem body."""
        self.problem_extra = {"scope": scope, "scopeId": scope_id, "period": period}
        return self


class RateLimited(EngineError):
    """A user's creates and quotes past their rate, or a process's check pool full for longer
    than its bounded wait: the request is refused before any costly work, never failed."""

    code = "RATE_LIMITED"
    http_status = 429
    title = "Too many requests"


class RequestTooLarge(EngineError):
    """The job's prompt and output budget cannot fit the model's context window: refused at
    create, before anything is queued or paid for."""

    code = "REQUEST_TOO_LARGE"
    http_status = 422
    title = "Input too long for the AI model"


class CostCapTooLow(EngineError):
    """The client's per-job cap (`maxCostUsd`) cannot pay for the job's prompt and a useful
    answer: refused at create, before anything is queued or reserved."""

    code = "COST_CAP_TOO_LOW"
    http_status = 422
    title = "Cost cap too low for this job"


class PayloadTooLarge(EngineError):
    code = "PAYLOAD_TOO_LARGE"
    http_status = 413
    title = "Request body too large"


class PlatformUnavailable(EngineError):
    code = "PLATFORM_UNAVAILABLE"
    http_status = 503
    title = "The AI platform is unavailable"


class CredentialMissing(EngineError):
    code = "CREDENTIAL_MISSING"
    http_status = 422
    title = "No usable credential"


class CredentialNotFound(EngineError):
    code = "CREDENTIAL_NOT_FOUND"
    http_status = 404
    title = "Credential not found"


class CredentialStorageUnavailable(EngineError):
    code = "CREDENTIAL_STORAGE_UNAVAILABLE"
    http_status = 503
    title = "Credential storage is not configured"


class Unauthenticated(EngineError):
    code = "UNAUTHENTICATED"
    http_status = 401
    title = "Authentication required"


class Forbidden(EngineError):
    code = "FORBIDDEN"
    http_status = 403
    title = "Forbidden"


class IllegalTransition(EngineError):
    """A lifecycle write the transition table forbids (or whose compare-and-set found another
    state)."""

    code = "INTERNAL_ILLEGAL_TRANSITION"
    http_status = 409
    title = "Illegal lifecycle transition"

    def __init__(self, job_id: str, from_status: str | None, to_status: str) -> None:
        super().__init__(
            "Illegal lifecycle transition.",
            internal_message=f"job {job_id}: {from_status} -> {to_status}",
        )
        self.job_id = job_id
        self.from_status = from_status
        self.to_status = to_status

    def __str__(self) -> str:
        return f"illegal transition of job {self.job_id}: {self.from_status} -> {self.to_status}"


class LockConflict(EngineError):
    code = "INTERNAL_LOCK_CONFLICT"
    http_status = 409
    title = "Job is locked by another worker"

    def __init__(self, job_id: str, locked_by: str | None) -> None:
        super().__init__("Job is locked.", internal_message=f"job {job_id} locked by {locked_by}")
        self.job_id = job_id
        self.locked_by = locked_by


class DuplicateJobDefinition(EngineError):
    code = "INTERNAL_DUPLICATE_JOB_DEFINITION"


class InvalidJobDefinition(EngineError):
    code = "INTERNAL_INVALID_JOB_DEFINITION"


class ExecutionFailure(EngineError):
    """A failure of a job's execution (provider, validation, safety, timeout, credential...).

    Raised by the gateway and the job types; the EXECUTE activity turns it into an
    `ApplicationError` whose type is `code` and whose message is only the public message.
    """

    def __init__(
        self,
        code: str,
        *,
        internal_message: str | None = None,
        retry_after_s: float | None = None,
        correction_hint: str | None = None,
        fault: Fault | None = None,
        answered: bool = False,
    ) -> None:
        self.code = code
        super().__init__(public_message_for(code), internal_message=internal_message)
        self.retry_after_float = retry_after_s
        # What the next attempt's prompt should be told was wrong (no user data).
        self.correction_hint = correction_hint
        self.fault = fault if fault is not None else fault_of(code)
        # The provider sent an HTTP answer: it is reachable, whatever the answer said.
        self.answered = answered
