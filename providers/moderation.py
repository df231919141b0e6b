"""Output moderation through an OpenAI-compatible moderations endpoint.

`POST {base}/moderations` with OpenAI's body `{"model", "input": [texts]}`; the answer's
`results[i].flagged` says whether text i is flagged. Only what the caller passes is sent: the
engine passes an answer's items as the provider wrote them (placeholders, never the originals
they stand for: jobs/guardrails.py).

Every failure (transport, a non-2xx answer, a body that is not a moderation result for each
text) is `MODERATION_UNAVAILABLE`, retryable, with an internal message of the status or the
exception's type only; it says nothing about the chat provider (no breaker counts it, no call
moves to a fallback). The key travels only in the Authorization header; failures are raised
outside `except` blocks so no httpx object (whose request holds the key) rides along.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import httpx

from engine.errors import ExecutionFailure

UNAVAILABLE = "MODERATION_UNAVAILABLE"
DEFAULT_TIMEOUT_S = 30.0


@runtime_checkable
class Moderator(Protocol):
    async def flagged(self, texts: Sequence[str]) -> list[bool]:
        """One verdict per text, in order; raises MODERATION_UNAVAILABLE."""
        ...


def _failure(message: str) -> ExecutionFailure:
    return ExecutionFailure(UNAVAILABLE, internal_message=f"moderation: {message}")


def verdicts(data: Any, count: int) -> list[bool] | None:
    """`results[i].flagged` for each of `count` texts; None when the body is not that."""
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list) or len(results) != count:
        return None
    out = []
    for r in results:
        flagged = r.get("flagged") if isinstance(r, dict) else None
        if not isinstance(flagged, bool):
            return None
        out.append(flagged)
    return out


class OpenAIModeration:
    """`Moderator` over `{base_url}/moderations` with `model` and an optional key."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None,
        *,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._api_key = api_key
        self._timeout = httpx.Timeout(timeout_s)
        self._owns_client = client is None
        self._client = client if client is not None else httpx.AsyncClient()

    def __repr__(self) -> str:
        return f"OpenAIModeration({self.base_url!r}, {self.model!r})"

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def flagged(self, texts: Sequence[str]) -> list[bool]:
        if not texts:
            return []
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        body = {"model": self.model, "input": list(texts)}
        failure: ExecutionFailure
        try:
            response = await self._client.post(
                f"{self.base_url}/moderations", json=body, headers=headers, timeout=self._timeout
            )
        except (httpx.HTTPError, RuntimeError) as exc:
            failure = _failure(f"transport error: {type(exc).__name__}")
        else:
            if not 200 <= response.status_code < 300:
                failure = _failure(f"HTTP {response.status_code}")
            else:
                try:
                    data: Any = response.json()
                except ValueError:
                    data = None
                got = verdicts(data, len(texts))
                if got is not None:
                    return got
                failure = _failure("malformed answer")
        raise failure
