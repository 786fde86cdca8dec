"""`python -m web` / `pcgh serve`: its options, the `add_command` contract pcgh relies on, and that it hands uvicorn
our app."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

import web.__main__ as serve


def _pcgh_like() -> argparse.ArgumentParser:
    """A parser as pcgh builds one: subcommands, each adding itself through add_command."""
    parser = argparse.ArgumentParser(prog="pcgh")
    serve.add_command(parser.add_subparsers(dest="command", required=True))
    return parser


def test_add_command_adds_serve_with_its_defaults_and_options() -> None:
    args = _pcgh_like().parse_args(["serve"])
    assert (args.command, args.db, args.host, args.port, args.create) == ("serve", None, "127.0.0.1", 8000, False)
    assert callable(args.handler)
    args = _pcgh_like().parse_args(["serve", "--db", "x.db", "--host", "0.0.0.0", "--port", "9001"])
    assert (args.db, args.host, args.port) == ("x.db", "0.0.0.0", 9001)
    for bad in ("0", "70000", "http"):
        with pytest.raises(SystemExit):
            _pcgh_like().parse_args(["serve", "--port", bad])


@pytest.fixture
def uvicorn_run(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    import uvicorn

    got: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: got.update(app=app, **kw))
    return got


def test_the_handler_runs_uvicorn_on_the_app(tmp_path: Path, uvicorn_run: dict[str, Any],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "pcg.db"
    args = _pcgh_like().parse_args(["serve", "--db", str(db), "--port", "8765", "--create"])
    assert args.handler(args) == 0
    assert isinstance(uvicorn_run["app"], FastAPI)
    assert (uvicorn_run["host"], uvicorn_run["port"]) == ("127.0.0.1", 8765)
    assert uvicorn_run["app"].state.store.url == str(db) and db.exists()
    assert capsys.readouterr().err == f"serving {db} (created, empty) on http://127.0.0.1:8765\n"


def test_a_missing_database_is_refused_unless_created_and_an_empty_one_is_served(
        tmp_path: Path, uvicorn_run: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped --db must not be served as an empty dashboard without a word: it is an error, before anything is
    written, unless --create asks for a new database; an existing empty one (made by --create) serves as it is."""
    db = tmp_path / "typo.db"
    assert serve.main(["--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m web: error: no results database at {db}") and "--create" in err
    assert not db.exists() and not uvicorn_run
    assert serve.main(["--db", str(db), "--create"]) == 0 and db.exists()
    capsys.readouterr()
    assert serve.main(["--db", f"sqlite:///{db}"]) == 0
    assert capsys.readouterr().err == f"serving sqlite:///{db} on http://127.0.0.1:8000\n"
    with pytest.raises(SystemExit) as e:
        serve.main(["--db", ""])
    assert e.value.code == 2 and "argument --db: is empty: give a SQLite file or a database URL" in capsys.readouterr().err


def test_main_serves_and_reports_a_bad_database_url(tmp_path: Path, uvicorn_run: dict[str, Any],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert serve.main(["--db", str(tmp_path / "pcg.db"), "--host", "0.0.0.0", "--create"]) == 0
    assert uvicorn_run["host"] == "0.0.0.0"
    assert serve.main(["--db", "mysql://nope/db"]) == 2
    assert "python -m web: error:" in capsys.readouterr().err


def test_python_dash_m_web_help() -> None:
    out = subprocess.run([sys.executable, "-m", "web", "--help"], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2]).stdout
    assert "--db" in out and "--host" in out and "--port" in out and "dashboard" in out
