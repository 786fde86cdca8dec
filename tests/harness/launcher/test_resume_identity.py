"""Resume finds a run by its matrix's identity, never changes a finished run, warns when the matrix changed; a run's
logs are apart from another database's. Cells here are all unsupported, so nothing launches: fast."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from harness.launcher import RunOptions, run_matrix
from harness.launcher.runner import run_logs
from harness.store import Store


def _matrix(folder: Path, quant: str = "fp8") -> Path:
    path = folder / "m.yaml"
    path.write_text(yaml.safe_dump({"name": "ident", "defaults": {"device": "cpu", "max_tokens": 16},
                                    "axes": {"model": ["qwen3-0.6b:tiny"], "quant": [quant], "graph": ["piecewise"]}}))
    return path


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _opts(resume: bool = False) -> RunOptions:
    return RunOptions(resume=resume, logs_dir=Path("logs"), progress=False)


@pytest.mark.parametrize("spelling", ["m.yaml", "./m.yaml", "{abs}"])
def test_resume_finds_the_run_however_the_path_is_written(here: Path, spelling: str) -> None:
    matrix = _matrix(here)
    with Store(str(here / "r.db")) as store:
        earlier = store.create_run("ident", "./m.yaml", {})  # an interrupted run recorded by an older pcgh
        store.finish_run(earlier, status="interrupted")
        resumed = run_matrix(spelling.format(abs=matrix), store, _opts(resume=True))
        assert resumed == earlier and store.run(earlier).status == "finished"
        assert [r.status for r in store.results(earlier)] == ["unsupported"]
        assert len(store.runs()) == 1


def test_resume_never_changes_a_finished_run(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    matrix = _matrix(here)
    with Store(str(here / "r.db")) as store:
        first = run_matrix(matrix, store, _opts())
        before = store.run(first)
        assert run_matrix(os.path.relpath(matrix), store, _opts(resume=True)) == first
        assert store.run(first) == before  # finished_at included
        assert "finished; nothing to resume" in capsys.readouterr().err


def test_resume_warns_when_the_matrix_changed(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    matrix = _matrix(here)
    with Store(str(here / "r.db")) as store:
        from harness.launcher.runner import matrix_identity

        resolved, sha, _ = matrix_identity(matrix)
        earlier = store.create_run("ident", resolved, {}, matrix_sha256=sha)
        store.finish_run(earlier, status="interrupted")
        _matrix(here, quant="int8")
        assert run_matrix(matrix, store, _opts(resume=True)) == earlier
    err = capsys.readouterr().err
    assert f"changed since run {earlier} started" in err


def test_two_databases_keep_their_logs_apart(here: Path) -> None:
    with Store(str(here / "a.db")) as a, Store(str(here / "b.db")) as b:
        assert run_logs("logs", a, 1) != run_logs("logs", b, 1)
        assert run_logs("logs", a, 1) == run_logs(Path("logs"), Store(str(here / "a.db")), 1)  # stable
        assert run_logs("logs", a, 1).name == "run-1" and run_logs("logs", a, 1).parent.name.startswith("a-")
