"""The GPUs of one host, handed to cells k at a time (a cell of k ranks holds k GPUs, one per rank).

Cells of different sizes run side by side: a cell waits until k GPUs are free. Requests are served in the order
they came (a cell waiting for 2 GPUs is not overtaken by later 1-GPU cells, or it could wait for ever while they
keep one GPU busy); a cell asking for more GPUs than the host has is refused at once (the pre-check makes such a
cell `unsupported` with "needs N GPUs", so the runner never asks).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from harness.launcher.groups import Cancelled


class GpuPool:
    """Free GPU ids of one host; thread-safe, first come first served."""

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = list(ids)
        self._free = list(self.ids)
        self._cond = threading.Condition()
        self._queue: deque[object] = deque()  # one ticket per waiting request, oldest first
        self._closed = False

    def acquire(self, k: int, timeout: float | None = None) -> list[int]:
        """k free GPU ids (the lowest free ones), waiting for them in turn; ValueError when the host has fewer
        than k, TimeoutError after `timeout` seconds (None: wait as long as it takes), Cancelled once the pool
        is closed (the runner is shutting down: a waiting cell must not hold its thread, and the exit, for ever)."""
        if not 1 <= k <= len(self.ids):
            raise ValueError(f"needs {k} GPUs; this host has {len(self.ids)}")
        ticket = object()
        with self._cond:
            self._queue.append(ticket)
            try:
                if not self._cond.wait_for(lambda: self._closed or (self._queue[0] is ticket and len(self._free) >= k),
                                           timeout):
                    raise TimeoutError(f"{k} GPUs did not come free within {timeout}s")
                if self._closed:
                    raise Cancelled("the runner is shutting down")
                self._free.sort()
                got, self._free = self._free[:k], self._free[k:]
                return got
            finally:
                self._queue.remove(ticket)
                self._cond.notify_all()  # the next in line may fit now

    def release(self, ids: Sequence[int]) -> None:
        with self._cond:
            self._free.extend(ids)
            self._cond.notify_all()

    def close(self) -> None:
        """Hand out no more GPUs: every waiting request raises Cancelled."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def free(self) -> int:
        with self._cond:
            return len(self._free)

    @contextmanager
    def held(self, k: int) -> Iterator[list[int]]:
        ids = self.acquire(k)
        try:
            yield ids
        finally:
            self.release(ids)
