"""Fixtures of the model-request tests: a store per backend, a private copy of the model cards, the CLI, an
offline hub with a fake cache."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.cards import CARDS_DIR
from harness.cli import main


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A SQLite store of its own for each test."""
    return f"sqlite:///{tmp_path / 'requests.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty store on each backend; PostgreSQL from PCG_TEST_POSTGRES_URL (as tests/harness/store does:
    skipped when unset, failed under CI), in a schema of its own."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'requests.db'}"
        return
    from sqlalchemy import create_engine, make_url, text

    base = os.environ.get("PCG_TEST_POSTGRES_URL")
    if not base:
        if _in_ci():
            pytest.fail("PCG_TEST_POSTGRES_URL is not set but CI is: .ci/run must start PostgreSQL and export it")
        pytest.skip("PCG_TEST_POSTGRES_URL is not set")
    schema = f"pcg_req_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield make_url(base).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    """A copy of harness/models (cards and configs): --write-card writes here, never into the checkout."""
    dest = tmp_path / "models"
    shutil.copytree(CARDS_DIR, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.fixture
def pcgh(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """Run `pcgh ARGS…`; (exit code, stdout, stderr). argparse's own exits come back as their code."""

    def run(*args: str) -> tuple[int, str, str]:
        try:
            rc = main([str(a) for a in args])
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 2
        out, err = capsys.readouterr()
        return rc, out, err

    return run


@pytest.fixture
def request_json(pcgh: Callable[..., tuple[int, str, str]], db: str) -> Callable[..., dict]:
    """`pcgh request MODEL --json --db <test store> ARGS…` → the printed object (asserting exit code 0)."""

    def run(model: str | Path, *args: str) -> dict:
        rc, out, err = pcgh("request", model, "--json", "--db", db, *args)
        assert rc == 0, err
        return json.loads(out)

    return run


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """HF_HUB_OFFLINE=1 with an empty hub cache of the test's own; returns the cache folder."""
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    return cache
