"""docker-compose.yml as compose reads it: the file, its engine services, each service's
command, and compose's variable interpolation (for the tests that start a service with the
environment compose would give it, tests/unit/test_compose.py and
tests/integration/test_compose_start.py)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def compose_file() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


ENGINE_SERVICES = (
    "migrate",
    "setup-temporal",
    "api",
    "worker-interactive",
    "worker-background",
    "worker-system",
)


class MissingRequired(Exception):
    """What compose reports for `${X:?message}` (or `${X?message}`) when X is missing."""


def _closing_brace(text: str, start: int) -> int:
    """Index of the `}` closing the `${` whose `{` is at `start` (expressions may nest)."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"unclosed ${{ in {text!r}")


def _expand(expr: str, env: Mapping[str, str]) -> str:
    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])(.*))?", expr, re.DOTALL)
    if m is None:
        raise ValueError(f"invalid interpolation ${{{expr}}}")
    name, op, arg = m.groups()
    value = env.get(name)
    if op is None:
        return value or ""  # compose warns and substitutes an empty string
    missing = value is None or (op.startswith(":") and value == "")
    kind = op[-1]
    if kind == "-":
        return interpolate(arg, env) if missing else str(value)
    if kind == "?":
        if missing:
            raise MissingRequired(
                f"required variable {name} is missing a value: {interpolate(arg, env)}"
            )
        return str(value)
    return "" if missing else interpolate(arg, env)  # `+`


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's interpolation: `$$`, `$X`, `${X}`, `${X:-d}`, `${X-d}`, `${X:?e}`, `${X?e}`,
    `${X:+a}`, `${X+a}`; the colon forms treat an empty value as missing."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "$" and text[i + 1 : i + 2] == "$":
            out.append("$")
            i += 2
        elif text[i] == "$" and text[i + 1 : i + 2] == "{":
            end = _closing_brace(text, i + 1)
            out.append(_expand(text[i + 2 : end], env))
            i = end + 1
        elif text[i] == "$" and (m := _NAME.match(text, i + 1)):
            out.append(env.get(m.group(), ""))
            i = m.end()
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def resolve(node: Any, env: Mapping[str, str]) -> Any:
    """The whole file interpolated, as compose does before anything starts."""
    if isinstance(node, dict):
        return {k: resolve(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [resolve(v, env) for v in node]
    return interpolate(node, env) if isinstance(node, str) else node


def command(name: str) -> list[str]:
    command = compose_file()["services"][name]["command"]
    assert isinstance(command, list)
    return [str(c) for c in command]
