"""`python -m bench.isolation`: does one user's rejected requests slow another user's jobs?

The provider is fakellm (a third party's OpenAI-compatible mock server, PyPI `fakellm`), run as a
subprocess with YAML rules: a call whose messages carry `POISON` is answered HTTP 400 "This
model's maximum context length is 65536 tokens..." (what DeepSeek and OpenAI answer an
oversized request), every other call a valid flashcard answer. The engine runs in this process
as the tests run it (embedded PostgreSQL and Temporal dev server from `bench.infra.servers`,
the workers and the outbox relay in process, the API under uvicorn on 127.0.0.1), with the
default breaker settings; jobs are created and polled over HTTP as a client would.

User B's latency is the wall time from B's POST /api/ai/jobs to the first GET that reads
`succeeded` (polled every 50 ms), for one `flashcard_generation` job at a time:
- alone: `--reps` jobs on the idle engine;
- during A: user A posts 4 jobs whose input carries `POISON` (a burst), then B posts one at
  once, so B's call lands among A's rejected ones;
- after A: A posts another burst of 4 and B sends nothing until all 4 have ended, then posts
  one job: what a user meets who arrives just after another user's burst of bad requests.
Each repetition runs one of each.
Repetitions run back to back: whatever A's jobs left behind (a paused key, an open breaker) is
what B's next job meets, as it would be in production.

This file and the scenario it runs (`bench/isolation_figure.py`) run against an older checkout
of the engine (copy both into that tree's `bench/` and run it from there: every other import then
resolves to that tree, so they import nothing from `bench` an older tree lacks), which is how
docs/benchmarks.md compares the code before and after provider failures were classified by whose
problem they are.

`FakeLLM`, `fakellm_server` and `isolation_rules` are shared with
tests/e2e/test_isolation_third_party.py, so the test and the figure see the same provider.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import yaml

if TYPE_CHECKING:
    from bench.isolation_figure import Figures

MODEL = "deepseek-chat"
# Only user A's jobs carry this text: fakellm's `messages_contain` rule answers them with 400.
POISON = "Zyxwv-tenant-A-oversized-marker"
TOO_LONG = (
    "This model's maximum context length is 65536 tokens. However, you requested 70412 tokens "
    "(66316 in the messages, 4096 in the completion). Please reduce the length of the messages "
    "or completion."
)
OUT_OF_BALANCE = "Insufficient Balance"
RATE_LIMITED = "Rate limit reached for requests"
# fakellm names the rule each call matched in its stats: the names say which answer it was.
RULE_TOO_LONG = "too-long"
RULE_VALID = "valid"
PLATFORM_KEY = "sk-bench-platform-key-0000"
JWT_SECRET = "bench-only-jwt-secret-not-for-production"
USER_A = "bench-a"
USER_B = "bench-b"
A_JOBS = 4
FLASH = "flashcard_generation"
SOURCE = (
    "Photosynthesis converts light energy into chemical energy. It takes place in the "
    "chloroplasts of plant cells."
)
ANSWER: dict[str, Any] = {
    "flashcards": [
        {"front": "What does photosynthesis convert?", "back": "Light into chemical energy."},
        {"front": "Where does it take place?", "back": "In the chloroplasts."},
    ]
}
POLL_S = 0.05


def balance_rule(i: int) -> str:
    return f"out-of-balance-{i}"


def rate_limit_rule(i: int) -> str:
    return f"rate-limited-{i}"


def isolation_rules(
    answer: Mapping[str, Any],
    *,
    poison: str = POISON,
    out_of_balance_keys: Sequence[str] = (),
    rate_limited_keys: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """fakellm rules, first match wins: calls made with one of `out_of_balance_keys` get 402,
    with one of `rate_limited_keys` 429 (fakellm sends no Retry-After), calls whose messages
    contain `poison` 400 "maximum context length", and every other call `answer` (serialised
    JSON, as a model asked for a JSON object answers). The keys are matched on the
    Authorization header; rule names carry indexes, never keys."""
    rules: list[dict[str, Any]] = []
    for i, key in enumerate(out_of_balance_keys):
        rules.append(
            {
                "name": balance_rule(i),
                "when": {"header.authorization": f"Bearer {key}"},
                "respond": {"status": 402, "error": OUT_OF_BALANCE},
            }
        )
    for i, key in enumerate(rate_limited_keys):
        rules.append(
            {
                "name": rate_limit_rule(i),
                "when": {"header.authorization": f"Bearer {key}"},
                "respond": {"status": 429, "error": RATE_LIMITED},
            }
        )
    rules.append(
        {
            "name": RULE_TOO_LONG,
            "when": {"messages_contain": poison},
            "respond": {"status": 400, "error": TOO_LONG},
        }
    )
    rules.append({"name": RULE_VALID, "respond": {"content": json.dumps(answer)}})
    return rules


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class FakeLLM:
    """A running `fakellm serve`: its URLs, and what it says it answered."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL (`.../v1`) the engine's AI_BASE_URL takes."""
        return f"{self.root_url}/v1"

    async def calls(self) -> dict[str, int]:
        """Calls answered so far, by rule name (fakellm's own count: its `/_fakellm/stats`)."""
        async with httpx.AsyncClient(timeout=10) as c:
            r = await c.get(f"{self.root_url}/_fakellm/stats")
            r.raise_for_status()
            by_rule: dict[str, int] = r.json()["by_rule"]
            return by_rule

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@contextlib.asynccontextmanager
async def fakellm_server(
    rules: Sequence[Mapping[str, Any]], workdir: Path, *, start_timeout_s: float = 30.0
) -> AsyncIterator[FakeLLM]:
    """`fakellm serve` on a free 127.0.0.1 port with `rules`, ready (it answered its stats
    endpoint) when this yields, stopped (SIGTERM, then SIGKILL) when it returns.

    The port is probed free and then bound by the child: another process could take it in
    between, which shows as a start failure with the child's log."""
    config = workdir / "fakellm.yaml"
    config.write_text(yaml.safe_dump({"version": 1, "rules": list(rules)}, sort_keys=False))
    port = _free_port()
    log_path = workdir / "fakellm.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fakellm.cli",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--config",
                str(config),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    fake = FakeLLM(proc, port, log_path)
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"fakellm exited with {proc.returncode}:\n{fake.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                await fake.calls()
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"fakellm did not answer in {start_timeout_s:g}s")
            await asyncio.sleep(0.05)
        yield fake
    finally:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait, 10)


async def run(args: argparse.Namespace) -> Figures:
    from bench.infra import progress, servers
    from bench.isolation_figure import scenario

    with servers(keep=False) as sv, tempfile.TemporaryDirectory(prefix="fakellm-") as tmp:
        async with fakellm_server(isolation_rules(ANSWER), Path(tmp)) as fake:
            progress(f"isolation: fakellm on {fake.root_url}")
            return await scenario(
                sv.database_url, sv.temporal_address, fake, args.reps, args.job_timeout_s
            )


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.isolation",
        description="User B's job latency alone, during and after user A's rejected requests.",
    )
    p.add_argument("--reps", type=int, default=5, help="jobs per figure (5)")
    p.add_argument(
        "--job-timeout-s",
        type=float,
        default=300.0,
        help="give up waiting for one job after this long (300)",
    )
    p.add_argument("--output", help="also write the figures as JSON here")
    args = p.parse_args(argv)
    from bench.isolation_figure import render

    figures = asyncio.run(run(args))
    print(render(figures))
    if args.output:
        Path(args.output).write_text(json.dumps(asdict(figures), indent=2))
    from bench.teardown import hard_exit

    hard_exit(0)


if __name__ == "__main__":
    main()
