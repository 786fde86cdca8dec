"""What the dashboard keeps between requests: a run's cells, and whole pages, each keyed on the store's revisions.

A finished run's cells do not change, and every write through the Store bumps the run's revision (RunCounts), so
a copy keyed on (run, revision) is exact, not "probably fresh": a page never shows less than the database holds.
Pages are keyed on the store's version (every run's revision together) and on the freshness line they print,
so a cached page also ends when its "N min old" text would change. At 10,000 cells, building the matrix page
costs ~0.5 s and serving a kept one ~1 ms; a nightly's readers mostly ask for the same few pages.

One lock guards the maps; a value is built outside it, once: concurrent requests for a missing key wait for the
first one to build it rather than each building their own (ten clients arriving together would otherwise
cost ten builds). PCG_PAGE_CACHE_MB=0 turns the page cache off (the benchmark measures both).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

from pydantic import TypeAdapter
from sqlalchemy import Engine

from harness.outcome import CellRecord
from harness.store import Views
from pcg_core.errors import ConfigError

V = TypeVar("V")
T = TypeVar("T")
DEFAULT_PAGE_MB = 64
MAX_PAGES = 512
DERIVED_BYTES = 256 * 2**20  # encoded API responses kept per the runs' revisions (a 10,000-cell diff is ~6 MB)


class Kept(Generic[V]):
    """A bounded least-recently-used map whose values are built once per key, even under concurrent requests."""

    def __init__(self, max_entries: int, max_bytes: int | None = None, size: Callable[[V], int] | None = None) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._size = size or (lambda v: 0)
        self._lock = threading.Lock()
        self._done: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._building: dict[Hashable, Future[V]] = {}
        self._bytes = 0
        self.hits = self.misses = 0

    def get(self, key: Hashable, build: Callable[[], V]) -> V:
        if self.max_entries <= 0:
            return build()
        with self._lock:
            if key in self._done:
                self._done.move_to_end(key)
                self.hits += 1
                return self._done[key][0]
            pending = self._building.get(key)
            mine = pending is None
            if mine:
                pending = self._building[key] = Future()
                self.misses += 1
        assert pending is not None
        if not mine:
            return pending.result()  # another request is building it: its value, or its exception
        try:
            value = build()
        except BaseException as e:
            with self._lock:
                del self._building[key]
            pending.set_exception(e)
            raise
        with self._lock:
            del self._building[key]
            self._keep(key, value)
        pending.set_result(value)
        return value

    def _keep(self, key: Hashable, value: V) -> None:
        n = self._size(value)
        if self.max_bytes is not None and n > self.max_bytes:
            return  # larger than the whole cache: serve it, keep nothing
        self._done[key] = (value, n)
        self._bytes += n
        while len(self._done) > self.max_entries or (self.max_bytes is not None and self._bytes > self.max_bytes):
            _, (_, dropped) = self._done.popitem(last=False)
            self._bytes -= dropped

    def clear(self) -> None:
        with self._lock:
            self._done.clear()
            self._bytes = 0


def page_cache_bytes() -> int:
    """PCG_PAGE_CACHE_MB (default 64; 0 turns the page cache off), as bytes; a bad value is a clear error."""
    raw = os.environ.get("PCG_PAGE_CACHE_MB", "").strip()
    if not raw:
        return DEFAULT_PAGE_MB * 2**20
    try:
        mb = float(raw)
        if not 0 <= mb < 2**20:
            raise ValueError
    except ValueError:
        raise ConfigError(f"PCG_PAGE_CACHE_MB={raw!r}: give the page cache's size in MiB (0 turns it off)") from None
    return int(mb * 2**20)


class KeptViews(Views):
    """Store.views keeping what the matrix reads per run (its cells, its statuses for the history strips), keyed on
    the run's revision: a finished run is read from the database once, a running one again after each write."""

    def __init__(self, engine: Engine, runs_kept: int = 6, strips_kept: int = 64, derived_kept: int = 64,
                 **flags: bool) -> None:
        super().__init__(engine, **flags)
        self._cells: Kept[list[CellRecord]] = Kept(runs_kept)
        self._statuses: Kept[dict[str, str]] = Kept(strips_kept)
        self._derived: Kept[Any] = Kept(derived_kept, DERIVED_BYTES, size=_encoded_bytes)

    def cells(self, run_id: int, latency: bool = False) -> list[CellRecord]:
        rev = self.revisions([run_id])[run_id]
        return self._cells.get((run_id, rev, latency), lambda: super(KeptViews, self).cells(run_id, latency))

    def statuses(self, run_id: int) -> dict[str, str]:
        rev = self.revisions([run_id])[run_id]
        return self._statuses.get((run_id, rev), lambda: super(KeptViews, self).statuses(run_id))

    def derived(self, name: str, run_ids: list[int], build: Callable[[], T], *params: Hashable,
                stored: TypeAdapter[T] | None = None) -> T:
        """Kept per (name, each run at its revision, params): a query string cannot make a page rebuild it, and
        a write to any of the runs makes the next read compute it afresh. `stored` (one run, no params): kept in
        the store as well (Views.stored), so another process or a restart reads it instead of building it."""
        revs = self.revisions(run_ids)
        if stored is not None:
            inner = build
            build = lambda: Views.derived(self, name, run_ids, inner, *params, stored=stored)  # noqa: E731
        return self._derived.get((name, tuple(revs.items()), params), build)


def _encoded_bytes(v: Any) -> int:
    """The bytes a kept value holds when it is an encoded response (web.deps.kept_json); other values count by
    entry only."""
    return sum(len(x) for x in v if isinstance(x, bytes)) if isinstance(v, tuple) else 0


def page_cache() -> Kept[tuple[int, bytes, list[tuple[bytes, bytes]]]]:
    """The app's kept pages (status, body, headers), bounded by PCG_PAGE_CACHE_MB."""
    limit = page_cache_bytes()
    return Kept(MAX_PAGES if limit else 0, limit, size=lambda page: len(page[1]))
