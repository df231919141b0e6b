"""The workflow modules' code read once per process (runtime/workflow_code.py): a module imported
again (as each run's sandbox imports it) is executed anew, with its file and package path, but
its file is not read again; other modules are left to the import system."""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime import workflow_code
from runtime.workflow_code import WorkflowCode

PACKAGE = "wfcode_demo"


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / PACKAGE
    root.mkdir()
    (root / "__init__.py").write_text("", "utf-8")
    (root / "helper.py").write_text("VALUE = 41\n", "utf-8")
    (root / "flow.py").write_text(
        "from wfcode_demo.helper import VALUE\nRUNS = []\nANSWER = VALUE + 1\n", "utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    finder = WorkflowCode(PACKAGE)
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    yield root
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]


def _fresh_import(name: str) -> types.ModuleType:
    """Import `name` as a new run's sandbox does: none of the package's modules loaded yet."""
    for m in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[m]
    return importlib.import_module(name)


def test_a_module_imported_again_runs_anew_without_reading_its_file(
    package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _fresh_import(f"{PACKAGE}.flow")
    assert first.ANSWER == 42
    first.RUNS.append("run 1")

    reads: list[str] = []
    original = importlib.machinery.SourceFileLoader.get_data

    def counting(self: importlib.machinery.SourceFileLoader, path: str) -> bytes:
        reads.append(path)
        return original(self, path)

    monkeypatch.setattr(importlib.machinery.SourceFileLoader, "get_data", counting)
    again = _fresh_import(f"{PACKAGE}.flow")
    assert again is not first and again.RUNS == []
    assert again.ANSWER == 42
    assert again.__file__ == str(package / "flow.py")
    assert sys.modules[PACKAGE].__path__ == [str(package)]
    assert [p for p in reads if PACKAGE in p] == []


def test_other_modules_and_missing_ones_go_to_the_import_system(package: Path) -> None:
    finder = sys.meta_path[0]
    assert isinstance(finder, WorkflowCode)
    assert finder.find_spec("json", None) is None
    assert finder.find_spec(f"{PACKAGE}_other", None) is None
    with pytest.raises(ModuleNotFoundError):
        _fresh_import(f"{PACKAGE}.missing")


def test_install_is_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    first = workflow_code.install("workflows_demo")
    assert workflow_code.install("workflows_demo") is first
    assert sys.meta_path[0] is first
    assert (
        sum(isinstance(f, WorkflowCode) and f.package == "workflows_demo" for f in sys.meta_path)
        == 1
    )
