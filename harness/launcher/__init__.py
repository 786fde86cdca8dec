"""The launcher: each cell in its own process, classified, retried once, recorded the moment it ends.

- plan.py — RunOptions and the planned cells (filters, tier, shard, pre-check)
- process.py — one attempt of one cell in a child process → a CellRecord
- worker.py — the child: CellSpec on stdin, CellOutcome file out, phase markers on stderr, a watchdog on its runner
- groups.py — the workers' process groups: started, waited for and killed by the runner (SIGTERM included)
- orphans.py — worker records in the run's logs; a resume kills what an earlier runner left behind
- classify.py — a child that died without an outcome, in the judge's words
- runner.py — run_matrix: resume, retry, GPU slots, recording
- progress.py — the progress bar
- environment.py — the provenance recorded with each run
"""

from harness.launcher.plan import Plan, RunOptions, plan
from harness.launcher.runner import run_matrix

__all__ = ["Plan", "RunOptions", "plan", "run_matrix"]
