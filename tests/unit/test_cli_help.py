"""Every `aijobs` subcommand (nested ones included) documents each of its flags and shows each
optional flag's default in `--help`: an operator learns the CLI from `--help`, not the source."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from runtime.cli import build_parser


def _subcommands(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name), sub
                yield from _subcommands(sub, (*prefix, name))


SUBCOMMANDS = dict(_subcommands(build_parser()))


def test_every_subcommand_is_listed() -> None:
    assert {"dev", "api", "worker", "token", "jobs", "jobs list", "jobs retry"} <= {
        " ".join(path) for path in SUBCOMMANDS
    }


@pytest.mark.parametrize("path", sorted(SUBCOMMANDS), ids=" ".join)
def test_help_documents_every_flag_with_its_default(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([*path, "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps long lines
    sub = SUBCOMMANDS[path]
    for action in sub._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        flag = action.option_strings[-1]
        assert action.help and action.help.strip(), f"aijobs {' '.join(path)} {flag}: no help"
        assert flag in text
        if not action.required:
            assert f"(default: {action.default})" in text, (path, flag, text)
