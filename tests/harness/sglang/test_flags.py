"""The SGLang engine axis: a cell's axes as sglang.launch_server flags — checked here by their meaning, and against
sglang 0.5.23's own ServerArgs parser for every SGLang cell of the nightly matrix — and its pre-check."""

from __future__ import annotations

import json
import re
import sys

import pytest

from harness.cards import find_card
from harness.cell.spec import CellSpec
from harness.matrix.expand import expand
from harness.matrix.precheck import precheck
from harness.matrix.schema import load_matrix
from harness.sglang.flags import parallel_flags, server_flags, unsupported_reason
from harness.sglang.precheck import sglang_reason


def _spec(**kw) -> CellSpec:
    return CellSpec(**{"model": "qwen3-8b", "graph": "breakable", "attention": "varlen", "device": "cuda",
                       "layers": 4, "weights": "synthetic", "engine": "sglang", **kw})


@pytest.mark.parametrize("mode,flags", [
    ("tp1", []),
    ("tp2", ["--tp-size", "2"]),
    ("tp2-ep2", ["--tp-size", "2", "--ep-size", "2"]),
    ("dp2", ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"]),
    ("ep2", ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention", "--ep-size", "2"]),  # experts over DP ranks
    ("tp2-ep8", ["--tp-size", "8", "--dp-size", "4", "--enable-dp-attention", "--ep-size", "8"]),
    ("tp2-pp2", ["--tp-size", "2", "--pp-size", "2"]),
])
def test_parallel_modes_become_sglang_sizes(mode, flags):
    assert parallel_flags(mode) == flags


def test_the_two_servers_differ_only_in_their_prefill_graphs():
    spec = _spec(quant="fp8_block", parallel="tp2")
    on, off = server_flags(spec, "/m", 30001, True), server_flags(spec, "/m", 30001, False)
    i, j = on.index("--cuda-graph-backend-prefill"), off.index("--cuda-graph-backend-prefill")
    assert on[:i] == off[:j] and on[i + 1] == "breakable" and off[j + 1] == "disabled" and j + 2 == len(off)
    assert on[i + 2:] == ["--cuda-graph-max-bs-prefill", "4096"]
    def value(flag):
        return on[on.index(flag) + 1]

    assert (value("--quantization"), value("--attention-backend"), value("--tp-size")) == ("fp8", "fa3", "2")
    assert value("--load-format") == "dummy" and value("--cuda-graph-backend-decode") == "disabled"
    assert "--load-format" not in server_flags(_spec(weights="real"), "/m", 1, True)  # a real checkpoint loads as is


@pytest.mark.parametrize("change,words", [
    ({"graph": "piecewise"}, "no 'piecewise' prefill graph backend"),
    ({"compiler": "inductor"}, "compiler 'inductor' is pcg's"),
    ({"quant": "w4a8"}, "loads no 'w4a8' checkpoint"),
    ({"attention": "pcg-other"}, "no SGLang backend"),
])
def test_axes_sglang_has_no_flags_for_are_refused_saying_which(change, words):
    spec = _spec(**change)
    assert words in unsupported_reason(spec)
    with pytest.raises(ValueError, match=re.escape(words)):
        server_flags(spec, "/m", 1, True)


def test_the_precheck_says_why_an_sglang_cell_does_not_run_here(monkeypatch):
    assert "CUDA GPU" in sglang_reason(_spec(device="cpu"), 1, 0)
    import harness.sglang.precheck as pre

    monkeypatch.setenv("PCG_SGLANG_PYTHON", sys.executable)  # pcg's own: no sglang in it
    assert "not installed for" in sglang_reason(_spec(), 1, 8)
    monkeypatch.setattr(pre, "sglang_installed", lambda python: True)
    assert sglang_reason(_spec(parallel="tp2"), 2, 1).startswith("needs 2 GPUs")
    assert sglang_reason(_spec(), 1, 1) is None  # it runs


def test_the_matrix_precheck_sends_sglang_cells_to_sglangs_own(monkeypatch, tmp_path):
    cells = [c for c in expand(load_matrix("harness/configs/nightly.yaml"), filters=[{"engine": "sglang"}])]
    assert cells and all(c.axes["engine"] == "sglang" and c.axes["graph"] in ("full", "breakable") for c in cells)
    caps = {"cuda_devices": 0}  # nothing pcg's capability table says applies to SGLang's kernels
    monkeypatch.setenv("PCG_SGLANG_PYTHON", str(tmp_path / "no-python"))
    assert {precheck(c, caps, {}) for c in cells} == {sglang_reason(cells[0].spec, 1, 0)}
    assert "not installed for" in sglang_reason(cells[0].spec, 1, 0)


def _nightly_sglang_argvs(tmp_path) -> list[tuple[str, list[str]]]:
    argvs = []
    for c in expand(load_matrix("harness/configs/nightly.yaml"), filters=[{"engine": "sglang"}]):
        assert unsupported_reason(c.spec) is None, c.key
        folder = tmp_path / c.spec.model
        if not folder.is_dir():
            folder.mkdir()
            (folder / "config.json").write_text(json.dumps(find_card(c.spec.model).config))
        for on in (True, False):
            argvs.append((f"{c.key} graphs={'on' if on else 'off'}", server_flags(c.spec, folder, 30000, on)))
    return argvs


@pytest.mark.slow
def test_every_flag_of_every_nightly_sglang_cell_parses_in_sglangs_own_parser(tmp_path):
    from sglang_env import EnvUnavailable, refused

    argvs = _nightly_sglang_argvs(tmp_path)
    assert len(argvs) >= 2 * 100  # the nightly's SGLang cells, both servers each
    planted = [("planted: the removed piecewise backend", [*argvs[0][1][:-4], "--cuda-graph-backend-prefill", "tc_piecewise"]),
               ("planted: a typo", [*argvs[0][1], "--tp-sise", "2"])]
    try:
        bad = refused(argvs + planted)
    except EnvUnavailable as e:
        pytest.skip(f"sglang {e}")
    assert [label for label, _ in bad] == [label for label, _ in planted], bad  # the parser refuses, and only those
