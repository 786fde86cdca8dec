"""A pre-imported parent for CPU cell workers (a zygote): each worker is forked from it, not started afresh.

Why: a tiny CPU cell does ~3 s of work in ~8 s of wall time; the rest is an interpreter starting and importing
torch, dynamo and transformers, again for every cell (CI's smoke matrix starts ~150 workers). A zygote imports
them once per process and environment (pool: shared by the process's runners), then forks a worker per request.
The zygote itself is zygote_serve.py.

What an exec'd worker has, a forked one has too (groups.py's guarantees):
- it leads a session of its own; its stdin is the runner's pipe, its stdout and stderr the cell's log;
- it holds the read end of its runner's watch pipe (passed with the request) and its watchdog kills its group when
  the runner is gone; the zygote watches a pipe of the process that owns it and exits, killing what it has, when
  that process is gone;
- its group is killed before it is reaped. Only its parent can reap it, and the parent is the zygote, so the zygote
  does both, in that order, and then reports the exit; the runner's kills go through the zygote, served in order
  with the reaping, so no group id is signalled once its leader was reaped;
- orphans.py knows it by pid and start time (its /proc environ is the zygote's); what it starts inherits the
  worker's environment, token included, as from an exec'd worker.

What differs, and why it is safe: the worker's environment is set after the imports. A zygote serves only requests
whose environment equals its own but for the per-worker keys (PER_WORKER_KEYS, none read at import); another
environment gets a zygote of its own. CUDA cells are never forked (the callers ask for CPU cells only): whatever
touched the driver at import would be the zygote's, not the worker's.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from typing import IO, Any

from harness.launcher.watch import PARENT_FD_ENV, TOKEN_ENV, ZYGOTE_FD_ENV, kill_worker
from harness.launcher.zygote_serve import MSG_BYTES

# The keys a request's environment may differ in from its zygote's: read when the worker runs, never at import.
PER_WORKER_KEYS = frozenset({PARENT_FD_ENV, TOKEN_ENV, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                             "MASTER_ADDR", "MASTER_PORT"})
FORK_ENV = "PCG_FORK_WORKERS"  # "0": every worker an interpreter of its own
START_TIMEOUT_S = 300.0  # the zygote's imports (seconds; minutes on a loaded machine)
FORK_TIMEOUT_S = 60.0  # a fork's answer
IDLE_KEPT = 2  # zygotes without a live worker kept per process (each holds ~0.5 GB of imports)


def enabled() -> bool:
    """Whether this host forks CPU workers: Linux (descriptors passed over a Unix socket), not switched off."""
    return sys.platform == "linux" and hasattr(socket, "send_fds") and os.environ.get(FORK_ENV, "1") != "0"


def base_env(env: dict[str, str]) -> dict[str, str]:
    """What keys a zygote: the environment less the per-worker keys."""
    return {k: v for k, v in env.items() if k not in PER_WORKER_KEYS}


class Unavailable(Exception):
    """The zygote cannot serve (it failed to start, or is gone): start the worker as an interpreter of its own."""


class ForkedWorker:
    """A worker the zygote forked, as groups.py uses a Popen: pid, stdin, wait(); its exit as the zygote reported it
    (the zygote has killed its group and reaped it by then)."""

    def __init__(self, pid: int, start: str | None, zygote: Zygote) -> None:
        self.pid, self.start, self.zygote = pid, start, zygote
        self.stdin: IO[str] | None = None  # the spawner's end of the worker's stdin
        self.returncode: int | None = None
        self._done = threading.Event()

    def exit_status(self) -> int | None:
        return self.returncode if self._done.is_set() else None

    def kill_group(self) -> None:
        self.zygote.kill(self.pid)

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"forked worker {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def ended(self, returncode: int) -> None:
        self.returncode = returncode
        self._done.set()


class Zygote:
    """The runner's end: starts the zygote (its imports done before the first fork), asks it for workers, reads
    their exits. Thread-safe."""

    def __init__(self, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        life, self._life = os.pipe()  # the zygote watches `life`; this process alone holds the write end
        self._log = tempfile.TemporaryFile()  # its own output: why it could not start, if it could not
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness.launcher.zygote_serve", str(theirs.fileno())],
            env={**base_env(env), ZYGOTE_FD_ENV: str(life)}, stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=True, close_fds=True, pass_fds=(theirs.fileno(), life))
        theirs.close()
        os.close(life)
        self.sock = ours
        self._lock = threading.Lock()
        self._replies: dict[int, tuple[threading.Event, list[dict[str, Any]]]] = {}
        self._workers: dict[int, ForkedWorker] = {}  # forked and not yet reported reaped
        self._next = 0
        self.gone: str | None = None  # why it can serve no more
        self.sock.settimeout(START_TIMEOUT_S)
        try:
            ready = json.loads(self.sock.recv(MSG_BYTES) or b"{}")
        except (OSError, ValueError) as e:
            ready = {"error": f"no answer: {e}"}
        if ready.get("op") != "ready":
            self.close()
            raise Unavailable(f"{ready.get('error', 'it ended')}; its output: {self._output()!r}")
        self.sock.settimeout(None)
        threading.Thread(target=self._read, name="pcg-zygote-reader", daemon=True).start()

    def _output(self) -> bytes:
        try:
            self._log.seek(0)
            return self._log.read()[-2000:]
        except (OSError, ValueError):
            return b""

    def busy(self) -> bool:
        with self._lock:
            return bool(self._workers)

    def spawn(self, argv: list[str], env: dict[str, str], stdout: IO[str], watch_fd: int) -> ForkedWorker:
        """Fork a worker running argv (`python -m module …` or `python script …`) with env, stdout and stderr into
        stdout, watch_fd its runner's pipe (worker.py's watchdog); its stdin a pipe whose write end is the worker's
        .stdin. Raises Unavailable when the zygote cannot (the caller starts an interpreter instead)."""
        read, write = os.pipe()
        event, reply = threading.Event(), list[dict[str, Any]]()
        with self._lock:
            if self.gone is not None:
                os.close(read)
                os.close(write)
                raise Unavailable(self.gone)
            self._next += 1
            ident = self._next
            self._replies[ident] = (event, reply)
            try:
                msg = json.dumps({"op": "spawn", "id": ident, "argv": argv, "env": env}).encode()
                socket.send_fds(self.sock, [msg], [read, stdout.fileno(), watch_fd])
            except OSError as e:
                self.gone = f"the zygote is gone ({e})"
                event.set()
            finally:
                os.close(read)  # the zygote has its own copy (or none: it is gone)
        if not event.wait(FORK_TIMEOUT_S):
            # A zygote that does not answer a fork in a minute is stuck: killed, so that no worker it forks later
            # runs beside the interpreter that replaces it (its reader then reports its workers killed).
            self.gone = f"no answer to a fork in {FORK_TIMEOUT_S:.0f} s"
            kill_worker(self.proc.pid)
        with self._lock:
            self._replies.pop(ident, None)
        worker = reply[0].get("worker") if reply else None
        if worker is None:
            os.close(write)
            raise Unavailable(reply[0].get("error", "no answer") if reply else self.gone or "no answer")
        worker.stdin = os.fdopen(write, "w")
        return worker

    def kill(self, pid: int) -> None:
        """Kill a worker's group (the zygote's work: it alone knows whether the worker is reaped yet)."""
        with self._lock:
            if self.gone is None:
                try:
                    self.sock.send(json.dumps({"op": "kill", "pid": pid}).encode())
                except OSError:
                    pass  # gone: the reader kills what it had

    def _read(self) -> None:
        """The zygote's messages, in its order: a worker is registered (started) before its exit can come."""
        while True:
            try:
                data = self.sock.recv(MSG_BYTES)
            except OSError:
                data = b""
            if not data:
                return self._lost(f"the zygote ended; its output: {self._output()!r}")
            msg = json.loads(data)
            with self._lock:
                if msg["op"] == "exited":
                    worker = self._workers.pop(msg["pid"], None)
                    if worker is not None:
                        worker.ended(msg["code"])
                    continue
                if msg["op"] == "started":
                    msg["worker"] = self._workers[msg["pid"]] = ForkedWorker(msg["pid"], msg.get("start"), self)
                event, reply = self._replies.get(msg["id"], (None, []))
                reply.append(msg)
                if event is not None:
                    event.set()

    def _lost(self, why: str) -> None:
        """The zygote died: its workers' groups are killed here (they are init's children now), each reported as
        killed; what is pending falls back to an interpreter of its own."""
        with self._lock:
            self.gone = why
            for pid, worker in list(self._workers.items()):
                kill_worker(pid)
                worker.ended(-signal.SIGKILL)
            self._workers.clear()
            for event, _ in self._replies.values():
                event.set()

    def close(self) -> None:
        """Stop the zygote: with its socket closed it kills its live workers' groups, reaps them and exits."""
        if self._life >= 0:
            os.close(self._life)
            self._life = -1
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            kill_worker(self.proc.pid)
            self.proc.wait()
        self._log.close()


class _Pool:
    """This process's zygotes, one per environment, shared by its runners (a Ray worker's tasks, a test session's
    runs): the imports are paid once per process and environment. A zygote with live workers is never closed here;
    of the idle ones the IDLE_KEPT used last are kept. An environment whose zygote could not start, or died, starts
    interpreters from then on (said once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._zygotes: dict[frozenset[tuple[str, str]], Zygote] = {}  # in order of last use
        self._refused: set[frozenset[tuple[str, str]]] = set()

    def get(self, env: dict[str, str]) -> Zygote | None:
        key = frozenset(base_env(env).items())
        with self._lock:
            if key in self._refused:
                return None
            found = self._zygotes.pop(key, None)
            if found is not None and found.gone is None:
                self._zygotes[key] = found  # last used now
                return found
            if found is not None:
                found.close()
                self._refused.add(key)
                return None
            idle = [k for k, z in self._zygotes.items() if not z.busy()]
            for k in idle[:max(0, len(idle) - IDLE_KEPT + 1)]:
                self._zygotes.pop(k).close()
            try:
                self._zygotes[key] = made = Zygote(env)
            except (Unavailable, OSError) as e:
                self._refused.add(key)
                print(f"pcgh: CPU workers start as interpreters of their own (no zygote: {e})"[:600], file=sys.stderr)
                return None
            return made

    def close(self) -> None:
        with self._lock:
            for z in self._zygotes.values():
                z.close()
            self._zygotes.clear()


pool = _Pool()
atexit.register(pool.close)


