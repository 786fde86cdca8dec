"""Run a matrix: plan it, launch each cell in its own process group with a timeout, retry a failure once (a pass
on retry is `pass_flaky`), and record every attempt in the store the moment it ends.

Cells run side by side: on CUDA each holds one GPU per rank (pinned with CUDA_VISIBLE_DEVICES; gpus.py hands them
out, cells of different sizes together), on a CPU `jobs` cells at a time. A cell of several ranks runs as that many
workers (ranks.py).
The runner owns their process groups (groups.py): none outlives the cell, the runner's exit or its death, and a
resume first kills what an earlier runner of the run left behind (orphans.py).
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from queue import Queue
from typing import Any
from collections.abc import Callable

from harness.launcher.environment import provenance
from harness.launcher.gpus import GpuPool
from harness.launcher.groups import Terminated, WorkerGroups
from harness.launcher.orphans import reap_orphans, report_reaped
from harness.launcher.plan import Plan, RunOptions, plan
from harness.launcher.process import cpu_threads, launch_repeated, log_name
from harness.launcher.progress import RunProgress
from harness.launcher.ray_executor import RaySeats
from harness.matrix import Cell
from harness.outcome import NOT_RETRIED, PASSING, CellRecord, Status
from harness.store import Store
from harness.store.rows import RunRow


def matrix_identity(matrix_path: str | Path) -> tuple[str, str, list[str]]:
    """(resolved path, sha256 of the content, the spellings earlier runs may have recorded it under): a matrix is
    the same one however its path is written (m.yaml, ./m.yaml, /abs/m.yaml)."""
    path = Path(matrix_path)
    resolved = path.resolve()
    spellings = {str(resolved), str(matrix_path), str(path), os.path.relpath(resolved)}
    spellings |= {f"./{s}" for s in list(spellings) if not s.startswith(("/", "./"))}
    return str(resolved), hashlib.sha256(resolved.read_bytes()).hexdigest(), sorted(spellings)


def run_logs(logs_dir: str | Path, store: Store, run_id: int) -> Path:
    """A run's log folder: per database and run, so two databases used from one folder never share one."""
    return Path(logs_dir) / store.identity / f"run-{run_id}"


def _resumable(store: Store, name: str, resolved: str, sha: str, spellings: list[str]) -> RunRow | None:
    """The newest run of this matrix (by identity) when it did not finish; None when there is none. Says on
    stderr what it found: a finished run (never changed), or a matrix whose content changed since."""
    runs = store.runs_of_matrix(name, spellings)
    if not runs:
        print(f"pcgh: no run of {resolved} to resume; starting a new one", file=sys.stderr)
        return None
    newest = runs[0]
    if newest.status == "finished":
        print(f"pcgh: run {newest.id} of {resolved} finished; nothing to resume (it is left as it is)", file=sys.stderr)
        return newest
    if newest.matrix_sha256 not in (None, sha):
        print(f"pcgh: warning: {resolved} changed since run {newest.id} started (content {newest.matrix_sha256[:12]} → "
              f"{sha[:12]}); resuming it with the matrix as it is now", file=sys.stderr)
    return newest


def run_matrix(matrix_path: str | Path, store: Store, opts: RunOptions,
               on_result: Callable[[CellRecord], None] | None = None, planned: Plan | None = None) -> int:
    """Run (or resume) a matrix into `store`; returns the run id. `planned`: the matrix's plan when the caller
    made it already (the command line plans before it opens the store)."""
    p = planned or plan(matrix_path, opts)
    matrix, cells = p.matrix, p.cells
    resolved, sha, spellings = matrix_identity(matrix_path)
    prev = _resumable(store, matrix.name, resolved, sha, spellings) if opts.resume else None
    if prev is not None and prev.status == "finished":
        return prev.id  # a finished run is never changed, not even its finish time
    if prev is None:
        run_id = store.create_run(matrix.name, resolved, provenance(), trigger=opts.trigger, matrix_sha256=sha)
    else:
        run_id = prev.id
    recorded = store.final_states(run_id) if prev else {}
    # In a run that did not finish, a failed first attempt without its retry (the parent died in between) is
    # not done: it gets its second attempt now, judged against the recorded first one.
    owes_retries = opts.retry and prev is not None
    retry_due = {k: r for k, r in recorded.items() if owes_retries and r["attempt"] == 1 and r["status"] not in NOT_RETRIED}
    done = set(recorded) - set(retry_due)
    record = _Recorder(store, run_id, on_result)
    counts = _record_unsupported(cells, done, record)
    todo = [c for c in cells if c.unsupported is None and c.key not in done]
    logs = run_logs(opts.logs_dir, store, run_id)
    if prev:  # an earlier runner of this run may have died leaving workers: none may write into it any more
        report_reaped(run_id, reap_orphans(logs / "workers"))
    groups = WorkerGroups(records=logs / "workers")
    seats: _Seats | RaySeats
    launch: Launch
    if opts.executor == "ray":  # each attempt a Ray task on a node with the cell's GPUs (ray_executor.py)
        seats = RaySeats(on_cuda=matrix.defaults.device.startswith("cuda"))
        launch = seats.launch
    else:
        seats = _Seats(p.caps["cuda_devices"], matrix.defaults.device, opts.jobs)
        launch = _local_launch(groups, seats.threads)
    attempts = _CellAttempts(record, opts, retry_due, logs, launch, groups)
    try:
        _run_cells(todo, attempts, seats, counts, opts.progress)
    except (KeyboardInterrupt, SystemExit) as e:  # SystemExit: Terminated, or an embedding program's own handler
        store.finish_run(run_id, status="interrupted")  # (Ray's driver turns SIGTERM into sys.exit)
        if isinstance(e, Terminated):
            e.redeliver()  # workers down, the run marked: now the process dies of the signal, embedded or not
        raise
    store.finish_run(run_id)
    return run_id


class _Recorder:
    """Stores each record the moment its attempt ends, one at a time: the cells' threads call it side by side."""

    def __init__(self, store: Store, run_id: int, on_result: Callable[[CellRecord], None] | None) -> None:
        self.store, self.run_id, self.on_result = store, run_id, on_result
        self.lock = threading.Lock()

    def __call__(self, rec: CellRecord) -> None:
        with self.lock:
            self.store.record_result(self.run_id, rec)
            if self.on_result:
                self.on_result(rec)


def _record_unsupported(cells: list[Cell], done: set[str], record: _Recorder) -> Counter:
    """The cells the plan refuses, recorded as unsupported without a worker; the counts the progress starts from."""
    counts: Counter = Counter()
    for cell in cells:
        if cell.unsupported is not None and cell.key not in done:
            refused = CellRecord(key=cell.key, axes=cell.axes, status=Status.UNSUPPORTED, reason=cell.unsupported)
            refused.metrics.process.gpus = cell.gpus  # what it would hold: the nightly's parallel cells carry their count
            record(refused)
            counts[Status.UNSUPPORTED] += 1
    return counts


class _Seats:
    """Where a cell runs. CUDA: each cell holds as many GPUs as it has ranks, cells of different sizes side by side
    (gpus.py); at most one cell per GPU at a time. CPU: `jobs` cells at a time, each of however many ranks, the
    cores shared out among them (`threads`)."""

    def __init__(self, n_gpus: int, device: str, jobs: int) -> None:
        on_gpus = device == "cuda" and n_gpus > 0
        self.pool = GpuPool(range(n_gpus)) if on_gpus else None
        self.slots: Queue = Queue()
        for _ in range(max(1, jobs)):
            self.slots.put(None)
        self.workers = n_gpus if on_gpus else self.slots.qsize()
        self.threads = None if on_gpus else cpu_threads(self.slots.qsize())

    def run(self, cell: Cell, attempts: Callable[[Cell, list[int] | None], str]) -> str:
        """`attempts` of `cell` once it holds its GPUs, or a CPU slot (None: no GPU)."""
        if self.pool is not None:
            with self.pool.held(cell.gpus or 1) as gpu:
                return attempts(cell, gpu)
        slot = self.slots.get()
        try:
            return attempts(cell, slot)
        finally:
            self.slots.put(slot)

    def close(self) -> None:
        """Hand out no more GPUs: a cell waiting for them gives up its thread."""
        if self.pool is not None:
            self.pool.close()


# One attempt: (cell, its log, its GPUs or None, repeats, attempt number) → its record.
Launch = Callable[[Cell, Path, list[int] | None, int, int], CellRecord]


def _local_launch(groups: WorkerGroups, threads: int | None) -> Launch:
    """Attempts in this host's worker groups."""
    def launch(cell: Cell, log: Path, gpu: list[int] | None, repeats: int, attempt: int) -> CellRecord:
        return launch_repeated(cell, log, gpu, repeats, attempt=attempt, groups=groups, threads=threads)

    return launch


class _CellAttempts:
    """A cell's attempts, wherever `launch` runs them: a failure is retried once, and a first attempt recorded
    before an earlier runner died gets only its retry."""

    def __init__(self, record: _Recorder, opts: RunOptions, retry_due: dict[str, dict[str, Any]], logs: Path,
                 launch: Launch, groups: WorkerGroups) -> None:
        self.record, self.opts, self.retry_due = record, opts, retry_due
        self.logs, self.launch, self.groups = logs, launch, groups

    def __call__(self, cell: Cell, gpu: list[int] | None) -> str:
        """The cell's final status after its attempts on `gpu`."""
        opts = self.opts
        owed = self.retry_due.get(cell.key)  # a first attempt recorded before the parent died
        if owed is None:
            first = self.launch(cell, self.logs / f"{log_name(cell.key)}.attempt1.log", gpu, opts.repeats, 1)
            self.record(first)
            status, reason = first.status, first.reason
        else:
            status, reason = owed["status"], owed["reason"]
        if status in NOT_RETRIED or not opts.retry or opts.repeats > 1:  # repeats are the second look already
            return status
        second = self.launch(cell, self.logs / f"{log_name(cell.key)}.attempt2.log", gpu, 1, 2)
        if second.status in PASSING:
            second.status = Status.PASS_FLAKY
            second.reason = f"passed on retry; first attempt: {status}: {reason}"[:2000]
        self.record(second)
        return second.status


def _run_cells(todo: list[Cell], attempts: _CellAttempts, seats: _Seats | RaySeats, counts: Counter, progress: bool) -> None:
    """The cells side by side, counted as each ends; on the way out, however it comes, no worker lives on and no
    waiting cell starts."""
    groups = attempts.groups
    with groups, RunProgress(len(todo), counts, enabled=progress) as bar, \
            ThreadPoolExecutor(max_workers=seats.workers) as executor:
        try:
            futures = {executor.submit(seats.run, cell, attempts): cell for cell in todo}
            for future in as_completed(futures):
                status = future.result()
                counts[status] += 1
                bar.advance(futures[future].key, status)
        finally:  # before the pool's exit waits for its threads: they wait for their workers
            groups.close()
            seats.close()  # a cell waiting for GPUs gives up its thread
            executor.shutdown(wait=False, cancel_futures=True)
