"""The watch every runner's worker keeps on its runner, and the names the runner and its workers share.

A worker leads a process group of its own and never outlives its runner: a watchdog thread blocks on the read end
of a pipe whose only write end the runner holds; when the runner is gone, however it died (SIGKILL included), the
read returns EOF and the watchdog kills the worker's whole group. Apart from worker.py (the worker's entry point,
which nothing imports: `python -m` would otherwise run a second copy of an imported module).
"""

from __future__ import annotations

import os
import select  # here, not in _poll: a lazy import there waits on the import lock its main thread may hold
import signal
import sys
import threading
import time
from collections.abc import Callable

PHASE_MARK = "PCG-PHASE"
PARENT_FD_ENV = "PCG_WORKER_PARENT_FD"  # the read end of the runner's pipe (its fd number in the worker)
TOKEN_ENV = "PCG_WORKER_TOKEN"  # the worker's identity, inherited by what it starts (orphans.py reads it)
ZYGOTE_FD_ENV = "PCG_ZYGOTE_WATCH_FD"  # the same pipe, in a zygote (zygote.py): watched only while it imports
_zygote_watch: tuple[threading.Thread, threading.Event, int] | None = None


def phase_marks() -> Callable[[str], None]:
    """run_cell's on_phase for a cell process: `PCG-PHASE <phase> at <s> s` on stderr as each phase starts (seconds
    since the cell began), so its log says how far it got and where its time went, also when it is killed
    (classify.py reads the phase names back)."""
    start = time.perf_counter()

    def mark(phase: str) -> None:
        print(f"{PHASE_MARK} {phase} at {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)

    return mark


def kill_worker(pid: int) -> None:
    """A worker's process group (its pgid is its pid: a session of its own), and the worker itself (a forked worker
    killed before its setsid has no group yet). Already gone is fine (on macOS a group of zombies answers EPERM)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _die() -> None:
    # Our own session (the runner starts us with one): the group is this process and what it started.
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def watch_parent() -> threading.Thread | None:
    """Start the watchdog when a runner handed this process its pipe; None when run on its own. In a zygote the
    watch is a thread that stops_watching_imports() ends (a zygote forks only with one thread)."""
    global _zygote_watch
    fd_text = os.environ.pop(PARENT_FD_ENV, None)  # popped: what the worker starts must not think it holds it
    zygote_fd = os.environ.pop(ZYGOTE_FD_ENV, None)
    if zygote_fd is not None:
        fd, stop = int(zygote_fd), threading.Event()
        thread = threading.Thread(target=_poll, args=(fd, stop), name="pcg-zygote-watch", daemon=True)
        thread.start()
        _zygote_watch = (thread, stop, fd)
        return thread
    if fd_text is None:
        return None
    fd = int(fd_text)
    os.set_inheritable(fd, False)

    def watch() -> None:
        try:
            while os.read(fd, 64):  # the runner never writes: this returns b"" (EOF) once it is gone
                pass
        except OSError:
            pass
        _die()

    thread = threading.Thread(target=watch, name="pcg-runner-watch", daemon=True)
    thread.start()
    return thread


def _poll(fd: int, stop: threading.Event) -> None:
    """The zygote's watch while it imports: the pipe's end of file, looked for every 0.1 s until stopped."""
    while not stop.is_set():
        if select.select([fd], [], [], 0.1)[0] and not os.read(fd, 64):
            _die()


def stop_watching_imports() -> int:
    """In a zygote, once its imports are done: end the watch thread (the zygote's loop watches the pipe from now
    on); the pipe's descriptor."""
    assert _zygote_watch is not None, "not a zygote"
    thread, stop, fd = _zygote_watch
    stop.set()
    thread.join()
    return fd
