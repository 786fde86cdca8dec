"""W4A8 / W4AFP8 MoE experts (pcg_core/quant/layers/experts.py with a W4A8 Int4Scheme): int4 weights held as the
weight-only int4 experts hold them, each projection's input quantized per token to int8 or FP8 e4m3 first. The
reference forward is that math exactly (and each projection is W4A8Linear's op on the expert's own weight), the
grouped path CUDA runs equals it, planted faults (the activation scale divided by, the activations left in 16
bits, the wrong 8-bit type) show, quantize_model and a compressed-tensors pack-quantized MoE checkpoint give W4A8
experts (not W4A16 ones), and capabilities no longer refuse them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from pcg_helpers import make_engine, prompts_of, routed_experts, tiny_model
from safetensors.torch import load_file

from pcg_core.quant import INT4_SCHEMES
from pcg_core.quant.layers import experts as experts_mod
from pcg_core.quant.layers.experts import (_int4_dequantized, grouped_quantized_experts_forward, quantize_experts,
                                    quantized_experts_forward)
from pcg_core.quant.schemes.int4 import quantize_int4_ordered

W4A8 = ["w4a8", "w4afp8"]
QMAX = {"int8": 127.0, "fp8": 448.0}
CONFIGS = Path(__file__).resolve().parents[4] / "harness" / "models" / "configs"


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _act(x: torch.Tensor, act: str) -> torch.Tensor:
    """Per-token dynamic 8-bit fake quantization written out here: s = absmax / qmax, int8 codes rounded half to
    even and clamped, FP8 codes the e4m3 cast; the codes times s, in float32."""
    xf = x.float()
    s = (xf.abs().amax(dim=-1, keepdim=True) / QMAX[act]).clamp(min=1e-12)
    q = (xf / s).round().clamp(-128, 127) if act == "int8" else (xf / s).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    return q * s


def _expected(mod: torch.nn.Module, floats: dict[str, torch.Tensor], scheme, x, idx, w) -> torch.Tensor:
    """The experts' W4A8 output from the float weights: each expert's weight quantized as an int4 linear is, the
    activations as _act does, products in float32, routed as the dense experts path routes."""
    def weight(p: str, e: int) -> torch.Tensor:
        f = floats[p][e]
        return quantize_int4_ordered(f, scheme.group_for(f.shape[-1]), scheme.sym, scheme.act_order).original()

    out = torch.zeros_like(x, dtype=torch.float32)
    for e in range(mod.num_experts):
        r = (w * (idx == e)).sum(dim=-1, keepdim=True)
        proj = mod._apply_gate((_act(x, scheme.activations) @ weight("gate_up_proj", e).t()).to(x.dtype))
        out += (_act(proj, scheme.activations) @ weight("down_proj", e).t()) * r.float()
    return out.to(x.dtype)


def _quantized(arch: str, name: str):
    mod, x, idx, w = routed_experts(arch)
    floats = {p: getattr(mod, p).detach().clone() for p in ("gate_up_proj", "down_proj")}
    quantize_experts(mod, INT4_SCHEMES[name])
    return mod, floats, x, idx, w


@pytest.mark.parametrize("arch", ["qwen3-moe", "mixtral"])
@pytest.mark.parametrize("name", W4A8)
def test_reference_forward_is_the_w4a8_math_exactly(arch, name):
    scheme = INT4_SCHEMES[name]
    mod, floats, x, idx, w = _quantized(arch, name)
    assert mod.quant_scheme is scheme and mod.quant_scheme.activations == scheme.activations
    got = quantized_experts_forward(mod, x, idx, w)
    assert torch.equal(got, _expected(mod, floats, scheme, x, idx, w))
    # each projection is W4A8Linear's op (its CPU reference) on the expert's own weight
    from pcg_core.quant.kernels import w4a8_gemm as w4a8

    e, p = 1, "down_proj"
    h = torch.randn(5, mod.down_proj_scales.shape[-1] * getattr(mod, f"{p}_group"))
    op = w4a8.reference(h, getattr(mod, p)[e], getattr(mod, f"{p}_scales")[e], getattr(mod, f"{p}_zeros")[e],
                        getattr(mod, f"{p}_group"), scheme.activations)
    assert torch.allclose(experts_mod._project(h, mod, p, e), op, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("arch", ["qwen3-moe", "mixtral"])
@pytest.mark.parametrize("name", W4A8)
def test_grouped_forward_equals_the_reference(arch, name):
    """Rows sorted by expert quantize as the reference's tokens do (per-token scales): the same math in another
    order, float32 here; leaving the activations in 16 bits there shows against the same tolerance."""
    mod, _, x, idx, w = _quantized(arch, name)
    want = quantized_experts_forward(mod, x, idx, w)
    assert _rel(grouped_quantized_experts_forward(mod, x, idx, w), want) < 1e-5
    mod.quant_scheme = dataclasses.replace(mod.quant_scheme, activations=None)  # planted: 16-bit activations
    assert _rel(grouped_quantized_experts_forward(mod, x, idx, w), want) > 1e-3


@pytest.mark.parametrize("name", W4A8)
@pytest.mark.parametrize("fault", ["scale_divides", "not_quantized", "other_type"])
def test_planted_activation_faults_show(name, fault, monkeypatch):
    scheme = INT4_SCHEMES[name]
    mod, floats, x, idx, w = _quantized("qwen3-moe", name)
    want = _expected(mod, floats, scheme, x, idx, w)
    if fault == "scale_divides":
        real = experts_mod.quantize_act
        monkeypatch.setattr(experts_mod, "quantize_act", lambda t, act: (lambda q, s: (q, 1 / s))(*real(t, act)))
    else:
        other = {"not_quantized": None, "other_type": "fp8" if scheme.activations == "int8" else "int8"}[fault]
        mod.quant_scheme = dataclasses.replace(scheme, activations=other)
    for forward in (quantized_experts_forward, grouped_quantized_experts_forward):
        assert _rel(forward(mod, x, idx, w), want) > 1e-3, f"{fault} went unnoticed by {forward.__name__}"


@pytest.mark.parametrize("name", W4A8)
def test_quantize_model_gives_w4a8_experts_and_the_graph_path_matches_eager_on_cpu(name):
    from pcg_core.quant.layers.linear import quantize_model

    lm = tiny_model("qwen3-moe")
    swapped = quantize_model(lm.model, INT4_SCHEMES[name])
    experts = [m for m in lm.model.modules() if getattr(m, "quant_scheme", None) is not None and hasattr(m, "num_experts")]
    assert sum(".experts" in n for n in swapped) == 2 and len(experts) == 2
    assert all(m.quant_scheme.activations == INT4_SCHEMES[name].activations for m in experts)
    engine = make_engine(lm.model, "piecewise")
    batch = engine.prefill_batch(prompts_of([5, 11, 3], lm.config.vocab_size, seed=2))
    assert torch.equal(engine.forward(batch).clone(), engine.forward(batch, eager=True))


# --- checkpoints: compressed-tensors pack-quantized W4A8 / W4AFP8 per-expert tensors --------------------------------


def _moe_checkpoint(tmp_path: Path, name: str):
    from pcg_core.model.loader import build_config, read_config_file, shrink_config, synthetic_model
    from pcg_core.quant.formats.checkpoint import write_checkpoint

    data = shrink_config(read_config_file(CONFIGS / "Qwen__Qwen3-30B-A3B.json"), tiny=True, layers=2)
    data |= {"hidden_size": 128, "moe_intermediate_size": 128}  # widths the formats' groups (32 and up) divide
    model = synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=0, peaked=True)
    write_checkpoint(model, data, tmp_path, "compressed-tensors", INT4_SCHEMES[name])
    return model


@pytest.mark.parametrize("name", W4A8)
def test_a_moe_checkpoint_round_trip_gives_w4a8_experts(name, tmp_path):
    from pcg_core.model.loader import load_model
    from pcg_core.quant.formats.int4 import Int4Format, common_group, stored_weight

    scheme = INT4_SCHEMES[name]
    model = _moe_checkpoint(tmp_path, name)
    files = load_file(tmp_path / "model.safetensors")
    assert any(k.endswith(".mlp.experts.0.gate_proj.weight_packed") for k in files)
    assert not any(k.endswith(("input_scale", "input_zero_point", "gate_up_proj")) for k in files)  # dynamic acts
    acts = json.loads((tmp_path / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"]
    assert acts["input_activations"]["type"] == ("int" if name == "w4a8" else "float")
    lm = load_model(str(tmp_path), weights="real")
    mods = dict(lm.model.named_modules())
    group = common_group(scheme, [m.in_features for m in model.modules() if type(m) is torch.nn.Linear] + [
        w.shape[-1] for m in model.modules() if hasattr(m, "gate_up_proj") for w in (m.gate_up_proj, m.down_proj)])
    fmt = Int4Format("compressed-tensors", group)

    def one(t: torch.Tensor) -> torch.Tensor:
        return stored_weight(quantize_int4_ordered(t, group, True, False), fmt, t.dtype).original()

    loaded = [n for n, m in model.named_modules() if hasattr(m, "gate_up_proj") and hasattr(m, "num_experts")]
    assert len(loaded) == 2
    for n in loaded:
        src, got = model.get_submodule(n), mods[n]
        assert got.quant_scheme.name == name and got.quant_scheme.activations == scheme.activations
        i = src.gate_up_proj.shape[1] // 2
        want = torch.stack([torch.cat([one(w[:i].detach()), one(w[i:].detach())]) for w in src.gate_up_proj])
        assert torch.equal(_int4_dequantized(got, "gate_up_proj", torch.float32), want)
        assert torch.equal(_int4_dequantized(got, "down_proj", torch.float32),
                           torch.stack([one(w.detach()) for w in src.down_proj]))
    # the same files declared W4A16 (no input_activations) load as weight-only experts, which compute otherwise
    experts = mods[loaded[0]]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 128, generator=g)
    idx = torch.stack([torch.randperm(experts.num_experts, generator=g)[:2] for _ in range(8)])
    w = torch.rand(8, 2, generator=g)
    w4a8_out = quantized_experts_forward(experts, x, idx, w)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"]["input_activations"] = None
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    w4a16 = dict(load_model(str(tmp_path), weights="real").model.named_modules())[loaded[0]]
    assert w4a16.quant_scheme.activations is None and w4a16.quant_scheme.name == "gptq"
    assert _rel(quantized_experts_forward(w4a16, x, idx, w), w4a8_out) > 1e-3


def test_capabilities_and_request_verdicts_run_w4a8_moe():
    from pcg_core.capabilities import capabilities, checkpoint_limits, quant_unsupported_reason

    for name in W4A8:
        assert quant_unsupported_reason(name, features=["moe"]) is None
        assert quant_unsupported_reason(name, features=["moe"], real_weights=True) is None
        assert "moe" not in checkpoint_limits(name) and "moe" not in capabilities()["quant_schemes"][name]["checkpoint_limits"]
    assert quant_unsupported_reason("nope", features=["moe"]) is not None  # unknown schemes still refused by name
