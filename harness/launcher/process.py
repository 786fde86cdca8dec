"""One attempt of one cell in a child process group: spec on stdin, outcome file back, log kept, timeout enforced.

A child that leaves no outcome (killed, segfaulted, timed out) is classified from its phase markers and log.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from harness.launcher.classify import classify_death
from harness.matrix import Cell
from harness.outcome import CellOutcome, CellRecord


def log_name(key: str) -> str:
    """A file name for a cell key (keys hold `|`, `:` and `*`)."""
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", key)


def _read_outcome(path: Path) -> CellOutcome | None:
    if not path.is_file():
        return None
    try:
        return CellOutcome.from_json(path.read_text())
    except ValueError:  # bad JSON and a failed validation alike
        return None  # a torn or foreign file is no outcome: the death is classified instead


def launch(cell: Cell, log_path: Path, gpu: int | None, attempt: int = 1) -> CellRecord:
    """Run `cell` once in a child process; its record for the store."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    result_path = log_path.with_suffix(".json")
    result_path.unlink(missing_ok=True)
    env = dict(os.environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    t0 = time.perf_counter()
    timed_out = False
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "harness.launcher.worker", str(result_path)],
            stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, text=True,
        )
        try:
            proc.stdin.write(json.dumps(asdict(cell.spec)))
            proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            returncode = proc.wait(timeout=cell.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)  # the whole group: the worker and anything it started
            returncode = proc.wait()
    duration = round(time.perf_counter() - t0, 3)
    log_text = log_path.read_text(errors="replace")
    outcome = None if timed_out else _read_outcome(result_path)
    if outcome is None:
        status, reason = classify_death(returncode, timed_out, log_text, cell.timeout_s)
        outcome = CellOutcome(status=status, reason=reason)
    outcome.duration_s = duration  # the parent's clock, process start-up included (metrics.cell_s: the cell's own)
    return CellRecord.of(cell.key, cell.axes, outcome, attempt=attempt, log=log_text)  # keeps the last LOG_KEEP
