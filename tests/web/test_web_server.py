"""The server as shipped (`python -m web`), over real sockets: half-sent requests are closed at their deadline and
never stop new requests being served."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from web_seed import seed
from web_support import TOKEN

ROOT = Path(__file__).resolve().parents[2]
SLOW = 1_100  # the count that stopped the server accepting before


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str, timeout: float = 5.0) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return r.status


def _closed_by_server(sock: socket.socket, wait: float) -> bool:
    sock.settimeout(wait)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:  # reset: closed too
        return True


def _start(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen, int]:
    """`python -m web` over a seeded database on a free port, answering; (its process, the port)."""
    db = tmp_path / "pcg.db"
    seed(f"sqlite:///{db}")
    port = _free_port()
    env = {**os.environ, "PCG_UPLOAD_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "web", "--db", str(db), "--port", str(port), *flags], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while True:
        try:
            _get(port, "/api/runs", timeout=2)
            return proc, port
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"the server did not start: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
            time.sleep(0.2)


@pytest.fixture
def server(tmp_path: Path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = SLOW + 200
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"this machine allows {hard} open files; the test holds {need}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    proc, port = _start(tmp_path, "--header-timeout", "1.5", "--body-timeout", "1.5")
    yield port
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_half_sent_requests_are_closed_and_never_block_new_ones(server):
    port = server
    slow = []
    try:
        for i in range(SLOW):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # the headers never end
            slow.append(s)
        upload = socket.create_connection(("127.0.0.1", port))  # an upload whose body never ends
        upload.sendall(b"POST /api/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() +
                       b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"name\":")
        slow.append(upload)
        t0 = time.monotonic()
        assert _get(port, "/api/runs") == 200  # served while 1,101 connections hang
        assert time.monotonic() - t0 < 5
        # each was closed by the server at its deadline (headers 1.5 s; the body 1.5 s after its headers)
        assert _closed_by_server(slow[0], wait=6) and _closed_by_server(slow[SLOW // 2], wait=2)
        assert _closed_by_server(upload, wait=6)
        assert _get(port, "/api/runs") == 200
    finally:
        for s in slow:
            s.close()


def _children(pid: int) -> set[int]:
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def test_the_upload_worker_does_not_outlive_a_killed_server(tmp_path: Path):
    """A server killed outright (no atexit) leaves no upload worker behind holding its memory."""
    import json
    import signal
    proc, port = _start(tmp_path)
    try:
        body = json.dumps({"name": "x", "matrix": "m", "results": []}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/api/runs", data=body, method="POST",
                                     headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 201
        workers = _children(proc.pid)
        assert workers, "the upload ran in no worker process"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{w}").exists() and "zombie" not in (Path(f"/proc/{w}/status").read_text()
                                                               if Path(f"/proc/{w}/status").exists() else "zombie")
              for w in workers):
        assert time.monotonic() < deadline, f"upload worker(s) {workers} still running 10 s after the server died"
        time.sleep(0.2)
