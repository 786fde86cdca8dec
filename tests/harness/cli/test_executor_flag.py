"""--executor's default from $PCG_EXECUTOR (how a CI job targets a Ray cluster without another command line), checked
like the flag itself."""

from __future__ import annotations

import pytest

from harness.cli import build_parser


@pytest.mark.parametrize("env,want", [(None, "local"), ("", "local"), ("ray", "ray")])
def test_the_executor_defaults_to_pcg_executor(monkeypatch, env, want):
    if env is None:
        monkeypatch.delenv("PCG_EXECUTOR", raising=False)
    else:
        monkeypatch.setenv("PCG_EXECUTOR", env)
    for command in ("run", "nightly"):
        assert build_parser().parse_args([command, "harness/configs/smoke.yaml"]).executor == want
    flag = build_parser().parse_args(["run", "harness/configs/smoke.yaml", "--executor", "local"])
    assert flag.executor == "local"  # the flag wins


def test_a_bad_pcg_executor_is_an_error_naming_it(monkeypatch, capsys):
    monkeypatch.setenv("PCG_EXECUTOR", "Ray")
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["run", "harness/configs/smoke.yaml"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "'Ray' is not an executor" in err and "PCG_EXECUTOR" in err
