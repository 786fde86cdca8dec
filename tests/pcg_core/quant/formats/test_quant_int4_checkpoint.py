"""pcg_core/quant/formats/int4.py and the loader: AWQ, GPTQ (v1, v2) and compressed-tensors pack-quantized
checkpoints written in their producers' layouts load back into exactly the int4 weights written; the
compressed-tensors package reads ours and we read its; planted reader faults (AWQ interleave, GPTQ's z − 1,
g_idx ignored, compressed-tensors' zero offset) move the loaded weights; bad declarations and files are refused
with the place named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pcg_core.errors import UnsupportedModel
from pcg_core.model.loader import build_config, load_model, read_config_file, shrink_config, synthetic_model
from pcg_core.quant import Int4Linear, detect, write_checkpoint
from pcg_core.quant.schemes import int4 as int4_mod
from pcg_core.quant.formats import int4 as ckpt
from pcg_core.quant.schemes.int4 import PLAIN_ORDER, Int4Scheme, quantize_int4, quantize_int4_ordered
from pcg_core.quant.formats.int4 import Int4Format, ct_pack, ct_unpack, stored_weight

CONFIGS = Path(__file__).resolve().parents[4] / "harness" / "models" / "configs"
LLAMA, QWEN3, MOE = "meta-llama__Llama-3.1-8B-Instruct.json", "Qwen__Qwen3-0.6B.json", "Qwen__Qwen3-30B-A3B.json"
# The tiny MoE's experts (48 wide) widened to what the formats' groups (32 and up) divide, two groups of 64 and up
MOE_WIDTHS = {"hidden_size": 128, "moe_intermediate_size": 128}

# (format, scheme as the writer takes it): each format's variants the loader must read
VARIANTS = {
    "awq-g64": ("awq", Int4Scheme("awq", 64, sym=False, act_order=False, description="")),
    "awq-g32": ("awq", Int4Scheme("awq", 32, sym=False, act_order=False, description="")),
    "gptq-sym-actorder": ("gptq", Int4Scheme("gptq", 64, sym=True, act_order=True, description="")),
    "gptq-asym-g32": ("gptq", Int4Scheme("gptq", 32, sym=False, act_order=False, description="")),
    "gptq_v2-asym-actorder": ("gptq_v2", Int4Scheme("gptq", 32, sym=False, act_order=True, description="")),
    "gptq-channel": ("gptq", Int4Scheme("gptq", -1, sym=True, act_order=False, description="")),
    "ct-sym": ("compressed-tensors", Int4Scheme("gptq", 64, sym=True, act_order=False, description="")),
    "ct-asym-actorder": ("compressed-tensors", Int4Scheme("gptq", 32, sym=False, act_order=True, description="")),
    "ct-channel": ("compressed-tensors", Int4Scheme("gptq", -1, sym=True, act_order=False, description="")),
}


def _synthetic(config: str = LLAMA, seed: int = 0, **override):
    data = shrink_config(read_config_file(CONFIGS / config), tiny=True, layers=2) | override
    return data, synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=seed, peaked=True)


def _expected(model: torch.nn.Module, fmt: str, scheme: Int4Scheme) -> dict[str, torch.Tensor]:
    """Each linear's weight as the checkpoint stands for it, computed here from the float model (not read back)."""
    linears = {n: m for n, m in model.named_modules() if type(m) is torch.nn.Linear and not n.endswith("lm_head")}
    group = ckpt.common_group(scheme, [m.in_features for m in linears.values()])
    fmt_ = Int4Format(fmt, group)
    return {n: stored_weight(quantize_int4_ordered(m.weight.detach(), group, scheme.sym, scheme.act_order), fmt_,
                             m.weight.dtype).original() for n, m in linears.items()}


def _mismatch(loaded: torch.nn.Module, expected: dict[str, torch.Tensor]) -> float:
    mods = dict(loaded.named_modules())
    assert all(isinstance(mods[n], Int4Linear) for n in expected), [n for n in expected if not isinstance(mods[n], Int4Linear)]
    return max(float((mods[n].weight_int4().original() - w).abs().max()) for n, w in expected.items())


@pytest.fixture(scope="module")
def llama():
    return _synthetic()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_format_loads_back_exactly_the_weights_it_wrote(variant, llama, tmp_path):
    data, model = llama
    fmt, scheme = VARIANTS[variant]
    write_checkpoint(model, data, tmp_path, fmt, scheme)
    spec = detect(json.loads((tmp_path / "config.json").read_text()))
    assert spec.scheme.name == scheme.name and spec.scheme.sym == scheme.sym and spec.scheme.act_order == scheme.act_order
    assert spec.int4.name == fmt
    lm = load_model(str(tmp_path), weights="real")
    assert _mismatch(lm.model, _expected(model, fmt, scheme)) == 0.0
    assert all(m.quant_scheme.name == scheme.name for m in lm.model.modules() if isinstance(m, Int4Linear))
    assert type(lm.model.lm_head) is torch.nn.Linear  # left in 16 bits, as written
    if scheme.act_order:
        assert any(m.perm is not None for m in lm.model.modules() if isinstance(m, Int4Linear))


# --- the compressed-tensors package as the oracle ---------------------------------------------------------------


@pytest.mark.parametrize("sym", [True, False])
def test_compressed_tensors_reads_ours_and_we_read_theirs(sym):
    """Both directions on one linear: its decompressor turns our tensors into our weight, and its compressor's
    tensors unpack with ours into its own decompressed weight (bf16, the model dtype the scales are stored in)."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    w = torch.randn(16, 128, generator=torch.Generator().manual_seed(3))
    q = quantize_int4(w, 32, sym)
    q.scales = q.scales.to(torch.bfloat16).float()
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(num_bits=4, type="int", symmetric=sym,
                                                                             strategy="group", group_size=32))
    theirs_of_ours = PackedQuantizationCompressor.decompress(dict(ct_pack(q, sym, torch.bfloat16)), scheme)["weight"]
    assert torch.equal(theirs_of_ours, q.dequantize().to(torch.bfloat16))
    zp = None if sym else (q.zeros - 8).to(torch.int8)  # theirs are signed, stored + 8
    packed = PackedQuantizationCompressor.compress({"weight": w.to(torch.bfloat16), "weight_scale": q.scales.to(torch.bfloat16),
                                                    "weight_zero_point": zp}, scheme)
    assert ("weight_zero_point" in packed) is not sym
    ours = ct_unpack(packed["weight_packed"], packed["weight_scale"], packed.get("weight_zero_point"),
                     packed["weight_shape"], None, 32)
    back = PackedQuantizationCompressor.decompress(dict(packed), scheme)["weight"]
    assert torch.equal(ours.dequantize().to(torch.bfloat16), back)


# --- planted reader faults --------------------------------------------------------------------------------------


def _plant_awq_plain_order(monkeypatch):
    monkeypatch.setattr(int4_mod, "AWQ_ORDER", PLAIN_ORDER)  # the interleave forgotten


def _plant_g_idx_ignored(monkeypatch):
    real = ckpt.gptq_unpack
    monkeypatch.setattr(ckpt, "gptq_unpack", lambda qw, qz, s, g_idx, group, v2=False: real(qw, qz, s, None, group, v2))


def _plant_ct_zero_unsigned(monkeypatch):
    real = ckpt.ct_unpack

    def unpack(packed, scale, zero_point, shape, g_idx, group):
        w = real(packed, scale, zero_point, shape, g_idx, group)
        w.zeros = w.zeros - 8  # the stored zero read as signed without its + 8
        return w
    monkeypatch.setattr(ckpt, "ct_unpack", unpack)


FAULTS = {
    "awq interleave ignored": ("awq-g64", _plant_awq_plain_order, None),
    "gptq v1 read as v2 (z − 1 kept)": ("gptq-asym-g32", None, {"checkpoint_format": "gptq_v2"}),
    "gptq g_idx ignored": ("gptq-sym-actorder", _plant_g_idx_ignored, None),
    "compressed-tensors zero offset dropped": ("ct-asym-actorder", _plant_ct_zero_unsigned, None),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_planted_reader_faults_move_the_loaded_weights(fault, llama, tmp_path, monkeypatch):
    data, model = llama
    variant, plant, config_edit = FAULTS[fault]
    fmt, scheme = VARIANTS[variant]
    write_checkpoint(model, data, tmp_path, fmt, scheme)
    expected = _expected(model, fmt, scheme)
    assert _mismatch(load_model(str(tmp_path), weights="real").model, expected) == 0.0  # the check passes unplanted
    if plant:
        plant(monkeypatch)
    if config_edit:
        cfg = json.loads((tmp_path / "config.json").read_text())
        cfg["quantization_config"].update(config_edit)
        (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert _mismatch(load_model(str(tmp_path), weights="real").model, expected) > 0.0, fault


# --- bad declarations and files ---------------------------------------------------------------------------------


@pytest.mark.parametrize("qc, message", [
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "only 'gemm'"),
    ({"quant_method": "awq", "bits": 8, "group_size": 128}, "8-bit weights: only 4-bit"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": False}, "zero_point: false"),
    ({"quant_method": "awq", "bits": 4, "group_size": 16}, "group_size 16"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"}, "checkpoint_format 'marlin'"),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "3-bit weights"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "dynamic": {"-:.*mlp.*": {}}}, "per-module overrides"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "lm_head": True}, "lm_head"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}}}}, "W4A8"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "tensor"}}}}, "strategy 'tensor'"),
])
def test_declarations_the_loader_cannot_read_are_refused_by_name(qc, message):
    with pytest.raises(UnsupportedModel, match="quantization_config") as e:
        detect({"quantization_config": qc})
    assert message in str(e.value), str(e.value)


def _rewrite(path: Path, edit) -> None:
    f = path / "model.safetensors"
    tensors = load_file(f)
    edit(tensors)
    save_file(tensors, f, metadata={"format": "pt"})


Q = "model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize("variant, edit, message", [
    ("gptq-asym-g32", lambda t: t.pop(f"{Q}.qzeros"), f"{Q}.qzeros is missing"),
    ("awq-g64", lambda t: t.update({f"{Q}.scales": t[f"{Q}.scales"][:, :8].contiguous()}), "do not fit"),
    ("awq-g64", lambda t: t.update({f"{Q}.qweight": t[f"{Q}.qweight"].to(torch.int64)}), "packed 8 per int32"),
    ("gptq-asym-g32", lambda t: t.update({f"{Q}.g_idx": torch.randperm(t[f"{Q}.g_idx"].numel()).to(torch.int32) // 32}),
     "act-order g_idx, but the checkpoint declares none"),
    ("ct-sym", lambda t: t.update({f"{Q}.weight_shape": torch.tensor([8, 64])}), "weight_packed"),
    ("ct-sym", lambda t: t.update({f"{Q}.weight_zero_point": torch.zeros(1, 1, dtype=torch.int32)}), "declares symmetric"),
    ("gptq-asym-g32", lambda t: t.update({f"{Q}.stray": torch.zeros(1)}), "does not use"),
])
def test_bad_files_name_the_tensor(variant, edit, message, llama, tmp_path):
    data, model = llama
    fmt, scheme = VARIANTS[variant]
    write_checkpoint(model, data, tmp_path, fmt, scheme)
    _rewrite(tmp_path, edit)
    with pytest.raises(UnsupportedModel) as e:
        load_model(str(tmp_path), weights="real")
    assert message in str(e.value) and str(tmp_path) in str(e.value), str(e.value)


def test_a_module_the_declaration_leaves_alone_must_not_be_packed(llama, tmp_path):
    data, model = llama
    write_checkpoint(model, data, tmp_path, "awq", VARIANTS["awq-g64"][1])
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"]["modules_to_not_convert"] = ["q_proj"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModel, match=r"q_proj\.qweight is packed in 4 bits but .* lists .*q_proj as not quantized"):
        load_model(str(tmp_path), weights="real")


def _expert_weights(model: torch.nn.Module, group: int, scheme: Int4Scheme, fmt: str) -> dict[str, torch.Tensor]:
    """Each experts module's [E, N, K] weights (gate_up fused) as the checkpoint stands for them: every expert's
    gate, up and down quantized alone (own groups and act-order), computed here from the float model."""
    fmt_ = Int4Format(fmt, group)

    def one(w: torch.Tensor) -> torch.Tensor:
        return stored_weight(quantize_int4_ordered(w.detach(), group, scheme.sym, scheme.act_order), fmt_,
                             w.dtype).original()

    out = {}
    for name, mod in model.named_modules():
        if hasattr(mod, "gate_up_proj") and hasattr(mod, "num_experts"):
            i = mod.gate_up_proj.shape[1] // 2
            out[f"{name}.gate_up_proj"] = torch.stack([torch.cat([one(w[:i]), one(w[i:])]) for w in mod.gate_up_proj])
            out[f"{name}.down_proj"] = torch.stack([one(w) for w in mod.down_proj])
    return out


@pytest.mark.parametrize("variant", ["awq-g32", "gptq-sym-actorder", "gptq_v2-asym-actorder", "ct-asym-actorder"])
def test_moe_experts_load_back_exactly_the_weights_written(variant, tmp_path):
    """Qwen3-MoE's experts as the producers write them (one packed linear per expert and projection, each with its
    own act-order) read into the fused int4 expert buffers: gate and up each keep their permutation."""
    from pcg_core.quant.layers.experts import _int4_dequantized

    data, model = _synthetic(MOE, **MOE_WIDTHS)
    fmt, scheme = VARIANTS[variant]
    write_checkpoint(model, data, tmp_path, fmt, scheme)
    files = load_file(tmp_path / "model.safetensors")
    assert any(".mlp.experts.0.gate_proj." in k for k in files) and not any(k.endswith("gate_up_proj") for k in files)
    lm = load_model(str(tmp_path), weights="real")
    group = ckpt.common_group(scheme, [m.in_features for m in model.modules() if type(m) is torch.nn.Linear] + [
        w.shape[-1] for m in model.modules() if hasattr(m, "gate_up_proj") for w in (m.gate_up_proj, m.down_proj)])
    want = _expert_weights(model, group, scheme, fmt)
    mods = dict(lm.model.named_modules())
    for key, w in want.items():
        mod, _, proj = key.rpartition(".")
        assert mods[mod].quant_scheme.name == scheme.name
        got = _int4_dequantized(mods[mod], proj, torch.float32)
        assert torch.equal(got, w.float()), key
    if scheme.act_order:
        perm = mods[next(iter(want)).rpartition(".")[0]].gate_up_proj_perm
        assert perm.dim() == 3 and perm.shape[1] == 2 and not torch.equal(perm[:, 0], perm[:, 1])


def test_moe_experts_planted_faults_move_the_weights(tmp_path):
    """The same file read with gate and up's permutations swapped, or with one expert's g_idx dropped, gives other
    weights: the check above can fail."""
    from pcg_core.quant.layers.experts import _int4_dequantized

    data, model = _synthetic(MOE, **MOE_WIDTHS)
    write_checkpoint(model, data, tmp_path, "gptq", VARIANTS["gptq-sym-actorder"][1])
    lm = load_model(str(tmp_path), weights="real")
    experts = next(m for m in lm.model.modules() if getattr(m, "gate_up_proj_perm", None) is not None)
    good = _int4_dequantized(experts, "gate_up_proj", torch.float32)
    experts.gate_up_proj_perm = experts.gate_up_proj_perm.flip(1)
    assert not torch.equal(_int4_dequantized(experts, "gate_up_proj", torch.float32), good)
    files = load_file(tmp_path / "model.safetensors")
    key = next(k for k in files if k.endswith(".experts.1.down_proj.g_idx"))
    files.pop(key)
    save_file(files, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UnsupportedModel, match=r"experts\.1\.down_proj"):  # g_idx gone: no act-order there, and
        load_model(str(tmp_path), weights="real")                          # the declaration says desc_act


def test_moe_experts_missing_or_mixed_tensors_are_named(tmp_path):
    data, model = _synthetic(MOE, **MOE_WIDTHS)
    write_checkpoint(model, data, tmp_path, "awq", VARIANTS["awq-g32"][1])
    files = load_file(tmp_path / "model.safetensors")
    key = next(k for k in files if k.endswith(".experts.2.up_proj.scales"))
    save_file({k: v for k, v in files.items() if k != key}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UnsupportedModel, match=r"experts\.2\.up_proj\.scales"):
        load_model(str(tmp_path), weights="real")
    # one expert's projection stored in 16 bits among packed ones: refused, never read as zeros
    mixed = dict(files)
    base = key.removesuffix(".scales")
    for suffix in ("qweight", "qzeros", "scales"):
        mixed.pop(f"{base}.{suffix}")
    mixed[f"{base}.weight"] = torch.zeros(8, 8)
    save_file(mixed, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UnsupportedModel, match="partly packed in 4 bits"):
        load_model(str(tmp_path), weights="real")
