"""The API figure's load generator: wrk, a native closed-loop HTTP benchmark (C + LuaJIT).

`connections` keep-alive connections over `threads` event-loop threads, each sending its next
request as soon as the previous answer arrived, for a whole number of seconds. The requests come
from a Lua script the bench writes per run:
- a list of fully formatted requests (method, path, headers, body), rotated through, each
  thread starting at its own offset: GETs of seeded jobs with their owners' tokens, POSTs spread
  over many users so per-user quotas never bind;
- or, for POSTs with a distinct `Idempotency-Key` each, a request formatted per call.
The script's `done()` prints one JSON line with exact percentiles (wrk's own text gives only
50/75/90/99); wrk's text output (`--latency`) is parsed too and kept in the results.

The client's CPU is wrk's utime + stime from /proc/<pid>/stat, read once wrk has exited but before
it is reaped (a zombie's stat holds its final counts), divided by the wall time of the run, so a
figure shows whether the client or the server was the bottleneck.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.procs import process_cpu_s

WRK_THREADS = 2  # wrk -t of the API figure (at most its connections)
_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}

_DONE = r"""
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH_WRK {\"duration_us\":%d,\"requests\":%d,\"bytes\":%d,\"connect\":%d,\"read\":%d," ..
    "\"write\":%d,\"status\":%d,\"timeout\":%d,\"mean_us\":%.1f,\"max_us\":%d,\"p50_us\":%d," ..
    "\"p90_us\":%d,\"p95_us\":%d,\"p99_us\":%d,\"p999_us\":%d}\n",
    summary.duration, summary.requests, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency.mean, latency.max, latency:percentile(50), latency:percentile(90),
    latency:percentile(95), latency:percentile(99), latency:percentile(99.9)))
end
"""

_THREAD_IDS = """
local nthreads = 0
function setup(thread)
  nthreads = nthreads + 1
  thread:set("tid", nthreads)
end
"""


def wrk_path() -> str | None:
    return shutil.which("wrk")


def wrk_version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    return (out.stdout + out.stderr).strip().splitlines()[0] if (out.stdout + out.stderr) else "?"


def _lua(s: str) -> str:
    """A Lua string literal."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _headers(h: dict[str, str]) -> str:
    return "{" + ", ".join(f"[{_lua(k)}] = {_lua(v)}" for k, v in h.items()) + "}"


def script_rotating(requests: list[tuple[str, str, dict[str, str], str | None]]) -> str:
    """Requests formatted once in `init`, then rotated through (each thread from its offset)."""
    rows = ",\n".join(
        f"  {{{_lua(m)}, {_lua(p)}, {_headers(h)}, {_lua(b) if b is not None else 'nil'}}}"
        for m, p, h, b in requests
    )
    return f"""{_THREAD_IDS}
local specs = {{
{rows}
}}
local reqs = {{}}
local n = 0
local i = 0
function init(args)
  for k = 1, #specs do
    local s = specs[k]
    reqs[k] = wrk.format(s[1], s[2], s[3], s[4])
  end
  n = #reqs
  i = ((tid or 1) * 7919) % n
end
function request()
  i = i % n + 1
  return reqs[i]
end
{_DONE}"""


def script_keyed_post(path: str, auths: list[str], body: str) -> str:
    """POSTs over `auths` (one per user, rotated), each with an Idempotency-Key of its own."""
    prefix = uuid.uuid4().hex[:12]
    rows = ",\n".join(f"  {_lua(a)}" for a in auths)
    return f"""{_THREAD_IDS}
local auths = {{
{rows}
}}
local body = {_lua(body)}
local n = #auths
local i = 0
local count = 0
function init(args)
  i = ((tid or 1) * 7919) % n
end
function request()
  i = i % n + 1
  count = count + 1
  return wrk.format("POST", {_lua(path)}, {{
    ["Authorization"] = auths[i],
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = "{prefix}-" .. (tid or 1) .. "-" .. count,
  }}, body)
end
{_DONE}"""


def _ms(value: str, unit: str) -> float:
    return float(value) * _UNITS_MS[unit]


def parse_output(text: str) -> dict[str, Any]:
    """wrk's text (`--latency`) and the script's BENCH_WRK line."""
    out: dict[str, Any] = {}
    m = re.search(r"Requests/sec:\s+([0-9.]+)", text)
    out["wrk_requests_per_s"] = float(m.group(1)) if m else None
    dist: dict[str, float] = {}
    in_dist = False
    for line in text.splitlines():
        if "Latency Distribution" in line:
            in_dist = True
            continue
        if in_dist:
            d = re.match(r"\s+([0-9.]+)%\s+([0-9.]+)(us|ms|s|m|h)\s*$", line)
            if not d:
                in_dist = False
                continue
            dist[d.group(1)] = _ms(d.group(2), d.group(3))
    out["latency_distribution_ms"] = dist
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    out["non_2xx_text"] = int(m.group(1)) if m else 0
    m = re.search(r"^BENCH_WRK (\{.*\})\s*$", text, re.MULTILINE)
    if m is None:
        raise RuntimeError(f"wrk printed no summary line; output:\n{text[-2000:]}")
    out["summary"] = json.loads(m.group(1))
    return out


def _stat_cpu_s(pid: int) -> float | None:
    try:
        return process_cpu_s(pid)
    except (OSError, ValueError, IndexError):
        return None


async def run_wrk(
    path: str,
    url: str,
    script: str,
    *,
    threads: int,
    connections: int,
    seconds: float,
    server_pid: int | None,
    work_dir: Path,
) -> dict[str, Any]:
    secs = max(1, round(seconds))  # wrk takes whole seconds
    threads = max(1, min(threads, connections))
    script_path = work_dir / f"wrk-{uuid.uuid4().hex[:8]}.lua"
    script_path.write_text(script)
    argv = [
        path,
        "-t",
        str(threads),
        "-c",
        str(connections),
        "-d",
        f"{secs}s",
        "--timeout",
        "30s",
        "--latency",
        "-s",
        str(script_path),
        url,
    ]
    ran = await _run(argv, secs, server_pid)
    script_path.unlink(missing_ok=True)
    if ran.returncode != 0:
        raise RuntimeError(f"wrk exited with {ran.returncode}:\n{ran.text[-2000:]}")
    return _result(argv, url, ran)


@dataclass(frozen=True)
class _Ran:
    """One wrk run: its output, exit code, wall time, and the CPU seconds of wrk and of the
    server around it (None where /proc could not be read)."""

    text: str
    returncode: int
    wall: float
    cpu: float | None
    srv0: float | None
    srv1: float | None


async def _run(argv: list[str], secs: int, server_pid: int | None) -> _Ran:
    """Run wrk to its exit and read its CPU before reaping it (a zombie's stat holds the totals)."""
    from runtime.procs import die_with_parent

    with tempfile.TemporaryFile() as out_f:
        srv0 = _stat_cpu_s(server_pid) if server_pid else None
        t0 = time.perf_counter()
        # Spawned from the loop's (main) thread: the parent-death signal is tied to it.
        proc = subprocess.Popen(
            argv,
            stdout=out_f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
        try:
            # Wait for the exit without reaping, so /proc/<pid>/stat still holds the totals.
            await asyncio.wait_for(
                asyncio.to_thread(os.waitid, os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT),
                timeout=secs + 60,
            )
            wall = time.perf_counter() - t0
            cpu = _stat_cpu_s(proc.pid)
            srv1 = _stat_cpu_s(server_pid) if server_pid else None
        finally:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        out_f.seek(0)
        text = out_f.read().decode(errors="replace")
    return _Ran(text, proc.returncode, wall, cpu, srv0, srv1)


def _result(argv: list[str], url: str, ran: _Ran) -> dict[str, Any]:
    """The run's figures: the script's exact percentiles, wrk's own text, and the CPU shares."""
    text, wall, cpu, srv0, srv1 = ran.text, ran.wall, ran.cpu, ran.srv0, ran.srv1
    parsed = parse_output(text)
    s = parsed["summary"]
    dur = s["duration_us"] / 1e6
    errors = {k: s[k] for k in ("connect", "read", "write", "timeout") if s[k]}
    ok = s["requests"] - s["status"]
    return {
        "client": "wrk",
        "argv": [*argv[1:-3], url],
        "ok": ok,
        "requests": s["requests"],
        "req_per_s": ok / dur if dur else 0.0,  # answers below 400, as the Python client counted
        "wall_s": wall,
        "duration_s": dur,
        "p50_ms": s["p50_us"] / 1e3,
        "p90_ms": s["p90_us"] / 1e3,
        "p95_ms": s["p95_us"] / 1e3,
        "p99_ms": s["p99_us"] / 1e3,
        "p999_ms": s["p999_us"] / 1e3,
        "max_ms": s["max_us"] / 1e3,
        "mean_ms": s["mean_us"] / 1e3,
        "non_2xx": s["status"],
        "transport_errors": errors,
        "client_cpu_s": cpu,
        "client_cpu_pct": 100.0 * cpu / wall if cpu is not None else None,
        "server_cpu_pct": (
            100.0 * (srv1 - srv0) / wall if srv0 is not None and srv1 is not None else None
        ),
        "wrk_requests_per_s": parsed["wrk_requests_per_s"],
        "latency_distribution_ms": parsed["latency_distribution_ms"],
        "stdout": text.replace(text[text.find("BENCH_WRK") :], "").rstrip()
        if "BENCH_WRK" in text
        else text,
    }
