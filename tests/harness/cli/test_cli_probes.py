"""pcgh under bad input and in CI: every bad input is one line and exit 2 (never a traceback), read-only commands
create nothing, `pcgh run` exits 1 when a launched cell fails, and the command line starts without torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.cli import main
from harness.store import Store

ROOT = Path(__file__).resolve().parents[3]
NIGHTLY_DB = ROOT / "benchmarks" / "results" / "2026-11-29-h200" / "nightly" / "nightly.db"
LAUNCHER_TESTS = ROOT / "tests" / "harness" / "launcher"
ONE_CELL = ["--filter", "model=qwen3-0.6b:tiny", "--filter", "graph=piecewise", "--filter", "quant=none",
            "--filter", "attention=sdpa"]  # a filter that selects nothing is itself bad input


def _pcgh(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.cli", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def _one_line_exit_2(p: subprocess.CompletedProcess[str]) -> None:
    """Exit 2 with `pcgh …: error: …` (argparse's usage line may come before it; a matrix's problems are listed
    under it, one a line), never a traceback."""
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    assert any(line.startswith("pcgh") and "error:" in line for line in p.stderr.splitlines()), p.stderr


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A folder with a copy of the committed nightly store, a regular file, and an empty matrix."""
    (tmp_path / "n.db").write_bytes(NIGHTLY_DB.read_bytes())
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    (tmp_path / "latin1.yaml").write_bytes("name: caf\u00e9\naxes: {model: [qwen3-0.6b:tiny]}\n".encode("latin-1"))
    (tmp_path / "latin1.json").write_bytes('{"model_type": "qwen3", "name": "caf\u00e9"}'.encode("latin-1"))
    lol = ["a: &a [x, x, x, x, x, x, x, x, x, x]"] + [f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, "
                                                       f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
                                                       f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]"
                                                       for i in range(8)]
    (tmp_path / "bomb.yaml").write_text("\n".join(lol) + "\nname: bomb\naxes: {model: [qwen3-0.6b:tiny]}\n")
    (tmp_path / "typo.yaml").write_text("name: t\naxes: {model: [qwen3-0.6b:tiny], graph: [piecewse]}\n")
    (tmp_path / "dup.yaml").write_text("name: t\nname: u\naxes: {model: [qwen3-0.6b:tiny]}\n")
    (tmp_path / "huge.yaml").write_text("name: t\ndefaults: {max_tokens: 100000000}\naxes: {model: [qwen3-0.6b:tiny]}\n")
    return tmp_path


PROBES = {
    "diff negative threshold": ["diff", "1", "2", "--db", "n.db", "--threshold", "-3"],
    "diff nan threshold": ["diff", "1", "2", "--db", "n.db", "--threshold", "nan"],
    "diff inf threshold": ["diff", "1", "2", "--db", "n.db", "--threshold", "inf"],
    "report --out is a file": ["report", "1", "--db", "n.db", "--out", "a-file"],
    "report --out under a file": ["report", "1", "--db", "n.db", "--out", "a-file/sub"],
    "report of a missing db": ["report", "--db", "missing.db"],
    "diff of a missing db": ["diff", "1", "2", "--db", "missing.db"],
    "report of an unknown run": ["report", "99", "--db", "n.db"],
    "run a bad matrix": ["run", "bad.yaml", "--db", "new.db"],
    "run a missing matrix": ["run", "nope.yaml", "--db", "new.db"],
    "run with --logs under a file": ["run", str(ROOT / "harness" / "configs" / "smoke.yaml"), "--db", "new.db",
                                     "--logs", "a-file/logs", *ONE_CELL],
    "serve on port 99999": ["serve", "--port", "99999"],
    "serve on a port that is no number": ["serve", "--port", "http"],
    "cell with a huge seed": ["cell", "--model", "qwen3-0.6b", "--tiny", "--graph", "piecewise", "--seed", str(2**70)],
    "cell with --max-tokens 2**40": ["cell", "--model", "qwen3-0.6b", "--tiny", "--graph", "piecewise",
                                     "--max-tokens", str(2**40)],
    "run --jobs 0": ["run", "bad.yaml", "--jobs", "0"],
    "run --shard 3/2": ["run", "bad.yaml", "--shard", "3/2"],
    "run --filter without =": ["run", "bad.yaml", "--filter", "graph"],
    "requests --limit -1": ["requests", "--db", "n.db", "--limit", "-1"],
    "run a non-UTF-8 matrix": ["run", "latin1.yaml", "--db", "new.db", "--dry-run"],
    "run a YAML bomb": ["run", "bomb.yaml", "--db", "new.db", "--dry-run"],
    "run a matrix with a typo": ["run", "typo.yaml", "--db", "new.db"],
    "run a matrix with a duplicate key": ["run", "dup.yaml", "--db", "new.db"],
    "run a matrix with max_tokens 1e8": ["run", "huge.yaml", "--db", "new.db"],
    "request a non-UTF-8 config.json": ["request", "latin1.json", "--db", "new.db"],
    "cell of a non-UTF-8 config.json": ["cell", "--model", "latin1.json", "--graph", "piecewise"],
    "cell with an unknown quant": ["cell", "--model", "qwen3-0.6b", "--graph", "piecewise", "--quant", "fp9"],
    "cell with an unknown graph": ["cell", "--model", "qwen3-0.6b", "--tiny", "--graph", "piecewse"],
    "run a filter value that is no value of its axis": ["run", str(ROOT / "harness" / "configs" / "smoke.yaml"),
                                                        "--db", "n.db", "--filter", "graph=piecewize"],
    "dry-run a filter glob that matches no model": ["run", str(ROOT / "harness" / "configs" / "smoke.yaml"), "--dry-run",
                                                    "--filter", "model=nomatch*"],
    "nightly of filters that select no cell": ["nightly", str(ROOT / "harness" / "configs" / "smoke.yaml"), "--db", "new.db",
                                               "--filter", "graph=full", "--filter", "quant=awq", "--filter", "attention=flex"],
    "run a folder": ["run", str(ROOT / "harness" / "configs"), "--db", "new.db"],
    "report --db ''": ["report", "--db", ""],
    "requests of a missing db": ["requests", "--db", "missing.db"],
    "cell with more layers than the model": ["cell", "--model", "qwen3-0.6b", "--graph", "piecewise", "--layers", "1000000000"],
}


@pytest.mark.parametrize("argv", PROBES.values(), ids=PROBES.keys())
def test_bad_input_is_one_line_and_exit_2_and_writes_nothing(tree: Path, argv: list[str]) -> None:
    before = sorted(p.name for p in tree.iterdir())
    _one_line_exit_2(_pcgh(*argv, cwd=tree))
    assert sorted(p.name for p in tree.iterdir()) == before  # no pcg.db, no log folder, no report folder


def test_a_database_this_process_cannot_write_is_refused_before_a_run_starts(tree: Path, monkeypatch, capsys) -> None:
    # A read-only mount, as seen by access(2) (root ignores file modes, so a chmod cannot show it in CI).
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if "ro" in Path(p).parts else real_access(p, mode, **kw))
    (tree / "ro").mkdir()
    (tree / "ro" / "pcg.db").write_bytes(NIGHTLY_DB.read_bytes())
    smoke = str(ROOT / "harness" / "configs" / "smoke.yaml")
    assert main(["run", smoke, "--db", str(tree / "ro" / "pcg.db"), "--logs", str(tree / "logs"),
                 *ONE_CELL]) == 2
    assert "read-only" in capsys.readouterr().err
    with Store(str(tree / "n.db"), read_only=True) as store:
        assert [r.id for r in store.runs()] == [2, 1]


def test_read_only_commands_read_an_old_database_without_changing_it(tree: Path) -> None:
    before = (tree / "n.db").read_bytes()
    assert _pcgh("report", "1", "--db", "n.db", cwd=tree).returncode == 0
    assert _pcgh("diff", "1", "2", "--db", "n.db", cwd=tree).returncode == 0
    assert _pcgh("requests", "--db", "n.db", cwd=tree).returncode == 0
    assert (tree / "n.db").read_bytes() == before  # no tables added, no counts filled in
    listed = _pcgh("requests", "--db", "missing.db", cwd=tree)  # a typo'd --db: an error, as for report
    assert listed.returncode == 2 and "no results database at" in listed.stderr and not (tree / "missing.db").exists()


def test_help_and_the_reading_commands_never_import_torch(tree: Path) -> None:
    """Which modules a command loads, not how long it takes: a wall-clock bound would flake on a loaded CI, while
    torch or transformers (seconds: `pcgh models` took 10 s) or pandas (a third of a second) loaded is the slow
    start-up back (benchmarks/cli_start.py times it). pandas loads where a frame is built: `report --out`'s CSVs."""
    code = ("import sys\nfrom harness.cli import main\n"
            "for argv in (['report', '1', '--db', 'n.db'], ['diff', '1', '2', '--db', 'n.db'], ['requests', '--db', 'n.db'],\n"
            "             ['models'], ['models', '--json']):\n"
            "    assert main(argv) == 0, argv\n"
            "    heavy = [m for m in ('torch', 'transformers', 'pandas') if m in sys.modules]\n"
            "    assert not heavy, f'pcgh {\" \".join(argv)} imported {heavy}'\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch imported'\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]


def test_models_lists_whole_ids_when_piped(tmp_path: Path) -> None:
    from harness.cards import load_cards

    p = _pcgh("models", cwd=tmp_path)  # stdout is a pipe: no terminal width to cut the table to
    assert p.returncode == 0
    rows = [line.split("│") for line in p.stdout.splitlines() if line.startswith("│")]
    rows = [r for r in rows if r[1].strip()]  # a long runtime reason folds onto lines with the id cell empty
    ids, hub_ids = [r[1].strip() for r in rows], [r[2].strip() for r in rows]
    cards = load_cards()
    assert ids == list(cards) and hub_ids == [c.hub_id for c in cards.values()]


def test_more_layers_than_the_model_has_is_an_error_naming_the_flag(capsys) -> None:
    assert main(["cell", "--model", "qwen3-0.6b", "--layers", str(10**9), "--graph", "piecewise"]) == 2
    err = capsys.readouterr().err
    assert "the model has 28 decoder layers" in err and "--layers" in err


@pytest.fixture
def faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PCG_PLUGINS", "fault_backends")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(LAUNCHER_TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PCG_TEST_FLAKY_DIR", str(tmp_path))
    monkeypatch.syspath_prepend(str(LAUNCHER_TESTS))


def test_run_exits_1_when_a_launched_cell_fails_and_says_so_briefly(tmp_path: Path, faults, capsys) -> None:
    matrix = tmp_path / "m.yaml"
    matrix.write_text(yaml.safe_dump({
        "name": "gate", "defaults": {"device": "cpu", "dtype": "float32", "max_tokens": 16, "max_new_tokens": 2},
        "axes": {"model": ["qwen3-0.6b:tiny"], "graph": ["test_raise_capture"]}}))
    db, logs = str(tmp_path / "r.db"), str(tmp_path / "logs")
    assert main(["run", str(matrix), "--db", db, "--logs", logs]) == 1
    out = capsys.readouterr().out
    assert "1 fail_capture" in out and "pcgh report 1 --db" in out
    assert len(out.splitlines()) <= 5  # a short summary; the full report is `pcgh report`
    assert main(["run", str(matrix), "--db", db, "--logs", logs, "--allow-failures", "--no-report"]) == 0


def test_an_unknown_run_points_to_pcgh_runs(tree: Path) -> None:
    res = _pcgh("diff", "1", "99", "--db", "n.db", cwd=tree)
    _one_line_exit_2(res)
    assert "`pcgh runs` lists the runs there" in res.stderr
