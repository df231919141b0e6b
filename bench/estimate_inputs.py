"""The estimate bench's inputs (`bench/estimates.py`): deterministic, seeded texts in English,
Chinese, Japanese and a markdown note with code, and the job inputs built from them, so two runs
measure the same samples and nothing is downloaded.
"""

# The sample texts are Chinese and Japanese prose: their full-width punctuation is the point,
# not a look-alike of ASCII.
# ruff: noqa: RUF001

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel

from jobs.spec import AnyJobType

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
