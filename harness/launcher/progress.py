"""The launcher's progress bar: cells done of all, counts by status, elapsed time and ETA (rich)."""

from __future__ import annotations

from collections import Counter
from typing import Any


class RunProgress:
    """rich progress bar with counts by status and an ETA (silent when disabled)."""

    def __init__(self, total: int, counts: Counter, enabled: bool = True):
        self.total, self.counts, self.enabled = total, counts, enabled
        self._progress = self._task = None

    def _label(self) -> str:
        return " ".join(f"{k}:{v}" for k, v in sorted(self.counts.items())) or "starting"

    def __enter__(self) -> RunProgress:
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
