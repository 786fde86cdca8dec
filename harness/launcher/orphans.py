"""Worker records in a run's log folder, and the reaping of workers an earlier runner of the run left behind.

A runner killed by SIGKILL cannot take its workers down; their pipe watchdog (worker.py) normally does, but a
worker stuck where no Python thread can run would outlive it and go on writing into the run. Each worker's
record (pid, its token, and its runner's pid and start time) stays in `<run logs>/workers/` until the runner
reaps it, so a resumed run finds what is left and kills it before redoing its cell.

A process is killed only when it carries a recorded token (its environment on Linux, which its own children
inherit; its command line elsewhere), and only when the runner that started it is gone: a recycled pid, an
unrelated process or the worker of a live runner is left alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.launcher.watch import TOKEN_ENV

_PROC = Path("/proc")


@dataclass(frozen=True)
class WorkerRecord:
    """One worker, as its runner wrote it down when it started it (the worker's pgid is its pid: a session of
    its own)."""

    pid: int
    token: str
    runner_pid: int
    runner_start: str | None  # the runner's start time, so that a recycled runner pid does not pass for it
    # A rank of a cell of several processes (parallel modes): the cell's key and the rank, so that a resume can say
    # which cell's ranks it killed. Every rank is a worker of its own (a session, a token, a record); None: one rank.
    cell: str | None = None
    rank: int | None = None
    # The worker's start time, for a worker forked from a zygote (zygote.py): its /proc environ is the zygote's and
    # holds no token, so it is known by pid and start time (what it started carries the token as usual).
    start: str | None = None

    @classmethod
    def mine(cls, pid: int, token: str, cell: str | None = None, rank: int | None = None) -> WorkerRecord:
        """The record of a worker this process has just started."""
        return cls(pid, token, os.getpid(), start_time(os.getpid()), cell, rank)


def write_record(folder: Path, rec: WorkerRecord) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"{rec.pid}.tmp"
    tmp.write_text(json.dumps(asdict(rec)))
    os.replace(tmp, folder / f"{rec.pid}.json")


def drop_record(folder: Path, pid: int) -> None:
    (folder / f"{pid}.json").unlink(missing_ok=True)


def read_records(folder: Path) -> list[WorkerRecord]:
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            out.append(WorkerRecord(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            path.unlink(missing_ok=True)  # torn or foreign: names nothing that can be checked
    return out


def _ps(pid: int, field: str) -> str | None:
    try:
        out = subprocess.run(["ps", "-ww", "-o", f"{field}=", "-p", str(pid)], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (state first), or None."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def start_time(pid: int) -> str | None:
    """When `pid` started (clock ticks since boot on Linux, ps's lstart elsewhere); None when it is gone."""
    if _PROC.is_dir():
        fields = _stat(pid)
        return fields[19] if fields else None
    return _ps(pid, "lstart")


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not: it only waits for its parent to read its status)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if _PROC.is_dir():
        fields = _stat(pid)
        return fields is not None and fields[0] != "Z"
    return not (_ps(pid, "state") or "Z").startswith("Z")


def _token_of(pid: int) -> str | None:
    """The worker token `pid` carries: in its environment on Linux (inherited by what the worker started), on its
    command line elsewhere (the worker's last argument)."""
    if _PROC.is_dir():
        try:
            env = (_PROC / str(pid) / "environ").read_bytes()
        except OSError:  # gone, or another user's
            return None
        prefix = f"{TOKEN_ENV}=".encode()
        found = [v[len(prefix):] for v in env.split(b"\0") if v.startswith(prefix)]
        return found[0].decode(errors="replace") if found else None
    args = _ps(pid, "command")
    return args.rsplit(None, 1)[-1] if args and "harness.launcher.worker" in args else None


def _candidates(records: list[WorkerRecord]) -> list[int]:
    """Pids to look at: every process on Linux (a worker's children carry its token too), else the recorded."""
    if _PROC.is_dir():
        return [int(p.name) for p in _PROC.iterdir() if p.name.isdigit()]
    return [r.pid for r in records]


def reap_orphans(folder: Path, wait_s: float = 5.0) -> list[int]:
    """Kill what is left of workers whose runner is gone (each with its process group); the pids killed.

    The records of those runners are dropped; a live runner's are kept. Waits up to `wait_s` for the killed to
    be gone, so that their cells are redone by nobody else.
    """
    records = read_records(folder)
    stale = {r.token: r for r in records if not (alive(r.runner_pid) and start_time(r.runner_pid) == r.runner_start)}
    if not stale:
        return []
    forked = {r.pid: r for r in stale.values() if r.start is not None}
    me = os.getpid()
    killed = []
    for pid in _candidates(list(stale.values())):
        token = _token_of(pid) if pid != me else None
        rec = stale.get(token) if token is not None else None
        if rec is None and pid in forked and start_time(pid) == forked[pid].start:
            rec = forked[pid]
        if rec is None or not alive(pid):
            continue
        try:
            # A verified member vouches for its group when that is the worker's own session (pgid = its pid):
            # the worker and whatever it started, nothing else.
            if os.getpgid(pid) == rec.pid:
                os.killpg(rec.pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (ProcessLookupError, PermissionError):
            continue
    deadline = time.monotonic() + wait_s
    while any(alive(p) for p in killed) and time.monotonic() < deadline:
        time.sleep(0.02)
    for rec in stale.values():
        drop_record(folder, rec.pid)
    return killed


def report_reaped(run_id: int, killed: list[int]) -> None:
    if killed:
        print(f"pcgh: run {run_id}: killed {len(killed)} process(es) an earlier runner of this run left behind "
              f"(pids {', '.join(map(str, killed))})", file=sys.stderr)
