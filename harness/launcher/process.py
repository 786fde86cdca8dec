"""One attempt of one cell in a child process group: spec on stdin, outcome file back, log kept, timeout enforced.

A child that leaves no outcome (killed, segfaulted, timed out) is classified from its phase markers and log.
Starting, waiting for and killing the child is groups.py's.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import harness.launcher.ranks as ranks  # the module: tests plant its WORKER
from harness.launcher.classify import classify_death
from harness.launcher.groups import Terminated, WorkerGroups
from harness.launcher.ranks import launch_ranks, visible_devices
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


def cpu_threads(workers: int) -> int:
    """Intra-op threads for each of `workers` CPU workers side by side: the cores shared out. Left to itself each
    worker's torch takes every core, and oversubscribed small ops spin: on 2 cores, 2 workers of 2 threads each
    ran a tiny-model cell 3.5× slower than 2 workers of 1 thread."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def _gpu_list(gpu: int | Sequence[int] | None) -> list[int] | None:
    return None if gpu is None else [gpu] if isinstance(gpu, int) else list(gpu)


def launch(cell: Cell, log_path: Path, gpu: int | Sequence[int] | None, attempt: int = 1,
           groups: WorkerGroups | None = None, threads: int | None = None) -> CellRecord:
    """Run `cell` once in a worker of `groups` (of its own when None); its record for the store. gpu: the cell's
    GPU, or its GPUs (one per rank); None on a CPU. threads: the worker's intra-op thread count (OMP_NUM_THREADS,
    unless the environment sets it already). A cell of several ranks runs as that many workers (ranks.py).

    Raises Cancelled when the runner shut down while the cell ran: there is nothing to record then.
    """
    if groups is None:
        try:
            with WorkerGroups() as own:
                return launch(cell, log_path, gpu, attempt, own, threads)
        except Terminated as e:
            e.redeliver()  # the worker is down: the process dies of the signal, as it would have without us
            raise
    gpus = _gpu_list(gpu)
    if gpus is not None and len(gpus) != cell.ranks:
        raise ValueError(f"cell {cell.key} runs as {cell.ranks} rank(s), one per GPU; it was handed GPUs {gpus}")
    if cell.processes > 1:
        ranked, log_text, duration = launch_ranks(cell, log_path, cell.ranks, gpus, groups)
        ranked.duration_s = duration
        ranked.metrics.process.gpus = len(gpus) if gpus is not None else None
        return CellRecord.of(cell.key, cell.axes, ranked, attempt=attempt, log=log_text)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    result_path = log_path.with_suffix(".json")
    result_path.unlink(missing_ok=True)
    env = dict(os.environ)
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices(gpus, env)
    if threads is not None:
        env.setdefault("OMP_NUM_THREADS", str(threads))
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = groups.spawn([sys.executable, *ranks.WORKER, str(result_path)], env, log, fork=gpus is None)
        assert proc.stdin is not None  # spawned with stdin=PIPE
        try:
            proc.stdin.write(json.dumps(asdict(cell.spec)))
            proc.stdin.close()
        except BrokenPipeError:
            pass
        # The whole group is killed when the worker ends (or times out): the worker and anything it started.
        returncode, timed_out = groups.wait(proc, cell.timeout_s)
    duration = round(time.perf_counter() - t0, 3)
    log_text = log_path.read_text(errors="replace")
    outcome = None if timed_out else _read_outcome(result_path)
    if outcome is None:
        status, reason = classify_death(returncode, timed_out, log_text, cell.timeout_s)
        outcome = CellOutcome(status=status, reason=reason)
    outcome.duration_s = duration  # the parent's clock, process start-up included (metrics.process.cell_s: the cell's own)
    outcome.metrics.process.gpus = 1 if gpus is not None else None
    return CellRecord.of(cell.key, cell.axes, outcome, attempt=attempt, log=log_text)  # keeps the last LOG_KEEP


def merge_repeats(outcomes: Sequence[CellOutcome]) -> CellOutcome:
    """One outcome for a cell run in several fresh processes: the first non-pass if any (a fault that fires in one
    process out of three is a fault), else the first; the metrics say how many ran and how each ended."""
    bad = [o for o in outcomes if not o.passed]
    first = (bad or outcomes)[0]
    merged = CellOutcome.model_validate(first.model_dump(include=set(CellOutcome.model_fields)))
    merged.metrics.process.repeats = len(outcomes)
    merged.metrics.process.repeat_statuses = [str(o.status) for o in outcomes]
    if bad and len(bad) < len(outcomes):
        merged.reason = f"failed in {len(bad)} of {len(outcomes)} fresh processes: {merged.reason}"[:2000]
    merged.duration_s = round(sum(o.duration_s or 0.0 for o in outcomes), 3)
    return merged


def launch_repeated(cell: Cell, log_path: Path, gpu: int | Sequence[int] | None, repeats: int, attempt: int = 1,
                    groups: WorkerGroups | None = None, threads: int | None = None) -> CellRecord:
    """`launch` in `repeats` fresh processes (logs .r1, .r2 … beside log_path), merged (merge_repeats)."""
    if repeats <= 1:
        return launch(cell, log_path, gpu, attempt, groups, threads)
    records = [launch(cell, log_path.with_suffix(f".r{i + 1}.log"), gpu, attempt, groups, threads) for i in range(repeats)]
    merged = merge_repeats(records)
    worst = records[[str(r.status) for r in records].index(str(merged.status))]
    return CellRecord.of(cell.key, cell.axes, merged, attempt=attempt, log=worst.log)
