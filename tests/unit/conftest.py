"""Fixtures of the unit tests (no server: pure logic, settings, subprocesses of the CLI)."""

from __future__ import annotations

import os

import pytest

from tests.unit.settings_helpers import setting_names


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """An environment without any engine setting: whatever the caller's shell exports."""
    for name in os.environ:
        if name.upper() in setting_names():
            monkeypatch.delenv(name)
    return monkeypatch
