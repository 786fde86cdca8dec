"""Run a matrix: expand, pre-check, launch each cell in its own process group with a timeout, retry a failure
once (a pass on retry is `pass_flaky`), and record every result in the store as the cell ends.

Workers run side by side: one per GPU (pinned with CUDA_VISIBLE_DEVICES) for CUDA matrices, `jobs` on a CPU.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from queue import Queue
from typing import Any, Callable

from harness.judge import PASSING
from harness.launcher.classify import classify_death
from harness.launcher.provenance import provenance
from harness.matrix import Cell, expand, load_matrix, precheck, shard
from pcg_core.capabilities import capabilities

NOT_RETRIED = PASSING + ("unsupported", "skipped", "eager_fail", "eager_nondeterministic")
LOG_KEEP = 200_000  # characters of a cell's log kept in the store (the file keeps everything)


@dataclass
class RunOptions:
    jobs: int = 1
    shard: tuple[int, int] | None = None
    resume: bool = False
    filters: list[dict[str, str]] = field(default_factory=list)
    tier: str | None = None
    trigger: str = "manual"
    logs_dir: Path = Path("pcg-logs")
    retry: bool = True
    progress: bool = True


def plan(matrix_path: str | Path, opts: RunOptions) -> tuple[Any, list[Cell]]:
    """The matrix and its cells after filters, shard and pre-check (cell.verdict set where unsupported)."""
    matrix = load_matrix(matrix_path)
    cells = expand(matrix, filters=opts.filters, tier=opts.tier)
    if opts.shard:
        cells = shard(cells, *opts.shard)
    caps, cards = capabilities(), {}
    for cell in cells:
        cell.verdict = precheck(cell, caps, cards)
    return matrix, cells


def _safe(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", key)


def launch(cell: Cell, log_path: Path, gpu: int | None) -> dict[str, Any]:
    """One attempt of one cell in a child process; returns a row for the store (without attempt)."""
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
    duration = time.perf_counter() - t0
    log_text = log_path.read_text(errors="replace")
    result = None
    if result_path.is_file():
        try:
            result = json.loads(result_path.read_text())
        except json.JSONDecodeError:
            result = None
    if result is not None and not timed_out:
        status, reason = result.get("status", "fail_run"), result.get("reason", "")
        metrics = {k: v for k, v in result.items() if k not in ("status", "reason")}
    else:
        status, reason = classify_death(returncode, timed_out, log_text, cell.timeout_s)
        metrics = {}
    return {"key": cell.key, "axes": cell.axes, "status": status, "reason": reason, "metrics": metrics,
            "log": log_text[-LOG_KEEP:], "duration_s": round(duration, 3)}


def run_matrix(matrix_path: str | Path, store: Any, opts: RunOptions,
               on_result: Callable[[dict[str, Any]], None] | None = None) -> int:
    """Run (or resume) a matrix into `store`; returns the run id."""
    matrix, cells = plan(matrix_path, opts)
    prev = store.latest_run(name=matrix.name, matrix=str(matrix_path)) if opts.resume else None
    # Resuming: the newest run of this matrix, finished or not; only its missing cells run.
    run_id = prev["id"] if prev else store.create_run(matrix.name, str(matrix_path), provenance(), trigger=opts.trigger)
    recorded = store.final_states(run_id) if prev else {}
    # In a run that did not finish, a failed first attempt without its retry (the parent died in between) is
    # not done: it gets its second attempt now, judged against the recorded first one. A finished run's
    # first-attempt failures are final (it ran without retries).
    owes_retries = opts.retry and prev is not None and prev["status"] != "finished"
    retry_due = {k: r for k, r in recorded.items() if owes_retries and r["attempt"] == 1 and r["status"] not in NOT_RETRIED}
    done = set(recorded) - set(retry_due)
    lock = threading.Lock()
    counts: Counter = Counter()

    def record(row: dict[str, Any], attempt: int) -> None:
        with lock:
            store.record_result(run_id, {**row, "attempt": attempt})
            if on_result:
                on_result({**row, "attempt": attempt})

    for cell in cells:
        if cell.verdict is not None and cell.key not in done:
            record({"key": cell.key, "axes": cell.axes, "status": "unsupported", "reason": cell.verdict,
                    "metrics": {}, "log": "", "duration_s": 0.0}, 1)
            counts["unsupported"] += 1
    todo = [c for c in cells if c.verdict is None and c.key not in done]

    gpus = capabilities()["cuda_devices"]
    slots: Queue = Queue()
    if matrix.defaults.device == "cuda" and gpus:
        for i in range(gpus):
            slots.put(i)
    else:
        for _ in range(max(1, opts.jobs)):
            slots.put(None)
    logs = Path(opts.logs_dir) / f"run-{run_id}"

    def work(cell: Cell) -> str:
        gpu = slots.get()
        try:
            first = retry_due.get(cell.key)
            if first is None:
                first = launch(cell, logs / f"{_safe(cell.key)}.attempt1.log", gpu)
                record(first, 1)
            if first["status"] in NOT_RETRIED or not opts.retry:
                return first["status"]
            second = launch(cell, logs / f"{_safe(cell.key)}.attempt2.log", gpu)
            if second["status"] in PASSING:
                second["status"] = "pass_flaky"
                second["reason"] = f"passed on retry; first attempt: {first['status']}: {first['reason']}"[:2000]
            record(second, 2)
            return second["status"]
        finally:
            slots.put(gpu)

    try:
        with _Progress(len(todo), counts, enabled=opts.progress) as bar, ThreadPoolExecutor(max_workers=slots.qsize()) as pool:
            for status in pool.map(work, todo):
                counts[status] += 1
                bar.advance()
    except KeyboardInterrupt:
        store.finish_run(run_id, status="interrupted")
        raise
    store.finish_run(run_id)
    return run_id


class _Progress:
    """rich progress bar with counts by status and an ETA (silent when disabled)."""

    def __init__(self, total: int, counts: Counter, enabled: bool = True):
        self.total, self.counts, self.enabled = total, counts, enabled
        self._progress = self._task = None

    def _label(self) -> str:
        return " ".join(f"{k}:{v}" for k, v in sorted(self.counts.items())) or "starting"

    def __enter__(self) -> "_Progress":
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._progress = Progress(TextColumn("cells"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                      TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.description}"))
            self._progress.start()
            self._task = self._progress.add_task(self._label(), total=self.total)
        return self

    def advance(self) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=1, description=self._label())

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()
