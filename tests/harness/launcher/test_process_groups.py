"""The runner owns its workers' process groups: no worker (nor what it started) outlives its cell or its runner,
however the runner ends; a resume kills an earlier runner's leftovers and nothing else; a worker killed in any
phase is a retried crash of that phase, never a verdict on the model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness.launcher import RunOptions, plan, run_matrix
from harness.launcher.classify import classify_death
from harness.launcher.groups import WorkerGroups
from harness.launcher.orphans import WorkerRecord, alive, read_records, write_record
from harness.launcher.watch import PHASE_MARK, TOKEN_ENV
from harness.launcher.runner import run_logs
from harness.outcome import CellRecord, Status
from harness.store import Store

HERE = Path(__file__).parent
ROOT = HERE.parents[2]


def _matrix(tmp_path: Path, graphs: list[str], timeout_s: int = 120) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({
        "name": "groups",
        "defaults": {"device": "cpu", "dtype": "float32", "max_tokens": 16, "max_new_tokens": 2, "timeout_s": timeout_s},
        "axes": {"model": ["qwen3-0.6b:tiny"], "graph": graphs},
    }))
    return path


@pytest.fixture
def plugin_env(tmp_path, monkeypatch):
    monkeypatch.setenv("PCG_PLUGINS", "fault_backends")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PCG_TEST_FLAKY_DIR", str(tmp_path))
    sys.path.insert(0, str(HERE))
    import fault_backends  # noqa: F401  (the parent's pre-check must see the test backends too)

    yield
    sys.path.remove(str(HERE))


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    """The pids still alive after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def _wait_for(path: Path, seconds: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, f"the runner ended early ({proc.returncode})"
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.1)


@pytest.mark.parametrize("phase", ["startup", "load", "eager", "capture", "run", "latency"])
@pytest.mark.parametrize("returncode", [-signal.SIGKILL, -signal.SIGSEGV, 1])
def test_a_death_without_an_outcome_is_a_crash_of_its_phase(phase, returncode):
    log = "" if phase == "startup" else f"{PHASE_MARK} load\n{PHASE_MARK} {phase}\n"
    status, reason = classify_death(returncode, False, log, 60)
    assert status == (Status.FAIL_CAPTURE if phase == "capture" else Status.FAIL_RUN)  # retried, never eager_fail
    assert f"in phase {phase}" in reason
    if returncode < 0:
        assert signal.Signals(-returncode).name in reason


def test_a_cells_end_takes_down_what_its_worker_started(tmp_path):
    """A worker that exits normally leaving a child behind: the child goes with the worker's group."""
    pid_file = tmp_path / "child.pid"
    with WorkerGroups(records=tmp_path / "workers") as groups, open(tmp_path / "log", "w") as log:
        proc = groups.spawn(["sh", "-c", f"sleep 60 & echo $! > {pid_file}"], dict(os.environ), log)
        proc.stdin.close()
        assert read_records(tmp_path / "workers")[0].pid == proc.pid  # recorded while it runs
        returncode, timed_out = groups.wait(proc, timeout=30)
    assert (returncode, timed_out) == (0, False)
    assert _gone_within([int(pid_file.read_text())], 5) == []
    assert read_records(tmp_path / "workers") == []  # reaped: its record is dropped


_RUNNER = """
import sys
from pathlib import Path
from harness.launcher import RunOptions, run_matrix
from harness.store import Store
from pcg_core.plugins import load_plugins

load_plugins()
with Store(sys.argv[1]) as store:
    run_matrix(sys.argv[2], store, RunOptions(logs_dir=Path(sys.argv[3]), progress=False))
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_dead_runner_leaves_no_worker_behind(tmp_path, plugin_env, sig):
    """The runner dies while its worker hangs (in load) with a child of its own: both are gone in seconds.
    SIGKILL: the worker's pipe watchdog does it; SIGTERM: the runner itself, and the run reads interrupted."""
    matrix, db, logs = _matrix(tmp_path, ["test_hang_load"], timeout_s=300), tmp_path / "r.db", tmp_path / "logs"
    runner = subprocess.Popen([sys.executable, "-c", _RUNNER, str(db), str(matrix), str(logs)])
    try:
        _wait_for(tmp_path / "child.pid", 120, runner)
        child = int((tmp_path / "child.pid").read_text())
        workers = [r.pid for r in read_records(next(logs.glob("*/run-1")) / "workers")]
        assert len(workers) == 1 and alive(workers[0]) and alive(child)
        runner.send_signal(sig)
        returncode = runner.wait(timeout=30)
        assert _gone_within([*workers, child], 5) == []
    finally:
        runner.kill()
    if sig == signal.SIGTERM:
        assert returncode == -signal.SIGTERM  # its workers down, the runner died of the signal itself
        with Store(str(db)) as store:
            assert store.run(1).status == "interrupted"
            assert store.results(1) == []  # a cell the runner killed has no outcome: none is recorded
        assert read_records(next(logs.glob("*/run-1")) / "workers") == []


# A suite that runs a matrix in-process (as tests/harness/test_smoke_run.py does), then has more to run.
_SUITE = """
import time
from pathlib import Path

from harness.launcher import RunOptions, run_matrix
from harness.store import Store
from pcg_core.plugins import load_plugins

HERE = Path(__file__).parent


def test_a_matrix_in_process():
    load_plugins()
    with Store(str(HERE / "r.db")) as store:
        run_matrix(HERE / "m.yaml", store, RunOptions(logs_dir=HERE / "logs", progress=False))


def test_the_rest_of_the_suite():
    time.sleep(300)
"""


@pytest.mark.slow
def test_sigterm_stops_a_suite_that_runs_the_runner_in_process(tmp_path, plugin_env):
    """`timeout 5400 python -m pytest` must stop the suite: the runner takes its workers down, marks the run
    interrupted, and the process dies of the signal, not one failed test after which pytest goes on."""
    _matrix(tmp_path, ["test_hang_load"], timeout_s=300)
    (tmp_path / "test_suite.py").write_text(_SUITE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    suite = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
                              str(tmp_path / "pytest.ini"), str(tmp_path / "test_suite.py")], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(tmp_path / "child.pid", 300, suite)
        workers = [r.pid for r in read_records(next((tmp_path / "logs").glob("*/run-1")) / "workers")]
        child = int((tmp_path / "child.pid").read_text())
        suite.send_signal(signal.SIGTERM)
        try:
            out, _ = suite.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            suite.kill()
            pytest.fail(f"pytest went on after SIGTERM:\n{suite.communicate()[0][-3000:]}")
    finally:
        suite.kill()
    assert suite.returncode == -signal.SIGTERM, out
    assert _gone_within([*workers, child], 5) == []
    with Store(str(tmp_path / "r.db")) as store:
        assert store.run(1).status == "interrupted"


# A stand-in for the slow start-up imports (torch: seconds, more under load) of a cell worker or of the zygote that
# forks CPU workers (either has the runner's pipe in its environment): importing harness.launcher.plan says so and
# takes two minutes.
_SLOW_START = """
import os, sys, time
from pathlib import Path

class _SlowPlan:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "harness.launcher.plan":
            (Path(os.environ["PCG_TEST_DIR"]) / "importing.pid").write_text(str(os.getpid()))
            time.sleep(120)
        return None

if os.environ.get("PCG_WORKER_PARENT_FD") or os.environ.get("PCG_ZYGOTE_WATCH_FD"):
    sys.meta_path.insert(0, _SlowPlan)
"""


@pytest.mark.parametrize("fork", ["1", "0"])
def test_a_runner_killed_while_its_worker_starts_leaves_no_worker(tmp_path, fork):
    """SIGKILL `pcgh run` while its worker (fork 0) or the zygote that forks it (fork 1) is still importing: it is
    gone within a second or two (its watchdog was up before the imports), not once they are done (~7 s on a loaded
    2-core CI)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SLOW_START)
    env = {**os.environ, "PCG_TEST_DIR": str(tmp_path), "PCG_FORK_WORKERS": fork,
           "PYTHONPATH": os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    runner = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(_matrix(tmp_path, ["breakable"])),
                               "--db", str(tmp_path / "r.db"), "--logs", str(tmp_path / "logs")],
                              env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = None
    try:
        _wait_for(tmp_path / "importing.pid", 300, runner)
        worker = int((tmp_path / "importing.pid").read_text())
        runner.kill()
        runner.wait(timeout=10)
        assert _gone_within([worker], 2) == []
    finally:
        runner.kill()
        if worker is not None and alive(worker):
            os.killpg(worker, signal.SIGKILL)


def test_a_worker_killed_in_load_or_eager_is_a_retried_crash(tmp_path, plugin_env):
    """Killed as load or eager starts, every time: a crash of that phase, retried (attempt 2), and it fails the run
    (eager_fail would be neither retried nor counted)."""
    matrix = _matrix(tmp_path, ["test_kill_load", "test_kill_eager"])
    with Store(str(tmp_path / "r.db")) as store:
        run_id = run_matrix(matrix, store, RunOptions(jobs=2, logs_dir=tmp_path / "logs", progress=False))
        attempts = store.results(run_id, all_attempts=True)
    by_graph: dict[str, list[tuple[int, str, str]]] = {}
    for r in attempts:
        by_graph.setdefault(r.axes["graph"], []).append((r.attempt, r.status, r.reason))
    for phase in ("load", "eager"):
        crash = ("fail_run", f"killed by SIGKILL in phase {phase}")
        assert sorted(by_graph[f"test_kill_{phase}"]) == [(1, *crash), (2, *crash)]


def _sleeper(token: str | None = None) -> subprocess.Popen:
    """A process in a session of its own, with a worker token in its environment when given."""
    env = {**os.environ, TOKEN_ENV: token} if token else {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env, start_new_session=True)


def test_resume_reaps_an_earlier_runners_orphans_and_nothing_else(tmp_path):
    matrix = _matrix(tmp_path, ["piecewise"])
    cell = plan(matrix, RunOptions()).cells[0]
    dead = subprocess.Popen(["true"])
    dead.wait()  # a runner that is gone
    orphan = _sleeper("tok-orphan")  # an earlier runner's worker, still running
    stranger = _sleeper()  # an unrelated process on a recorded pid (a recycled one): no token
    owned = _sleeper("tok-live")  # the worker of a runner that still runs (this process)
    procs = (orphan, stranger, owned)
    try:
        with Store(str(tmp_path / "r.db")) as store:
            run_id = store.create_run("groups", str(matrix), {})  # an unfinished run, its one cell recorded
            store.record_result(run_id, CellRecord(key=cell.key, axes=cell.axes, status="pass"))
            folder = run_logs(tmp_path / "logs", store, run_id) / "workers"
            write_record(folder, WorkerRecord(orphan.pid, "tok-orphan", dead.pid, "0"))
            write_record(folder, WorkerRecord(stranger.pid, "tok-recycled", dead.pid, "0"))
            write_record(folder, WorkerRecord.mine(owned.pid, "tok-live"))
            seen: list[str] = []
            run_matrix(matrix, store, RunOptions(resume=True, logs_dir=tmp_path / "logs", progress=False),
                       on_result=lambda row: seen.append(row.key))
        assert orphan.wait(timeout=5) == -signal.SIGKILL
        assert stranger.poll() is None and owned.poll() is None
        assert seen == []  # the run was complete: the reaping ran all the same
        assert [r.pid for r in read_records(folder)] == [owned.pid]  # a live runner's record is kept
        assert json.loads((folder / f"{owned.pid}.json").read_text())["token"] == "tok-live"
    finally:
        for p in procs:
            p.kill()
            p.wait()
