"""The runner's workers, each the leader of a process group of its own, and the one place they are started,
waited for and taken down.

- every worker gets a new session (pgid = its pid), so that what it starts (compile workers, a shell) is in its
  group and a signal to the group reaches all of it, and nothing of the runner's terminal group;
- when a worker ends, for whatever reason, its whole group is killed before the worker is reaped (a zombie still
  holds its pgid, so the group id cannot have been recycled when the kill is sent);
- close() kills every live group; WorkerGroups as a context manager closes on the way out, normal or not, and
  turns SIGTERM/SIGHUP into an exception (Terminated) so that the way out runs; once it has, the signal is
  delivered again with its default action (Terminated.redeliver), so the process still dies of it: a program that
  embeds the runner (pytest, under a CI's wall-clock cap) would otherwise catch the exception and go on;
- each worker holds the read end of a pipe whose write end only this process holds (non-inheritable, and
  close_fds): when the runner dies, SIGKILL included, the worker's watchdog sees EOF and kills its group
  (worker.py). PR_SET_PDEATHSIG is not used: it fires when the *thread* that forked the worker exits, and its
  SIGKILL would beat the watchdog, leaving the worker's children behind;
- each live worker has a record in the run's log folder until it is reaped (orphans.py), for a resume to find;
- a CPU cell's worker is forked from a pre-imported zygote where one can serve (zygote.py: the same guarantees,
  its group killed and reaped by the zygote, its parent), else started as an interpreter of its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

import harness.launcher.zygote as zygote
from harness.launcher.orphans import WorkerRecord, drop_record, start_time, write_record
from harness.launcher.watch import PARENT_FD_ENV, TOKEN_ENV, kill_worker
from harness.launcher.zygote import ForkedWorker

_FATAL = (signal.SIGTERM, signal.SIGHUP)  # fatal by default, so they would skip every `finally`
Worker = subprocess.Popen | ForkedWorker


class Cancelled(Exception):
    """The runner is shutting down: the worker was killed by it, and the cell has no outcome to record."""


class Terminated(SystemExit):
    """SIGTERM or SIGHUP, raised in the main thread so that the runner takes its workers down on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)  # the shell's exit code for death by that signal
        self.signum = signum

    def redeliver(self) -> None:
        """Die of the signal, as its default action would have had us die before the workers were down. Called
        once the way out has run; our handler is only ever installed over the default one, so this is what the
        program asked for. Returns only where the signal is blocked in this thread (then the exception goes on)."""
        signal.signal(self.signum, signal.SIG_DFL)
        os.kill(os.getpid(), self.signum)


def _kill(proc: Worker) -> None:
    """The worker's group: killed here, or by the zygote for a forked worker (it alone knows whether it reaped it)."""
    if isinstance(proc, ForkedWorker):
        proc.kill_group()
    else:
        kill_worker(proc.pid)


def _exit_status(proc: Worker) -> int | None:
    """The worker's return code once it has exited (negative: the signal that killed it), None while it runs;
    without reaping it (WNOWAIT), as _exited. Where there is no waitid, poll() reaps."""
    if isinstance(proc, ForkedWorker):
        return proc.exit_status()
    if not hasattr(os, "waitid"):
        return proc.poll()
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return proc.poll() if proc.returncode is None else proc.returncode
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


@dataclass
class RankEnd:
    """How one rank of a cell of several ended: its return code; whether it still ran at the timeout; whether the
    runner killed it because another rank ended badly first (its own death then says nothing)."""

    returncode: int
    timed_out: bool = False
    killed_after: int | None = None  # the rank whose bad end made the runner kill this one


def _exited(proc: Worker) -> bool:
    """Whether the worker has exited, without reaping it (WNOWAIT): until it is reaped its pid, and so its group's
    id, cannot be given to another process. Where there is no waitid, poll() reaps (a far smaller window)."""
    if isinstance(proc, ForkedWorker):
        return proc.exit_status() is not None
    if not hasattr(os, "waitid"):
        return proc.poll() is not None
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


class WorkerGroups:
    """The live workers of one runner. Thread-safe: cells are launched from a thread pool."""

    def __init__(self, records: Path | None = None) -> None:
        self.records = records  # where worker records go (the run's log folder); None: nowhere
        self._read, self._write = os.pipe()  # both non-inheritable; workers get the read end through pass_fds
        self._lock = threading.Lock()
        self._live: dict[int, Worker] = {}
        self._closed = False
        self._runner_start = start_time(os.getpid())
        self._handlers: dict[int, Any] = {}

    def spawn(self, args: list[str], env: dict[str, str], stdout: IO[str], cell: str | None = None,
              rank: int | None = None, fork: bool = False) -> Worker:
        """Start a worker (stdin a text pipe, stderr into stdout) as the leader of a new session. cell, rank: which
        rank of which cell it is, when the cell runs as several (its record says so, for a resume's report).
        fork: a CPU cell's worker (`python -m module …` or `python script …`), forked from a zygote where one can
        serve."""
        token = uuid.uuid4().hex
        env = {**env, PARENT_FD_ENV: str(self._read), TOKEN_ENV: token}
        parent = self._zygote(args, env) if fork else None
        with self._lock:  # close() either sees this worker or makes it never start
            if self._closed:
                raise Cancelled("the runner is shutting down")
            proc: Worker | None = None
            if parent is not None:
                try:
                    proc = parent.spawn([*args, token], env, stdout, self._read)
                except zygote.Unavailable:
                    proc = None  # an interpreter of its own, below
            if proc is None:
                proc = subprocess.Popen(
                    [*args, token], stdin=subprocess.PIPE, stdout=stdout, stderr=subprocess.STDOUT, text=True,
                    env=env, start_new_session=True, close_fds=True, pass_fds=(self._read,),
                )
            self._live[proc.pid] = proc
            if self.records is not None:
                start = proc.start if isinstance(proc, ForkedWorker) else None
                write_record(self.records, WorkerRecord(proc.pid, token, os.getpid(), self._runner_start, cell, rank,
                                                        start))
        return proc

    def _zygote(self, args: list[str], env: dict[str, str]) -> zygote.Zygote | None:
        """This process's zygote for env (zygote.pool: started on first use, its imports seconds), or None: forking
        is off here, this interpreter is not the one asked for, or no zygote can serve env."""
        if not zygote.enabled() or not args or args[0] != sys.executable or self._closed:
            return None
        return zygote.pool.get(env)

    def wait(self, proc: Worker, timeout: float | None) -> tuple[int, bool]:
        """Wait for a worker to end (up to `timeout` seconds), kill its group, reap it: (returncode, timed_out).

        Raises Cancelled when close() was called meanwhile: the worker was killed by the runner, not by its cell.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        delay, timed_out = 0.001, False
        while not _exited(proc) and not self._closed:
            if deadline is not None and time.monotonic() >= deadline:
                timed_out = True
                break
            time.sleep(delay)
            delay = min(2 * delay, 0.05)
        _kill(proc)  # the worker's leftovers on a normal end; all of it on a timeout or close
        returncode = proc.wait()
        with self._lock:
            self._live.pop(proc.pid, None)
            if self.records is not None:
                drop_record(self.records, proc.pid)
            if self._closed:
                raise Cancelled("the runner is shutting down")
        return returncode, timed_out

    def wait_all(self, procs: list[Worker], timeout: float | None) -> list[RankEnd]:
        """Wait for the ranks of one cell (up to `timeout` seconds for all of them), then kill every rank's group
        and reap them all: how each ended, in rank order.

        The first rank to exit nonzero (a crash, a signal) ends the cell: the others are killed at once, since
        they would otherwise wait in a collective for a peer that is gone until the timeout. A rank that exits 0
        is done; the others go on. Raises Cancelled when close() was called meanwhile.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        delay, pending, bad = 0.001, set(range(len(procs))), None
        while pending and bad is None and not self._closed:
            for i in sorted(pending):
                code = _exit_status(procs[i])
                if code is not None:
                    pending.discard(i)
                    if code != 0:
                        bad = i
                        break
            if not pending or bad is not None:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(delay)
            delay = min(2 * delay, 0.05)
        for proc in procs:  # every group first, so that no rank waits on a peer while another is reaped
            _kill(proc)
        ends = []
        for i, proc in enumerate(procs):
            code = proc.wait()
            ends.append(RankEnd(code, timed_out=bad is None and i in pending,
                                killed_after=bad if bad is not None and i in pending else None))
        with self._lock:
            for proc in procs:
                self._live.pop(proc.pid, None)
                if self.records is not None:
                    drop_record(self.records, proc.pid)
            if self._closed:
                raise Cancelled("the runner is shutting down")
        return ends

    def discard(self, procs: list[Worker]) -> None:
        """Kill and reap workers whose cell cannot go on (a rank of it could not be started)."""
        for proc in procs:
            _kill(proc)
        for proc in procs:
            proc.wait()
            with self._lock:
                self._live.pop(proc.pid, None)
                if self.records is not None:
                    drop_record(self.records, proc.pid)

    def close(self) -> None:
        """Kill every live worker's group and start no more. Safe to call again (it kills again)."""
        with self._lock:
            self._closed = True
            for proc in list(self._live.values()):
                _kill(proc)
            for fd in (self._write, self._read):
                if fd >= 0:
                    os.close(fd)  # with the write end gone, any worker that missed the kill kills itself
            self._read = self._write = -1

    def _on_fatal(self, signum: int, frame: FrameType | None) -> None:
        if not self._closed:  # one is enough: a second must not cut the way out short
            raise Terminated(signum)

    def __enter__(self) -> WorkerGroups:
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            for sig in _FATAL:
                if signal.getsignal(sig) is signal.SIG_DFL:  # an embedding program's own handler stays
                    self._handlers[sig] = signal.signal(sig, self._on_fatal)
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.close()
        finally:
            for sig, handler in self._handlers.items():
                signal.signal(sig, handler)
            self._handlers.clear()
