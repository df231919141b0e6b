"""What the job workers' sandbox passes through (runtime/worker.py `sandbox_runner`): the pure
modules (engine, the stages' typed stubs), never the workflow code itself, which the sandbox
re-imports at every run and so keeps checking."""

from __future__ import annotations

from runtime.worker import sandbox_runner


def _passed_through(name: str) -> bool:
    mods = sandbox_runner().inner.restrictions.passthrough_modules
    parts = name.split(".")
    return any(".".join(parts[:i]) in mods for i in range(1, len(parts) + 1))


def test_the_stubs_and_the_pure_modules_are_passed_through() -> None:
    assert _passed_through("workflows.stages")
    assert _passed_through("engine.contracts")


def test_the_workflow_code_stays_in_the_sandbox() -> None:
    for name in ("workflows", "workflows.job_workflow", "workflows.system", "workflows.bulk"):
        assert not _passed_through(name), name
