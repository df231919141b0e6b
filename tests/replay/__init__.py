"""Replay tests: workflow histories recorded from real runs, replayed against today's code.

`record.py` writes the histories, `test_replay.py` replays them (no server needed).
"""

from __future__ import annotations

from pathlib import Path

HISTORIES = Path(__file__).parent / "histories"

# Put into every job input when recording. Inputs stay in PostgreSQL: only ids, hashes and codes
# may reach Temporal, so this string must appear in no recorded history.
SENTINEL = "replay-sentinel-7d1e4b-not-for-temporal"
