"""The zygote process (zygote.py says why and what it keeps): its imports, then a loop that forks a worker per
request, kills a worker's group before reaping it and reports each exit, until its owner is gone."""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys
import threading
import traceback
from typing import Any

from harness.launcher.orphans import start_time
from harness.launcher.watch import PARENT_FD_ENV, kill_worker, stop_watching_imports, watch_parent

MSG_BYTES = 1 << 20  # the largest message either side sends (a request holds the worker's environment)


def _preimport() -> None:
    """What every cell worker imports before its cell (harness/launcher/worker.py's main)."""
    import harness.cell  # noqa: F401
    import harness.cell.run  # noqa: F401
    import harness.outcome  # noqa: F401
    import pcg_core.errors  # noqa: F401
    import pcg_core.plugins  # noqa: F401


def _child(req: dict[str, Any], fds: list[int], own: tuple[int, ...]) -> None:
    """In the forked worker: become what an exec'd worker is, run argv, exit with its code. Never returns. fds: its
    stdin, its log, its runner's watch pipe; own: the zygote's descriptors, closed here (what its imports opened
    stays open, as they left it)."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.dup2(fds[0], 0)
        os.dup2(fds[1], 1)
        os.dup2(fds[1], 2)
        for fd in {*own, fds[0], fds[1]} - {0, 1, 2}:
            os.close(fd)
        os.environ.clear()
        os.environ.update({**req["env"], PARENT_FD_ENV: str(fds[2])})  # the runner's pipe, as numbered here
        watch_parent()  # the worker's watchdog, as an exec'd worker starts it when it imports harness.launcher
        import runpy

        argv = req["argv"][1:]  # after the interpreter
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            import atexit

            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(sock: socket.socket, watch_fd: int) -> int:
    """Fork a worker per request, kill and reap, report exits; end with the process that owns the zygote (its pipe
    or the socket closed), killing the workers it still has."""
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_w)  # SIGCHLD wakes the select below
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    for f in (sock, wake_r, watch_fd):
        sel.register(f, selectors.EVENT_READ)
    live: set[int] = set()
    own = (sock.fileno(), wake_r, wake_w, watch_fd)
    try:
        while True:
            for key, _ in sel.select(timeout=1.0):
                if key.fileobj == watch_fd and not os.read(watch_fd, 64):
                    return 0  # the owner is gone
                if key.fileobj == wake_r:
                    _drain(wake_r)
                if key.fileobj is sock and not _request(sock, live, own):
                    return 0  # the owner closed us
            _reap(sock, live)
    except (BrokenPipeError, ConnectionResetError):
        return 0
    finally:
        for pid in live:
            kill_worker(pid)
        for pid in live:
            os.waitpid(pid, 0)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _request(sock: socket.socket, live: set[int], own: tuple[int, ...]) -> bool:
    """Serve one request (a kill, a fork); False once the owner has closed the socket."""
    data, fds, _, _ = socket.recv_fds(sock, MSG_BYTES, 4)
    if not data:
        return False
    req = json.loads(data)
    if req["op"] == "kill":
        if req["pid"] in live:  # not yet reaped: its group id is still its own
            kill_worker(req["pid"])
        return True
    if threading.active_count() != 1:  # a fork would copy another thread's locks, held
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"op": "error", "id": req["id"], "error": "the zygote has threads"}).encode())
        return True
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(req, fds, own)
    for fd in fds:
        os.close(fd)
    live.add(pid)
    sock.send(json.dumps({"op": "started", "id": req["id"], "pid": pid, "start": start_time(pid)}).encode())
    return True


def _reap(sock: socket.socket, live: set[int]) -> None:
    """Each exited worker: its group killed, then reaped (the group id cannot have been recycled before), reported."""
    for pid in sorted(live):
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            continue
        kill_worker(pid)
        _, status = os.waitpid(pid, 0)
        live.discard(pid)
        sock.send(json.dumps({"op": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


def main() -> int:
    """The zygote: its imports under the watch thread harness.launcher started (an owner killed meanwhile ends it),
    then one thread only, forking."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    try:
        try:
            _preimport()
        finally:
            watch_fd = stop_watching_imports()
        import torch

        if torch.cuda.is_initialized():
            raise RuntimeError("CUDA was initialized at import: a fork would share it")
        if threading.active_count() != 1:
            raise RuntimeError(f"{threading.active_count()} threads after the imports: a fork would copy their locks")
    except Exception as e:  # noqa: BLE001 — any failure means: no zygote, workers start as interpreters
        sock.send(json.dumps({"op": "error", "error": f"{type(e).__name__}: {e}"}).encode())
        return 1
    sock.send(json.dumps({"op": "ready"}).encode())
    return serve(sock, watch_fd)


if __name__ == "__main__":
    raise SystemExit(main())
