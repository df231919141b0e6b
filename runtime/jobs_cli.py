"""`aijobs jobs list|get|cancel|retry`: an operator's view of jobs through the HTTP API.

It speaks only HTTP (`AIJOBS_API_URL`, `AIJOBS_TOKEN`), never the database: what it shows and
does is exactly what the API allows that token, with the API's own checks and audit. The
answer is printed as indented JSON on stdout; an HTTP error prints the problem+json body on
stderr and exits 1, so scripts can tell the two apart.

`retry` works with the token it is given: it asks the owner's route first (`POST
/api/ai/jobs/{jobId}/retry`, what any user may do with their own job); a job the token does not
own reads there as missing (404), and only then is the admin route asked (`POST
/admin-api/ai/jobs/{jobId}/retry`, any user's job, audited). A user's token refused there (403)
gets the owner route's 404. The CLI never reads the token's claims: the API decides what the
token may do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any
from urllib.parse import quote

import httpx

DEFAULT_API_URL = "http://127.0.0.1:8000"
TIMEOUT_S = 30.0


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    formatter: type[argparse.HelpFormatter],
) -> None:
    """Registers `jobs` and its subcommands on `aijobs`'s subparsers."""
    j = sub.add_parser(
        "jobs",
        help="list, show, cancel or retry jobs through the HTTP API "
        f"(AIJOBS_API_URL, default {DEFAULT_API_URL}; AIJOBS_TOKEN, required)",
        description=__doc__,
        formatter_class=formatter,
    )
    js = j.add_subparsers(dest="jobs_command", required=True)
    ls = js.add_parser("list", help="the token's jobs, newest first", formatter_class=formatter)
    ls.add_argument("--status", default=None, help="only jobs in this lifecycle status")
    ls.add_argument("--job-type", default=None, help="only jobs of this job type")
    ls.add_argument("--limit", type=int, default=20, help="jobs per page (1-100)")
    ls.add_argument("--cursor", default=None, help="nextCursor of the previous page")
    js.add_parser("get", help="one job", formatter_class=formatter).add_argument(
        "job_id", metavar="JOB_ID"
    )
    js.add_parser("cancel", help="cancel one job", formatter_class=formatter).add_argument(
        "job_id", metavar="JOB_ID"
    )
    js.add_parser(
        "retry",
        help="retry a failed or cancelled job: one of the token's own jobs through the owner's "
        "route, any user's job through the admin route with an admin token",
        formatter_class=formatter,
    ).add_argument("job_id", metavar="JOB_ID")
    j.set_defaults(func=cmd_jobs)


def _request(args: argparse.Namespace) -> tuple[str, str, dict[str, Any]]:
    command: str = args.jobs_command
    if command == "list":
        params = {
            "status": args.status,
            "jobType": args.job_type,
            "limit": args.limit,
            "cursor": args.cursor,
        }
        return "GET", "/api/ai/jobs", {k: v for k, v in params.items() if v is not None}
    job = quote(args.job_id, safe="")
    if command == "get":
        return "GET", f"/api/ai/jobs/{job}", {}
    if command == "cancel":
        return "POST", f"/api/ai/jobs/{job}/cancel", {}
    return "POST", f"/api/ai/jobs/{job}/retry", {}


def _admin_retry(
    http: httpx.Client, args: argparse.Namespace, owned: httpx.Response
) -> httpx.Response:
    """After the owner's retry route answered `owned`: a 404 (not the token's job, or no such
    job) is asked again of the admin route, whose answer stands unless it refuses the token's
    role (403: a user's token, for which the owner route's 404 is the answer)."""
    if args.jobs_command != "retry" or owned.status_code != 404:
        return owned
    r = http.post(f"/admin-api/ai/jobs/{quote(args.job_id, safe='')}/retry")
    return owned if r.status_code == 403 else r


def cmd_jobs(args: argparse.Namespace) -> int:
    token = os.environ.get("AIJOBS_TOKEN", "").strip()
    if not token:
        print(
            "aijobs jobs: AIJOBS_TOKEN is not set (a bearer token; `aijobs token --user U` "
            "signs one)",
            file=sys.stderr,
            flush=True,
        )
        return 2
    base_url = os.environ.get("AIJOBS_API_URL", "").strip() or DEFAULT_API_URL
    method, path, params = _request(args)
    try:
        with httpx.Client(
            base_url=base_url.rstrip("/"),
            timeout=TIMEOUT_S,
            headers={"Authorization": f"Bearer {token}"},
        ) as http:
            r = _admin_retry(http, args, http.request(method, path, params=params))
    except httpx.HTTPError as exc:
        print(f"aijobs jobs: {base_url} did not answer: {exc}", file=sys.stderr, flush=True)
        return 1
    if r.is_error:
        print(r.text, file=sys.stderr, flush=True)
        return 1
    print(json.dumps(r.json(), indent=2, ensure_ascii=False), flush=True)
    return 0
