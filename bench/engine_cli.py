"""`python -m bench.engine_cli NAME=VALUE ... -- <aijobs arguments>`: the `aijobs` CLI with some
of the engine's tuning constants changed, for the benches (and the cluster test) that run the
engine as processes and must change what is not a setting: a poll slowed to one an hour to
measure what it costs, fair dispatch off for the fairness figure's baseline, lock TTLs short
enough for a test that kills processes.

NAME is either a module constant (`activities.webhooks.POLL_INTERVAL_S`), set before any other
engine module is imported (so every `from module import NAME` sees the new value), or
`relay.<field>`, a field of the relay's configuration (`activities/relay.py` `RelayConfig`,
e.g. `relay.fairness`, `relay.lock_ttl_s`). VALUE is JSON (`3600`, `false`, `5.0`).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any


def parse(pairs: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(module constants by dotted name, relay configuration fields) from NAME=VALUE pairs."""
    constants: dict[str, Any] = {}
    relay: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or "." not in name:
            raise SystemExit(f"bench.engine_cli: want module.NAME=JSON or relay.field=JSON: {pair}")
        value = json.loads(raw)
        if name.startswith("relay."):
            relay[name.removeprefix("relay.")] = value
        else:
            constants[name] = value
    return constants, relay


def argv(pairs: dict[str, Any], command: Sequence[str]) -> list[str]:
    """The arguments after `python -m bench.engine_cli` for `command` with these changes."""
    return [*(f"{k}={json.dumps(v)}" for k, v in pairs.items()), "--", *command]


def apply(args: Sequence[str]) -> list[str]:
    """Makes the changes before `--` (in a fresh process: before the engine is imported);
    returns the `aijobs` arguments after it."""
    split = list(args).index("--") if "--" in args else len(args)
    constants, relay = parse(args[:split])
    for dotted, value in constants.items():
        module_name, _, attr = dotted.rpartition(".")
        module = importlib.import_module(module_name)
        if not hasattr(module, attr):
            raise SystemExit(f"bench.engine_cli: {module_name} has no {attr}")
        setattr(module, attr, value)
    from runtime import wiring  # after the constants: it imports some of them by name

    if relay:
        built: Callable[..., Any] = wiring.relay_config
        wiring.relay_config = lambda s: dataclasses.replace(built(s), **relay)  # type: ignore[assignment]
    return list(args[split + 1 :])


def main(args: Sequence[str]) -> None:
    command = apply(args)
    from runtime.cli import main as aijobs

    aijobs(command)


if __name__ == "__main__":
    main(sys.argv[1:])
