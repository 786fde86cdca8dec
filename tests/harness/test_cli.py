"""pcgh's own plumbing: commands contributed through entry points, and runtime errors mapped to flags."""

from __future__ import annotations

import importlib.util
import sys
import types
from importlib.metadata import EntryPoint

import pytest

from harness import cli
from pcg_core.errors import ConfigError


def _entry_points(monkeypatch, *eps: EntryPoint) -> None:
    monkeypatch.setattr(cli, "entry_points", lambda group: list(eps) if group == cli.COMMANDS_GROUP else [])


def test_a_contributed_command_runs_through_its_handler(monkeypatch, capsys):
    mod = types.ModuleType("pcg_test_cmd")

    def add_command(sub):
        p = sub.add_parser("hello")
        p.add_argument("--name", default="x")
        p.set_defaults(handler=lambda args: print(f"hello {args.name}") or 0)

    mod.add_command = add_command
    monkeypatch.setitem(sys.modules, "pcg_test_cmd", mod)
    _entry_points(monkeypatch, EntryPoint("hello", "pcg_test_cmd:add_command", cli.COMMANDS_GROUP))
    assert cli.main(["hello", "--name", "pcg"]) == 0
    assert capsys.readouterr().out == "hello pcg\n"


def test_a_command_whose_extra_is_missing_says_how_to_install_it(monkeypatch, capsys):
    _entry_points(monkeypatch, EntryPoint("serve", "pcg_no_such_module_xyz:add_command", cli.COMMANDS_GROUP))
    assert cli.main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "pcg_no_such_module_xyz" in err and 'pip install -e ".[web]"' in err


def test_serve_without_the_dashboards_extra_is_unavailable_not_a_crash(monkeypatch, capsys):
    """The real entry point, with uvicorn missing (None in sys.modules: cannot be imported): pcgh still runs its
    other commands, and `serve` says what to install."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a))
    monkeypatch.delitem(sys.modules, "web.__main__", raising=False)
    _entry_points(monkeypatch, EntryPoint("serve", "web.__main__:add_command", cli.COMMANDS_GROUP))
    assert cli.main(["serve", "--db", "x.db"]) == 2
    err = capsys.readouterr().err
    assert "uvicorn" in err and 'pip install -e ".[web]"' in err
    assert cli.main(["models"]) == 0  # the rest of pcgh is unaffected


def test_the_dashboard_contributes_serve():
    """The installed entry point (pyproject's pcgh.commands group) adds `serve` with its flags."""
    args = cli.build_parser().parse_args(["serve", "--db", "x.db", "--port", "8123"])
    assert args.db == "x.db" and args.port == 8123 and callable(args.handler)


@pytest.mark.parametrize("field,flag", [("backend", "--graph"), ("layers", "--layers"), ("device", "--device")])
def test_runtime_errors_name_the_flag_on_the_cell_command(field, flag):
    e = ConfigError("capture backend 'x' is unknown", field=field)
    assert cli.error_text(e, "cell").endswith(f"(set by {flag})")
    assert cli.error_text(e, "run") == str(e)  # run has no such flag: the matrix field is named instead
    assert cli.error_text(ConfigError("no field"), "cell") == "no field"
    assert "`pcgh models` lists them" in cli.error_text(ConfigError("not a model", field="spec"), "cell")


def test_cell_flags_default_to_the_cellspecs_own_defaults():
    """A repro command leaves out a setting nobody recorded; pcgh's default must then be the cell's default."""
    from harness.cell import CellSpec

    args = cli.build_parser().parse_args(["cell", "--model", "m", "--graph", "piecewise"])
    assert cli.spec_from_args(args) == CellSpec(model="m", graph="piecewise")


@pytest.mark.parametrize("flag,value", [("--top-k", "0"), ("--logprob-tol", "0"), ("--logprob-tol", "-1e-3"),
                                        ("--logprob-tol", "nan"), ("--logprob-tol", "inf"), ("--logprob-tol", "x")])
def test_cell_settings_must_be_positive(flag, value, capsys):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["cell", "--model", "m", "--graph", "piecewise", f"{flag}={value}"])
    assert e.value.code == 2 and "expected a positive" in capsys.readouterr().err
