"""compressed-tensors W4A8 / W4AFP8 in the `int-quantized` format (pcg_core/quant/int4_checkpoint.py CT_INT,
formats.py): 4-bit int weights stored one per int8, which is what llm-compressor writes for its W4A8 and W4AFP8
presets (compressed-tensors picks int-quantized for int weights with quantized activations).

Held to: the pack-quantized reading of the same weights (one canonical layout, so the loaded models are equal
buffer for buffer), compressed-tensors' own decompressor on our files, our loader on compressed-tensors' own
compressor's files (its scales, its rounding, its −8s), and planted faults (an off-by-one zero point, a 9 stored in
a 4-bit weight) that those checks catch."""

from __future__ import annotations

import json

import pytest
import torch
from pcg_helpers import config_path
from safetensors.torch import load_file, save_file

from pcg_core import load_model
from pcg_core.errors import UnsupportedModel
from pcg_core.model.loader import build_config, read_config_file, shrink_config, synthetic_model
from pcg_core.quant import write_checkpoint
from pcg_core.quant.formats import int4 as int4_checkpoint
from pcg_core.quant.layers.experts import expert_weight, is_experts
from pcg_core.quant.formats.detect import detect
from pcg_core.quant.layers.int4_linear import W4A8Linear
from pcg_core.quant.schemes.int4 import INT4_SCHEMES, Int4Scheme
from pcg_core.quant.formats.int4 import CT_INT, declaration


def ct() -> None:
    pytest.importorskip("compressed_tensors")  # a dev dependency: its tests skip cleanly without it


def _scheme(name: str, sym: bool = True, group: int | None = None) -> Int4Scheme:
    base = INT4_SCHEMES[name]
    return Int4Scheme(base.name, base.group if group is None else group, sym=sym, act_order=False,
                      description=base.description, activations=base.activations)


@pytest.fixture(scope="module")
def moe():
    """Tiny Qwen3-MoE at widths the groups divide (its experts are per-expert linears on disk)."""
    data = shrink_config(read_config_file(config_path("qwen3-moe")), tiny=True, layers=2)
    data |= {"hidden_size": 128, "moe_intermediate_size": 128}
    return synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=0, peaked=True), data


def _write(model, data, path, scheme, ct_format="int-quantized"):
    write_checkpoint(model, data, path, "compressed-tensors", scheme, ct_format=ct_format)
    return path


# --- the same weights as pack-quantized ------------------------------------------------------------------------


@pytest.mark.parametrize("name, sym, group", [("w4a8", True, None), ("w4a8", False, None), ("w4afp8", True, None),
                                              ("w4a8", False, -1)])
def test_int_quantized_loads_the_same_model_as_pack_quantized(moe, tmp_path, name, sym, group):
    model, data = moe
    scheme = _scheme(name, sym, group)
    a = load_model(str(_write(model, data, tmp_path / "int", scheme)), weights="real").model
    b = load_model(str(_write(model, data, tmp_path / "pack", scheme, "pack-quantized")), weights="real").model
    qc = json.loads((tmp_path / "int" / "config.json").read_text())["quantization_config"]
    weights = qc["config_groups"]["group_0"]["weights"]
    assert qc["format"] == "int-quantized" and weights["symmetric"] is sym
    assert weights["strategy"] == ("channel" if group == -1 else "group")
    stored = load_file(tmp_path / "int" / "model.safetensors")
    w = stored["model.layers.0.self_attn.q_proj.weight"]
    assert w.dtype == torch.int8 and int(w.min()) >= -8 and int(w.max()) <= 7 and int(w.min()) < 0
    assert ("model.layers.0.mlp.experts.3.down_proj.weight_zero_point" in stored) is not sym
    linears = [m for m in a.modules() if type(m) is W4A8Linear]
    assert len(linears) == 8 and all(m.act == scheme.activations and m.quant_scheme.name == name for m in linears)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert len(_loaded(a)) == 8 + 2 * 8 * 3  # the experts' buffers compared too: 2 layers × 8 experts × 3 projections
    assert type(a.lm_head) is torch.nn.Linear


# --- compressed-tensors' own compressor, both ways ------------------------------------------------------------


def _ct_scheme(qc: dict):
    from compressed_tensors.quantization import QuantizationConfig

    return QuantizationConfig.model_validate(qc).config_groups["group_0"]


def _loaded(lm) -> dict[str, torch.Tensor]:
    """Every quantized weight of the loaded model dequantized, by the module name the files use (experts: each
    expert's gate/up/down from the fused buffers)."""
    out = {n: m.dequantized_weight() for n, m in lm.named_modules() if type(m) is W4A8Linear}
    for n, m in lm.named_modules():
        if is_experts(m) and getattr(m, "quant_scheme", None) is not None:
            for e in range(m.num_experts):
                gate_up = expert_weight(m, "gate_up_proj", e)
                half = gate_up.shape[0] // 2
                out |= {f"{n}.{e}.gate_proj": gate_up[:half], f"{n}.{e}.up_proj": gate_up[half:],
                        f"{n}.{e}.down_proj": expert_weight(m, "down_proj", e)}
    return out


@pytest.mark.parametrize("sym, group", [(True, None), (False, None), (False, -1)])
def test_compressed_tensors_decompresses_our_files_to_our_weights(moe, tmp_path, sym, group):
    ct()
    from compressed_tensors.compressors.naive_quantized.base import IntQuantizationCompressor

    model, data = moe
    _write(model, data, tmp_path, _scheme("w4a8", sym, group))
    scheme = _ct_scheme(json.loads((tmp_path / "config.json").read_text())["quantization_config"])
    stored = load_file(tmp_path / "model.safetensors")
    loaded = _loaded(load_model(str(tmp_path), weights="real").model)
    assert len(loaded) == 8 + 2 * 8 * 3
    for name, ours in loaded.items():
        local = {k.removeprefix(f"{name}."): v for k, v in stored.items() if k.startswith(f"{name}.")}
        theirs = IntQuantizationCompressor.decompress(local, scheme)["weight"]
        assert torch.equal(ours, theirs.float()), name


def test_a_planted_zero_point_fault_is_caught_by_compressed_tensors(moe, tmp_path, monkeypatch):
    """The comparison above can fail: zero points read one off (the signed offset taken as 7, not 8)."""
    ct()
    from compressed_tensors.compressors.naive_quantized.base import IntQuantizationCompressor

    model, data = moe
    _write(model, data, tmp_path, _scheme("w4a8", False))
    real = int4_checkpoint.ct_int_unpack

    def off_by_one(*args):
        w = real(*args)
        w.zeros = w.zeros - 1
        return w

    monkeypatch.setattr(int4_checkpoint, "ct_int_unpack", off_by_one)
    scheme = _ct_scheme(json.loads((tmp_path / "config.json").read_text())["quantization_config"])
    stored = load_file(tmp_path / "model.safetensors")
    name, ours = next(iter(_loaded(load_model(str(tmp_path), weights="real").model).items()))
    local = {k.removeprefix(f"{name}."): v for k, v in stored.items() if k.startswith(f"{name}.")}
    assert not torch.equal(ours, IntQuantizationCompressor.decompress(local, scheme)["weight"].float())


def _ct_compress(w: torch.Tensor, scheme, group: int) -> dict[str, torch.Tensor]:
    """One linear as compressed-tensors quantizes and compresses it: its own qparams (symmetric: absmax/7.5, so
    −8 occurs), its own rounding, its own int8 values."""
    from compressed_tensors.compressors.naive_quantized.base import IntQuantizationCompressor
    from compressed_tensors.quantization.utils import calculate_qparams

    n, k = w.shape
    g = k if group == -1 else group
    blocks = w.reshape(n, k // g, g)
    scale, zp = calculate_qparams(blocks.amin(-1), blocks.amax(-1), scheme.weights)
    state = {"weight": w, "weight_scale": scale.to(w.dtype), "weight_zero_point": zp.round().to(torch.int8)}
    return IntQuantizationCompressor.compress(state, scheme)


@pytest.mark.parametrize("sym", [True, False])
def test_compressed_tensors_compressor_output_loads_with_our_loader(moe, tmp_path, sym):
    ct()
    from compressed_tensors.compressors.naive_quantized.base import IntQuantizationCompressor

    model, data = moe
    _write(model, data, tmp_path, _scheme("w4a8", sym))  # the layout and config; its quantized tensors replaced
    qc = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    scheme, group = _ct_scheme(qc), qc["config_groups"]["group_0"]["weights"]["group_size"]
    stored = load_file(tmp_path / "model.safetensors")
    floats = model.state_dict()
    theirs: dict[str, torch.Tensor] = {}
    for key in [k for k, v in stored.items() if v.dtype == torch.int8 and k.endswith(".weight")]:
        mod = key.removesuffix(".weight")
        w = floats[key] if key in floats else _expert_weight(model, key)
        for suffix in ("weight", "weight_scale", "weight_zero_point"):
            stored.pop(f"{mod}.{suffix}", None)
        packed = _ct_compress(w, scheme, group)
        stored.update({f"{mod}.{s}": t.contiguous() for s, t in packed.items()})
        theirs[mod] = IntQuantizationCompressor.decompress(packed, scheme)["weight"].float()
    assert any(int(stored[f"{m}.weight"].min()) == -8 for m in theirs)  # compressed-tensors' range, not ours
    save_file(stored, tmp_path / "model.safetensors", metadata={"format": "pt"})
    loaded = _loaded(load_model(str(tmp_path), weights="real").model)
    assert loaded.keys() == theirs.keys()
    for name, ours in loaded.items():
        assert torch.equal(ours, theirs[name]), name


def _expert_weight(model, key: str) -> torch.Tensor:
    """The float weight of `…experts.<e>.<proj>.weight` from the fused experts module."""
    prefix, e, proj, _ = key.rsplit(".", 3)
    experts = model.get_submodule(prefix)
    e = int(e)
    if proj == "down_proj":
        return experts.down_proj[e].detach()
    i = experts.gate_up_proj.shape[1] // 2
    return experts.gate_up_proj[e, :i].detach() if proj == "gate_proj" else experts.gate_up_proj[e, i:].detach()


def test_compressed_tensors_reads_our_declaration_and_picks_this_format_itself():
    ct()
    from compressed_tensors.compressors.format import infer_module_format
    from compressed_tensors.config import CompressionFormat

    for name in ("w4a8", "w4afp8"):
        qc = declaration(CT_INT, INT4_SCHEMES[name], 128, ("lm_head",))
        group = _ct_scheme(qc)
        assert qc["format"] == "int-quantized" and group.weights.num_bits == 4 and group.input_activations.num_bits == 8
        # What llm-compressor writes for these presets: compressed-tensors' own choice of format for the scheme
        assert infer_module_format(torch.nn.Linear, group) == CompressionFormat.int_quantized


# --- refusals ---------------------------------------------------------------------------------------------------


def test_values_outside_4_bits_are_refused_not_wrapped(moe, tmp_path):
    model, data = moe
    _write(model, data, tmp_path, _scheme("w4a8", False))
    clean = load_file(tmp_path / "model.safetensors")
    key = "model.layers.1.self_attn.o_proj"
    for suffix, value, col in (("weight", 9, 17), ("weight", -9, 17), ("weight_zero_point", 8, 0)):
        t = dict(clean)
        bad = t[f"{key}.{suffix}"].clone()
        bad[3, col] = value  # 9 wrapped into 4 bits would read as -7: a sign flip, not a rounding
        t[f"{key}.{suffix}"] = bad
        save_file(t, tmp_path / "model.safetensors")
        with pytest.raises(UnsupportedModel, match=rf"{key}: {suffix} holds {value} at \[3, {col}\] \(1 values "
                                                   r"outside \[-8, 7\]\)"):
            load_model(str(tmp_path), weights="real")
    t = dict(clean)  # zero points of the right count in the wrong layout
    t[f"{key}.weight_zero_point"] = clean[f"{key}.weight_zero_point"].reshape(1, -1).contiguous()
    save_file(t, tmp_path / "model.safetensors")
    with pytest.raises(UnsupportedModel, match=rf"{key}: weight_zero_point is torch.int8 \(1, 128\); asymmetric 4-bit "
                                               r"weights need int8 \(128, 1\)"):
        load_model(str(tmp_path), weights="real")
    save_file(clean, tmp_path / "model.safetensors")  # the control: the same files unchanged load
    assert len(_loaded(load_model(str(tmp_path), weights="real").model)) == 8 + 2 * 8 * 3


@pytest.mark.parametrize("change, match", [
    (lambda t, k: t.update({f"{k}.weight_zero_point": torch.zeros(64, 2, dtype=torch.int8)}),
     "weight_zero_point is there, but the checkpoint declares symmetric"),
    (lambda t, k: t.update({f"{k}.weight_g_idx": torch.arange(128, dtype=torch.int32) // 64}),
     "weight_g_idx is there, but compressed-tensors int-quantized has no act-order"),
    (lambda t, k: t.pop(f"{k}.weight_scale"), r"weight_scale is missing \(compressed-tensors int-quantized stores it"),
    (lambda t, k: t.update({f"{k}.weight_scale": torch.ones(64, 4)}), r"weight_scale is \(64, 4\); 64 outputs"),
    (lambda t, k: t.update({f"{k}.weight_scale": t[f"{k}.weight_scale"].t().contiguous()}), r"weight_scale is \(2, 64\)"),
    (lambda t, k: t.update({f"{k}.weight": t[f"{k}.weight"].float()}), None),
])
def test_files_that_do_not_match_the_declaration_are_refused(moe, tmp_path, change, match):
    model, data = moe
    _write(model, data, tmp_path, _scheme("w4a8"))
    t = load_file(tmp_path / "model.safetensors")
    change(t, "model.layers.0.self_attn.q_proj")
    save_file(t, tmp_path / "model.safetensors")
    if match is None:  # a 16-bit weight is a linear left in 16 bits, as in every format: its scale is then unused
        with pytest.raises(UnsupportedModel, match="tensors the model does not use, e.g. .*q_proj.weight_scale"):
            load_model(str(tmp_path), weights="real")
        return
    with pytest.raises(UnsupportedModel, match=match) as e:
        load_model(str(tmp_path), weights="real")
    assert str(e.value).startswith(f"{tmp_path}: model.layers.0.self_attn.q_proj") and str(e.value).count(str(tmp_path)) == 1


def _ct(weights: dict | None = None, acts: dict | None = None, fmt: str = "int-quantized", **group) -> dict:
    w = {"num_bits": 4, "type": "int", "symmetric": True, "dynamic": False, "strategy": "group", "group_size": 128}
    a = {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": True, "strategy": "token"}
    g = {"targets": ["Linear"], "weights": w | (weights or {}), "input_activations": a | (acts or {})} | group
    if acts == {"none": True}:
        g["input_activations"] = None
    return {"quantization_config": {"quant_method": "compressed-tensors", "format": fmt, "config_groups": {"group_0": g}}}


def test_the_declarations_read():
    for acts, name in (({}, "w4a8"), ({"type": "float"}, "w4afp8")):
        spec = detect(_ct(acts=acts))
        assert spec.scheme.name == name and spec.int4.name == CT_INT and spec.int4.group == 128 and not spec.scheme.act_order
    assert detect(_ct({"strategy": "channel", "group_size": None})).int4.group == -1
    assert not detect(_ct({"symmetric": False, "actorder": "weight"})).scheme.sym  # contiguous groups: no g_idx
    assert detect(_ct(fmt="naive-quantized")).int4.name == CT_INT  # the same compressor's tensors
    # recent compressed-tensors names the format in the group too, "mixed-precision" at the top
    assert detect(_ct(fmt="mixed-precision", format="int-quantized")).int4.name == CT_INT
    assert detect(_ct(fmt=None, format="int-quantized")).int4.name == CT_INT


@pytest.mark.parametrize("qc, match", [
    (_ct({"actorder": "group"}), r"actorder 'group' in int-quantized: that format stores no g_idx"),
    (_ct({"group_size": 96}), r"group_size 96: the int4 loader reads groups of -1, 32, 64, 128"),
    (_ct({"strategy": "tensor"}), r"weight strategy 'tensor': int-quantized 4-bit weights are read per group or per"),
    (_ct({"type": "float"}), r"float weights: int-quantized 4-bit weights are read as static int weights"),
    (_ct(acts={"dynamic": False}), r"int-quantized is read with 8-bit activations per token, dynamic and symmetric"),
    (_ct(acts={"num_bits": 4}), r"int-quantized is read with 8-bit activations"),
    (_ct(acts={"none": True}), r"4-bit weight-only in int-quantized: .* weight-only \(W4A16\) from pack-quantized"),
    (_ct({"num_bits": 3}), r"3-bit weights × 8-bit activations: float-/int-quantized is read with 8-bit weights × 8-bit "
                           r"activations \(FP8, INT8\) and 4-bit int weights"),
    (_ct(fmt="pack-quantized", format="int-quantized"), r"format 'pack-quantized', but its config_groups say "
                                                        r"'int-quantized'"),
    (_ct(fmt="sparse-bitmask"), r"format 'sparse-bitmask' is not read; the formats read are"),
])
def test_declarations_not_read_are_refused_by_name_saying_what_is(qc, match):
    with pytest.raises(UnsupportedModel, match=match) as e:
        detect(qc)
    assert "compressed-tensors int-quantized W4A8 / W4AFP8" in str(e.value)  # the list of what is read


def test_the_writer_refuses_what_int_quantized_cannot_hold():
    with pytest.raises(ValueError, match="int-quantized holds 4-bit weights with 8-bit activations"):
        declaration(CT_INT, INT4_SCHEMES["gptq"], 128, ())
    with pytest.raises(ValueError, match="without act-order"):
        declaration(CT_INT, Int4Scheme("w4a8", 128, sym=True, act_order=True, description="", activations="int8"), 128, ())
