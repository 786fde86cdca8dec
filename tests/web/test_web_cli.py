"""`pcgh serve`: its options, and that it hands uvicorn our app; the other subcommands still parse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from harness import cli


def test_serve_defaults_and_options() -> None:
    args = cli.build_parser().parse_args(["serve"])
    assert (args.db, args.host, args.port) == (None, "127.0.0.1", 8000)
    args = cli.build_parser().parse_args(["serve", "--db", "x.db", "--host", "0.0.0.0", "--port", "9001"])
    assert (args.db, args.host, args.port) == ("x.db", "0.0.0.0", 9001)
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--port", "0"])


def test_serve_runs_uvicorn_on_the_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    got: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: got.update(app=app, **kw))
    db = tmp_path / "pcg.db"
    assert cli.main(["serve", "--db", str(db), "--port", "8765"]) == cli.EXIT_PASS
    assert isinstance(got["app"], FastAPI) and (got["host"], got["port"]) == ("127.0.0.1", 8765)
    assert got["app"].state.queries.store.url == str(db) and db.exists()


def test_serve_reports_a_bad_database_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--db", "mysql://nope/db"]) == cli.EXIT_BAD_INPUT
    assert "pcgh serve: error:" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["run", "m.yaml"], ["report"], ["diff", "1", "latest"], ["models"],
                                  ["cell", "--model", "m", "--graph", "full"]])
def test_other_subcommands_still_parse(argv: list[str]) -> None:
    assert cli.build_parser().parse_args(argv).command == argv[0]
