"""`python -m tests.cluster.engine <aijobs arguments>`: the `aijobs` CLI with two of the
engine's lock constants shortened, as the cluster test needs them: it SIGKILLs workers and
relays, and waiting out a minute-long lock after each kill would only make it slower. The SQL
lock of a running job (engine/queues.py `LOCK_TTL_S`) is 3 s and a relay's outbox claim
(activities/relay.py `CLAIM_TTL_S`) 5 s; nothing else differs from `aijobs`."""

from __future__ import annotations

import dataclasses
import sys

from activities.relay import RelayConfig
from engine import queues
from engine.settings import Settings
from runtime import wiring
from runtime.cli import main

JOB_LOCK_TTL_S = 3
CLAIM_TTL_S = 5.0
_relay_config = wiring.relay_config


def _short_claims(settings: Settings) -> RelayConfig:
    return dataclasses.replace(_relay_config(settings), lock_ttl_s=CLAIM_TTL_S)


if __name__ == "__main__":
    # Before the CLI imports runtime.worker, which takes `relay_config` from runtime.wiring.
    queues.LOCK_TTL_S = JOB_LOCK_TTL_S
    wiring.relay_config = _short_claims
    main(sys.argv[1:])
