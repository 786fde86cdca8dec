"""Cells of several ranks: the launcher starts one worker per rank with torch's env:// variables, a crash or a
hang of any rank ends the cell with its status naming the rank and leaves no process behind, and a cell's record
is rank 0's outcome. The workers are planted (planted_rank_worker.py): the runtime does not run tp2 yet."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from harness.launcher import RunOptions, plan, ranks, run_matrix
from harness.launcher.groups import RankEnd
from harness.launcher.orphans import alive, read_records
from harness.launcher.runner import run_logs
from harness.outcome import CellOutcome, Status
from harness.store import Store
from pcg_core.capture.breakable import BreakableBackend
from pcg_core.capture.registry import CAPTURE_BACKENDS, register_capture_backend

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
PLANTED = ("test_ranks_ok", "test_ranks_allreduce", "test_rank1_crash", "test_rank1_hang", "test_rank1_fails",
           "test_rank1_flaky")
for _name in PLANTED:  # names a matrix may hold (the planted worker reads them; nothing captures)
    if _name not in CAPTURE_BACKENDS.names():
        register_capture_backend(type(f"Planted_{_name}", (BreakableBackend,), {"name": _name}))


def _matrix(tmp_path: Path, graphs: list[str], parallel: str = "tp2", timeout_s: int = 60) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({
        "name": "ranks",
        "defaults": {"device": "cpu", "dtype": "float32", "max_tokens": 16, "max_new_tokens": 2, "timeout_s": timeout_s},
        "axes": {"model": ["qwen3-0.6b:tiny"], "graph": graphs, "parallel": [parallel]},
    }))
    return path


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """The planted worker in place of the cell worker, importable from the ranks' PYTHONPATH."""
    monkeypatch.setattr(ranks, "WORKER", [str(HERE / "planted_rank_worker.py")])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PCG_TEST_FLAKY_DIR", str(tmp_path))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def _run(tmp_path: Path, matrix: Path, **opts) -> tuple[dict, list, Path]:
    """Run the matrix with its tp2 cells let through the pre-check (the runtime lacks tp2; the worker is planted)."""
    p = plan(matrix, RunOptions())
    for cell in p.cells:
        assert cell.ranks == 2
        cell.unsupported = None
    with Store(str(tmp_path / "r.db")) as store:
        run_id = run_matrix(matrix, store, RunOptions(logs_dir=tmp_path / "logs", progress=False, **opts), planned=p)
        rows = {r.axes["graph"]: r for r in store.results(run_id)}
        attempts = store.results(run_id, all_attempts=True)
        logs = run_logs(tmp_path / "logs", store, run_id)
    return rows, attempts, logs


def _pids(tmp_path: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted(tmp_path.glob("rank*.pid"))]


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def test_a_crash_of_rank_1_ends_the_cell_naming_it_and_kills_rank_0(tmp_path, planted):
    rows, _, logs = _run(tmp_path, _matrix(tmp_path, ["test_rank1_crash"]), retry=False)
    row = rows["test_rank1_crash"]
    assert row.status == Status.FAIL_RUN
    assert row.reason.startswith("rank 1 of 2: killed by SIGSEGV in phase load"), row.reason
    assert "other rank(s) killed" in row.reason
    assert row.duration_s < 30  # at once, not at the cell's 60 s timeout: rank 0 did not wait for its dead peer
    pids = _pids(tmp_path)  # rank 0, its child (hung in "a collective"), rank 1
    assert len(pids) == 3
    assert _gone_within(pids, 5) == []
    assert read_records(logs / "workers") == []
    # the cell's log: each rank's lines under its prefix, and how each ended
    assert "[rank 1] planted crash on rank 1" in row.log and "[rank 0] hello from rank 0" in row.log
    assert "rank 0 killed after rank 1 ended" in row.log and "rank 1 killed by SIGSEGV" in row.log


def test_a_hang_of_rank_1_is_a_timeout_and_both_ranks_go(tmp_path, planted):
    rows, _, _ = _run(tmp_path, _matrix(tmp_path, ["test_rank1_hang"], timeout_s=3), retry=False)
    row = rows["test_rank1_hang"]
    assert row.status == Status.TIMEOUT
    assert row.reason.startswith("ranks 0, 1 of 2: no result after 3s"), row.reason
    pids = _pids(tmp_path)
    assert len(pids) == 4  # two ranks, a child each
    assert _gone_within(pids, 5) == []


def test_ranks_that_pass_record_rank_0s_outcome_with_their_env(tmp_path, planted):
    rows, attempts, _ = _run(tmp_path, _matrix(tmp_path, ["test_ranks_ok", "test_rank1_fails"]))
    row = rows["test_ranks_ok"]
    assert row.status == Status.PASS and row.metrics.process.rank_statuses == ["pass", "pass"]
    env = json.loads(row.reason)  # rank 0's outcome (the reason is what it saw)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_ADDR"]) == ("0", "2", "0", "127.0.0.1")
    assert env["OMP_NUM_THREADS"] == "1" and env["CUDA_VISIBLE_DEVICES"] is None  # a CPU cell: one thread a rank
    assert row.metrics.process.gpus is None
    # a rank that does not pass makes the cell not pass, named, though rank 0 passed
    bad = rows["test_rank1_fails"]
    assert bad.status == Status.FAIL_ACCURACY
    assert bad.reason.startswith("rank 1 of 2: fail_accuracy:") and "planted mismatch" in bad.reason
    assert "rank 0: pass" in bad.reason and bad.metrics.process.rank_statuses == ["pass", "fail_accuracy"]
    assert sorted(r.attempt for r in attempts if r.axes["graph"] == "test_ranks_ok") == [1]  # a pass is not retried


def test_a_rank_that_fails_once_is_retried_as_the_whole_cell(tmp_path, planted):
    rows, attempts, _ = _run(tmp_path, _matrix(tmp_path, ["test_rank1_flaky"]))
    row = rows["test_rank1_flaky"]
    assert row.status == Status.PASS_FLAKY
    assert "first attempt: fail_run: rank 1 of 2: exit code 3 in phase load" in row.reason
    assert "planted one-off failure on rank 1" in row.reason
    assert sorted(r.attempt for r in attempts) == [1, 2]


def test_the_ranks_rendezvous_over_gloo(tmp_path, planted):
    """A real all_reduce over the env:// variables the launcher set: the wiring works, not just the names."""
    rows, _, _ = _run(tmp_path, _matrix(tmp_path, ["test_ranks_allreduce"], timeout_s=120), retry=False)
    row = rows["test_ranks_allreduce"]
    assert row.status == Status.PASS, row.reason + row.log[-2000:]
    got = json.loads(row.reason)
    assert got["sum"] == 3.0 and got["world"] == 2 and got["rank"] == 0 and got["backend"] == "gloo"
    assert int(got["MASTER_PORT"]) > 0


def test_a_rank_that_died_alone_after_the_others_ended_is_a_crash():
    """Rank 0 ended with its outcome, rank 1 then died on its own (no one killed it): a crash of rank 1, even if it
    wrote an outcome first; and an outcome missing from a rank that exited 0 is a crash of that rank."""
    ok = CellOutcome(status=Status.PASS)
    log = "PCG-PHASE load\nPCG-PHASE run\n"
    out = ranks.judge_ranks([RankEnd(0), RankEnd(-signal.SIGABRT)], [log, log], [ok, ok], 60)
    assert out.status == Status.FAIL_RUN and out.reason == "rank 1 of 2: killed by SIGABRT in phase run"
    out = ranks.judge_ranks([RankEnd(0), RankEnd(0)], [log, log], [ok, None], 60)
    assert out.status == Status.FAIL_RUN and out.reason.startswith("rank 1 of 2: exit code 0 in phase run")
    out = ranks.judge_ranks([RankEnd(0), RankEnd(0)], [log, log], [ok, ok], 60)
    assert out.status == Status.PASS and out.metrics.process.rank_statuses == ["pass", "pass"]


def test_rank_env_and_visible_devices():
    env = ranks.rank_env({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 1, 2, 29500, [2, 3])
    assert env["CUDA_VISIBLE_DEVICES"] == "6,7"  # the runner's GPUs 2 and 3 are the host's 6 and 7
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]) == ("1", "1", "2", "29500")
    assert "OMP_NUM_THREADS" not in env  # a GPU cell's threads are torch's own
    assert ranks.rank_env({}, 0, 2, 1, [0, 1])["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert ranks.rank_env({"OMP_NUM_THREADS": "4"}, 0, 2, 1, None)["OMP_NUM_THREADS"] == "4"  # the user's stands
    a, b = ranks.reserve_port(), ranks.reserve_port()
    assert a != b  # two live cells never share a rendezvous port
    ranks.release_port(a)
    ranks.release_port(b)


def test_pcgh_cell_runs_a_parallel_mode_through_the_launcher(tmp_path, planted, capsys):
    """`pcgh cell --parallel tp2`: one worker per rank, as `pcgh run` starts them, not the cell in-process."""
    from harness.cli import main

    code = main(["cell", "--model", "qwen3-0.6b", "--tiny", "--graph", "test_ranks_ok", "--parallel", "tp2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["status"] == "pass", out
    assert out["metrics"]["process"]["rank_statuses"] == ["pass", "pass"]
    env = json.loads(out["reason"])
    assert (env["RANK"], env["WORLD_SIZE"]) == ("0", "2")
    assert len(_pids(tmp_path)) == 2 and _gone_within(_pids(tmp_path), 5) == []


@pytest.mark.skipif(__import__("torch").cuda.device_count() >= 2, reason="this host has the GPUs: it would launch")
def test_pcgh_cell_refuses_a_cuda_cell_without_its_gpus(tmp_path, planted, capsys):
    from harness.cli import main

    code = main(["cell", "--model", "qwen3-0.6b", "--tiny", "--graph", "test_ranks_ok", "--parallel", "tp2",
                 "--device", "cuda", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["status"] == "unsupported"
    assert out["reason"].startswith("needs 2 GPUs (tp2: one per rank, on one host)")
    assert _pids(tmp_path) == []  # nothing was launched


_RUNNER = """
import sys
from pathlib import Path

from harness.launcher import RunOptions, plan, ranks, run_matrix
from harness.store import Store
from pcg_core.capture.breakable import BreakableBackend
from pcg_core.capture.registry import register_capture_backend

register_capture_backend(type("Planted", (BreakableBackend,), {"name": "test_rank1_hang"}))
ranks.WORKER = [sys.argv[4]]
p = plan(sys.argv[2], RunOptions())
for cell in p.cells:
    cell.unsupported = None
with Store(sys.argv[1]) as store:
    run_matrix(sys.argv[2], store, RunOptions(logs_dir=Path(sys.argv[3]), progress=False), planned=p)
"""


@pytest.mark.slow
def test_a_runner_killed_while_its_ranks_hang_leaves_none_of_them(tmp_path, planted):
    """SIGKILL the runner while both ranks of a cell hang, each with a child: every rank's watchdog takes its
    group down. While they ran, each rank had its record, naming the cell and the rank."""
    import subprocess
    import sys

    matrix, logs = _matrix(tmp_path, ["test_rank1_hang"], timeout_s=300), tmp_path / "logs"
    runner = subprocess.Popen([sys.executable, "-c", _RUNNER, str(tmp_path / "r.db"), str(matrix), str(logs),
                               str(HERE / "planted_rank_worker.py")])
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("rank*.child.pid"))) < 2:
            assert runner.poll() is None and time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.1)
        records = read_records(next(logs.glob("*/run-1")) / "workers")
        assert sorted(r.rank for r in records) == [0, 1] and all("graph=test_rank1_hang" in r.cell for r in records)
        pids = _pids(tmp_path)
        runner.kill()
        runner.wait(timeout=10)
        assert _gone_within(pids, 5) == []
    finally:
        runner.kill()


def test_a_resume_reaps_every_rank_an_earlier_runner_left(tmp_path):
    """Two ranks of one cell outlived their runner (stuck where no watchdog runs): a resume kills both, and a
    record written before records named cells still reads."""
    import subprocess
    import sys

    from harness.launcher.orphans import WorkerRecord, reap_orphans, write_record

    dead = subprocess.Popen(["true"])
    dead.wait()
    folder = tmp_path / "workers"
    procs = []
    try:
        for rank in (0, 1):
            token = f"tok-rank{rank}"
            procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                          env={**os.environ, "PCG_WORKER_TOKEN": token}, start_new_session=True))
            write_record(folder, WorkerRecord(procs[-1].pid, token, dead.pid, "0", "model=m|parallel=tp2", rank))
        (folder / "12345.json").write_text(json.dumps({"pid": 12345, "token": "old", "runner_pid": dead.pid,
                                                        "runner_start": "0"}))  # a record from before
        assert {r.rank for r in read_records(folder)} == {0, 1, None}
        killed = reap_orphans(folder)
        assert sorted(killed) == sorted(p.pid for p in procs)
        assert read_records(folder) == []
    finally:
        for p in procs:
            p.kill()
            p.wait()
