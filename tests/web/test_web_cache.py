"""web.cache.Kept: bounded, least recently used out first, one build per key under concurrent requests, and a
failed build kept for nobody."""

from __future__ import annotations

import threading
import time

import pytest

from pcg_core.errors import ConfigError
from web.cache import Kept, page_cache_bytes


def test_bounded_by_entries_and_bytes_least_recently_used_out_first() -> None:
    kept: Kept[bytes] = Kept(3, max_bytes=10, size=len)
    for k in "abc":
        kept.get(k, lambda k=k: k.encode() * 3)  # 9 bytes in all
    assert kept.get("a", lambda: b"new") == b"aaa"  # still kept (and now the most recent)
    kept.get("d", lambda: b"dd")  # 11 bytes: b goes, the least recently used
    assert kept.get("b", lambda: b"B") == b"B"  # rebuilt; a 4th entry: c goes
    assert kept.get("a", lambda: b"X") == b"aaa" and kept.get("c", lambda: b"C") == b"C"
    kept.get("huge", lambda: b"x" * 11)  # bigger than the whole cache: served, not kept
    assert kept.get("huge", lambda: b"again") == b"again"
    off: Kept[int] = Kept(0)
    assert off.get("k", lambda: 1) == 1 and off.get("k", lambda: 2) == 2


def test_concurrent_requests_for_one_key_build_it_once() -> None:
    kept: Kept[int] = Kept(4)
    builds = []

    def build() -> int:
        builds.append(1)
        time.sleep(0.2)
        return 42

    got: list[int] = []
    threads = [threading.Thread(target=lambda: got.append(kept.get("page", build))) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [42] * 10 and len(builds) == 1 and (kept.hits, kept.misses) == (0, 1)


def test_a_failed_build_raises_for_everyone_waiting_and_is_not_kept() -> None:
    kept: Kept[int] = Kept(4)
    with pytest.raises(RuntimeError):
        kept.get("k", lambda: (_ for _ in ()).throw(RuntimeError("db down")))
    assert kept.get("k", lambda: 7) == 7


def test_page_cache_size_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PCG_PAGE_CACHE_MB", "0")
    assert page_cache_bytes() == 0
    monkeypatch.setenv("PCG_PAGE_CACHE_MB", "lots")
    with pytest.raises(ConfigError, match="PCG_PAGE_CACHE_MB='lots'"):
        page_cache_bytes()
