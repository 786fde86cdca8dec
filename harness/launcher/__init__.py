"""The launcher: each cell in its own process, classified, retried once, recorded the moment it ends."""

from harness.launcher.runner import RunOptions, run_matrix

__all__ = ["RunOptions", "run_matrix"]
