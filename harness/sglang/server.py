"""One server for the length of a `with`: started in a process group of its own, waited on until healthy, and torn
down — the whole group, its scheduler and detokenizer processes too — when the block ends, by error or timeout
as well."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from harness.sglang.client import SGLangClient

def launch_command() -> tuple[str, ...]:
    """`python -m sglang.launch_server` with the python of sglang's environment (precheck.sglang_python)."""
    from harness.sglang.precheck import sglang_python

    return (sglang_python(), "-m", "sglang.launch_server")


class ServerDied(RuntimeError):
    """The server exited before it was healthy, or while it served."""


@contextmanager
def running_server(flags: Sequence[str], port: int, log_path: Path, health_timeout_s: float,
                   command: Sequence[str], env: dict[str, str] | None = None) -> Iterator[SGLangClient]:
    """`command FLAGS` serving on 127.0.0.1:`port`, its output appended to `log_path`; a client of it, once /health
    answers. ServerDied when it exits first (its log's end in the message), TimeoutError when it is not healthy in
    time."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([*command, *flags], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
    client = SGLangClient(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + health_timeout_s
        while not client.healthy():
            if proc.poll() is not None:
                raise ServerDied(f"the server exited ({proc.returncode}) before it was healthy: {_tail(log_path)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server was not healthy after {health_timeout_s:.0f} s: {_tail(log_path)}")
            time.sleep(0.5)
        yield client
        if proc.poll() is not None:
            raise ServerDied(f"the server exited ({proc.returncode}) while serving: {_tail(log_path)}")
    finally:
        client.close()
        stop_group(proc)


def stop_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM to the server's process group, SIGKILL to what is left after `grace_s`; returns once no process of
    the group is left running (a member killed but not yet scheduled to die would still hold its GPU memory)."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        while _group_running(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _group_running(proc.pid):
            break
    proc.wait()


def _group_running(pgid: int) -> bool:
    """Whether a process of group `pgid` is alive and not a zombie. A zombie is dead (its memory freed) but still
    answers `killpg(pgid, 0)`; a container's init may never reap the children a dead leader leaves it."""
    proc_root = Path("/proc")
    if not proc_root.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for stat in proc_root.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone while we looked
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


def _tail(path: Path, chars: int = 1500) -> str:
    text = path.read_text(errors="replace") if path.is_file() else ""
    return text[-chars:].strip() or "(no output)"
