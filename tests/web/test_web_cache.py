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


def test_derived_answers_are_built_once_per_revision_and_exact_after_a_write(tmp_path, monkeypatch) -> None:
    """With the page cache off, the support summary, the grid, the diff and the API's encoded answers are built once
    per the runs' revisions (a query string that asks nothing new rebuilds nothing), and a write to a run makes
    the next read show it."""
    from fastapi.testclient import TestClient
    from web_seed import axes, key, seed

    from harness.outcome import CellRecord
    from harness.store import Store
    from web import services
    from web.app import create_app

    monkeypatch.setenv("PCG_PAGE_CACHE_MB", "0")
    url = f"sqlite:///{tmp_path / 'pcg.db'}"
    seed(url)
    built = {"support": 0, "diff": 0}
    real_support, real_diff = services.support, services.diff_runs
    monkeypatch.setattr(services, "support", lambda *a, **k: (built.__setitem__("support", built["support"] + 1),
                                                             real_support(*a, **k))[1])
    monkeypatch.setattr(services, "diff_runs", lambda *a, **k: (built.__setitem__("diff", built["diff"] + 1),
                                                               real_diff(*a, **k))[1])
    with TestClient(create_app(url)) as client:
        for q in ("", "?x=1", "?x=2&y=3"):
            assert client.get("/" + q).status_code == 200 and client.get("/api/support" + q).status_code == 200
            assert client.get("/api/diff" + q).status_code == 200 and client.get("/diff" + q).status_code == 200
        assert built == {"support": 1, "diff": 1}
        before = client.get("/api/diff").json()
        k = key("llama-3.1-8b:tiny", "piecewise")
        with Store(url) as store:  # run 3 (the latest) gets a new attempt: a failure
            store.record_result(3, CellRecord(key=k, axes=axes("llama-3.1-8b:tiny", "piecewise"), status="fail_run",
                                              reason="planted after the first read", attempt=9))
        after = client.get("/api/diff").json()
        assert k not in {c["key"] for c in before["new_failures"]}
        assert k in {c["key"] for c in after["new_failures"]}
        assert "planted after the first read" in client.get("/").text
        assert built == {"support": 2, "diff": 2}


def test_a_restarted_server_reads_the_runs_aggregates_from_the_store(tmp_path, monkeypatch) -> None:
    """The support summary and the request queue's counts per model are kept in the store per run revision: a
    second app over the same database (a restart, another worker) answers with them and builds neither, and
    after a write it builds them again, once."""
    from fastapi.testclient import TestClient
    from web_seed import axes, key, seed

    from harness.outcome import CellRecord
    from harness.store import Store
    from web import services
    from web.app import create_app

    monkeypatch.setenv("PCG_PAGE_CACHE_MB", "0")
    url = f"sqlite:///{tmp_path / 'pcg.db'}"
    seed(url)
    built = {"support": 0, "model_counts": 0}
    real_support = services.support

    def counted_support(*a, **k):
        built["support"] += 1
        return real_support(*a, **k)

    monkeypatch.setattr(services, "support", counted_support)
    with TestClient(create_app(url)) as client:
        first = client.get("/api/support").json()
        assert client.get("/requests").status_code == 200
        client.app.state.store.views.flush()
    assert built["support"] == 1
    with Store(url) as store:  # the queue's counts are read from the kept row from here on
        real_counts = type(store.views).model_counts
    monkeypatch.setattr(type(store.views), "model_counts", lambda self, run_id: (
        built.__setitem__("model_counts", built["model_counts"] + 1), real_counts(self, run_id))[1])
    with TestClient(create_app(url)) as client:
        assert client.get("/api/support").json() == first
        assert client.get("/requests").status_code == 200
        assert built == {"support": 1, "model_counts": 0}
        with Store(url) as store:
            store.record_result(3, CellRecord(key=key("llama-3.1-8b:tiny", "piecewise"), status="fail_run",
                                              axes=axes("llama-3.1-8b:tiny", "piecewise"), reason="planted", attempt=9))
        assert client.get("/api/support").json() != first
        assert client.get("/requests").status_code == 200
        assert built == {"support": 2, "model_counts": 1}
