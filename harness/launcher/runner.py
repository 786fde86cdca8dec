"""Run a matrix: plan it, launch each cell in its own process group with a timeout, retry a failure once (a pass
on retry is `pass_flaky`), and record every attempt in the store the moment it ends.

Workers run side by side: one per GPU (pinned with CUDA_VISIBLE_DEVICES) for CUDA matrices, `jobs` on a CPU.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from queue import Queue
from typing import Callable

from harness.launcher.environment import provenance
from harness.launcher.plan import RunOptions, plan
from harness.launcher.process import launch, log_name
from harness.launcher.progress import RunProgress
from harness.matrix import Cell
from harness.outcome import NOT_RETRIED, PASSING, CellRecord, Status
from harness.store import Store


def run_matrix(matrix_path: str | Path, store: Store, opts: RunOptions,
               on_result: Callable[[CellRecord], None] | None = None) -> int:
    """Run (or resume) a matrix into `store`; returns the run id."""
    p = plan(matrix_path, opts)
    matrix, cells = p.matrix, p.cells
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

    def record(rec: CellRecord) -> None:
        with lock:
            store.record_result(run_id, rec)
            if on_result:
                on_result(rec)

    for cell in cells:
        if cell.unsupported is not None and cell.key not in done:
            record(CellRecord(key=cell.key, axes=cell.axes, status=Status.UNSUPPORTED, reason=cell.unsupported))
            counts[Status.UNSUPPORTED] += 1
    todo = [c for c in cells if c.unsupported is None and c.key not in done]

    gpus = p.caps["cuda_devices"]
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
            owed = retry_due.get(cell.key)  # a first attempt recorded before the parent died
            if owed is None:
                first = launch(cell, logs / f"{log_name(cell.key)}.attempt1.log", gpu)
                record(first)
                status, reason = first.status, first.reason
            else:
                status, reason = owed["status"], owed["reason"]
            if status in NOT_RETRIED or not opts.retry:
                return status
            second = launch(cell, logs / f"{log_name(cell.key)}.attempt2.log", gpu, attempt=2)
            if second.status in PASSING:
                second.status = Status.PASS_FLAKY
                second.reason = f"passed on retry; first attempt: {status}: {reason}"[:2000]
            record(second)
            return second.status
        finally:
            slots.put(gpu)

    try:
        with RunProgress(len(todo), counts, enabled=opts.progress) as bar, ThreadPoolExecutor(max_workers=slots.qsize()) as pool:
            for status in pool.map(work, todo):
                counts[status] += 1
                bar.advance()
    except KeyboardInterrupt:
        store.finish_run(run_id, status="interrupted")
        raise
    store.finish_run(run_id)
    return run_id
