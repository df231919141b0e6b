"""Schemathesis against the real server: the OpenAPI document must tell the truth.

The CLI runs in a subprocess against the e2e server's `/openapi.json`, with every check
(`--checks all`), twice: with a valid bearer token (an admin's: every route is reachable) through
the examples, fuzzing and stateful phases, and without one (every protected route must answer its
documented 401) through examples and fuzzing. The stateful phase chains operations along the links
schemathesis infers from the responses and `Location` headers (a create, then that job's get,
cancel, purge, artifacts...), so a status one operation leaves a resource in (a purge of a job
still queued: 409) must be documented too. The server keeps running on the test's event loop
meanwhile; the whole test takes about 50 s here.

Bounded for the suite's time box: a few examples per operation (`MAX_EXAMPLES`), more scenarios
for the stateful phase (`STATEFUL_EXAMPLES`, at most `MAX_STEPS` calls each). The coverage phase
(boundary values of every schema; about 40 s more per run) is left out: what it found here (a
literal path such as `/api/ai/jobs/quote` answering an undeclared GET through the
`/api/ai/jobs/{jobId}` template with 422, and its 405s listing that template's methods in
`Allow`; a bulk body's boolean or date-time given as a number) is held by `test_api_mistakes.py`
and the strict fields. The two event-stream routes are left out: a stream that stays open (a
queued job's, or the all-jobs stream) would hold a generated request until its timeout;
`test_events.py` covers them. The operator pauses the fuzzing creates are lifted when it ends,
so none holds another test's jobs.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import Api

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
BUDGET_S = 120.0  # a hang guard: about 30 s and 15 s for the two runs on a quiet 2-core machine
# A schema-valid request may still be refused with 422 where validity depends on what no schema
# can state: an opaque cursor the server never issued, an Idempotency-Key already used with
# another body or a credential mode without a stored key (a create, or an admin retry of a job
# whose owner has no key left), a webhook URL that is not http(s), a usage range whose `from` is
# after its `to` or more than 366 days before it, a `maxCostUsd` with more than 8 decimal places
# (a quote checks a body as a create does; the schema does not state the places), a schedule's
# cron, time zone or interval (exactly one of the two) that the server cannot read, an operator
# pause's `jobType` the engine does not know or a match with no member given.
PAGED_OR_STATEFUL = (
    r"^/(admin-)?api/ai/(jobs|outbox|webhooks|webhook-deliveries|audit|usage|schedules|pauses)"
    r"(/\{jobId\}/(artifacts|retry)|/quote)?$"
)
MAX_EXAMPLES = 5
STATEFUL_EXAMPLES = 20
MAX_STEPS = 6
CONFIG = f"""
generation.max-examples = @MAX_EXAMPLES@

[phases.stateful]
generation.max-examples = {STATEFUL_EXAMPLES}
max-steps = {MAX_STEPS}

[[operations]]
include-path-regex = '{PAGED_OR_STATEFUL}'
checks.positive_data_acceptance.expected-statuses = [
    "2xx", "401", "403", "404", "409", "422", "429"
]
"""


async def run_schemathesis(
    api: Api, *headers: str, tmp: Path, phases: str, max_examples: int = MAX_EXAMPLES
) -> tuple[int, str]:
    argv = [
        str(SCHEMATHESIS),
        "--no-color",
        "--config-file",
        str(tmp / "schemathesis.toml"),
        "run",
        f"{api.base_url}/openapi.json",
        "--checks",
        "all",
        "--seed",
        "20261202",
        "--phases",
        phases,
        "--exclude-path-regex",
        r"/events$",
        "--request-timeout",
        "10",
        "--no-shrink",
        # One worker: Hypothesis parses lambda sources with `ast.parse`, which CPython 3.11
        # does not support from several threads at once (SystemError "AST constructor
        # recursion depth mismatch").
        "--workers",
        "1",
        "--report",
        "junit",
        "--report-dir",
        str(tmp),
    ]
    for h in headers:
        argv += ["-H", h]
    tmp.mkdir(parents=True, exist_ok=True)
    config = CONFIG.replace("@MAX_EXAMPLES@", str(max_examples))
    (tmp / "schemathesis.toml").write_text(config)
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=tmp,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), BUDGET_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"schemathesis did not finish within {BUDGET_S}s") from None
    text = out.decode(errors="replace")
    (tmp / "output.txt").write_text(text)
    return proc.returncode or 0, text


async def lift_every_pause(api: Api) -> int:
    """The operator pauses the fuzzing created, deleted through the admin API: none is left to
    hold another test's jobs. How many there were."""
    admin = api.as_admin()
    listed = await api.http.get("/admin-api/ai/pauses", headers=admin)
    assert listed.status_code == 200, listed.text
    items = listed.json()["items"]
    for p in items:
        r = await api.http.delete(f"/admin-api/ai/pauses/{p['pauseId']}", headers=admin)
        assert r.status_code in (204, 404), r.text
    return len(items)


@pytest.mark.slow
async def test_schemathesis_with_and_without_a_token(api: Api, tmp_path: Path) -> None:
    t0 = time.monotonic()
    auth = f"Authorization: Bearer {api.token('schemathesis', admin=True)}"
    try:
        rc, out = await run_schemathesis(
            api, auth, tmp=tmp_path / "with", phases="examples,fuzzing,stateful"
        )
    finally:
        await lift_every_pause(api)
    assert rc == 0, out[-20000:]
    assert "Stateful" in out and "Stateful (disabled)" not in out, out[-5000:]
    # Unauthenticated, every protected operation answers 401 whatever it is sent: two
    # examples each say so.
    rc, out = await run_schemathesis(
        api, tmp=tmp_path / "without", phases="examples,fuzzing", max_examples=2
    )
    assert rc == 0, out[-20000:]
    assert time.monotonic() - t0 < 2 * BUDGET_S
