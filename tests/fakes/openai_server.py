"""A local fake OpenAI-compatible server for the tests (loopback only).

Behaviour is scripted: `POST /_script` queues steps that the chat endpoint consumes one per call,
in order; when the queue is empty the `default` step answers (itself defaulting to a valid `{}`).
`GET /_calls` reports what the server saw, `GET /_messages` the chat `messages` of every call
in order (to assert on prompts, e.g. a retry's corrective instruction), `POST /_reset` forgets
everything.

Step kinds (a step is a JSON object with `kind` and optional fields):
- `valid`: 200 with `content` (an object, default `{}`) serialised as the message content (or
  `content_text`, a string, as it is), finish_reason "stop", usage `tokens_in` (default 11) /
  `tokens_out` (default 7; `"max"`: the request's `max_tokens`);
- `invalid_json`: 200 whose content is "this is not json {";
- `schema_invalid`: 200 whose content is `{"unexpected": true}`;
- `status`: HTTP `status` (default 500) with an OpenAI-style error body
  (`message`, `code` optional) and a Retry-After header if `retry_after` is given;
- `rate_limited`: 429 with Retry-After `retry_after` (default "1");
- `slow`: waits `delay_s` (default 1.0), then answers like `valid`; the wait ends early when the
  client disconnects, so cancelled callers do not keep the server busy;
- `content_filter`: 200 with finish_reason "content_filter" and content "";
- `malformed`: 200 whose JSON is not a chat completion (no `choices`), for parser tests.

`rules` (optional, with `POST /_script`) answer some calls whatever the queue holds: a list of
`{"match": TEXT, "step": STEP}`; a call whose Authorization header or messages contain TEXT is
answered by the first matching rule's step and consumes no queued step (one tenant's key or
input rejected while the others' calls go through).

Any step may carry `echo_model`: the `model` the answer reports instead of the requested one
(OpenAI answers a request for `gpt-4o-mini` with a dated id such as `gpt-4o-mini-2024-07-18`),
and `headers`: extra response headers of a `valid` or `slow` answer (OpenAI's
`x-ratelimit-*`). A `valid` or `slow` step may carry `usage_extra`: fields merged into the
answer's `usage` (OpenAI's `prompt_tokens_details`/`completion_tokens_details`, DeepSeek's
`prompt_cache_hit_tokens`/`prompt_cache_miss_tokens`).

Streaming: a call whose body says `"stream": true` is answered by a `valid` or `slow` step
with a `text/event-stream` of chat-completion chunks (after a `slow` step's wait): the content
in pieces of `chunk_chars` characters (default 8), `chunk_delay_s` seconds apart (default 0),
preceded by the step's `reasoning` text (DeepSeek's `reasoning_content` deltas) if any, then a
chunk with finish_reason "stop", then (when the call asked for `stream_options.include_usage`)
a usage chunk with empty `choices`, then `data: [DONE]`. `cut_after: N` ends the stream after N
content pieces: `cut: "close"` (default) ends the body there without a finish or [DONE],
`cut: "abort"` breaks the connection mid-body. `stream_json: true` answers a streamed call with
a plain JSON completion instead (as many mocks and proxies do). `hold_at: N` stops the stream
before its content piece N (before a `cut_after` there) until `POST /_release` is called (a
test decides when the answer may end, instead of sleeping); `GET /_streams` then reports
`held` (how many streams waited there, counted when they started to wait), and `pieces`: per
streamed answer, `[end, at]` for each content piece (its end offset in the content, and when it
was handed to the server, epoch seconds), for the latency bench (bench/stream_items.py).
`GET /_streams` reports, per call in order, whether it asked to stream (`stream`,
`include_usage`) and, per streamed answer, how it ended (`ends`: "complete", "cut",
"aborted" or "client_gone").

`GET /_timings` reports when each call arrived (`started_at`, epoch seconds) and the most calls
it ever had in flight at once (`max_in_flight`), for the provider-limit tests.
`GET /_max_tokens` reports the answer budget (`max_tokens`, or null) each call asked for, in
order, for the cost-cap tests.

Files and Batches (`/files`, `/batches`, ...; `POST /_batch_script`, `GET /_batches`): see
tests/fakes/openai_batches.py. Moderations (`/moderations`; `POST /_moderation`,
`GET /_moderation`) and the refusal of a structured-output form (`POST /_forms`,
`GET /_forms`): see tests/fakes/openai_moderation.py. A batch's lines are answered from the
same script as chat calls but are not counted as chat calls.

The `Authorization` headers seen are kept for assertions: this server is for fake keys only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field, field_validator

from tests.fakes.openai_batches import install_batch_routes
from tests.fakes.openai_moderation import install_moderation_routes

STEP_KINDS = frozenset(
    {
        "valid",
        "invalid_json",
        "schema_invalid",
        "status",
        "rate_limited",
        "slow",
        "content_filter",
        "malformed",
    }
)
DEFAULT_STEP: dict[str, Any] = {"kind": "valid", "content": {}}
_DISCONNECT_POLL_S = 0.05


def _check_step(step: dict[str, Any]) -> dict[str, Any]:
    kind = step.get("kind")
    if kind not in STEP_KINDS:
        raise ValueError(f"unknown step kind {kind!r}; expected one of {sorted(STEP_KINDS)}")
    return step


class Rule(BaseModel):
    match: str = Field(min_length=1)
    step: dict[str, Any]

    @field_validator("step")
    @classmethod
    def _valid_step(cls, step: dict[str, Any]) -> dict[str, Any]:
        return _check_step(step)


class ScriptBody(BaseModel):
    steps: list[dict[str, Any]] = Field(default_factory=list)
    default: dict[str, Any] | None = None
    rules: list[Rule] = Field(default_factory=list)

    @field_validator("steps")
    @classmethod
    def _valid_steps(cls, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [_check_step(step) for step in steps]

    @field_validator("default")
    @classmethod
    def _valid_default(cls, step: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if step is None else _check_step(step)


class _FakeState:
    """Mutable state of one fake app; only touched from the server's event loop."""

    def __init__(self) -> None:
        self.steps: deque[dict[str, Any]] = deque()
        self.default: dict[str, Any] = dict(DEFAULT_STEP)
        self.rules: list[Rule] = []
        self.authorizations: list[str | None] = []
        self.models: list[str | None] = []
        self.messages: list[Any] = []  # each call's `messages` (prompts: fake data only)
        self.started_at: list[float] = []
        self.max_tokens: list[int | None] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.streams: list[bool] = []
        self.include_usage: list[bool] = []
        self.stream_ends: list[str] = []
        self.release = asyncio.Event()
        self.held = 0
        self.pieces: list[list[list[float]]] = []

    def reset(self) -> None:
        self.steps.clear()
        self.default = dict(DEFAULT_STEP)
        self.rules = []
        self.authorizations.clear()
        self.models.clear()
        self.messages.clear()
        self.started_at.clear()
        self.max_tokens.clear()
        self.in_flight = self.max_in_flight = 0
        self.streams.clear()
        self.include_usage.clear()
        self.stream_ends.clear()
        self.release = asyncio.Event()
        self.held = 0
        self.pieces.clear()

    def next_step(self) -> dict[str, Any]:
        return self.steps.popleft() if self.steps else self.default


def _completion(
    model: str, content: str, *, finish_reason: str, tokens_in: int, tokens_out: int
) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-fake-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": tokens_in,
            "completion_tokens": tokens_out,
            "total_tokens": tokens_in + tokens_out,
        },
    }


def _content(step: Mapping[str, Any]) -> str:
    """A step's answer text: `content_text` as it is, else `content` as JSON."""
    text = step.get("content_text")
    return text if isinstance(text, str) else json.dumps(step.get("content", {}))


def _valid_response(step: Mapping[str, Any], model: str) -> Response:
    content = _content(step)
    body = _completion(
        model,
        content,
        finish_reason="stop",
        tokens_in=int(step.get("tokens_in", 11)),
        tokens_out=int(step.get("tokens_out", 7)),
    )
    body["usage"].update(dict(step.get("usage_extra") or {}))
    # Escaped to ASCII, as json.dumps does: a `content_text` may hold what UTF-8 cannot encode
    # (a lone surrogate), which JSON can still carry as an escape.
    return Response(
        json.dumps(body).encode(),
        media_type="application/json",
        headers={str(k): str(v) for k, v in dict(step.get("headers") or {}).items()},
    )


def _whole_answer(step: Mapping[str, Any], model_name: str) -> Response:
    """The non-streamed answer of a step (a `slow` step after its wait answers as `valid`)."""
    kind = step["kind"]
    if kind in ("valid", "slow"):
        return _valid_response(step, model_name)
    if kind in ("invalid_json", "schema_invalid"):
        content = "this is not json {" if kind == "invalid_json" else '{"unexpected": true}'
        return JSONResponse(
            _completion(model_name, content, finish_reason="stop", tokens_in=11, tokens_out=7)
        )
    if kind == "status":
        headers: dict[str, str] = {}
        if step.get("retry_after") is not None:
            headers["Retry-After"] = str(step["retry_after"])
        return JSONResponse(
            {
                "error": {
                    "message": str(step.get("message", "scripted error")),
                    "code": step.get("code"),
                }
            },
            status_code=int(step.get("status", 500)),
            headers=headers,
        )
    if kind == "rate_limited":
        return JSONResponse(
            {"error": {"message": "rate limited", "code": "rate_limit_exceeded"}},
            status_code=429,
            headers={"Retry-After": str(step.get("retry_after", "1"))},
        )
    if kind == "content_filter":
        return JSONResponse(
            _completion(model_name, "", finish_reason="content_filter", tokens_in=11, tokens_out=0)
        )
    # "malformed"
    return JSONResponse({"id": "chatcmpl-fake", "object": "chat.completion"})


class _Abort(Exception):
    """Raised inside a streamed body to break the connection mid-answer."""


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-fake-stream",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


def _streamed_response(
    state: _FakeState, step: Mapping[str, Any], model: str, include_usage: bool
) -> StreamingResponse:
    content = _content(step)
    size = max(1, int(step.get("chunk_chars", 8)))
    delay_s = float(step.get("chunk_delay_s", 0.0))
    cut_after = step.get("cut_after")
    pieces = [content[i : i + size] for i in range(0, len(content), size)]
    reasoning = str(step.get("reasoning", ""))
    thoughts = [reasoning[i : i + size] for i in range(0, len(reasoning), size)]
    usage = {
        "prompt_tokens": int(step.get("tokens_in", 11)),
        "completion_tokens": int(step.get("tokens_out", 7)),
    }
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    usage.update(dict(step.get("usage_extra") or {}))

    async def body() -> Any:
        end = "client_gone"
        sent: list[list[float]] = []
        state.pieces.append(sent)
        try:
            yield _chunk(model, {"role": "assistant", "content": ""})
            for thought in thoughts:
                yield _chunk(model, {"reasoning_content": thought})
            for n, piece in enumerate(pieces):
                if step.get("hold_at") is not None and n == int(step["hold_at"]):
                    state.held += 1
                    await state.release.wait()
                if cut_after is not None and n >= int(cut_after):
                    if step.get("cut") == "abort":
                        end = "aborted"
                        raise _Abort
                    end = "cut"
                    return
                if delay_s > 0:
                    await asyncio.sleep(delay_s)
                sent.append([n * size + len(piece), time.time()])
                yield _chunk(model, {"content": piece})
            yield _chunk(model, {}, "stop")
            if include_usage:
                tail = {"id": "chatcmpl-fake-stream", "model": model, "choices": [], "usage": usage}
                yield f"data: {json.dumps(tail)}\n\n".encode()
            yield b"data: [DONE]\n\n"
            end = "complete"
        finally:
            state.stream_ends.append(end)

    headers = {str(k): str(v) for k, v in dict(step.get("headers") or {}).items()}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)


async def _sleep_unless_disconnected(request: Request, delay_s: float) -> bool:
    """Sleep `delay_s`; return False early if the client went away meanwhile."""
    deadline = time.monotonic() + delay_s
    while (remaining := deadline - time.monotonic()) > 0:
        if await request.is_disconnected():
            return False
        await asyncio.sleep(min(_DISCONNECT_POLL_S, remaining))
    return True


def create_fake_app() -> FastAPI:
    """A fresh app with its own (empty) script and call log."""
    app = FastAPI(title="fake-openai", docs_url=None, redoc_url=None, openapi_url=None)
    state = _FakeState()
    app.state.fake = state

    async def chat_completions(request: Request) -> Response:
        state.started_at.append(time.time())
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            return await answer(request)
        finally:
            state.in_flight -= 1

    async def answer(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            body = None
        model = body.get("model") if isinstance(body, dict) else None
        state.authorizations.append(request.headers.get("authorization"))
        state.models.append(model if isinstance(model, str) else None)
        state.messages.append(body.get("messages") if isinstance(body, dict) else None)
        budget = body.get("max_tokens") if isinstance(body, dict) else None
        state.max_tokens.append(budget if isinstance(budget, int) else None)
        streamed = isinstance(body, dict) and body.get("stream") is True
        options = body.get("stream_options") if isinstance(body, dict) else None
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        state.streams.append(streamed)
        state.include_usage.append(include_usage)
        if not isinstance(body, dict):
            return JSONResponse(
                {"error": {"message": "invalid JSON body", "code": "invalid_request"}},
                status_code=400,
            )
        model_name = model if isinstance(model, str) else "fake-model"
        refused = moderation.form_refusal(body)
        if refused is not None:
            return refused
        step = pick_step(request.headers.get("authorization"), body)
        model_name = str(step.get("echo_model", model_name))
        kind = step["kind"]
        streams = streamed and not step.get("stream_json")
        if kind in ("valid", "slow") and streams:
            if kind == "slow" and not await _sleep_unless_disconnected(
                request, float(step.get("delay_s", 1.0))
            ):
                return JSONResponse({"error": {"message": "client gone"}}, status_code=499)
            return _streamed_response(state, step, model_name, include_usage)
        if kind == "slow":
            if not await _sleep_unless_disconnected(request, float(step.get("delay_s", 1.0))):
                return JSONResponse({"error": {"message": "client gone"}}, status_code=499)
        return _whole_answer(step, model_name)

    def pick_step(authorization: str | None, body: dict[str, Any]) -> dict[str, Any]:
        """The step that answers a request: the first matching rule's, else the next queued."""
        seen = f"{authorization}\n{json.dumps(body.get('messages'))}"
        ruled = next((r.step for r in state.rules if r.match in seen), None)
        step = ruled if ruled is not None else state.next_step()
        if step.get("tokens_out") == "max":  # the answer takes the whole budget asked for
            step = {**step, "tokens_out": int(body.get("max_tokens") or 7)}
        return step

    def answer_line(authorization: str | None, body: dict[str, Any]) -> tuple[int, Any]:
        """A batch line answered as a chat call would be (never streamed, no wait): its HTTP
        status and JSON body. Not counted as a chat call."""
        model = body.get("model")
        refused = moderation.form_refusal(body)
        if refused is not None:
            return refused.status_code, json.loads(bytes(refused.body))
        step = pick_step(authorization, body)
        name = str(step.get("echo_model", model if isinstance(model, str) else "fake-model"))
        response = _whole_answer(step, name)
        return response.status_code, json.loads(bytes(response.body))

    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_api_route("/chat/completions", chat_completions, methods=["POST"])
    batches = install_batch_routes(app, answer_line)
    moderation = install_moderation_routes(app)

    @app.post("/_script")
    async def script(body: ScriptBody) -> dict[str, int]:
        state.steps = deque(body.steps)
        state.default = body.default if body.default is not None else dict(DEFAULT_STEP)
        state.rules = list(body.rules)
        return {"queued": len(state.steps)}

    @app.get("/_calls")
    async def calls() -> dict[str, Any]:
        return {
            "count": len(state.authorizations),
            "authorizations": list(state.authorizations),
            "models": list(state.models),
        }

    @app.get("/_timings")
    async def timings() -> dict[str, Any]:
        return {"started_at": list(state.started_at), "max_in_flight": state.max_in_flight}

    @app.get("/_max_tokens")
    async def max_tokens() -> dict[str, Any]:
        return {"max_tokens": list(state.max_tokens)}

    @app.get("/_streams")
    async def streams() -> dict[str, Any]:
        return {
            "stream": list(state.streams),
            "include_usage": list(state.include_usage),
            "ends": list(state.stream_ends),
            "held": state.held,
            "pieces": state.pieces,
        }

    @app.post("/_release")
    async def release() -> dict[str, bool]:
        state.release.set()
        batches.release()
        return {"released": True}

    @app.get("/_messages")
    async def messages() -> dict[str, Any]:
        return {"messages": list(state.messages)}

    @app.post("/_reset")
    async def reset() -> dict[str, bool]:
        state.reset()
        batches.reset()
        moderation.reset()
        return {"reset": True}

    return app


class FakeOpenAIServer:
    """Runs `create_fake_app()` with uvicorn on 127.0.0.1 in a background thread.

    Use as `with FakeOpenAIServer() as fake:` or `async with FakeOpenAIServer() as fake:`.
    The port is chosen by binding port 0 before uvicorn starts, so there is no race with other
    processes. `stop()` asks uvicorn to exit and joins the thread; in-flight slow requests are
    abandoned after a 1 s graceful period.
    """

    def __init__(self, *, start_timeout_s: float = 10.0) -> None:
        self._start_timeout_s = start_timeout_s
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("FakeOpenAIServer is not running")
        return self._port

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL (`.../v1`) to give an `OpenAICompatibleProvider`."""
        return f"{self.root_url}/v1"

    def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("FakeOpenAIServer already started")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self._port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            create_fake_app(),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="fake-openai", daemon=True
        )
        self._server, self._thread = server, thread
        thread.start()
        deadline = time.monotonic() + self._start_timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("fake OpenAI server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is not None:
            server.should_exit = True
        if thread is not None:
            thread.join(timeout=10)
        self._server = self._thread = None
        self._port = None

    def __enter__(self) -> FakeOpenAIServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> FakeOpenAIServer:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)

    # --- control helpers -------------------------------------------------------------------

    @staticmethod
    def _script_body(
        steps: Sequence[Mapping[str, Any]],
        default: Mapping[str, Any] | None,
        rules: Sequence[tuple[str, Mapping[str, Any]]] = (),
    ) -> dict[str, Any]:
        return {
            "steps": [dict(step) for step in steps],
            "default": None if default is None else dict(default),
            "rules": [{"match": match, "step": dict(step)} for match, step in rules],
        }

    def script(
        self, steps: Sequence[Mapping[str, Any]], default: Mapping[str, Any] | None = None
    ) -> None:
        """Replace the queue of scripted steps (and the default step).

        Control calls ignore proxy environment variables: the server is always on loopback.
        """
        response = httpx.post(
            f"{self.root_url}/_script", json=self._script_body(steps, default), trust_env=False
        )
        response.raise_for_status()

    def calls(self) -> dict[str, Any]:
        response = httpx.get(f"{self.root_url}/_calls", trust_env=False)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def reset(self) -> None:
        httpx.post(f"{self.root_url}/_reset", trust_env=False).raise_for_status()

    async def ascript(
        self,
        steps: Sequence[Mapping[str, Any]],
        default: Mapping[str, Any] | None = None,
        *,
        rules: Sequence[tuple[str, Mapping[str, Any]]] = (),
    ) -> None:
        """Replace the script; `rules` are (text, step) pairs answered before the queue. Sent
        as ASCII JSON, so a step may hold a lone surrogate (escaped on the way)."""
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await client.post(
                f"{self.root_url}/_script",
                content=json.dumps(self._script_body(steps, default, rules)),
                headers={"Content-Type": "application/json"},
            )
            response.raise_for_status()

    async def acalls(self) -> dict[str, Any]:
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await client.get(f"{self.root_url}/_calls")
            response.raise_for_status()
            result: dict[str, Any] = response.json()
            return result

    async def atimings(self) -> dict[str, Any]:
        """`started_at` (each call's arrival, epoch seconds) and `max_in_flight`."""
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await client.get(f"{self.root_url}/_timings")
            response.raise_for_status()
            result: dict[str, Any] = response.json()
            return result

    async def amax_tokens(self) -> list[int | None]:
        """The `max_tokens` each chat call asked for (None where absent), in order."""
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await client.get(f"{self.root_url}/_max_tokens")
            response.raise_for_status()
            result: list[int | None] = response.json()["max_tokens"]
            return result

    async def amessages(self) -> list[Any]:
        """The `messages` list of every chat call so far, in order."""
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await client.get(f"{self.root_url}/_messages")
            response.raise_for_status()
            result: list[Any] = response.json()["messages"]
            return result

    async def astreams(self) -> dict[str, Any]:
        """Per call: `stream` and `include_usage` asked; per streamed answer, how it `ends`."""
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await client.get(f"{self.root_url}/_streams")
            response.raise_for_status()
            result: dict[str, Any] = response.json()
            return result

    async def arelease(self) -> None:
        """Let the streams held at their `hold_at` piece go on."""
        async with httpx.AsyncClient(trust_env=False) as client:
            (await client.post(f"{self.root_url}/_release")).raise_for_status()

    async def abatch_script(self, **script: Any) -> None:
        """Replace the batch script (tests/fakes/openai_batches.py: hold, end_status, ...)."""
        async with httpx.AsyncClient(trust_env=False) as client:
            (await client.post(f"{self.root_url}/_batch_script", json=script)).raise_for_status()

    async def abatches(self) -> dict[str, Any]:
        """The batches seen (`batches`: id, status, lines, requests), `uploads`, `cancels`."""
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await client.get(f"{self.root_url}/_batches")
            response.raise_for_status()
            result: dict[str, Any] = response.json()
            return result

    async def amoderation(self, **script: Any) -> None:
        """Script the moderations endpoint (`flag` terms, `status`, `fail_times`)."""
        async with httpx.AsyncClient(trust_env=False) as client:
            (await client.post(f"{self.root_url}/_moderation", json=script)).raise_for_status()

    async def amoderations(self) -> list[dict[str, Any]]:
        """Every moderation request seen (`model`, `input`, `authorization`), in order."""
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await client.get(f"{self.root_url}/_moderation")
            response.raise_for_status()
            result: list[dict[str, Any]] = response.json()["requests"]
            return result

    async def arefuse_forms(self, *forms: str) -> None:
        """Answer DeepSeek's 400 to every chat call asking for one of `forms`."""
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await client.post(f"{self.root_url}/_forms", json={"refuse": list(forms)})
            response.raise_for_status()

    async def aforms(self) -> list[dict[str, Any]]:
        """Each chat call's requested form (`type`, and `json_schema` when it sent one)."""
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await client.get(f"{self.root_url}/_forms")
            response.raise_for_status()
            result: list[dict[str, Any]] = response.json()["forms"]
            return result

    async def areset(self) -> None:
        async with httpx.AsyncClient(trust_env=False) as client:
            (await client.post(f"{self.root_url}/_reset")).raise_for_status()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fake OpenAI-compatible server (loopback).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8999)
    args = parser.parse_args(argv)
    uvicorn.run(create_fake_app(), host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
