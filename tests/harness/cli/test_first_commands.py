"""A new user's first commands (issue 46): a typo is one line and exit 2 before torch loads and before anything
is recorded; a filter that selects nothing is not a green run; the runs are listed; the help has examples."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from harness.cli import build_parser
from harness.cli.runs import end_summary
from harness.outcome import CellRecord, cell_key
from harness.store import RunRow, Store
from pcg_core.known import MAX_TOKENS

ROOT = Path(__file__).resolve().parents[3]
SMOKE = str(ROOT / "harness" / "configs" / "smoke.yaml")
NIGHTLY = str(ROOT / "harness" / "configs" / "nightly.yaml")  # with `nightly: {requests: …}`
NIGHTLY_DB = ROOT / "benchmarks" / "results" / "2026-11-29-h200" / "nightly" / "nightly.db"


def _pcgh(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.cli", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PCG_DB_URL": ""})


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A copy of the committed nightly store: two finished runs."""
    path = tmp_path / "n.db"
    path.write_bytes(NIGHTLY_DB.read_bytes())
    return path


def _runs(db: Path) -> list[int]:
    with Store(str(db), read_only=True) as store:
        return [r.id for r in store.runs()]


@pytest.mark.parametrize("argv, words", [
    (["run", SMOKE, "--filter", "graph=piecewize"], ["'piecewize' matches none of", "did you mean 'piecewise'?"]),
    (["run", SMOKE, "--filter", "model=nomatch*"], ["'nomatch*' matches none of", "model values (qwen3-0.6b:tiny,"]),
    (["run", SMOKE, "--dry-run", "--filter", "graph=piecewize"], ["did you mean 'piecewise'?"]),
    (["run", SMOKE, "--filter", "graph=full", "--filter", "quant=awq", "--filter", "attention=flex"],
     ["--filter graph=full --filter quant=awq --filter attention=flex selects no cells of"]),
    (["run", SMOKE, "--dry-run", "--tier", "dense", "--filter", "quant=awq", "--filter", "attention=flex"],
     ["--tier dense --filter quant=awq --filter attention=flex selects no cells"]),
    (["nightly", SMOKE, "--filter", "graph=piecewize"], ["did you mean 'piecewise'?"]),
])
def test_a_filter_that_selects_nothing_is_bad_input_and_records_nothing(db: Path, argv: list[str], words: list[str]) -> None:
    before = db.read_bytes()
    p = _pcgh(*argv, "--db", str(db), "--logs", str(db.parent / "logs"), cwd=db.parent)
    assert p.returncode == 2 and "Traceback" not in p.stderr, (p.returncode, p.stderr)
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith(f"pcgh {argv[0]}: error: --"), p.stderr
    for w in words:
        assert w in line, line
    assert db.read_bytes() == before and _runs(db) == [2, 1] and not (db.parent / "logs").exists()


def test_matrix_mistakes_are_reported_before_torch_is_imported(tmp_path: Path) -> None:
    """Each is one error, said in under a second instead of the ~10 s torch takes to import first."""
    text = Path(SMOKE).read_text()
    (tmp_path / "typo.yaml").write_text(text.replace("graph: [piecewise, breakable, full]", "graph: [piecewize, breakable, full]"))
    (tmp_path / "key.yaml").write_text(text.replace("  timeout_s: 300", "  tmeout_s: 300"))
    code = f"""
import sys
from harness.cli import main
for argv in (['run', 'typo.yaml'], ['run', 'key.yaml'], ['nightly', 'key.yaml'], ['run', {SMOKE!r}, '--filter', 'graph=fulll'],
             ['run', {str(ROOT / 'harness' / 'configs')!r}], ['run', {SMOKE!r}, '--tier', 'dens'],
             ['nightly', {NIGHTLY!r}, '--filter', 'graph=fulll'], ['nightly', {NIGHTLY!r}, '--tier', 'quik']):
    assert main(argv + ['--db', 'x.db']) == 2, argv
assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch imported'
"""
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    errors = [line for line in p.stderr.splitlines() if line.strip()]
    typo = [line for line in errors if "typo.yaml" in line]
    assert len(typo) == 1 and "field axes.graph.0: unknown capture backend 'piecewize'; did you mean 'piecewise'?" in typo[0]
    assert any("key.yaml:10: field defaults.tmeout_s: unknown key 'tmeout_s'; did you mean 'timeout_s'?" in e for e in errors)
    assert any(e.startswith("pcgh run: error: ") and "configs: is a folder, not a matrix file; e.g. "
               f"{ROOT / 'harness' / 'configs' / 'smoke.yaml'} (files there: full.yaml, multi_gpu.yaml, nightly.yaml, quick.yaml, smoke.yaml)" in e
               for e in errors), errors
    assert any("tier 'dens' is not in matrix 'smoke'; did you mean 'dense'?" in e for e in errors)
    # the nightly matrix joins requested models to its model axis: its other axes are checked at once all the same
    assert any(e.startswith("pcgh nightly: error: --filter graph=fulll: ") for e in errors)
    assert any("tier 'quik' is not in matrix 'nightly'; did you mean 'quick'?" in e for e in errors)
    assert not (tmp_path / "x.db").exists()


def test_runs_lists_the_run_ids_with_their_counts_and_only_reads(db: Path) -> None:
    before = db.read_bytes()
    p = _pcgh("runs", "--db", str(db), cwd=db.parent)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split() == ["id", "name", "status", "trigger", "started", "(UTC)", "cells", "pass", "fail", "not",
                                "counted"]
    assert [line.split()[:3] for line in lines[1:3]] == [["2", "nightly", "finished"], ["1", "nightly", "finished"]]
    assert lines[1].split()[-4:] == ["504", "21", "0", "483"] and "`pcgh diff BASE HEAD`" in lines[-1]
    p = _pcgh("runs", "--db", str(db), "--json", "--limit", "1", cwd=db.parent)
    [run] = json.loads(p.stdout)
    assert (run["id"], run["name"], run["cells"], run["passing"], run["failing"], run["not_counted"]) == (2, "nightly", 504, 21, 0, 483)
    assert run["counts"] == {"pass": 21, "unsupported": 483} and run["started_at"].startswith("2026-11-29T")
    assert "no runs of matrix 'smoke'" in _pcgh("runs", "--db", str(db), "--name", "smoke", cwd=db.parent).stdout
    assert db.read_bytes() == before
    p = _pcgh("runs", "--db", "missing.db", cwd=db.parent)
    assert p.returncode == 2 and "pcgh runs: error: no results database at" in p.stderr
    assert not (db.parent / "missing.db").exists()
    code = ("import sys\nfrom harness.cli import main\n"
            f"assert main(['runs', '--db', {str(db)!r}]) == 0\n"
            "assert not {'torch', 'transformers', 'pandas'} & set(sys.modules), 'a heavy import'\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]  # a reading command: it starts as fast as report


def _record(key: str, status: str = "pass", graphs: int | None = 0, reason: str = "", **axes: str) -> CellRecord:
    axes = {"model": "qwen3-0.6b:tiny", "quant": "none", "attention": "sdpa", "parallel": "tp1", "graph": key,
            "compiler": "eager", **axes}
    metrics = {"speedup": {"8": 0.6, "32": 1.5}, "graphs_captured": graphs} if status == "pass" else {}
    return CellRecord(key=cell_key(axes), axes=axes, status=status, reason=reason, metrics=metrics, log="",
                      duration_s=1.0, attempt=1)


def test_the_end_of_run_summary_says_why_cells_did_not_run_and_where_the_dashboard_is() -> None:
    varlen = "attention backend 'varlen' cannot run on cpu: FlashAttention-2 kernels exist for CUDA only"
    records = [_record("piecewise"), _record("full"), _record("breakable", "unsupported", reason=varlen),
               _record("piecewise", "unsupported", reason=varlen, attention="varlen"),
               _record("full", "unsupported", reason="quantization 'fp9' is not supported\n(detail)", quant="fp9")]
    run = RunRow(id=7, name="smoke", matrix="smoke.yaml", started_at=datetime.now(UTC), status="finished")  # no finish time
    out = end_summary(run, records, [], "my runs.db").splitlines()
    assert out[0] == "run 7 (smoke, finished): 5 cells, 2 pass, 3 unsupported; pass rate 100.0% (2/2 counted)"
    assert out[1] == "speedup: not measured on CPU (no CUDA graphs are captured there)"  # nothing was captured
    assert out[2:4] == [f"  2 unsupported: {varlen}", "  1 unsupported: quantization 'fp9' is not supported…"]
    assert out[4:] == ["full report: pcgh report 7 --db 'my runs.db'", "dashboard: pcgh serve --db 'my runs.db'"]
    cuda = [_record("piecewise", graphs=40), _record("full", graphs=8)]
    assert end_summary(run, cuda, [], None).splitlines()[1:] == [
        "geomean speedup 0.95× over 2 passing cell(s)", "full report: pcgh report 7", "dashboard: pcgh serve"]


def test_a_cpu_run_report_does_not_headline_a_graph_speedup() -> None:
    from harness.reports import summary_markdown

    cpu = summary_markdown(RunRow(id=1, name="smoke", matrix="smoke.yaml", started_at=datetime.now(UTC)), [_record("piecewise"), _record("full")])
    assert "**Speedup: not measured on CPU** (no CUDA graphs are captured there" in cpu and "Geomean speedup" not in cpu
    cuda = summary_markdown(RunRow(id=2, name="nightly", matrix="n.yaml", started_at=datetime.now(UTC)), [_record("piecewise", graphs=40), _record("full", graphs=None)])
    assert "**Geomean speedup: 0.95×** over 2 passing cell(s) with timings" in cuda  # unrecorded: as before


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]


def test_pcgh_help_shows_examples() -> None:
    text = build_parser().format_help()
    assert "examples:\n  pcgh run harness/configs/quick.yaml" in text and "pcgh runs" in text and "pcgh serve" in text


def test_cell_help_describes_every_flag_its_defaults_and_the_ranges_its_errors_use(capsys) -> None:
    cell = _subparser("cell")
    text = " ".join(cell.format_help().split())
    assert text.count("Run one cell: an eager reference and a graph candidate") == 1 and "examples:" in text
    assert [a.dest for a in cell._actions if not a.help] == []
    for shown in ("default 4096 on cuda, 64 on cpu", "(default: sdpa)", "(default: eager)", "(default: auto)", "(default: 8)",
                  f"largest token bucket, 1 to {MAX_TOKENS}"):
        assert shown in text, shown
    assert "(default: None)" not in text and "(default: False)" not in text
    with pytest.raises(SystemExit):
        cell.parse_args(["--model", "m", "--graph", "full", "--max-tokens", str(2**40)])
    assert f"expected a token count from 1 to {MAX_TOKENS}, got {2**40}" in capsys.readouterr().err
