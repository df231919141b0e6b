"""`python -m bench.estimate_costs`: how far a quote's expected cost lands from what a call is then
charged, per job type, when the provider reports cached prompt tokens or reasoning tokens
(docs/benchmarks.md, "Token estimates per job type", the money table).

Nothing here starts a server or calls a provider. It reuses `bench.estimates`'s samples (the
same deterministic inputs, the engine's estimate and DeepSeek's own token counts) and prices
each sample three ways with the engine's own price table (`providers/pricing.py`
`PriceTable.call_cost`, the function that charges real calls):

- `plain` (deepseek-chat): the provider reports DeepSeek's prompt count and the stand-in
  answer's count, nothing cached, no reasoning;
- `cached` (deepseek-chat): the same request sent again (a retry, or the same source quoted
  twice): DeepSeek's context cache serves every complete 64-token unit of the prompt, so all
  but at most 64 tokens per call are `prompt_cache_hit_tokens`, charged at the cache-hit price;
- `reasoning` (deepseek-reasoner): the answer plus `REASONING_PER_ANSWER_TOKEN` reasoning
  tokens per answer token (an assumption: no real model answered here), all at the output price
  and, as for the provider, within the call's `max_tokens`.

Per (job type, scenario): the median and p95 of `expected / charged - 1` (the quote's
`estimatedCostUsd` against the charge; negative: the quote shows less than was spent), and how
many samples the reservation (`worstCaseCostUsd`, what create holds against the budgets)
covered. The reservation is the bound that must hold; the expected figure is only a guide.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from decimal import Decimal
from pathlib import Path

from bench.estimates import DEFAULT_MARGIN, JOB_TYPES, SEEDS, DeepSeekCounter, Sample, measure
from bench.stats import median, percentile
from jobs.costs import estimate_job
from providers.pricing import PriceTable

CACHE_UNIT = 64  # DeepSeek's context cache stores prompts in units of 64 tokens
REASONING_PER_ANSWER_TOKEN = 2.0
SCENARIOS: dict[str, str] = {
    "plain": "deepseek-chat",
    "cached": "deepseek-chat",
    "reasoning": "deepseek-reasoner",
}


@dataclass(frozen=True)
class Priced:
    job_type: str
    scenario: str
    expected_usd: Decimal  # the quote's estimatedCostUsd
    reserved_usd: Decimal  # the quote's worstCaseCostUsd: what create reserves
    charged_usd: Decimal  # what the engine charges for the reported usage


def _budget(job_type: str) -> int:
    jt = next(jt for jt in JOB_TYPES if jt.job_type == job_type)
    return jt.definition.execution.max_output_tokens


def _per_call(total: int, calls: int) -> list[int]:
    base, extra = divmod(total, calls)
    return [base + (1 if i < extra else 0) for i in range(calls)]


def price_sample(s: Sample, scenario: str, table: PriceTable, margin: float) -> Priced:
    model = SCENARIOS[scenario]
    budget = _budget(s.job_type)
    est = estimate_job(
        _per_call(s.estimate, s.calls),
        model=model,
        price=table.price_for(model),
        output_budget=budget,
        expected_output_tokens=s.expected_output,
        margin=margin,
    )
    tokens_out = s.reference_output
    cached = 0
    if scenario == "cached":
        cached = max(0, s.reference - CACHE_UNIT * s.calls)
    elif scenario == "reasoning":
        tokens_out = round(s.reference_output * (1 + REASONING_PER_ANSWER_TOKEN))
    tokens_out = min(tokens_out, budget * s.calls)  # the provider stops at max_tokens
    charged = table.call_cost(model, s.reference, tokens_out, cached_in=cached)
    return Priced(s.job_type, scenario, est.estimated_cost_usd, est.worst_case_cost_usd, charged)


@dataclass(frozen=True)
class CostRow:
    job_type: str
    scenario: str
    model: str
    samples: int
    charged_median_usd: float
    error_median: float  # expected / charged - 1
    error_p95: float
    error_min: float
    covered: int  # samples whose reservation covered the charge


def summarize_costs(priced: Sequence[Priced]) -> list[CostRow]:
    rows = []
    for key in dict.fromkeys((p.job_type, p.scenario) for p in priced):
        group = [p for p in priced if (p.job_type, p.scenario) == key]
        err = [float(p.expected_usd / p.charged_usd) - 1 for p in group if p.charged_usd > 0]
        rows.append(
            CostRow(
                job_type=key[0],
                scenario=key[1],
                model=SCENARIOS[key[1]],
                samples=len(group),
                charged_median_usd=median([float(p.charged_usd) for p in group]),
                error_median=median(err),
                error_p95=percentile(err, 95),
                error_min=min(err),
                covered=sum(1 for p in group if p.reserved_usd >= p.charged_usd),
            )
        )
    return rows


def render_costs(rows: Sequence[CostRow]) -> str:
    lines = [
        "Money: the quote's expected cost vs the charge for the reported usage",
        "",
        "| job type | scenario | model | n | charged (median, USD) | error median | error p95 "
        "| worst under | reservation covered |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.job_type} | {r.scenario} | {r.model} | {r.samples} "
            f"| {r.charged_median_usd:.6f} | {100 * r.error_median:+.1f} % "
            f"| {100 * r.error_p95:+.1f} % "
            f"| {'none' if r.error_min >= 0 else f'{100 * r.error_min:+.1f} %'} "
            f"| {r.covered} / {r.samples} |"
        )
    return "\n".join(lines)


def run(samples: Sequence[Sample], margin: float) -> list[CostRow]:
    table = PriceTable()
    return summarize_costs(
        [price_sample(s, scenario, table, margin) for s in samples for scenario in SCENARIOS]
    )


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.estimate_costs", description=__doc__)
    p.add_argument("--seeds", type=int, default=SEEDS, help=f"inputs per size ({SEEDS})")
    p.add_argument(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        help="the estimate margin (jobs/costs.py ESTIMATE_MARGIN)",
    )
    p.add_argument("--output", help="also write the rows as JSON to this path")
    args = p.parse_args(argv)
    rows = run(measure(DeepSeekCounter(), seeds=args.seeds), args.margin)
    print(render_costs(rows))
    if args.output:
        Path(args.output).write_text(json.dumps([asdict(r) for r in rows], indent=2))


if __name__ == "__main__":
    main()
