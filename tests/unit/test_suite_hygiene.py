"""Rules of the test suite itself: a hung test fails alone, by timeout, and the session goes on;
no test module imports another (shared data and helpers live in helper modules); warnings are
errors."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def pytest_options() -> dict[str, object]:
    options: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "pytest"
    ]["ini_options"]
    return options


# ---- per-test timeout ---------------------------------------------------------------------------

HANGING = textwrap.dedent(
    """
    import asyncio
    import time


    def test_sync_hang():
        time.sleep(3600)


    async def test_async_hang():
        await asyncio.sleep(3600)


    async def test_after_the_hangs():
        await asyncio.sleep(0)
    """
)


def test_a_hung_test_fails_by_timeout_and_the_session_goes_on(tmp_path: Path) -> None:
    """The project's configuration (pyproject.toml, its timeout method included) with a 2 s limit:
    both hung tests fail by timeout within seconds, the test after them still runs and passes,
    and the async hang's report names the `await` that never returned."""
    (tmp_path / "test_hanging.py").write_text(HANGING)
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.timeouts",
            "--timeout=2",
            "-q",
            str(tmp_path / "test_hanging.py"),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "FAILED test_hanging.py::test_sync_hang - Failed: Timeout (>2.0s)" in out, out
    assert "FAILED test_hanging.py::test_async_hang - Failed: Timeout (>2.0s)" in out, out
    assert "2 failed, 1 passed" in out, out
    # The pending task's stack points at the hung await (line 11 of the file above).
    assert "coro=<test_async_hang() running at" in out and "test_hanging.py:11" in out, out
    assert elapsed < 60, f"two 2 s timeouts took {elapsed:.0f}s"


def test_the_suite_has_a_timeout_no_healthy_test_comes_near() -> None:
    options = pytest_options()
    # signal: only the hung test fails; the thread method would os._exit the whole session.
    assert options["timeout_method"] == "signal"
    timeout = options["timeout"]
    assert isinstance(timeout, int) and 120 <= timeout <= 600, timeout


def test_warnings_are_errors() -> None:
    filters = pytest_options()["filterwarnings"]
    assert isinstance(filters, list) and filters[0] == "error", filters
    # Every ignore is precise: a message or a module, never a whole category alone.
    for entry in filters[1:]:
        action, message, _category, module = [*str(entry).split(":"), "", "", ""][:4]
        assert action == "ignore" and (message or module), entry


# ---- no test module imports another ---------------------------------------------------------


def imported_modules(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def is_test_module(dotted: str) -> bool:
    parts = dotted.split(".")
    return parts[0] == "tests" and any(p.startswith("test_") for p in parts[1:])


def test_no_test_module_imports_another() -> None:
    """A test module imported by another runs its module-level code twice and ties the two
    together (moving or deleting one breaks the other): shared data and helpers live in helper
    modules (tests/support.py, tests/stack.py, tests/job_data.py, tests/webhook_helpers.py,
    tests/integration/engine_helpers.py, ...)."""
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted(TESTS.rglob("*.py"))
        for name in imported_modules(path)
        if is_test_module(name)
    ]
    assert offenders == []


def test_the_import_check_sees_an_import_of_a_test_module(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from tests.integration.test_job_types import INPUTS\n"
        "import tests.unit.test_jwt\n"
        "from tests.integration import test_relay\n"
        "from tests.support import eventually\n"
    )
    assert [n for n in imported_modules(sample) if is_test_module(n)] == [
        "tests.integration.test_job_types",
        "tests.integration.test_job_types.INPUTS",
        "tests.unit.test_jwt",
        "tests.integration.test_relay",
    ]
