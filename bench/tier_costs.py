"""`python -m bench.tier_costs`: what a job of each built-in type costs on each service tier, and
how much of its prompt a provider's prefix cache serves (docs/benchmarks.md, "Service tiers and
the prompt cache").

Nothing here starts a server or calls a provider. It reuses the estimate bench's samples
(`bench/estimates.py`: the same deterministic inputs in four languages and several sizes, the
prompts exactly as EXECUTE builds them, one per chunk of a long source, and DeepSeek's own token
counts) and adds, per sample:

- the *stable prefix*: the longest start that every prompt of the type shares (the system
  message and the user message up to the source, jobs/types/*.py), counted with the engine's
  vocabulary (`engine/tokens.py`) and with DeepSeek's;
- (a) the *cached share of a repeated prompt*: the prefix in whole 64-token units, as
  DeepSeek's context cache stores it, over the prompt's tokens, per call; what a second job of
  the type gets at the cache-hit price. OpenAI caches only prompts of 1,024 tokens and more,
  in steps of 128 from there, so its share is shown beside it;
- (b) the cost per 1,000 jobs (the mean over the samples, times 1,000) at the engine's price
  table (`PriceTable.call_cost` with its `tier`, what real calls are charged by), per tier,
  with and without the cache hit: `standard`; `batch` (the model's batch price: half of
  standard for the built-in OpenAI models, cached input at half the cache-hit price);
  `offpeak` (DeepSeek's discount window: the standard price times the window's factor, 0.5);
  `reused` (a reused result makes no call: 0). A tier a provider does
  not offer is `n/a`: DeepSeek has no batch API, OpenAI no discount window.

deepseek-chat is charged DeepSeek's counts (what it reports); gpt-4o-mini the engine's cl100k
count (OpenAI's own vocabulary is not shipped here), both the DeepSeek count of the stand-in
answer. Every tier's figure is a ratio against `standard` without the cache, priced in the same
run from the same samples.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from decimal import Decimal
from pathlib import Path

from bench.estimate_inputs import job_input
from bench.estimates import (
    JOB_TYPES,
    LANGUAGES,
    SEEDS,
    DeepSeekCounter,
    Sample,
    TextCounter,
    measure_one,
    sizes_for,
)
from bench.stats import median
from engine.tokens import MESSAGE_OVERHEAD_TOKENS, count_tokens
from jobs.chunked import ChunkPolicy, chunk_prompt, plan
from jobs.spec import AnyJobType, Prompt
from providers.pricing import PriceTable

DEEPSEEK_UNIT = 64  # DeepSeek's context cache stores prompts in units of 64 tokens
OPENAI_MIN = 1024  # OpenAI caches prompts of at least 1,024 tokens...
OPENAI_STEP = 128  # ... in steps of 128 tokens from there
# DeepSeek's chat framing before the user message's text: the BOS token before the system
# prompt and the user role token (bench/estimates.py DEEPSEEK_FRAMING).
DEEPSEEK_PREFIX_FRAMING = 2
OFFPEAK_DISCOUNT = Decimal("0.5")  # the default off-peak window's price factor
TIERS = ("standard", "batch", "offpeak", "reused")
# The models priced, and the tiers their provider offers.
MODELS: dict[str, tuple[str, ...]] = {
    "deepseek-chat": ("standard", "offpeak", "reused"),
    "gpt-4o-mini": ("standard", "batch", "reused"),
}


def common_prefix(texts: Sequence[str]) -> str:
    """The longest text every one of `texts` starts with ("" for none)."""
    if not texts:
        return ""
    first, last = min(texts), max(texts)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return first[:n]


def stable_prefix(prompts: Sequence[Prompt]) -> Prompt:
    """What every prompt of `prompts` starts with: the shared system message and, when the
    system messages are all the same, the shared start of the user messages."""
    system = common_prefix([p.system for p in prompts])
    same_system = all(p.system == system for p in prompts)
    user = common_prefix([p.user for p in prompts]) if same_system else ""
    return Prompt(system=system, user=user)


def deepseek_cached(prefix_tokens: int) -> int:
    """The prompt tokens DeepSeek serves from its cache: the prefix's whole 64-token units."""
    return prefix_tokens // DEEPSEEK_UNIT * DEEPSEEK_UNIT


def openai_cached(prefix_tokens: int) -> int:
    """The prompt tokens OpenAI serves from its cache: none under 1,024, else 1,024 and every
    whole 128-token step of the prefix past it."""
    if prefix_tokens < OPENAI_MIN:
        return 0
    return OPENAI_MIN + (prefix_tokens - OPENAI_MIN) // OPENAI_STEP * OPENAI_STEP


@dataclass(frozen=True)
class Measured:
    """One sample of the estimate bench and its stable prefix, per call (every call of a
    chunked job repeats the same prefix)."""

    sample: Sample
    prefix_tokens: int  # engine count (cl100k + the system message's framing)
    prefix_reference: int  # DeepSeek's count (+ its framing before the user text)
    output_budget: int  # the type's max_tokens per call

    @property
    def deepseek_cached_in(self) -> int:
        s = self.sample
        return min(s.reference, s.calls * deepseek_cached(self.prefix_reference))

    @property
    def openai_cached_in(self) -> int:
        s = self.sample
        return min(s.estimate, s.calls * openai_cached(self.prefix_tokens))

    @property
    def cached_share(self) -> float:
        """(a): the share of the prompt a repeated prompt gets at the cache-hit price,
        in DeepSeek's 64-token units, counted with the engine's vocabulary."""
        s = self.sample
        return min(1.0, s.calls * deepseek_cached(self.prefix_tokens) / s.estimate)

    @property
    def openai_share(self) -> float:
        return self.openai_cached_in / self.sample.estimate


def prefix_count(prefix: Prompt) -> int:
    """Engine tokens of a stable prefix: the system message with its framing, then the start
    of the user message."""
    return count_tokens(prefix.system) + MESSAGE_OVERHEAD_TOKENS + count_tokens(prefix.user)


def prompts_of(jt: AnyJobType, language: str, size: int, seed: int) -> list[Prompt]:
    """The sample's first-attempt prompts, as EXECUTE builds them (bench/estimates.py)."""
    inp = job_input(jt, language, size, seed)
    chunks = plan(jt, inp, ChunkPolicy())
    return [chunk_prompt(jt, inp, c) for c in chunks] if chunks else [jt.prompt(inp)]


def measure_type(jt: AnyJobType, counter: TextCounter, seeds: int) -> list[Measured]:
    sizes = sizes_for(jt)
    keys = [(lang, size, seed) for lang in LANGUAGES for size in sizes for seed in range(seeds)]
    prompts = {k: prompts_of(jt, *k) for k in keys}
    prefix = stable_prefix([p for ps in prompts.values() for p in ps])
    tokens = prefix_count(prefix)
    reference = counter.count(prefix.system) + counter.count(prefix.user) + DEEPSEEK_PREFIX_FRAMING
    budget = jt.definition.execution.max_output_tokens
    return [Measured(measure_one(jt, *k, counter), tokens, reference, budget) for k in keys]


# ---- pricing ------------------------------------------------------------------------------------


def tier_cost(
    table: PriceTable, model: str, tokens_in: int, tokens_out: int, cached_in: int, tier: str
) -> Decimal:
    """One job's charge on `tier`, by the function that charges real calls
    (`PriceTable.call_cost`): standard at the table's prices, batch at the model's batch price,
    off-peak at the standard price times the window's factor; a reused result nothing."""
    if tier == "reused":
        return Decimal(0)
    discount = OFFPEAK_DISCOUNT if tier == "offpeak" else None
    return table.call_cost(model, tokens_in, tokens_out, cached_in, tier=tier, discount=discount)


def job_cost(table: PriceTable, m: Measured, model: str, tier: str, *, cache: bool) -> Decimal:
    """What one sample's job is charged on `model` and `tier`, its stable prefix served from
    the provider's cache or not."""
    s = m.sample
    tokens_out = min(s.reference_output, m.output_budget * s.calls)  # the call stops at max_tokens
    if model.startswith("deepseek"):
        tokens_in, cached = s.reference, m.deepseek_cached_in
    else:
        tokens_in, cached = s.estimate, m.openai_cached_in
    return tier_cost(table, model, tokens_in, tokens_out, cached if cache else 0, tier)


@dataclass(frozen=True)
class CacheRow:
    job_type: str
    size: int  # source characters, or answers for weak_point_analysis
    samples: int
    prefix_tokens: int
    share_median: float
    share_min: float
    share_max: float
    openai_share_median: float


@dataclass(frozen=True)
class CostRow:
    job_type: str
    model: str
    samples: int
    standard_per_1000_usd: float  # the baseline: standard, no cache hit
    # "<tier>" and "<tier>+cache" -> the cost against the baseline (None: tier not offered)
    ratios: dict[str, float | None]


def per_1000(costs: Sequence[Decimal]) -> Decimal:
    """The cost of 1,000 jobs drawn like `costs` (their mean, times 1,000)."""
    return sum(costs, Decimal(0)) / len(costs) * 1000


def cache_rows(measured: Sequence[Measured]) -> list[CacheRow]:
    rows = []
    for job_type, size in dict.fromkeys((m.sample.job_type, m.sample.size) for m in measured):
        group = [m for m in measured if (m.sample.job_type, m.sample.size) == (job_type, size)]
        share = [m.cached_share for m in group]
        rows.append(
            CacheRow(
                job_type,
                size,
                len(group),
                group[0].prefix_tokens,
                median(share),
                min(share),
                max(share),
                median([m.openai_share for m in group]),
            )
        )
    return rows


def cost_rows(measured: Sequence[Measured], table: PriceTable) -> list[CostRow]:
    rows = []
    for job_type in dict.fromkeys(m.sample.job_type for m in measured):
        group = [m for m in measured if m.sample.job_type == job_type]
        for model, offered in MODELS.items():
            base = per_1000([job_cost(table, m, model, "standard", cache=False) for m in group])
            ratios: dict[str, float | None] = {}
            for tier in TIERS:
                for cache in (False, True) if tier != "reused" else (False,):
                    key = f"{tier}+cache" if cache else tier
                    if tier not in offered:
                        ratios[key] = None
                        continue
                    cost = per_1000([job_cost(table, m, model, tier, cache=cache) for m in group])
                    ratios[key] = float(cost / base) if base else 0.0
            rows.append(CostRow(job_type, model, len(group), float(base), ratios))
    return rows


# ---- report -------------------------------------------------------------------------------------


def _ratio(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.3f} x"


def render(caches: Sequence[CacheRow], costs: Sequence[CostRow]) -> str:
    lines = [
        "Prompt cache: share of a repeated prompt served at the cache-hit price",
        "",
        "| job type | size | n | stable prefix (tokens) | DeepSeek share median | min | max "
        "| OpenAI share median |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in caches:
        lines.append(
            f"| {c.job_type} | {c.size:,} | {c.samples} | {c.prefix_tokens} "
            f"| {100 * c.share_median:.1f} % "
            f"| {100 * c.share_min:.1f} % | {100 * c.share_max:.1f} % "
            f"| {100 * c.openai_share_median:.1f} % |"
        )
    keys = [k for t in TIERS for k in ((t,) if t == "reused" else (t, f"{t}+cache"))]
    lines += [
        "",
        "Cost per 1,000 jobs: standard in USD, every other column a ratio against it",
        "",
        "| job type | model | standard (USD / 1,000 jobs) | " + " | ".join(keys[1:]) + " |",
        "|---|---|---:|" + "---:|" * (len(keys) - 1),
    ]
    for r in costs:
        cells = " | ".join(_ratio(r.ratios[k]) for k in keys[1:])
        lines.append(f"| {r.job_type} | {r.model} | {r.standard_per_1000_usd:.4f} | {cells} |")
    return "\n".join(lines)


def run(
    counter: TextCounter, seeds: int, table: PriceTable | None = None
) -> tuple[list[CacheRow], list[CostRow]]:
    measured = [m for jt in JOB_TYPES for m in measure_type(jt, counter, seeds)]
    return cache_rows(measured), cost_rows(measured, table or PriceTable())


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.tier_costs", description=__doc__)
    p.add_argument("--seeds", type=int, default=SEEDS, help=f"inputs per size ({SEEDS})")
    p.add_argument("--output", help="also write the rows as JSON to this path")
    args = p.parse_args(argv)
    caches, costs = run(DeepSeekCounter(), args.seeds)
    print(render(caches, costs))
    if args.output:
        Path(args.output).write_text(
            json.dumps(
                {"cache": [asdict(c) for c in caches], "cost": [asdict(c) for c in costs]},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
