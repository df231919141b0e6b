"""Every activity a workflow calls goes through a typed stub declared in workflows/ (the stub's
own name is the activity's name, its hints the input and result types): no workflow names an
activity by a string or an upper-case constant, and every stub is an activity the workers
register, under the same name with the same types. Checked on the source and the modules."""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_type_hints

ROOT = Path(__file__).resolve().parents[2]
# The calls that schedule an activity from workflow code.
SCHEDULING = {
    "execute_activity",
    "execute_local_activity",
    "start_activity",
    "start_local_activity",
    "execute_activity_method",
    "start_activity_method",
    "execute_local_activity_method",
    "start_local_activity_method",
}


def modules(package: str) -> Iterator[tuple[Path, Any]]:
    for path in sorted((ROOT / package).glob("*.py")):
        name = f"{package}.{path.stem}" if path.stem != "__init__" else package
        yield path, importlib.import_module(name)


def activity_name(fn: Any) -> str | None:
    defn = getattr(fn, "__temporal_activity_definition", None)
    return None if defn is None else str(defn.name)


def stubs() -> dict[str, Callable[..., Any]]:
    """The activity stubs of workflows/, by activity name."""
    found: dict[str, Callable[..., Any]] = {}
    for _, mod in modules("workflows"):
        for _, fn in inspect.getmembers(mod, inspect.isfunction):
            name = activity_name(fn)
            if name is not None and fn.__module__ == mod.__name__:
                assert name == fn.__name__, f"{mod.__name__}.{fn.__name__} runs as {name}"
                found[name] = fn
    return found


def registered() -> dict[str, Callable[..., Any]]:
    """The real activities of activities/ (methods of its classes), by activity name."""
    found: dict[str, Callable[..., Any]] = {}
    for _, mod in modules("activities"):
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ != mod.__name__:
                continue
            for _, fn in inspect.getmembers(cls, inspect.isfunction):
                name = activity_name(fn)
                if name is not None:
                    assert name not in found, f"two activities named {name}"
                    found[name] = fn
    return found


def signature(fn: Callable[..., Any]) -> tuple[list[Any], Any]:
    hints = get_type_hints(fn)
    params = [p for p in inspect.signature(fn).parameters if p != "self"]
    return [hints[p] for p in params], hints["return"]


def test_every_stub_is_a_registered_activity_with_the_same_types() -> None:
    found, real = stubs(), registered()
    assert {"execute", "batch_poll", "bulk_finish", "reconcile_once", "schedule_run"} <= set(found)
    missing = sorted(set(found) - set(real))
    assert missing == [], f"stubs no worker registers: {missing}"
    for name, stub in found.items():
        assert signature(stub) == signature(real[name]), name


def strings(tree: ast.AST) -> Iterator[ast.Constant]:
    """The string constants of a module that are not docstrings."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                yield node


def test_no_workflow_names_an_activity_by_a_string_or_a_constant() -> None:
    names = set(registered())
    bad: list[str] = []
    for path, _ in modules("workflows"):
        tree = ast.parse(path.read_text(), filename=str(path))
        where = path.relative_to(ROOT).as_posix()
        bad += [f"{where}:{c.lineno} {c.value!r}" for c in strings(tree) if c.value in names]
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in SCHEDULING
                and node.args
            ):
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) or (
                isinstance(first, ast.Name | ast.Attribute)
                and (first.id if isinstance(first, ast.Name) else first.attr).isupper()
            ):
                bad.append(f"{where}:{node.lineno} {ast.unparse(first)}")
    assert bad == [], bad


def test_the_check_sees_a_string_and_a_constant() -> None:
    """Guards the test above: both forms of the old call are found."""
    tree = ast.parse('X = "batch_poll"\nworkflow.execute_activity(BATCH_POLL, b)\n')
    assert [c.value for c in strings(tree)] == ["batch_poll"]
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call))
    assert isinstance(call.args[0], ast.Name) and call.args[0].id.isupper()
