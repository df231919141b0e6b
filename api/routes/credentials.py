"""A user's own provider keys: add, list (masked), revoke (issue 6)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(prefix="/api/ai/credentials", tags=["credentials"])
