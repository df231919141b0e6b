"""The errors of the operators' and the webhooks' resources: outbox rows, webhooks and their
deliveries, bulk operations, budgets, rollouts and pauses. Each carries its public code and HTTP
status as every EngineError does (engine/errors.py), and the API maps them to problem+json."""

from __future__ import annotations

from engine.errors import EngineError, ValidationFailed


class RolloutNotFound(EngineError):
    code = "ROLLOUT_NOT_FOUND"
    http_status = 404
    title = "The job type has no rollout"


class PauseNotFound(EngineError):
    code = "PAUSE_NOT_FOUND"
    http_status = 404
    title = "Pause not found"


class OutboxEventNotFound(EngineError):
    code = "OUTBOX_EVENT_NOT_FOUND"
    http_status = 404
    title = "Outbox event not found"


class OutboxNotRequeueable(EngineError):
    code = "OUTBOX_NOT_REQUEUEABLE"
    http_status = 409
    title = "Only dead, failed or pending outbox events can be requeued"


class WebhookNotFound(EngineError):
    code = "WEBHOOK_NOT_FOUND"
    http_status = 404
    title = "Webhook not found"


class BudgetNotFound(EngineError):
    code = "BUDGET_NOT_FOUND"
    http_status = 404
    title = "Budget not found"


class WebhookDeliveryNotFound(EngineError):
    code = "WEBHOOK_DELIVERY_NOT_FOUND"
    http_status = 404
    title = "Webhook delivery not found"


class WebhookDeliveryNotReplayable(EngineError):
    code = "WEBHOOK_DELIVERY_NOT_REPLAYABLE"
    http_status = 409
    title = "Only delivered, failed or dead deliveries can be replayed"


class BulkOperationNotFound(EngineError):
    code = "BULK_OPERATION_NOT_FOUND"
    http_status = 404
    title = "Bulk operation not found"


class BulkTooLarge(ValidationFailed):
    """A bulk filter matches more jobs than ADMIN_BULK_MAX_JOBS: nothing is frozen or changed.
    The problem body carries `matched` and `limit` so the admin can narrow the filter."""

    code = "BULK_TOO_LARGE"
    title = "Too many jobs match"

    def __init__(self, matched: int, limit: int) -> None:
        super().__init__(
            f"The filter matches {matched} jobs; a bulk operation may act on at most {limit}. "
            "Narrow the filter (e.g. by createdFrom/createdTo).",
            errors=[
                {"loc": ["body"], "msg": f"{matched} jobs match, limit {limit}", "type": "too_many"}
            ],
        )
        self.problem_extra: dict[str, object] = {"matched": matched, "limit": limit}
