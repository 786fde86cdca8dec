"""The launcher on real child processes: planted faults get the right status, other cells survive, resume
redoes nothing, shards split the matrix."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

from harness.launcher import RunOptions, plan, run_matrix
from harness.outcome import CellRecord
from harness.store import Store

HERE = Path(__file__).parent


def _matrix(tmp_path: Path, graphs: list[str], timeout_s: int = 120, models=("qwen3-0.6b:tiny",)) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({
        "name": "faults",
        "defaults": {"device": "cpu", "dtype": "float32", "max_tokens": 16, "max_new_tokens": 2, "timeout_s": timeout_s},
        "axes": {"model": list(models), "graph": graphs},
    }))
    return path


@pytest.fixture
def plugin_env(tmp_path, monkeypatch):
    monkeypatch.setenv("PCG_PLUGINS", "fault_backends")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), str(HERE.parents[2]), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PCG_TEST_FLAKY_DIR", str(tmp_path))
    sys.path.insert(0, str(HERE))
    import fault_backends  # noqa: F401  (the parent's pre-check must see the test backends too)

    yield
    sys.path.remove(str(HERE))


@pytest.mark.slow
def test_planted_faults_get_their_status_and_others_survive(tmp_path, plugin_env):
    graphs = ["piecewise", "test_perturb", "test_raise_capture", "test_segfault", "test_hang", "test_flaky"]
    matrix = _matrix(tmp_path, graphs, timeout_s=40)
    with Store(str(tmp_path / "r.db")) as store:
        run_id = run_matrix(matrix, store, RunOptions(jobs=2, logs_dir=tmp_path / "logs", progress=False))
        rows = {r.axes["graph"]: r for r in store.results(run_id)}
        attempts = store.results(run_id, all_attempts=True)
    assert rows["piecewise"].status == "pass", rows["piecewise"].reason
    assert rows["test_perturb"].status == "fail_accuracy", rows["test_perturb"].reason
    assert rows["test_raise_capture"].status == "fail_capture"
    assert "planted failure during capture" in rows["test_raise_capture"].reason
    assert rows["test_segfault"].status == "fail_capture"
    assert "SIGSEGV" in rows["test_segfault"].reason
    assert rows["test_hang"].status == "timeout"
    assert rows["test_flaky"].status == "pass_flaky"
    assert "planted one-off failure" in rows["test_flaky"].reason
    # every failure was retried once; passes were not
    by_graph = {}
    for r in attempts:
        by_graph.setdefault(r.axes["graph"], []).append(r.attempt)
    assert sorted(by_graph["piecewise"]) == [1]
    assert sorted(by_graph["test_hang"]) == [1, 2]
    assert rows["piecewise"].metrics.capture.pieces == 3  # metrics stored with the result
    assert "PCG-PHASE" in rows["test_segfault"].log  # the cell's log is kept


def test_resume_redoes_nothing_and_completes_a_partial_run(tmp_path):
    matrix = _matrix(tmp_path, ["piecewise", "breakable"], models=("qwen3-0.6b:tiny", "qwen3-8b:tiny"))
    db = str(tmp_path / "r.db")
    seen: list[str] = []
    with Store(db) as store:
        partial = run_matrix(matrix, store, RunOptions(filters=[{"graph": "piecewise"}], logs_dir=tmp_path / "l", progress=False))
        assert {r.axes["graph"] for r in store.results(partial)} == {"piecewise"}
        store.finish_run(partial, status="interrupted")  # as if the parent had died before the breakable cells
        resumed = run_matrix(matrix, store, RunOptions(resume=True, logs_dir=tmp_path / "l", progress=False),
                             on_result=lambda row: seen.append(row.key))
        assert resumed == partial
        assert seen and all("graph=breakable" in k for k in seen)  # only the missing cells ran
        assert len(store.results(partial)) == 4
        seen.clear()
        again = run_matrix(matrix, store, RunOptions(resume=True, logs_dir=tmp_path / "l", progress=False),
                           on_result=lambda row: seen.append(row.key))
        assert again == partial and seen == []  # a finished run resumed: nothing redone


def test_shards_partition_the_matrix():
    smoke = Path(__file__).parents[3] / "harness" / "configs" / "smoke.yaml"
    cells = plan(smoke, RunOptions()).cells
    keys = {c.key for c in cells}
    parts = [{c.key for c in plan(smoke, RunOptions(shard=(i, 3))).cells} for i in range(3)]
    assert set().union(*parts) == keys
    assert sum(len(p) for p in parts) == len(keys)
    assert all(parts)


def test_resume_gives_a_failed_first_attempt_its_retry(tmp_path):
    """The parent died after recording a first attempt's failure and before the retry: resume retries it."""
    matrix = _matrix(tmp_path, ["piecewise", "breakable"])
    cells = {c.axes["graph"]: c for c in plan(matrix, RunOptions()).cells}
    with Store(str(tmp_path / "r.db")) as store:
        run_id = store.create_run("faults", str(matrix), {})
        def failed(cell, status="fail_capture"):
            return CellRecord(key=cell.key, axes=cell.axes, status=status, reason="killed parent", duration_s=1.0)

        for graph, status in (("piecewise", "fail_capture"), ("breakable", "eager_fail")):  # eager_fail: never retried
            store.record_result(run_id, failed(cells[graph], status))
        seen: list[tuple[str, int]] = []
        resumed = run_matrix(matrix, store, RunOptions(resume=True, logs_dir=tmp_path / "l", progress=False),
                             on_result=lambda row: seen.append((row.key, row.attempt)))
        assert resumed == run_id
        assert seen == [(cells["piecewise"].key, 2)]  # only the retry ran, as attempt 2
        rows = {r.axes["graph"]: r for r in store.results(run_id)}
        assert rows["piecewise"].status == "pass_flaky"
        assert "first attempt: fail_capture: killed parent" in rows["piecewise"].reason
        assert rows["breakable"].status == "eager_fail"
        # a finished run's first-attempt failure is final (that run went without retries): not retried on resume
        store.record_result(run_id, failed(cells["breakable"]))
        seen.clear()
        run_matrix(matrix, store, RunOptions(resume=True, logs_dir=tmp_path / "l", progress=False),
                   on_result=lambda row: seen.append((row.key, row.attempt)))
        assert seen == [] and store.run(run_id).status == "finished"
