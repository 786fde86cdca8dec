"""The launcher: each cell in its own process, classified, retried once, recorded the moment it ends.

- plan.py — RunOptions and the planned cells (filters, tier, shard, pre-check)
- process.py — one attempt of one cell in a child process → a CellRecord
- ranks.py — a cell of several ranks (a parallel mode): one worker per rank with torch's env:// variables
- gpus.py — the host's GPUs, handed to cells k at a time (one per rank), cells of different sizes side by side
- worker.py — the child: CellSpec on stdin, CellOutcome file out, phase markers on stderr
- watch.py — every worker's watchdog on its runner, and the names runner and workers share
- zygote.py, zygote_serve.py — CPU workers forked from a pre-imported parent, one per process and environment
- groups.py — the workers' process groups: started, waited for and killed by the runner (SIGTERM included)
- orphans.py — worker records in the run's logs; a resume kills what an earlier runner left behind
- classify.py — a child that died without an outcome, in the judge's words
- runner.py — run_matrix: resume, retry, GPUs, recording
- ray_executor.py — `--executor ray`: each attempt a Ray task on a node with the cell's GPUs
- progress.py — the progress bar
- environment.py — the provenance recorded with each run

A cell worker (`python -m harness.launcher.worker`) imports this package before its own module runs: its watchdog on
the runner starts here (watch.py), before the imports below (torch: seconds, more on a loaded machine), or a runner killed
meanwhile would leave it running until they are done.
"""

from harness.launcher.watch import watch_parent

watch_parent()  # in a runner's worker only (it has the runner's pipe); nothing elsewhere
from harness.launcher.plan import Plan, RunOptions, plan  # noqa: E402
from harness.launcher.runner import run_matrix  # noqa: E402

__all__ = ["Plan", "RunOptions", "plan", "run_matrix"]
