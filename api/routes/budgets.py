"""SUPER_ADMIN routes: the budgets of an organisation, a team or a tag (docs/money.md). A PUT
creates or replaces one (the period's spend stays), a DELETE removes it; each writes its audit
entry in its own transaction. Every answer shows the budget as it holds now: the period's
spend (its usage rows) and its scope's open reservations."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response, status
from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from api.deps import Admin, State
from api.errors import PROBLEM
from api.schemas import Camel, UsdAmount
from db import scope_budgets as scope_budgets_db
from engine.errors import BudgetNotFound
from engine.scopes import MAX_TAGS, SCOPE_ID_PATTERN, Period, Scope
from jobs import scope_budgets
from jobs.audit import BUDGET_DELETE, BUDGET_PUT, AuditEntry, AuditLog
from jobs.scope_budgets import ScopeHolding

router = APIRouter(prefix="/admin-api/ai/budgets", tags=["admin"])

ScopePath = Annotated[
    Scope, Path(description="Whose budget: an organisation's, a team's or a tag's")
]
ScopeIdPath = Annotated[
    str,
    Path(
        alias="scopeId",
        min_length=1,
        max_length=64,
        pattern=SCOPE_ID_PATTERN,
        description="The organisation or team id (a token's claim) or the tag",
    ),
]
Fraction = Annotated[float, Field(gt=0, le=1, strict=True, allow_inf_nan=False)]
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {
        "description": "No budget for this scope and id (`BUDGET_NOT_FOUND`)",
        "content": {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }
}


class BudgetBody(Camel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    limit_usd: Decimal = Field(
        gt=0,
        max_digits=18,
        decimal_places=8,
        allow_inf_nan=False,
        description="At most this much spend plus open reservations per period, in USD (a "
        "positive number or decimal string, at most 8 decimal places)",
        examples=["25.00"],
    )
    period: Period = Field(description="UTC days or UTC months")
    alert_at: list[Fraction] = Field(
        default_factory=list,
        max_length=MAX_TAGS,
        description="Fractions of the limit in (0, 1] (at most 10): when the period's spend "
        "reaches one, one `ai.budget.threshold_crossed` event goes to the admin webhooks",
        examples=[[0.5, 0.8]],
    )


class BudgetOut(Camel):
    scope: Scope
    scope_id: str
    limit_usd: UsdAmount
    period: Period
    alert_at: list[float]
    spent_usd: UsdAmount = Field(description="The scope's calls in the current period")
    reserved_usd: UsdAmount = Field(
        description="The open reservations of the scope's jobs (a call in flight counts here "
        "until its usage row is written)"
    )
    resets_at: dt.datetime = Field(description="When the current period ends (UTC)")


class BudgetList(Camel):
    items: list[BudgetOut]


def _out(h: ScopeHolding) -> dict[str, Any]:
    b = h.budget
    return BudgetOut(
        scope=b.scope,  # the CHECK constraint keeps it a Scope
        scope_id=b.scope_id,
        limit_usd=b.limit_usd,
        period=b.period,  # likewise a Period
        alert_at=[float(a) for a in b.alert_at],
        spent_usd=h.held.spent_usd,
        reserved_usd=h.held.reserved_usd,
        resets_at=h.resets_at,
    ).model_dump(mode="json", by_alias=True)


@router.put(
    "/{scope}/{scopeId}",
    response_model=BudgetOut,
    summary="Create or replace the budget of an organisation, a team or a tag",
    description=(
        "The budget applies to every job of the scope (a job counts in its organisation's, "
        "each of its teams' and each of its tags'): a create, a quote, a retry or a "
        "schedule's run is admitted only if the period's spend + open reservations + its worst "
        "case stay within `limitUsd`. Replacing a budget keeps the period's spend and the "
        "alerts already sent in it. Audited as `budget.put`."
    ),
)
async def put_budget(
    scope: ScopePath, scope_id: ScopeIdPath, body: BudgetBody, state: State, admin: Admin
) -> dict[str, Any]:
    audit = AuditLog(state.sessionmaker)
    entry = AuditEntry(admin.user_id, BUDGET_PUT, "budget", f"{scope}:{scope_id}")
    now = dt.datetime.now(dt.UTC)
    async with audit.refusals(entry), state.sessionmaker.begin() as s:
        row = await scope_budgets_db.put(
            s,
            scope,
            scope_id,
            limit_usd=body.limit_usd,
            period=body.period,
            alert_at=[Decimal(str(a)) for a in body.alert_at],
        )
        # In the PUT's transaction: the entry exists if and only if the budget does.
        await audit.write(
            s,
            entry,
            "put",
            limitUsd=str(body.limit_usd),
            period=body.period,
            alertAt=list(body.alert_at),
        )
        (held,) = await scope_budgets.holding(s, [row], now)
    return _out(held)


@router.get(
    "/{scope}/{scopeId}",
    response_model=BudgetOut,
    responses=_NOT_FOUND,
    summary="A budget as it holds now",
)
async def get_budget(
    scope: ScopePath, scope_id: ScopeIdPath, state: State, _admin: Admin
) -> dict[str, Any]:
    async with state.sessionmaker.begin() as s:
        row = await scope_budgets_db.get(s, scope, scope_id)
        if row is None:
            raise BudgetNotFound(f"No {scope} budget for {scope_id!r}.")
        (held,) = await scope_budgets.holding(s, [row], dt.datetime.now(dt.UTC))
    return _out(held)


@router.delete(
    "/{scope}/{scopeId}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses=_NOT_FOUND,
    summary="Remove a budget",
    description="Its scope's jobs are no longer limited by it. Audited as `budget.delete`.",
)
async def delete_budget(
    scope: ScopePath, scope_id: ScopeIdPath, state: State, admin: Admin
) -> Response:
    audit = AuditLog(state.sessionmaker)
    entry = AuditEntry(admin.user_id, BUDGET_DELETE, "budget", f"{scope}:{scope_id}")
    async with audit.refusals(entry), state.sessionmaker.begin() as s:
        if not await scope_budgets_db.delete(s, scope, scope_id):
            raise BudgetNotFound(f"No {scope} budget for {scope_id!r}.")
        await audit.write(s, entry, "deleted")
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("", response_model=BudgetList, summary="Every budget, or every budget of one scope")
async def list_budgets(
    state: State,
    _admin: Admin,
    scope: Annotated[Scope | None, Query(description="Only this scope's budgets")] = None,
) -> dict[str, Any]:
    async with state.sessionmaker.begin() as s:
        rows = await scope_budgets_db.list_budgets(s, scope)
        held = await scope_budgets.holding(s, rows, dt.datetime.now(dt.UTC)) if rows else []
    return {"items": [_out(h) for h in held]}
