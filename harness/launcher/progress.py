"""The launcher's progress: on a terminal a rich bar (cells done of all, counts by status, elapsed time and ETA);
elsewhere (a CI log, a pipe) one plain line per finished cell on stderr, since a redrawn bar there is either
nothing or noise."""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Any, TextIO


def _clock(seconds: float) -> str:
    s = int(max(0.0, seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class RunProgress:
    """Progress of a run's launched cells (silent when disabled)."""

    def __init__(self, total: int, counts: Counter, enabled: bool = True, stream: TextIO | None = None):
        self.total, self.counts, self.enabled = total, counts, enabled
        self.stream = stream or sys.stderr
        self._progress: Any = None
        self._task: Any = None
        self._done = 0
        self._t0 = time.monotonic()

    def _label(self) -> str:
        return " ".join(f"{k}:{v}" for k, v in sorted(self.counts.items())) or "starting"

    def __enter__(self) -> RunProgress:
        self._t0 = time.monotonic()
        if self.enabled and self.stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._progress = Progress(TextColumn("cells"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                      TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.description}"),
                                      console=Console(file=self.stream))
            self._progress.start()
            self._task = self._progress.add_task(self._label(), total=self.total)
        return self

    def advance(self, key: str = "", status: str = "") -> None:
        """One more cell finished (its key and final status, for the plain lines)."""
        self._done += 1
        if self._progress is not None:
            self._progress.update(self._task, advance=1, description=self._label())
        elif self.enabled:
            elapsed = time.monotonic() - self._t0
            eta = elapsed / self._done * (self.total - self._done)
            print(f"[{self._done}/{self.total}] {status} {key} · elapsed {_clock(elapsed)}, ETA {_clock(eta)} · {self._label()}",
                  file=self.stream, flush=True)

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()
