"""A checkpoint pcg did not write, loaded where its kernels run, must match its dequantized reference (issue 47).

The files are an HF `fp8` checkpoint (DeepSeek's format: 128×128 blocks, `weight_scale_inv`) written here by a few
lines of safetensors and JSON — not pcg's `write_checkpoint` — at Qwen2.5-0.5B's widths (hidden 896 = 7 blocks, the
width whose block GEMM was garbage on the H200), two layers, from weights shaped like a trained model's (block scales
10–100× apart). pcg loads it, runs it eagerly, and the judge's reference layer holds that run to transformers' own
forward of the dequantized math within the reference's measured bf16 noise. On CUDA the block GEMM as it ran before
the fix must fail the same check: the test can fail.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from harness.cell.prompts import prompt_suite, run_case
from harness.cell.judge.reference import reference_cases, reference_layer
from pcg_core import load_model
from pcg_core.config import CaptureConfig, EngineConfig
from pcg_core.engine import Engine
from pcg_core.model.loader import build_config, read_config_file, shrink_config, synthetic_model
from pcg_core.quant.layers import linear as quant_linear
from pcg_core.quant.synthetic_weights import make_realistic_

CONFIG = Path(__file__).resolve().parents[4] / "harness" / "models" / "configs" / "Qwen__Qwen2.5-0.5B.json"
FP8_MAX = 448.0


def write_hf_fp8(path: Path, layers: int = 2, seed: int = 0) -> None:
    """Every linear but the head as e4m3 codes with a float32 scale per 128×128 block (amax / 448), the rest bf16."""
    data = {**shrink_config(read_config_file(CONFIG), layers=layers), "vocab_size": 8192}  # the widths that matter kept
    model = synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=seed, peaked=True)
    make_realistic_(model, seed)
    tensors = {}
    for name, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            key = f"{name}.{pname}" if name else pname
            if isinstance(mod, torch.nn.Linear) and pname == "weight" and not name.endswith("lm_head"):
                n, k = p.shape
                blocks = p.detach().reshape(n // 128, 128, k // 128, 128)
                scale = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=1e-12)
                codes = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
                tensors[key], tensors[f"{key}_scale_inv"] = codes.reshape(n, k).contiguous(), scale.contiguous()
            else:
                tensors[key] = p.detach().to(torch.bfloat16).contiguous()
    save_file(tensors, str(path / "model.safetensors"))
    config = {**data, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
              "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                      "weight_block_size": [128, 128]}}
    (path / "config.json").write_text(json.dumps(config))


def reference_check(path: Path, device: str, dtype: str):
    lm = load_model(str(path), weights="real", dtype=getattr(torch, dtype), device=device)
    config = EngineConfig(device=device, dtype=dtype, attention="sdpa",
                          capture=CaptureConfig(backend="disabled", max_tokens=64))
    cases = prompt_suite(config.capture.ladder, lm.config.vocab_size, seed=1, max_new_tokens=4)
    chosen, _ = reference_cases(cases)
    config = replace(config, kv_slots=max(c.kv_slots(16) for c in cases) + 16)
    engine = Engine(lm.model, config)
    outputs = {c.name: run_case(engine, c, 5) for c in chosen}
    return reference_layer(lm.model, config, cases, outputs, quantized=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hf-fp8-896")
    write_hf_fp8(path)
    return path


def test_on_the_cpu_the_checkpoint_matches_its_reference(checkpoint):
    check = reference_check(checkpoint, "cpu", "float32")
    assert check.status == "pass", check.reason
    assert check.kernel_rel == 0.0  # on the CPU the quantized layers are their reference math


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_checkpoint_matches_its_reference_within_bf16_noise(checkpoint):
    check = reference_check(checkpoint, "cuda", "bfloat16")
    assert check.status == "pass", check.reason
    assert 0 < check.kernel_rel <= check.kernel_bound


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_block_gemm_as_it_was_fails_the_same_check(checkpoint, monkeypatch):
    def old_block_fp8_mm(xq, sx, weight, weight_scale):
        sx = sx.t().contiguous().t()
        return torch._scaled_mm(xq, weight.t(), scale_a=sx, scale_b=weight_scale.t(), out_dtype=torch.bfloat16)

    monkeypatch.setattr(quant_linear, "block_fp8_mm", old_block_fp8_mm)
    check = reference_check(checkpoint, "cuda", "bfloat16")
    assert check.status == "fail" and check.kernel_rel > check.kernel_bound, check
