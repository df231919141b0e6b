"""The OpenAPI document, made readable by a person: what `/docs` and `/redoc` show a client team.

- every operation has a summary and a description;
- every request body and every 2xx response that has content carries an example: the create
  body's are the README's (one per public job type), the others are built from the schema
  (`example_of`), so an example never drifts from the shape it illustrates;
- every schema property has a description (`GLOSSARY`: one meaning per member name across the
  API, which is how the API names things) and a human title ("Source text", not the generated
  "Sourcetext").
"""

from __future__ import annotations

import re
from typing import Any

from pydantic.alias_generators import to_camel

# One description per JSON member name: the API uses each name for one thing. A few are spelled
# in snake_case and camelized below: the job view's own keys are spelled in jobs/views.py only.
_GLOSSARY: dict[str, str] = {
    "action": "What the admin did (`cancel`, `retry`, ...)",
    "actor": "The admin's user id (`sub` of their token)",
    "admitted": "Whether a create with this body would be admitted now",
    "aggregateId": "The id of what the event is about (a job id)",
    "answers": "The learner's answers to analyse",
    "artifactCount": "How many artifacts the job projected",
    "artifactId": "The artifact's id (the business row's id)",
    "artifactType": "What kind of business row the artifact is (`quiz_question`, ...)",
    "artifacts": "The artifacts the job projected",
    "attempt": "The attempt number (1 for the first)",
    "attemptCount": "How many attempts were made so far",
    "attempts": "Each attempt's calls, tokens and cost",
    "availableAt": "When the event may be dispatched next",
    "budgets": "Your cost budgets, what is spent and reserved in each",
    "calls": "How many provider calls the job makes",
    "cancelOutcome": "`cancelled` (it was queued) or `cancel_requested` (it is running)",
    "cancelRequestedAt": "When a cancel was requested, if one was",
    "code": "The stable, machine-readable code",
    "correctAnswer": "The correct answer",
    "count": "How many items to generate",
    "createdAt": "When it was created (RFC 3339)",
    "createdFrom": "Only jobs created at or after this time (RFC 3339)",
    "createdTo": "Only jobs created before this time (RFC 3339)",
    "credentialId": "Which of your own active keys pays (with `credentialMode: user_deepseek_key`)",
    "credentialMode": "Who pays the provider: the platform's key or your own",
    "delayMs": "How long the synthetic call takes, in milliseconds",
    "deliveredAt": "When the endpoint acknowledged the delivery",
    "detail": "More about it, in words or as an object",
    "difficulty": "How hard the questions are: easy, medium or hard",
    "done": "How many jobs the operation has acted on",
    "dryRun": "Only count and sample what would be acted on; change nothing",
    "echo": "A JSON object copied into the job's output and artifact",
    "endpointId": "The webhook endpoint's id",
    "errorCode": "The job's error code when it failed (e.g. `PROVIDER_UNAVAILABLE`)",
    "estimatedInputTokens": "The prompt tokens estimated before any call",
    "eventId": "The outbox event's id",
    "eventType": "What happened (`job.succeeded`, ...)",
    "eventTypes": "The events the endpoint receives (all when left out)",
    "expectedOutputTokens": "The answer tokens expected (for the estimated cost)",
    "failCode": "The error code the synthetic call fails with",
    "failTimes": "How many times the synthetic call fails before it succeeds",
    "failed": "How many jobs the operation could not act on",
    "failedReasons": "Why, per reason, with counts",
    "filter": "The filter the operation was started with",
    "finished_at": "When it finished (RFC 3339), null until then",
    "from": "The first UTC day of the range",
    "givenAnswer": "What the learner answered (empty: skipped)",
    "groupBy": "What the rows are grouped by",
    "hang": "The synthetic call never answers (until the job's timeout)",
    "id": "Its id",
    "input": "The job type's input (see the `*Input` schemas)",
    "internalErrorMessage": "The internal error message (admins only; never shown to users)",
    "invalidOutput": "The synthetic call answers with output that fails validation",
    "isCorrect": "Whether the learner's answer was correct",
    "items": "The page's items",
    "jobId": "The job's id",
    "jobType": "The job type (`quiz_generation`, ...)",
    "keyHint": "The key's last characters, to tell keys apart",
    "lastError": "The last error, truncated",
    "lastStatusCode": "The HTTP status the endpoint answered last",
    "lifecycleStatus": "queued, running, succeeded, failed or cancelled",
    "limit": "Which limit refuses it",
    "lockedBy": "The relay holding the event, while it dispatches it",
    "matched": "How many jobs the filter matches",
    "maxCostUsd": "The most the job may cost in all, in USD",
    "maxOutputTokens": "Each call's answer budget, in tokens",
    "message": "What it means, in words",
    "model": "The AI model the job runs on",
    "msg": "What is wrong, in words",
    "nextAttemptAt": "When the next delivery attempt is due",
    "operationId": "The bulk operation's id",
    "ordinal": "The position in the job's list (0-based)",
    "outcome": "How it ended (`ok`, `refused`, ...)",
    "outputHash": "The SHA-256 of the validated output",
    "pending": "How many jobs the operation has yet to act on",
    "previousSecretValidUntil": "Until when the secret before a rotation still signs",
    "priority": "0 (lowest) to 100; the job type's default when left out",
    "progress": "0 to 100",
    "provider": "The AI provider (`deepseek`)",
    "public_error_message": "What went wrong, safe to show a user",
    "publishedAt": "When the event was dispatched",
    "question": "The question",
    "queueName": "The queue the job runs on",
    "reason": "Why, as a code",
    "refusal": "Which limit would refuse a create now, and until when (null: admitted)",
    "resetsAt": "When the window starts over",
    "result": "The job's result once it succeeded (its artifacts' count and ids)",
    "retriedFromJobId": "The job this one retries",
    "retryAfterS": "Seconds until a retry may be admitted",
    "revokedAt": "When the key was revoked, if it was",
    "sample": "Up to 20 of the matching job ids",
    "since": "Since when",
    "skipped": "How many jobs the operation skipped (their state had changed)",
    "skippedReasons": "Why, per reason, with counts",
    "sourceText": "The text to work from",
    "started_at": "When it started running (RFC 3339), null until then",
    "status": "The state it is in",
    "targetId": "Your product's id for what the job is about",
    "targetType": "Your product's kind of thing the job is about (`lesson`, ...)",
    "temporalUiUrl": "The workflow in the Temporal UI",
    "title": "A short summary of the problem",
    "to": "The last UTC day of the range",
    "tokensIn": "Prompt tokens",
    "tokensOut": "Answer tokens",
    "topic": "The topic",
    "total": "The sums over the whole range",
    "type": "Its type",
    "until": "Until when (RFC 3339)",
    "url": "The endpoint's URL (https)",
    "userId": "The user's id (`sub` of their token)",
    "webhookId": "The webhook endpoint's id",
    "window": "The budget's window (`day`, `month`)",
    "workflowId": "The Temporal workflow's id",
}

GLOSSARY = {to_camel(k): v for k, v in _GLOSSARY.items()}

# Operations FastAPI documents with a summary only.
DESCRIPTIONS: dict[tuple[str, str], str] = {
    ("get", "/api/ai/jobs"): "Your jobs, newest first, filtered by `status` and `jobType`. "
    "Paged: pass `nextCursor` back as `cursor` (opaque).",
    ("get", "/api/ai/jobs/{jobId}"): "The job's state, progress, error and result. Someone "
    "else's job answers 404 `JOB_NOT_FOUND`, as a job that does not exist does.",
    ("post", "/api/ai/jobs/{jobId}/cancel"): "A queued job is cancelled at once (200); a "
    "running one is asked to stop (202) and ends `cancelled`. A finished job is 409.",
    ("get", "/admin-api/ai/jobs"): "Every user's jobs with their internals, newest first, "
    "filtered by type, status, queue, user and creation time. Paged by `cursor`.",
    ("post", "/admin-api/ai/jobs/{jobId}/retry"): "A failed or cancelled job is created again "
    "as a new job with the same input (201); retrying it again returns that same new job (200). "
    "Any other state is 409 `JOB_NOT_RETRYABLE`.",
    ("get", "/api/ai/credentials"): "Your provider keys, masked (`keyHint`): a key is never "
    "returned once stored.",
    ("get", "/api/ai/webhooks"): "Your webhook endpoints, without their secrets.",
    ("get", "/admin-api/ai/webhook-deliveries"): "Webhook deliveries of every user, newest "
    "first, with their attempts and last error. Paged by `cursor`.",
    ("get", "/healthz"): "Liveness: 200 while the process serves requests. Needs no token.",
    ("get", "/readyz"): "Readiness: 200 when PostgreSQL (and Temporal, when configured) "
    "answer, 503 with the failing check otherwise. Needs no token.",
}

# The README's create bodies, one per job type (only the public ones are shown).
CREATE_EXAMPLES: dict[str, dict[str, Any]] = {
    "synthetic": {
        "jobType": "synthetic",
        "targetType": "demo",
        "targetId": "1",
        "input": {"echo": {"hello": "world"}},
    },
    "quiz_generation": {
        "jobType": "quiz_generation",
        "targetType": "lesson",
        "targetId": "L1",
        "input": {
            "sourceText": "Photosynthesis converts light energy into chemical energy stored "
            "in glucose.",
            "count": 3,
            "difficulty": "easy",
        },
    },
    "flashcard_generation": {
        "jobType": "flashcard_generation",
        "targetType": "lesson",
        "targetId": "L1",
        "input": {"sourceText": "Mitochondria are the powerhouse of the cell.", "count": 5},
    },
    "weak_point_analysis": {
        "jobType": "weak_point_analysis",
        "targetType": "quiz",
        "targetId": "Q7",
        "input": {
            "answers": [
                {
                    "question": "What does chlorophyll absorb?",
                    "givenAnswer": "Oxygen",
                    "correctAnswer": "Light",
                    "isCorrect": False,
                    "topic": "photosynthesis",
                }
            ]
        },
    },
}
BODY_EXAMPLES: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/api/ai/credentials"): {"provider": "deepseek", "apiKey": "sk-0123456789abcdef"},
    ("post", "/api/ai/webhooks"): {
        "url": "https://hooks.example.com/aijobs",
        "eventTypes": ["job.succeeded", "job.failed"],
    },
    ("post", "/api/ai/schedules"): {
        "jobType": "flashcard_generation",
        "input": {"sourceText": "Mitochondria are the powerhouse of the cell.", "count": 5},
        "intervalSeconds": 86400,
        "targetType": "lesson",
        "targetId": "L1",
    },
    ("post", "/admin-api/ai/bulk/cancel"): {"status": "queued", "dryRun": True},
    ("post", "/admin-api/ai/bulk/retry"): {"errorCode": "PROVIDER_UNAVAILABLE", "dryRun": True},
}
# One event of a stream, as the event schema (api/stream_schema.py) describes it.
_STREAM_EXAMPLE = {
    "id": "1764693545123456",
    "event": "status",
    "data": '{"jobId":"…","lifecycleStatus":"running","progress":10}',
}


def human_title(name: str) -> str:
    """`sourceText` → "Source text", `maxCostUsd` → "Max cost USD"."""
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name).replace("_", " ").split()
    out = [w.upper() if w.lower() in ("usd", "id", "url", "ui") else w.lower() for w in words]
    text = " ".join(out)
    return text[:1].upper() + text[1:]


def _resolve(schema: dict[str, Any], comps: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return dict(comps.get(ref.rsplit("/", 1)[-1], {}))
    return schema


# Examples by member name, where a schema alone would only say "string".
_NAMED_EXAMPLES: dict[str, Any] = {
    "jobType": "quiz_generation",
    "queueName": "ai-interactive",
    "targetType": "lesson",
    "targetId": "L1",
    "errorCode": None,
    "public_error_message": None,
    "userId": "alice",
    "actor": "root",
    "provider": "deepseek",
    "model": "deepseek-chat",
    "keyHint": "…cdef",
    "url": "https://hooks.example.com/aijobs",
    "artifactType": "quiz_question",
    "nextCursor": None,
}
NAMED_EXAMPLES = {to_camel(k): v for k, v in _NAMED_EXAMPLES.items()}


def example_of(
    schema: dict[str, Any], comps: dict[str, Any], depth: int = 0, name: str = ""
) -> Any:
    """A plausible value of `schema` (for documentation only)."""
    if name in NAMED_EXAMPLES:
        return NAMED_EXAMPLES[name]
    schema = _resolve(schema, comps)
    if depth > 8:
        return None
    for key in ("examples",):
        if schema.get(key):
            return schema[key][0]
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = [o for o in schema.get(key, []) if o.get("type") != "null"]
        if options:
            return example_of(options[0], comps, depth + 1)
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        return {k: example_of(v, comps, depth + 1, k) for k, v in props.items()}
    if kind == "array":
        return [example_of(schema.get("items", {}), comps, depth + 1)]
    if kind == "integer":
        return max(int(schema.get("minimum", 1)), 0)
    if kind == "number":
        return 0.0012
    if kind == "boolean":
        return False
    if kind == "string":
        fmt = schema.get("format")
        return {
            "date-time": "2026-12-04T20:00:00Z",
            "date": "2026-12-04",
            "uuid": "4cd166ee-5b1a-4f7e-9d65-0c3f2a1b9e10",
            "uri": "https://example.com",
        }.get(fmt or "", "string")
    return None


def _describe_properties(comps: dict[str, Any]) -> None:
    for comp in comps.values():
        if not isinstance(comp, dict):
            continue
        for name, prop in comp.get("properties", {}).items():
            prop.setdefault("description", GLOSSARY.get(name, human_title(name)))
            prop["title"] = human_title(name)


def _examples(method: str, path: str, op: dict[str, Any], comps: dict[str, Any]) -> None:
    body = op.get("requestBody", {}).get("content", {}).get("application/json")
    if body is not None and "example" not in body and "examples" not in body:
        given = BODY_EXAMPLES.get((method, path))
        body["example"] = given if given is not None else example_of(body["schema"], comps)
    for status, response in op.get("responses", {}).items():
        if not status.startswith("2"):
            continue
        for media_type, media in response.get("content", {}).items():
            if "example" in media or "examples" in media:
                continue
            if media_type == "text/event-stream":
                media["example"] = _STREAM_EXAMPLE
            elif media_type.startswith("text/"):
                media["example"] = "# HELP aijobs_jobs ...\n"
            else:
                media["example"] = example_of(media.get("schema", {}), comps)


def describe(schema: dict[str, Any], public_types: list[str]) -> None:
    """Fills in what a reader needs (see the module's docstring); never changes a shape."""
    comps = schema["components"]["schemas"]
    _describe_properties(comps)
    for path, item in schema.get("paths", {}).items():
        for method, op in item.items():
            if not isinstance(op, dict) or "responses" not in op:
                continue
            op.setdefault("summary", human_title(op.get("operationId", path)))
            if not op.get("description"):
                op["description"] = DESCRIPTIONS.get((method, path), op["summary"] + ".")
            _examples(method, path, op, comps)
    create = schema["paths"]["/api/ai/jobs"]["post"]["requestBody"]["content"]["application/json"]
    create.pop("example", None)
    create["examples"] = {
        t: {"summary": f"Create a {t} job", "value": CREATE_EXAMPLES[t]}
        for t in public_types
        if t in CREATE_EXAMPLES
    }
    quote = schema["paths"]["/api/ai/jobs/quote"]["post"]["requestBody"]["content"]
    quote["application/json"].pop("example", None)
    quote["application/json"]["examples"] = create["examples"]
