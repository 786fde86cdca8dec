"""Fixtures for the dashboard tests: a seeded database, a TestClient on it, and for the browser tests a live
server plus Debian's chromium driven by Playwright.

The API tests run on SQLite and on PostgreSQL (PCG_TEST_POSTGRES_URL, one schema per test), because the
dashboard's own queries pull JSON apart in SQL and the two backends spell that differently. PostgreSQL and
the browser skip when absent, except under CI (CI set), where a skip would hide a broken .ci/run: there they fail.
"""

from __future__ import annotations

import socket
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from web_seed import Seeded, seed
from web_support import CHROMIUM, CHROMIUM_ARGS, TOKEN, Tab, skip_or_fail

warnings.filterwarnings("ignore", message=".*httpx.*starlette.testclient.*")  # starlette 1.x prefers httpx2
from fastapi.testclient import TestClient  # noqa: E402 - after the warnings filter it needs

from web.app import create_app  # noqa: E402


@pytest.fixture
def seeded(db_url: str) -> Seeded:
    return seed(db_url)


@pytest.fixture
def client(seeded: Seeded) -> Iterator[TestClient]:
    with TestClient(create_app(seeded.url, upload_token=TOKEN)) as c:
        yield c


@pytest.fixture
def sqlite_client(tmp_path: Path) -> Iterator[TestClient]:
    """A seeded SQLite database only: for page tests, where the backend is not what is under test."""
    with TestClient(create_app(seed(f"sqlite:///{tmp_path / 'pcg.db'}").url, upload_token=TOKEN)) as c:
        yield c


# --- browser ------------------------------------------------------------------------------------------------


@dataclass
class Live:
    url: str
    seeded: Seeded


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    """uvicorn serving a freshly seeded SQLite database on a free 127.0.0.1 port, in a background thread."""
    import uvicorn

    seeded = seed(f"sqlite:///{tmp_path / 'pcg.db'}")
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(seeded.url, upload_token=TOKEN), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            pytest.fail("the dashboard server did not start")
        time.sleep(0.02)
    try:
        yield Live(f"http://127.0.0.1:{port}", seeded)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Debian's chromium under Playwright, with a fresh profile; never a downloaded browser."""
    if not Path(CHROMIUM).is_file():
        skip_or_fail(f"{CHROMIUM} is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        skip_or_fail("the playwright package is not installed (pip install -e '.[dev]')")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1280, "height": 800})
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def tab(browser: Any, live: Live) -> Iterator[Tab]:
    """A page on the live server that records every request and dialog; after the test, every request must
    have gone to the server itself (no CDN, nothing from the network)."""
    page = browser.new_page()
    t = Tab(page, live.url, [], [])
    page.on("request", lambda r: t.requests.append(r.url))
    page.on("dialog", lambda d: (t.dialogs.append(d.message), d.dismiss()))
    try:
        yield t
    finally:
        page.close()
    outside = [u for u in t.requests if not u.startswith((live.url + "/", "data:"))]
    assert not outside, f"the browser fetched from outside the server: {outside}"
