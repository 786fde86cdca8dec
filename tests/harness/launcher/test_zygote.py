"""CPU workers forked from a zygote keep the guarantees of workers started as interpreters (groups.py): a timeout
or a normal end takes down what the worker started, a resume finds an earlier runner's forked worker, a zygote
that dies takes its workers with it and the runner goes on without it, and a worker runs in its own environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.launcher import zygote
from harness.launcher.groups import WorkerGroups
from harness.launcher.orphans import _token_of, alive, read_records, reap_orphans, write_record

pytestmark = pytest.mark.skipif(not zygote.enabled(), reason="workers are forked on Linux only")

_WORKER = """
import os, subprocess, sys, time
from pathlib import Path
out = Path(sys.argv[1])
child = subprocess.Popen(["sleep", "60"])  # what the worker starts: its group's
(out / "child.pid").write_text(str(child.pid))
(out / "seen.txt").write_text(repr((os.environ.get("PCG_TEST_X"), sys.argv[1:-1], sys.stdin.read())))
print("worker says hello", flush=True)
time.sleep(float(sys.argv[2]))
sys.exit(int(sys.argv[3]))
"""


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


@pytest.fixture
def worker(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(_WORKER))
    return script


def _spawn(groups: WorkerGroups, script: Path, out: Path, sleep: float, code: int, env: dict | None = None):
    log = open(out / "log", "w")
    proc = groups.spawn([sys.executable, str(script), str(out), str(sleep), str(code)],
                        env or {**os.environ, "PCG_TEST_X": "mine"}, log, fork=True)
    proc.stdin.write("the spec")
    proc.stdin.close()
    log.close()
    return proc


def _wait_file(path: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


def test_a_forked_worker_runs_in_its_own_environment_and_its_end_takes_its_child(tmp_path, worker):
    with WorkerGroups(records=tmp_path / "workers") as groups:
        proc = _spawn(groups, worker, tmp_path, 0, 3)
        assert isinstance(proc, zygote.ForkedWorker)
        rec = read_records(tmp_path / "workers")[0]
        assert rec.pid == proc.pid and rec.start is not None  # known by start time: its environ is the zygote's
        returncode, timed_out = groups.wait(proc, timeout=60)
    assert (returncode, timed_out) == (3, False)
    assert (tmp_path / "seen.txt").read_text() == repr(("mine", [str(tmp_path), "0", "3"], "the spec"))
    assert "worker says hello" in (tmp_path / "log").read_text()
    assert _gone_within([int((tmp_path / "child.pid").read_text())], 5) == []
    assert read_records(tmp_path / "workers") == []


def test_a_forked_workers_timeout_kills_its_group(tmp_path, worker):
    with WorkerGroups() as groups:
        proc = _spawn(groups, worker, tmp_path, 60, 0)
        _wait_file(tmp_path / "child.pid")
        returncode, timed_out = groups.wait(proc, timeout=1)
    assert timed_out and returncode == -signal.SIGKILL
    assert _gone_within([proc.pid, int((tmp_path / "child.pid").read_text())], 5) == []


def test_a_resume_finds_a_forked_worker_by_its_start_time(tmp_path, worker):
    folder = tmp_path / "workers"
    with WorkerGroups(records=folder) as groups:
        proc = _spawn(groups, worker, tmp_path, 60, 0)
        _wait_file(tmp_path / "child.pid")
        child = int((tmp_path / "child.pid").read_text())
        rec = read_records(folder)[0]
        assert _token_of(proc.pid) is None and _token_of(child) == rec.token  # the worker itself shows no token
        dead = subprocess.Popen(["true"])
        dead.wait()
        write_record(folder, rec.__class__(**{**rec.__dict__, "runner_pid": dead.pid}))  # as if its runner died
        killed = reap_orphans(folder)
        assert proc.pid in killed
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert _gone_within([child], 5) == []
        # a recycled pid (a process on the recorded pid that started at another time, without the token) is left alone
        stranger = subprocess.Popen(["sleep", "60"])
        try:
            write_record(folder, rec.__class__(**{**rec.__dict__, "pid": stranger.pid, "start": "1"}))
            assert reap_orphans(folder) == [] and stranger.poll() is None
        finally:
            stranger.kill()
            stranger.wait()


def test_a_dead_zygote_takes_its_workers_and_the_runner_goes_on(tmp_path, worker):
    env = {**os.environ, "PCG_TEST_X": "a zygote of its own"}  # this process's other tests keep theirs
    with WorkerGroups() as groups:
        proc = _spawn(groups, worker, tmp_path, 60, 0, env)
        _wait_file(tmp_path / "child.pid")
        parent = proc.zygote
        os.kill(parent.proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert _gone_within([proc.pid, int((tmp_path / "child.pid").read_text())], 5) == []
        (tmp_path / "child.pid").unlink()
        again = _spawn(groups, worker, tmp_path, 0, 0, env)
        assert isinstance(again, subprocess.Popen)  # an interpreter of its own: this environment's zygote died
        assert groups.wait(again, timeout=60) == (0, False)


def test_another_environment_gets_a_zygote_of_its_own_shared_by_runners_and_fork_off_starts_interpreters(
        tmp_path, worker, monkeypatch):
    parents = []
    for run in range(2):  # two runners of this process, one after the other
        with WorkerGroups() as groups:
            for value in ("one", "two"):
                out = tmp_path / f"{run}{value}"
                out.mkdir()
                env = {**os.environ, "PCG_TEST_X": value, "OMP_NUM_THREADS": "1" if value == "one" else "2"}
                proc = _spawn(groups, worker, out, 0, 0, env)
                groups.wait(proc, timeout=60)
                parents.append(proc.zygote)
                assert eval((out / "seen.txt").read_text())[0] == value  # the request's environment, not the zygote's
    assert parents[0] is not parents[1] and parents[:2] == parents[2:]
    monkeypatch.setenv(zygote.FORK_ENV, "0")
    with WorkerGroups() as groups:
        proc = _spawn(groups, worker, tmp_path, 0, 0)
        assert isinstance(proc, subprocess.Popen)
        groups.wait(proc, timeout=60)
