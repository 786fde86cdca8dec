"""The ways a command ends that are no bug of pcg's are one line on stderr, never a traceback: a lean install
without the runtime's modules (exit 2, saying which extra to install), Ctrl-C during a run (130, saying how to
resume it), a reader that closed the pipe (141, nothing said) and a path that cannot be written (2, naming it)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness.launcher.orphans import alive, read_records
from harness.store import Store

ROOT = Path(__file__).resolve().parents[3]
NIGHTLY_DB = ROOT / "benchmarks" / "results" / "2026-11-29-h200" / "nightly" / "nightly.db"
CONFIG = ROOT / "harness" / "models" / "configs" / "Qwen__Qwen3-0.6B.json"
# A lean install (`pcg[web]`): the runtime extra's modules are not there at all, as Python says it of a module
# that is not installed (No module named …), not blocked in sys.modules.
LEAN = """
import sys
from importlib.abc import MetaPathFinder

class NotInstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "huggingface_hub", "safetensors"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
"""
# The pcgh entry point, with Python's own Ctrl-C handler even where the test runs with SIGINT ignored (a
# background job inherits SIG_IGN, and Python then installs none).
PCGH = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); from harness.cli import main; "
        "raise SystemExit(main(sys.argv[1:]))")


def _pcgh(*argv: str, lean: bool = False, cwd: Path = ROOT, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", (LEAN if lean else "") + "\n" + PCGH, *argv], cwd=cwd, text=True,
                            stderr=subprocess.PIPE, **kw)


def _ended(p: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    _, err = p.communicate(timeout=timeout)
    assert "Traceback" not in err and "Error:" not in err, err  # no traceback, no `BrokenPipeError: …` line
    return p.returncode, err


@pytest.mark.parametrize("argv", [
    ["run", "harness/configs/smoke.yaml", "--dry-run"],
    ["cell", "--model", "qwen3-0.6b", "--tiny", "--graph", "breakable", "--device", "cpu"],
    ["request", str(CONFIG)],
], ids=["run --dry-run", "cell", "request"])
def test_a_lean_install_says_which_extra_to_install(argv, tmp_path):
    db = ["--db", str(tmp_path / "r.db")] if argv[0] == "request" else []
    returncode, err = _ended(_pcgh(*argv, *db, lean=True, stdout=subprocess.DEVNULL), 120)
    assert returncode == 2, err
    assert err.count("\n") == 1 and err.startswith(f"pcgh {argv[0]}: error: needs torch (No module named 'torch')"), err
    assert err.endswith('install the runtime extra from pcg\'s checkout: pip install -e ".[runtime]"\n'), err


def test_the_lean_install_still_lists_the_model_cards():
    returncode, err = _ended(_pcgh("models", lean=True, stdout=subprocess.DEVNULL), 120)
    assert (returncode, err) == (0, "")


def test_ctrl_c_during_a_run_is_one_line_saying_how_to_resume(tmp_path):
    matrix, db, logs = tmp_path / "m.yaml", tmp_path / "r.db", tmp_path / "logs"
    matrix.write_text(yaml.safe_dump({
        "name": "ctrl-c", "defaults": {"device": "cpu", "dtype": "float32", "max_tokens": 16, "max_new_tokens": 2},
        "axes": {"model": ["qwen3-0.6b:tiny"], "graph": ["piecewise", "breakable"]}}))
    runner = _pcgh("run", str(matrix), "--db", str(db), "--logs", str(logs), stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (workers := list(logs.glob("*/run-1/workers/*.json"))):
            assert runner.poll() is None and time.monotonic() < deadline, "no worker started"
            time.sleep(0.05)
        pids = [r.pid for r in read_records(workers[0].parent)]
        runner.send_signal(signal.SIGINT)
        returncode, err = _ended(runner, 60)
    finally:
        runner.kill()
    assert returncode == 130, err
    assert err == f"pcgh run: interrupted; `pcgh run {matrix} --resume --db {db} --logs {logs}` finishes the run\n"
    assert not [p for p in pids if alive(p)]
    with Store(str(db)) as store:
        assert store.run(1).status == "interrupted"


@pytest.fixture
def nightly_db(tmp_path: Path) -> Path:
    (tmp_path / "n.db").write_bytes(NIGHTLY_DB.read_bytes())
    return tmp_path / "n.db"


@pytest.mark.parametrize("argv", [["report", "latest", "--db", "n.db"], ["models"],
                                  ["run", str(ROOT / "harness/configs/smoke.yaml"), "--dry-run"]],
                         ids=["report", "models", "run --dry-run"])
def test_a_reader_that_closed_the_pipe_ends_it_quietly(argv, nightly_db):
    """`pcgh report | head -1`, at its worst: the reader is gone before the first write. Exit 141, as for a tool
    that SIGPIPE ended, and nothing on stderr (the interpreter's flush at exit included)."""
    p = _pcgh(*argv, cwd=nightly_db.parent, stdout=subprocess.PIPE)
    p.stdout.close()
    assert _ended(p, 120) == (141, "")


def test_a_reader_that_takes_one_line_then_goes(nightly_db):
    """The race `| head -1` runs: whichever write meets the closed pipe, the end is the same, a few times over."""
    for _ in range(3):
        p = _pcgh("report", "latest", "--db", "n.db", cwd=nightly_db.parent, stdout=subprocess.PIPE)
        assert p.stdout.readline()
        p.stdout.close()
        assert _ended(p, 120) in ((0, ""), (141, ""))


def test_a_card_folder_that_cannot_be_written_is_one_line_naming_the_path(tmp_path):
    """--write-card into a folder where the configs/ subfolder cannot be made (a file of that name holds the
    place: an OSError that root meets too, where a read-only mode would not stop it)."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "configs").write_text("a file, not a folder")
    returncode, err = _ended(_pcgh("request", str(CONFIG), "--write-card", "--models-dir", str(models),
                                   "--db", str(tmp_path / "r.db"), stdout=subprocess.DEVNULL))
    assert returncode == 2, err
    assert err.count("\n") == 1 and err.startswith(f"pcgh request: error: {models / 'configs'}: "), err
    assert "--models-dir" in err
