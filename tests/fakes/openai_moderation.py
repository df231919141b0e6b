"""The fake OpenAI server's moderations endpoint and its refusal of a structured-output form
(tests/fakes/openai_server.py mounts both).

- `POST /moderations` (also `/v1/moderations`): OpenAI's body `{"model", "input": [texts]}`;
  answers `{"id", "model", "results": [{"flagged", "categories", "category_scores"}]}`, a text
  flagged when it contains any of the scripted `flag` terms. `status` answers that HTTP status
  instead (an OpenAI error body), `fail_times` times (default: always).
- A chat call whose `response_format.type` is one of the scripted `refuse_forms` is answered
  400 with DeepSeek's error body ("This response_format type is unavailable now"), before any
  chat step is consumed; a call without `response_format` is type `none`.

Control: `POST /_moderation` `{"flag": [...], "status": N, "fail_times": N}` and
`POST /_forms` `{"refuse": [...]}` (each replaced whole); `GET /_moderation` reports every
moderation request (`model`, `input`, `authorization`) and `GET /_forms` every chat call's
requested form and, for `json_schema`, its `json_schema` member, in order. `POST /_reset` of the
server forgets all of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

DEEPSEEK_FORM_REFUSAL = {
    "error": {
        "message": "This response_format type is unavailable now",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_request_error",
    }
}


@dataclass
class ModerationState:
    flag: list[str] = field(default_factory=list)
    status: int | None = None
    fail_times: int | None = None
    failures: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    refuse_forms: list[str] = field(default_factory=list)
    forms: list[dict[str, Any]] = field(default_factory=list)

    def reset(self) -> None:
        self.flag, self.status, self.fail_times, self.failures = [], None, None, 0
        self.requests.clear()
        self.refuse_forms = []
        self.forms.clear()

    def form_refusal(self, body: dict[str, Any]) -> JSONResponse | None:
        """Record the chat call's form; DeepSeek's 400 when that form is refused."""
        fmt = body.get("response_format")
        kind = fmt.get("type") if isinstance(fmt, dict) else "none"
        schema = fmt.get("json_schema") if isinstance(fmt, dict) else None
        self.forms.append({"type": kind, "json_schema": schema})
        if kind in self.refuse_forms:
            return JSONResponse(DEEPSEEK_FORM_REFUSAL, status_code=400)
        return None


def install_moderation_routes(app: FastAPI) -> ModerationState:
    state = ModerationState()

    async def moderations(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            body = None
        texts = body.get("input") if isinstance(body, dict) else None
        state.requests.append(
            {
                "model": body.get("model") if isinstance(body, dict) else None,
                "input": texts,
                "authorization": request.headers.get("authorization"),
            }
        )
        if state.status is not None and (
            state.fail_times is None or state.failures < state.fail_times
        ):
            state.failures += 1
            error = {"error": {"message": "scripted moderation failure", "code": "server_error"}}
            return JSONResponse(error, status_code=state.status)
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list):
            return JSONResponse({"error": {"message": "input required"}}, status_code=400)
        results = []
        for text in texts:
            flagged = any(term in str(text) for term in state.flag)
            results.append(
                {
                    "flagged": flagged,
                    "categories": {"violence": flagged},
                    "category_scores": {"violence": 0.99 if flagged else 0.01},
                }
            )
        model = body.get("model") if isinstance(body, dict) else None
        return JSONResponse({"id": "modr-fake", "model": model, "results": results})

    app.add_api_route("/v1/moderations", moderations, methods=["POST"])
    app.add_api_route("/moderations", moderations, methods=["POST"])

    @app.post("/_moderation")
    async def script(body: dict[str, Any]) -> dict[str, bool]:
        state.flag = [str(t) for t in body.get("flag", [])]
        state.status = body.get("status")
        state.fail_times = body.get("fail_times")
        state.failures = 0
        return {"scripted": True}

    @app.get("/_moderation")
    async def seen() -> dict[str, Any]:
        return {"requests": list(state.requests)}

    @app.post("/_forms")
    async def forms(body: dict[str, Any]) -> dict[str, bool]:
        state.refuse_forms = [str(f) for f in body.get("refuse", [])]
        return {"scripted": True}

    @app.get("/_forms")
    async def forms_seen() -> dict[str, Any]:
        return {"forms": list(state.forms)}

    return state
