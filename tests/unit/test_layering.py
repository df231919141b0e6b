"""The layering of docs/architecture.md: a part imports only parts above it in the table;
nothing imports api/ or runtime/ except runtime/. Checked on the source, so a wrong import fails
here before it tangles."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("engine", "db", "providers", "jobs", "workflows", "activities", "api", "runtime")
ALLOWED: dict[str, set[str]] = {
    "engine": set(),
    "db": {"engine"},
    "providers": {"engine"},
    "jobs": {"engine", "db", "providers"},
    "workflows": {"engine"},
    "activities": {"jobs", "db", "providers", "engine"},
    "api": {"jobs", "db", "engine"},
    "runtime": set(OURS) - {"runtime"},
}


def imports_of(package: str) -> dict[str, set[str]]:
    """Our top-level packages imported by each module of `package`."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
        found[str(path.relative_to(ROOT))] = {n for n in names if n in OURS and n != package}
    return found


@pytest.mark.parametrize("package", OURS)
def test_imports_follow_the_layer_table(package: str) -> None:
    bad = {
        module: sorted(targets - ALLOWED[package])
        for module, targets in imports_of(package).items()
        if targets - ALLOWED[package]
    }
    assert not bad, f"{package} may import only {sorted(ALLOWED[package])}: {bad}"


def test_the_checker_sees_imports() -> None:
    # Guards the test itself: activities really import db and engine.
    seen = set().union(*imports_of("activities").values())
    assert {"db", "engine"} <= seen
