"""`pcgh cell` on checkpoints laid out as the hub lays them: shards named by model.safetensors.index.json with a stray
file beside them (Mistral repositories ship consolidated.safetensors so), quantized and 16-bit, pass; the stray
file is never read (pcg_core/quant/files.py). A missing shard stops the cell as unsupported, naming the index."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from harness.cards import CARDS_DIR
from harness.cell.run import run_cell
from harness.cell.spec import CellSpec
from harness.outcome import Status
from pcg_core.model.loader import build_config, read_config_file, shrink_config, synthetic_model
from pcg_core.quant import SCHEMES, write_checkpoint
from pcg_core.quant.formats.files import INDEX


def _model():
    data = shrink_config(read_config_file(CARDS_DIR / "configs" / "Qwen__Qwen3-0.6B.json"), tiny=True, layers=2)
    return synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=0, peaked=True), data


def _stray(path) -> list[str]:
    """A consolidated.safetensors beside the shards (other names, other values); the shards' names."""
    save_file({"layers.0.attention.wq.weight": torch.randn(64, 64), "norm.weight": torch.ones(64)},
              path / "consolidated.safetensors")
    return sorted(set(json.loads((path / INDEX).read_text())["weight_map"].values()))


@pytest.mark.slow
def test_a_sharded_quantized_checkpoint_with_a_stray_file_passes(tmp_path):
    model, data = _model()
    write_checkpoint(model, data, tmp_path, "compressed-tensors", SCHEMES["fp8_per_token"], shards=3)
    shards = _stray(tmp_path)
    assert len(shards) == 3
    out = run_cell(CellSpec(str(tmp_path), weights="real", quant="fp8_per_token", max_tokens=64, max_new_tokens=2))
    assert out.status == Status.PASS, out.reason
    assert out.metrics.quant.quant_layers == 14
    (tmp_path / shards[1]).unlink()
    gone = run_cell(CellSpec(str(tmp_path), weights="real", quant="fp8_per_token", max_tokens=64, max_new_tokens=2))
    assert gone.status == Status.UNSUPPORTED and INDEX in gone.reason and shards[1] in gone.reason, gone.reason


@pytest.mark.slow
def test_a_sharded_16_bit_checkpoint_with_a_stray_file_passes(tmp_path):
    model, _ = _model()
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert len(_stray(tmp_path)) > 1
    out = run_cell(CellSpec(str(tmp_path), weights="real", max_tokens=64, max_new_tokens=2))
    assert out.status == Status.PASS, out.reason
