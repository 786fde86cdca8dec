"""Store tests run against each backend: a SQLite file, and PostgreSQL from PCG_TEST_POSTGRES_URL.

PostgreSQL skips when that variable is unset, except under CI (CI set), where a skip would hide a broken
.ci/run: there it fails. Each PostgreSQL test gets its own schema (via search_path in the URL's options), so
tests never see each other's rows and a second Store opened on the same URL sees the same tables.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, text

AXES = {"model": "qwen3-0.6b:tiny", "quant": "none", "attention": "sdpa", "parallel": "tp1", "graph": "piecewise", "compiler": "eager"}


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _postgres_url() -> Iterator[str]:
    base = os.environ.get("PCG_TEST_POSTGRES_URL")
    if not base:
        if _in_ci():
            pytest.fail("PCG_TEST_POSTGRES_URL is not set but CI is: .ci/run must start PostgreSQL and export it")
        pytest.skip("PCG_TEST_POSTGRES_URL is not set (e.g. postgresql+psycopg://postgres@127.0.0.1:55432/pcg_test)")
    schema = f"pcg_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield make_url(base).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL to an empty database of the parametrised backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'pcg.db'}"
    else:
        yield from _postgres_url()


@pytest.fixture
def axes() -> dict[str, str]:
    return dict(AXES)
