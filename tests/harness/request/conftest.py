"""Fixtures of the model-request tests: a store per backend, a private copy of the model cards, the CLI, an
offline hub with a fake cache."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.cards import CARDS_DIR
from harness.cli import main


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A SQLite store of its own for each test."""
    return f"sqlite:///{tmp_path / 'requests.db'}"


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
