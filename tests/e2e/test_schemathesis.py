"""Schemathesis against the real server: the OpenAPI document must tell the truth.

The CLI runs in a subprocess against the e2e server's `/openapi.json`, with every check (what
`--checks all` runs, set in its config file), twice: with a valid bearer token (an admin's:
every route is reachable) through every phase (examples, coverage, fuzzing and stateful), and
without one (every protected route must answer its documented 401) through examples and
fuzzing. The event streams
are included: each event a stream sends is validated as its schema says (an object with `id`,
`event` and `data`, `data` JSON of the event's own schema, api/stream_schema.py); a stream is
read until its first event, or for a second when none comes (the all-jobs stream of a user
without a change stays open by design). The stateful phase chains operations along the links
schemathesis infers from the responses and `Location` headers (a create, then that job's get,
cancel, purge, artifacts...), so a status one operation leaves a resource in (a purge of a job
still queued: 409) must be documented too.

A schema-valid request is refused with 422 only where its validity depends on what no schema
can state, and only there is 422 accepted (`ACCEPTS_422`):

- an opaque cursor the server never issued, or a date range, on the GET list routes;
- a POST body whose rules depend on the clock, on stored state or on parsing: a create's or a
  quote's `runAt` and cost cap (`COST_CAP_TOO_LOW`, the cap's decimal places), an
  `Idempotency-Key` used with another body, a credential mode without a stored key
  (`CREDENTIAL_MISSING`; a retry of a job whose owner has no key left too), a schedule's cron,
  time zone and dates, a webhook receiver's URL rules (a user's or an admin's), an admin bulk
  filter matching too many jobs, a budget's `limitUsd` (its decimal places, as a cost cap's), a
  feedback's `itemOrdinal` that is no artifact's of the job, a rollout whose arms name a prompt
  version or a model the deployment does not list, or whose weights do not sum to 100, a
  create's flow members checked against each other (a `maxDelayMs` below `delayMs`, a TTL
  shorter than the debounce delay, a deadline before `runAt`), an operator pause's match (a
  `jobType` the engine does not know, no member given).

The operator pauses the fuzzing creates are lifted when it ends, so none holds another test's
jobs.

One check is off where the API means otherwise: `use_after_free` on the reads of one job, since
its DELETE purges the job's private data and leaves the job readable (docs/api.md).

Anything the schema can state, it states: a schedule has exactly one of `intervalSeconds` and
`cron` (`oneOf`), a webhook URL is http(s) (`pattern`), a pin is exemplified per job type.
Every documented request example of a create, a quote and a schedule is accepted on any date
(`test_every_documented_example_is_accepted`).

Bounded for the suite's time box: a few examples per operation (`MAX_EXAMPLES`), more scenarios
for the stateful phase (`STATEFUL_EXAMPLES`, at most `MAX_STEPS` calls each).
"""

from __future__ import annotations

import asyncio
import copy
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Api

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
BUDGET_S = 240.0  # a hang guard: about 90 s and 15 s for the two runs on a quiet 2-core machine
# GET list routes: an opaque cursor the server never issued, a date range out of order or too
# long.
LISTS = (
    r"^GET /(admin-)?api/ai/(jobs|outbox|webhooks|webhook-deliveries|audit|usage|schedules)"
    r"(/\{jobId\}/artifacts)?$"
)
# POST bodies whose rules depend on the clock, stored state or parsing (module docstring).
BODIES = (
    r"^(POST /(api/ai/(jobs|jobs/quote|schedules|webhooks|jobs/\{jobId\}/(retry|feedback))"
    r"|admin-api/ai/(jobs/\{jobId\}/retry|bulk/cancel|bulk/retry|webhooks|pauses))"
    r"|PUT /admin-api/ai/(budgets/\{scope\}/\{scopeId\}|job-types/\{jobType\}/rollout))$"
)
EVENT_STREAMS = r"/events$"
JOB_READS = r"^/api/ai/jobs/\{jobId\}"
# A sweep with another seed or more examples: AIJOBS_SCHEMATHESIS_SEED, _EXAMPLES.
SEED = os.environ.get("AIJOBS_SCHEMATHESIS_SEED", "20261202")
MAX_EXAMPLES = int(os.environ.get("AIJOBS_SCHEMATHESIS_EXAMPLES", "5"))
STATEFUL_EXAMPLES = 20
MAX_STEPS = 6
# Every check, as `--checks all` runs them (the built-in ones and the 10 s response time
# limit), given in the file rather than on the command line: a check named there overrides an
# operation's own, and one operation needs one off (`JOB_READS`).
CONFIG = f"""
generation.max-examples = @MAX_EXAMPLES@
checks.max_response_time = 10.0

[phases.stateful]
generation.max-examples = {STATEFUL_EXAMPLES}
max-steps = {MAX_STEPS}

[[operations]]
include-name-regex = '{LISTS}'
checks.positive_data_acceptance.expected-statuses = [
    "2xx", "401", "403", "404", "409", "422", "429"
]

[[operations]]
include-name-regex = '{BODIES}'
checks.positive_data_acceptance.expected-statuses = [
    "2xx", "401", "403", "404", "409", "422", "429"
]

[[operations]]
include-path-regex = '{EVENT_STREAMS}'
max-stream-events = 1
request-timeout = 1

# `DELETE /api/ai/jobs/{{jobId}}` purges the job's private data and the job stays, readable, as
# `privateDataPurged: true` (docs/api.md "Purging a job"): reading it afterwards is no use of
# a freed resource.
[[operations]]
include-path-regex = '{JOB_READS}'
checks.use_after_free.enabled = false
"""
# Every other operation answers a schema-valid request with one of schemathesis's defaults.
ACCEPTS_422 = (LISTS, BODIES)


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
        "--seed",
        SEED,
        "--phases",
        phases,
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
            api, auth, tmp=tmp_path / "with", phases="examples,coverage,fuzzing,stateful"
        )
    finally:
        await lift_every_pause(api)
    assert rc == 0, out[-20000:]
    assert "Stateful" in out and "Stateful (disabled)" not in out, out[-5000:]
    assert "Coverage (disabled)" not in out, out[-5000:]
    for stream in ("GET /api/ai/jobs/events", "GET /api/ai/jobs/{jobId}/events"):
        assert stream in out or "Selected: " in out, out[-5000:]
    # Unauthenticated, every protected operation answers 401 whatever it is sent: two
    # examples each say so.
    rc, out = await run_schemathesis(
        api, tmp=tmp_path / "without", phases="examples,fuzzing", max_examples=2
    )
    assert rc == 0, out[-20000:]
    assert time.monotonic() - t0 < 2 * BUDGET_S
    # A rollout the fuzzing put would give later tests' jobs an arm: none is left behind.
    for job_type in ("synthetic", "quiz_generation", "flashcard_generation", "weak_point_analysis"):
        gone = await api.http.delete(
            f"/admin-api/ai/job-types/{job_type}/rollout", headers=api.as_admin()
        )
        assert gone.status_code in (204, 404), gone.text


# ---- the documented examples ----------------------------------------------------------------

EXAMPLED = (("/api/ai/jobs", 202), ("/api/ai/jobs/quote", 200), ("/api/ai/schedules", 201))


def _resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return dict(spec["components"]["schemas"][ref.rsplit("/", 1)[-1]])
    return schema


def _property_examples(spec: dict[str, Any], schema: dict[str, Any]) -> list[tuple[str, Any]]:
    """(property, example) of every property example of `schema`."""
    out: list[tuple[str, Any]] = []
    for name, prop in _resolve(spec, schema).get("properties", {}).items():
        examples = prop.get("examples", []) + ([prop["example"]] if "example" in prop else [])
        out += [(name, example) for example in examples]
    return out


def documented_bodies(spec: dict[str, Any], path: str) -> list[dict[str, Any]]:
    """Each documented example of a POST body, and each property example put into one of them
    (as schemathesis's examples phase combines them): a `oneOf` variant's into the example of
    its own job type."""
    media = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    bodies = [e["value"] for e in media.get("examples", {}).values()]
    if "example" in media:
        bodies.append(media["example"])
    assert bodies, path
    schema = _resolve(spec, media["schema"])
    variants = [_resolve(spec, v) for v in schema.get("oneOf", [])] or [schema]
    out = list(bodies)
    for variant in variants:
        own = variant.get("properties", {}).get("jobType", {}).get("enum", [])
        base = next((b for b in bodies if own and b.get("jobType") == own[0]), bodies[0])
        for name, example in _property_examples(spec, variant):
            if name != "jobType":
                out.append({**copy.deepcopy(base), name: example})
    return out


async def test_every_documented_example_is_accepted(api: Api) -> None:
    """On any date, with an admin's token and a fresh Idempotency-Key, at the server's default
    settings: no absolute time that expires, no combination the server refuses."""
    spec = (await api.http.get("/openapi.json")).json()
    headers = api.as_admin("examples")
    for path, status in EXAMPLED:
        for body in documented_bodies(spec, path):
            if body.get("jobType") not in spec["x-job-types"]:
                continue  # a type this server does not offer
            key = {"Idempotency-Key": f"example-{uuid.uuid4()}"}
            r = await api.http.post(path, json=body, headers=headers | key)
            assert r.status_code == status, (path, body, r.text)
