"""Token prices and context windows per model, and the cost of one provider call in USD.

Prices are USD per one million tokens, as `Decimal` so that sums are exact; costs are quantized
to 8 decimal places, half up.

A cost is never silently zero: the cost quotas (QUOTA_MAX_COST_USD_PER_DAY/MONTH) and the
budgets read the usage rows, so a call priced at 0 by mistake would spend money no budget sees.
The model a usage row is priced by is the one the provider echoes back, and providers echo ids
the table may not know (OpenAI answers `gpt-4o-mini-2024-07-18` to a request for
`gpt-4o-mini`). `PriceTable.canonical` maps such an id to a known model, in this order:

1. the exact id (case-insensitive);
2. the id without a trailing version: `-YYYY-MM-DD`, `-YYYYMMDD` or `-NNNN`
   (`gpt-4o-2024-08-06` -> `gpt-4o`, `deepseek-chat-0324` -> `deepseek-chat`);
3. the longest known model name the id starts with, followed by `-`, `.`, `:`, `@` or `_`
   (`gpt-4o-mini-search-preview` -> `gpt-4o-mini`, never `gpt-4o`).

An id none of these maps is charged the fallback price (AI_MODEL_FALLBACK_PRICE; by default the
most expensive input and output prices of the table, so a budget errs on the safe side), logged
once per model per table (one table per process) and counted in
`aijobs_unpriced_calls_total{model}`. A model that is free on purpose (a local model server) is
given an explicit zero price in AI_MODEL_PRICES; only the synthetic provider is free by default.

What a call is charged (`PriceTable.call_cost`): the provider's `prompt_tokens` include the
prompt tokens it served from its cache, and its `completion_tokens` include the reasoning
tokens of a reasoning model. So the cached part of the prompt is charged the cache-hit price
(`Price.usd_per_million_cached_in`; without one, the input price) instead of the input price,
the rest of the prompt the input price, and every completion token, reasoning included, the
output price: no token is charged twice.

Which price a call is charged at (`PriceTable.priced_as`): the reservation that let the job run
was made at the requested model's price, so an echoed id the table does not know is priced as
the requested model, never at the fallback (which may be cheaper than the reservation assumed,
or dearer than it allowed). Such echoes are counted through `on_unknown_echo`.

Service tiers (`Price.at_tier`): a `batch` call (the provider's Batch API) pays the model's batch
prices (`Price.usd_per_million_batch_in`/`_out`; without them half the standard prices, as
OpenAI's and Anthropic's batch tiers charge), its cached prompt tokens half the cache-hit price;
an `offpeak` call pays the standard prices times the discount window's price factor
(`discount`, e.g. 0.5; none known: the standard price, never less than was reserved); a
`standard` call the standard prices. The tier scales the whole price, so a charge at a tier is
never more than the same call's standard charge when the factor is at most 1.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from engine.tiers import SERVICE_TIERS

if TYPE_CHECKING:
    from engine.settings import Settings

log = logging.getLogger(__name__)

_MILLION = Decimal(1_000_000)
_QUANTUM = Decimal("0.00000001")  # 8 decimal places
# Version suffixes stripped from an unknown id (rule 2 above), tried in this order.
_VERSION_SUFFIXES = (
    re.compile(r"-\d{4}-\d{2}-\d{2}$"),
    re.compile(r"-\d{8}$"),
    re.compile(r"-\d{4}$"),
)
_PREFIX_BOUNDARY = "-.:@_"
_MAX_NAME = 128  # a model name longer than this is refused in AI_MODEL_PRICES
# Distinct unknown ids warned about per table: a provider echoing random ids cannot grow the
# set (or the log) without bound; past this, one more warning says so and the rest are quiet.
_MAX_WARNED = 100
_HALF = Decimal("0.5")


@dataclass(frozen=True)
class Price:
    """USD per million input and output tokens; `context_window` in tokens (None: unbounded,
    as for the synthetic provider); `usd_per_million_cached_in` the price of a prompt token the
    provider served from its cache (None: the input price); `usd_per_million_batch_in`/`_out`
    the prices of a call sent through the provider's Batch API (None: half the standard
    price)."""

    usd_per_million_in: Decimal
    usd_per_million_out: Decimal
    context_window: int | None = None
    # Left out of equality, so that prices compare as they did before cache-hit prices existed
    # (a table's entries are still told apart by what every model has).
    usd_per_million_cached_in: Decimal | None = field(default=None, compare=False)
    usd_per_million_batch_in: Decimal | None = field(default=None, compare=False)
    usd_per_million_batch_out: Decimal | None = field(default=None, compare=False)

    @property
    def cached_in(self) -> Decimal:
        """The cache-hit price of an input token (the input price when none is set)."""
        c = self.usd_per_million_cached_in
        return self.usd_per_million_in if c is None else c

    def at_tier(self, tier: str = "standard", discount: Decimal | None = None) -> Price:
        """The prices a call of `tier` pays, as a plain price (module docstring): `batch` the
        batch prices and half the cache-hit price, `offpeak` every price times `discount`
        (None: unchanged), `standard` this price itself. Only `offpeak` reads `discount`.
        Raises ValueError for an unknown tier or a negative or non-finite discount."""
        if tier not in SERVICE_TIERS:
            raise ValueError(f"unknown service tier {tier!r}")
        if tier == "batch":
            b_in, b_out = self.usd_per_million_batch_in, self.usd_per_million_batch_out
            return Price(
                self.usd_per_million_in * _HALF if b_in is None else b_in,
                self.usd_per_million_out * _HALF if b_out is None else b_out,
                self.context_window,
                self.cached_in * _HALF,
            )
        if tier == "offpeak" and discount is not None:
            if not discount.is_finite() or discount < 0:
                raise ValueError("an off-peak discount must be a non-negative factor")
            return Price(
                self.usd_per_million_in * discount,
                self.usd_per_million_out * discount,
                self.context_window,
                self.cached_in * discount,
            )
        return self


_D = Decimal
PRICES: dict[str, Price] = {
    "deepseek-chat": Price(Decimal("0.27"), Decimal("1.10"), 65_536, Decimal("0.07")),
    "deepseek-reasoner": Price(Decimal("0.55"), Decimal("2.19"), 65_536, Decimal("0.14")),
    # OpenAI's Batch API: half the standard prices, stated rather than left to the default.
    "gpt-4o-mini": Price(_D("0.15"), _D("0.60"), 128_000, _D("0.075"), _D("0.075"), _D("0.30")),
    "gpt-4o": Price(_D("2.50"), _D("10.00"), 128_000, _D("1.25"), _D("1.25"), _D("5.00")),
    "synthetic": Price(Decimal(0), Decimal(0), None),
}


def most_expensive(prices: Mapping[str, Price]) -> Price:
    """The highest input and the highest output price of `prices` (the default fallback)."""
    return Price(
        max((p.usd_per_million_in for p in prices.values()), default=Decimal(0)),
        max((p.usd_per_million_out for p in prices.values()), default=Decimal(0)),
        None,
    )


class PriceTable:
    """The prices one process charges with. Built once at startup (`from_settings`) and passed
    down (through the gateway to EXECUTE); `cost_usd` is what a usage row records.

    `on_unpriced(model)` is called once per call charged the fallback price (the worker wires
    the `aijobs_unpriced_calls_total` counter to it; the counter bounds its label), and
    `on_unknown_echo(echoed)` once per `priced_as` whose echoed id the table does not know (so
    priced as the requested model)."""

    def __init__(
        self,
        prices: Mapping[str, Price] | None = None,
        *,
        fallback: Price | None = None,
        on_unpriced: Callable[[str], None] | None = None,
        on_unknown_echo: Callable[[str], None] | None = None,
        warn: bool = True,
    ) -> None:
        table = PRICES if prices is None else prices
        self._prices = {name.strip().lower(): p for name, p in table.items()}
        # Longest first: rule 3 takes the first name that matches.
        self._by_length = sorted(self._prices, key=len, reverse=True)
        self.fallback = fallback if fallback is not None else most_expensive(self._prices)
        self._on_unpriced = on_unpriced
        self._on_unknown_echo = on_unknown_echo
        self._warn = warn
        self._warned: set[str] = set()
        self._overflowed = False
        self._lock = threading.Lock()

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        on_unpriced: Callable[[str], None] | None = None,
        on_unknown_echo: Callable[[str], None] | None = None,
    ) -> PriceTable:
        """The built-in table with AI_MODEL_PRICES merged over it (an entry replaces the
        built-in one of the same name) and AI_MODEL_FALLBACK_PRICE. Raises ValueError naming
        the setting when either is malformed."""
        prices = dict(PRICES)
        prices.update(parse_prices(settings.ai_model_prices))
        fallback = parse_fallback(settings.ai_model_fallback_price)
        return cls(
            prices, fallback=fallback, on_unpriced=on_unpriced, on_unknown_echo=on_unknown_echo
        )

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(sorted(self._prices))

    def canonical(self, model: str) -> str | None:
        """The known model `model` maps to (rules in the module docstring), None if none."""
        name = model.strip().lower()
        if name in self._prices:
            return name
        for suffix in _VERSION_SUFFIXES:
            stripped = suffix.sub("", name)
            if stripped != name and stripped in self._prices:
                return stripped
        for known in self._by_length:
            rest = name[len(known) :]
            if name.startswith(known) and rest and rest[0] in _PREFIX_BOUNDARY:
                return known
        return None

    def price_for(self, model: str) -> Price:
        """The price of `model`'s canonical model, or the fallback price (quietly: only
        `cost_usd` reports a charge at the fallback)."""
        known = self.canonical(model)
        return self._prices[known] if known is not None else self.fallback

    def context_window(self, model: str) -> int | None:
        """Tokens the model accepts (prompt and answer), None when unbounded or unknown."""
        known = self.canonical(model)
        return self._prices[known].context_window if known is not None else None

    def cost_usd(self, model: str, tokens_in: int, tokens_out: int) -> Decimal:
        """Cost of a call, quantized to 8 decimal places with ROUND_HALF_UP; an unknown model is
        charged the fallback price and reported."""
        return self.call_cost(model, tokens_in, tokens_out)

    def priced_as(self, echoed: str, requested: str) -> str:
        """The model a call is charged as: the canonical id of the provider's echo when the
        table knows it, else the requested model (its canonical id when known, else as given,
        which `call_cost` then charges at the fallback and reports). The reservation was made
        at the requested model's price, so an unknown echo never moves the charge off it; each
        unknown echo is reported to `on_unknown_echo`."""
        known = self.canonical(echoed) if echoed else None
        if known is not None:
            return known
        if echoed and self._on_unknown_echo is not None:
            self._on_unknown_echo(echoed[:_MAX_NAME])
        return self.canonical(requested) or requested

    def call_cost(
        self,
        model: str,
        tokens_in: int,
        tokens_out: int,
        cached_in: int = 0,
        *,
        tier: str = "standard",
        discount: Decimal | None = None,
    ) -> Decimal:
        """Cost of one call, quantized to 8 decimal places with ROUND_HALF_UP. `tokens_in` is
        the whole prompt and `cached_in` the part of it served from the provider's cache
        (charged the cache-hit price, the rest the input price; a count above `tokens_in` is
        cut to it); `tokens_out` is the whole answer, reasoning tokens included, all at the
        output price; every price at `tier` (`Price.at_tier`, with `discount` for `offpeak`).
        An unknown model is charged the fallback price and reported."""
        if tokens_in < 0 or tokens_out < 0 or cached_in < 0:
            raise ValueError("token counts must be non-negative")
        known = self.canonical(model)
        if known is None:
            base = self.fallback
            self._report_unpriced(model)
        else:
            base = self._prices[known]
        price = base.at_tier(tier, discount)
        cached = min(cached_in, tokens_in)
        raw = (
            Decimal(tokens_in - cached) * price.usd_per_million_in
            + Decimal(cached) * price.cached_in
            + Decimal(tokens_out) * price.usd_per_million_out
        ) / _MILLION
        return raw.quantize(_QUANTUM, rounding=ROUND_HALF_UP)

    def worst_case_cost(
        self,
        model: str,
        prompt_tokens: int,
        max_output_tokens: int,
        margin: float,
        *,
        tier: str = "standard",
        discount: Decimal | None = None,
    ) -> Decimal:
        """The most one call can cost, by the rule the create path reserves with
        (jobs/costs.py): the prompt padded by `margin` (ceil of tokens * (1 + margin)) at the
        input price, no cache discount, plus the whole answer budget at the output price, both
        at `tier` (as `call_cost`), rounded up to 8 decimal places. Quiet: an unknown model
        counts at the fallback without a report, as no call was charged."""
        if prompt_tokens < 0 or max_output_tokens < 0 or margin < 0:
            raise ValueError("token counts and margin must be non-negative")
        price = self.price_for(model).at_tier(tier, discount)
        padded_in = math.ceil(prompt_tokens * (1 + margin))
        raw = (
            Decimal(padded_in) * price.usd_per_million_in
            + Decimal(max_output_tokens) * price.usd_per_million_out
        ) / _MILLION
        return raw.quantize(_QUANTUM, rounding=ROUND_CEILING)

    def _report_unpriced(self, model: str) -> None:
        if self._on_unpriced is not None:
            self._on_unpriced(model)
        if not self._warn:
            return
        name = model[:_MAX_NAME]
        with self._lock:
            if name in self._warned or self._overflowed:
                return
            full = len(self._warned) >= _MAX_WARNED
            if full:
                self._overflowed = True
            else:
                self._warned.add(name)
        if full:
            log.warning(
                "more models have no price; further ones are charged the fallback price "
                "without a warning (see aijobs_unpriced_calls_total)"
            )
            return
        # A model name is configuration or a provider's echo, never user data.
        log.warning(
            "model %r has no price; charged the fallback price (add it to AI_MODEL_PRICES)",
            name,
            extra={
                "model": name,
                "fallback_usd_per_million_in": str(self.fallback.usd_per_million_in),
                "fallback_usd_per_million_out": str(self.fallback.usd_per_million_out),
            },
        )


# ---- settings -------------------------------------------------------------------------------


def _decimal(value: Any, where: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{where}: want a number")
    try:
        d = Decimal(str(value))
    except InvalidOperation:
        raise ValueError(f"{where}: want a number") from None
    if not d.is_finite() or d < 0:
        raise ValueError(f"{where}: want a non-negative number")
    return d


def _batch(entry: Any, where: str) -> tuple[Decimal | None, Decimal | None]:
    """An entry's `batch` prices: {"input": .., "output": ..}; absent or null: (None, None),
    half the standard prices."""
    if entry is None:
        return None, None
    if not isinstance(entry, dict) or set(entry) != {"input", "output"}:
        raise ValueError(f"{where}: want an object with input, output")
    return _decimal(entry["input"], f"{where}.input"), _decimal(entry["output"], f"{where}.output")


def _price(entry: Any, where: str, *, window: bool) -> Price:
    extra = {"context_window", "batch"} if window else set()
    allowed = {"input", "output", "cached_input"} | extra
    if not isinstance(entry, dict) or not {"input", "output"} <= set(entry) <= allowed:
        keys = "input, output[, cached_input][, context_window][, batch]"
        keys = keys if window else "input, output"
        raise ValueError(f"{where}: want an object with {keys}")
    cw = entry.get("context_window")
    if cw is not None and (isinstance(cw, bool) or not isinstance(cw, int) or cw <= 0):
        raise ValueError(f"{where}.context_window: want a positive integer or null")
    cached = entry.get("cached_input")
    batch_in, batch_out = _batch(entry.get("batch"), f"{where}.batch")
    return Price(
        _decimal(entry["input"], f"{where}.input"),
        _decimal(entry["output"], f"{where}.output"),
        cw,
        None if cached is None else _decimal(cached, f"{where}.cached_input"),
        batch_in,
        batch_out,
    )


def parse_prices(text: str) -> dict[str, Price]:
    """AI_MODEL_PRICES: a JSON object of model name -> {"input": USD per million input
    tokens, "output": USD per million output tokens, "context_window": tokens or null,
    optionally "cached_input": USD per million prompt tokens served from the provider's cache
    (absent or null: the input price), optionally "batch": {"input": .., "output": ..}, USD per
    million tokens through the provider's Batch API (absent or null: half the standard
    prices)}.
    Empty: no entries. Raises ValueError naming the setting and the entry."""
    if not text.strip():
        return {}
    try:
        raw = json.loads(text)
    except ValueError:
        raise ValueError("AI_MODEL_PRICES: not valid JSON") from None
    if not isinstance(raw, dict):
        raise ValueError("AI_MODEL_PRICES: want a JSON object of model name -> price")
    out: dict[str, Price] = {}
    for name, entry in raw.items():
        model = name.strip().lower()
        if not model or len(model) > _MAX_NAME:
            raise ValueError(f"AI_MODEL_PRICES: a model name must have 1-{_MAX_NAME} characters")
        out[model] = _price(entry, f"AI_MODEL_PRICES[{model[:40]!r}]", window=True)
    return out


def parse_fallback(text: str) -> Price | None:
    """AI_MODEL_FALLBACK_PRICE: {"input": ..., "output": ...} (USD per million tokens); empty:
    None (the table's most expensive prices)."""
    if not text.strip():
        return None
    try:
        raw = json.loads(text)
    except ValueError:
        raise ValueError("AI_MODEL_FALLBACK_PRICE: not valid JSON") from None
    return _price(raw, "AI_MODEL_FALLBACK_PRICE", window=False)


# ---- module-level helpers (the built-in table) -------------------------------------------------

# Quiet: the process's own table (the gateway's) reports unpriced calls; this one serves
# callers that only need a figure, and must not count the same call twice.
_BUILT_IN = PriceTable(warn=False)


def price_for(model: str) -> Price:
    """The built-in price of `model` (canonical rules apply), or the built-in fallback."""
    return _BUILT_IN.price_for(model)


def cost_usd(model: str, tokens_in: int, tokens_out: int) -> Decimal:
    """Cost of a call at the built-in prices, quantized to 8 decimal places, half up."""
    return _BUILT_IN.cost_usd(model, tokens_in, tokens_out)
