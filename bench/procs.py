"""The bench's child processes: each starts with its own log file, is registered in `PROCS` the
moment it starts, and gets the kernel's parent-death signal.

`stop_all()` (called from the outermost `finally` of `bench/cli.py`) stops whatever is still
running, so even a SIGKILLed bench leaves no worker behind. Children are spawned from the main
thread only: PR_SET_PDEATHSIG fires when the spawning *thread* exits. CPU time is read from
`/proc/<pid>/stat`, per process, per process tree and per thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Only these variables of the caller's environment reach the children; engine knobs come from
# the bench's own parameters (or --env), so a stray DB_POOL_SIZE in a shell cannot skew a run.
_INHERITED_ENV = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "TZ",
    "VIRTUAL_ENV",
    "PYTHONPATH",
    "XDG_RUNTIME_DIR",
)

_T0 = time.monotonic()


def progress(msg: str) -> None:
    print(f"[bench {time.monotonic() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# ---- child processes ----------------------------------------------------------------------


class Proc:
    """A child process with its own log file; `peak_rss_kb` reads VmHWM while it runs."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.peak_rss_kb: int | None = None
        self.cpu_s: float | None = None
        self.cpu_by_thread: dict[str, float] = {}
        self.exit_code: int | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        from runtime.procs import die_with_parent

        out = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
                start_new_session=True,  # a Ctrl-C reaches the bench only; it stops children
            )
        finally:
            out.close()
        PROCS.append(self)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def read_status(self) -> None:
        """Remember peak RSS and CPU time (call while alive; kept after exit)."""
        if not self.alive():
            return
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_rss_kb = int(line.split()[1])
            self.cpu_s = process_cpu_s(self.pid)
            self.cpu_by_thread = thread_cpu_s(self.pid)

    def signal_stop(self) -> None:
        self.read_status()
        if self.alive():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout_s: float = 15.0) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            progress(f"{self.name} did not stop in {timeout_s:.0f}s; killing it")
            self.proc.kill()
            self.proc.wait(5)
        self.exit_code = self.proc.returncode
        if self in PROCS:
            PROCS.remove(self)

    def stop(self, timeout_s: float = 15.0) -> None:
        self.signal_stop()
        self.wait_stopped(timeout_s)

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def log_levels(self) -> dict[str, int]:
        """How many error / warning lines the child logged (JSON-lines logs, plus tracebacks)."""
        out = {"error": 0, "warning": 0, "traceback": 0}
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return out
        for line in text.splitlines():
            if '"level": "error"' in line or '"level": "critical"' in line:
                out["error"] += 1
            elif '"level": "warning"' in line:
                out["warning"] += 1
            elif line.startswith("Traceback"):
                out["traceback"] += 1
        return out


PROCS: list[Proc] = []


def stop_all() -> None:
    """Stop every child still running (SIGTERM all first, then wait for each)."""
    procs = list(PROCS)
    for p in procs:
        p.signal_stop()
    for p in procs:
        p.wait_stopped()


def stop_group(procs: list[Proc]) -> None:
    for p in procs:
        p.signal_stop()
    for p in procs:
        p.wait_stopped()


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of /proc/<pid>/stat (1-based, pid is field 1).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a server and its children (PostgreSQL: postmaster + backends): its own
    utime + stime, the cutime + cstime of the children it reaped, and its live children's."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            f = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(f[1]) == pid:  # field 4, the parent pid
            ticks += int(f[11]) + int(f[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds per thread group: `main` (the asyncio loop: activities, SQL, HTTP), the other
    Python threads (e.g. the SDK's workflow-task executor) and the SDK core's Rust threads, by
    their thread names."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = "main" if task.name == str(pid) else comm
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return {k: round(v, 2) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


# Compiled bytecode of the measured processes, outside the checkout. The image's `pip install .`
# compiles every module, so a production worker's sandbox re-imports the workflow module from
# bytecode at each run; a bench child that could not write bytecode (PYTHONDONTWRITEBYTECODE, set
# in the image and in many shells) would compile the workflow source at each run instead, a cost
# (about 2 ms per engine job, less for the baselines' smaller module) nothing ships with.
PYCACHE = Path(tempfile.gettempdir()) / f"aijobs-bench-pycache-{os.getuid()}"


def child_env(base: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in _INHERITED_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    env.update(base)
    return env


def check_alive(procs: list[Proc]) -> None:
    for p in procs:
        if not p.alive():
            code = p.proc.returncode if p.proc else None
            raise RuntimeError(f"{p.name} exited (code {code}); log tail:\n{p.tail()}")
