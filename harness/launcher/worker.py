"""A cell's own process: reads a CellSpec (JSON) on stdin, runs it, writes its CellOutcome (JSON) to argv[1].

Phase markers go to stderr so that the parent can classify a death without a result (segfault, OOM kill).

The worker leads a process group of its own and never outlives its runner: a watchdog thread blocks on the read
end of a pipe whose only write end the runner holds; when the runner is gone, however it died (SIGKILL
included), the read returns EOF and the watchdog kills the worker's whole group.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.cell import CellSpec
    from harness.outcome import CellOutcome

PHASE_MARK = "PCG-PHASE"
PARENT_FD_ENV = "PCG_WORKER_PARENT_FD"  # the read end of the runner's pipe (its fd number in the worker)
TOKEN_ENV = "PCG_WORKER_TOKEN"  # the worker's identity, inherited by what it starts (orphans.py reads it)
ZYGOTE_FD_ENV = "PCG_ZYGOTE_WATCH_FD"  # the same pipe, in a zygote (zygote.py): watched only while it imports
_zygote_watch: tuple[threading.Thread, threading.Event, int] | None = None


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
    import select

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


def _other_engine(spec: CellSpec) -> CellOutcome:
    """An SGLang cell: its two servers on the GPUs this worker holds, their logs after the verdict in this log."""
    import tempfile

    from harness.sglang.cell import run_sglang_cell

    with tempfile.TemporaryDirectory(prefix="pcg-sglang-") as work:
        try:
            return run_sglang_cell(spec, Path(work))
        finally:
            for log in sorted(Path(work).glob("*.log")):
                print(f"--- {log.name} (its last 20,000 characters) ---\n{log.read_text(errors='replace')[-20_000:]}",
                      flush=True)


def main() -> int:
    watch_parent()  # started already, as the package was imported (harness/launcher/__init__.py); this one is a no-op
    from harness.cell import CellSpec, run_cell
    from harness.outcome import CellOutcome, Status
    from pcg_core.errors import ConfigError
    from pcg_core.plugins import load_plugins

    out = Path(sys.argv[1])
    spec = CellSpec(**json.load(sys.stdin))

    def phase(name: str) -> None:
        print(f"{PHASE_MARK} {name}", file=sys.stderr, flush=True)

    try:
        load_plugins()
        outcome = run_cell(spec, on_phase=phase) if spec.engine == "pcg" else _other_engine(spec)
    except ConfigError as e:
        outcome = CellOutcome(status=Status.FAIL_RUN, reason=f"bad input: {e}")
    tmp = out.with_suffix(".tmp")
    tmp.write_text(outcome.to_json())
    os.replace(tmp, out)  # the parent sees a whole result or none
    from pcg_core.distributed import shutdown

    shutdown()  # a rank of a parallel cell: its process group torn down before the interpreter's exit (NCCL warns)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
