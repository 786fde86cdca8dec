"""Kernel tuning tables as data (pcg_core/quant/kernels/configs/*.json, tuning.py): every table is well formed, a GPU
gets its own entry or the table's default, every kernel reads its table, and a malformed table is an error naming
the file and the entry — never a silently wrong launch."""

from __future__ import annotations

import json

import pytest

from pcg_core.errors import ConfigError
from pcg_core.quant.kernels import fp4_gemm, int8_gemm, moe_gemm, tuning, w4a8_gemm, w4a16_gemm

KERNELS = {"w4a16_gemm": w4a16_gemm, "w4a8_gemm": w4a8_gemm, "fp4_gemm": fp4_gemm, "int8_gemm": int8_gemm,
           "moe_gemm": moe_gemm}


def test_every_table_is_a_kernels_and_well_formed():
    assert {p.stem for p in tuning.CONFIGS_DIR.glob("*.json")} == set(KERNELS)
    for name, module in KERNELS.items():
        assert module.KERNEL == name
        data = tuning.load(name)
        rows = tuning.configs(name, None)
        assert rows[-1][0] == tuning.UNBOUNDED and all(len(cfg) == len(data["fields"]) for _, cfg in rows)
        assert all(e["source"] for e in data["gpus"].values())


def test_a_gpu_gets_its_entry_or_the_default():
    h100 = tuning.configs("w4a16_gemm", "NVIDIA H100 80GB HBM3")
    assert tuning.configs("w4a16_gemm", "a GPU nobody tuned for") == h100 == tuning.configs("w4a16_gemm", None)
    assert tuning.configs("int8_gemm", "NVIDIA H200")[0] == (16, (16, 64, 256, 1, 4, 4))


def test_the_kernels_read_their_tables():
    assert int8_gemm.config_for(1) == tuning.configs("int8_gemm")[0][1]
    assert int8_gemm.config_for(1 << 20) == tuning.configs("int8_gemm")[-1][1]
    assert moe_gemm.config_for(1 << 20, 1) == tuning.configs("moe_gemm")[-1][1]
    assert w4a16_gemm.gemm_config(8, 4096, 128)[:2] == tuning.configs("w4a16_gemm")[0][1][:2]
    assert w4a8_gemm.gemm_config(300, 4096, 128)[:2] == tuning.configs("w4a8_gemm")[-1][1][:2]


@pytest.mark.parametrize("break_it,words", [
    (lambda t: t.update(default="nobody"), "default 'nobody' is not one of its gpus"),
    (lambda t: t["gpus"][t["default"]]["rows"].pop(), "must rise by token count and end with null"),
    (lambda t: t["gpus"][t["default"]]["rows"][0][1].append(7), "is not 6 positive integers"),
    (lambda t: t["gpus"][t["default"]]["rows"].reverse(), "must rise by token count"),
    (lambda t: t.pop("fields"), "needs fields, gpus and default"),
])
def test_a_malformed_table_is_an_error_naming_it(tmp_path, monkeypatch, break_it, words):
    table = json.loads((tuning.CONFIGS_DIR / "w4a16_gemm.json").read_text())
    break_it(table)
    (tmp_path / "w4a16_gemm.json").write_text(json.dumps(table))
    monkeypatch.setattr(tuning, "CONFIGS_DIR", tmp_path)
    tuning.load.cache_clear()
    try:
        with pytest.raises(ConfigError, match=words) as e:
            tuning.load("w4a16_gemm")
        assert str(tmp_path / "w4a16_gemm.json") in str(e.value)
    finally:
        tuning.load.cache_clear()
        tuning.configs.cache_clear()
