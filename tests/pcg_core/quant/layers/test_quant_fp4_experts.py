"""FP4 MoE experts (pcg_core/quant/layers/fp4_experts.py): the reference forward is the dequantized math exactly, held to
transformers' own float experts forward over weights decoded HERE, independently (e2m1 from its bit fields, nibbles
by hand, e8m0 as 2^(s − 127)); planted faults move the output past the tolerance; gpt-oss's on-disk MXFP4 round
trips; the grouped path matches the reference; and whole cells pass on tiny Qwen3-MoE, Mixtral and gpt-oss."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers.models.gpt_oss.configuration_gpt_oss import GptOssConfig
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

from pcg_core.errors import UnsupportedModel
from pcg_core.quant.layers.experts import grouped_quantized_experts_forward, quantized_experts_forward
from pcg_core.quant.schemes.fp4 import FP4_SCHEMES, modelopt_nvfp4_pack, modelopt_nvfp4_unpack, quantize_nvfp4
from pcg_core.quant.layers.fp4_experts import (fp4_experts_forward, gpt_oss_mxfp4_tensors, grouped_fp4_experts_forward,
                                        install_fp4_experts, load_gpt_oss_mxfp4, quantize_experts_fp4,
                                        read_gpt_oss_mxfp4)
from pcg_core.quant.layers.linear import quantize_model

E, H, I, T, TOP_K = 4, 64, 96, 12, 2  # noqa: E741 - I is the intermediate width, as in the configs
TOL = 1e-4  # float32, relative to the output's largest magnitude: only the summation order differs


def _e2m1_value(code: int) -> float:
    """e2m1 from its fields: sign bit 3, exponent bits 1..2 (bias 1), mantissa bit 0; exponent 0 is subnormal."""
    sign = -1.0 if code & 8 else 1.0
    exp, man = (code >> 1) & 3, code & 1
    return sign * (man / 2 if exp == 0 else 2.0 ** (exp - 1) * (1 + man / 2))


TABLE = torch.tensor([_e2m1_value(c) for c in range(16)], dtype=torch.float64)


def _codes(packed: torch.Tensor) -> torch.Tensor:
    """Nibbles by hand: byte j holds code 2j low, 2j + 1 high."""
    out = torch.empty(*packed.shape[:-1], 2 * packed.shape[-1], dtype=torch.long)
    out[..., 0::2], out[..., 1::2] = (packed & 15).long(), (packed >> 4).long()
    return out


def _decode(packed: torch.Tensor, scale: torch.Tensor, glob: torch.Tensor | None, block: int) -> torch.Tensor:
    v = TABLE[_codes(packed)].unflatten(-1, (-1, block)) * scale.double()[..., None]
    if glob is not None:
        v = v * glob.double()[..., None, None]
    return v.flatten(-2).float()


def _decoded_buffers(mod: torch.nn.Module, name: str) -> torch.Tensor:
    return _decode(getattr(mod, name), getattr(mod, f"{name}_scale"), getattr(mod, f"{name}_global"), mod.fp4_block)


def _gpt_oss(seed: int = 0) -> GptOssExperts:
    cfg = GptOssConfig(hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=TOP_K)
    cfg._experts_implementation = "eager"  # transformers' own loop: the float reference
    torch.manual_seed(seed)
    m = GptOssExperts(cfg)
    with torch.no_grad():
        m.gate_up_proj.normal_(0, 0.15), m.down_proj.normal_(0, 0.1)
        m.gate_up_proj_bias.normal_(0, 0.3), m.down_proj_bias.normal_(0, 0.3)
    return m


def _qwen3(seed: int = 0) -> Qwen3MoeExperts:
    cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=TOP_K)
    cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    m = Qwen3MoeExperts(cfg)
    with torch.no_grad():
        m.gate_up_proj.normal_(0, 0.15), m.down_proj.normal_(0, 0.1)
    return m


def _inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    idx = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(T)])
    idx[0] = torch.tensor([0, 1])  # experts 0 and 1 are routed, whatever the draw (the faults below live there)
    return x, idx, torch.rand(T, TOP_K, generator=g)


def _float_from(q: torch.nn.Module, float_mod: torch.nn.Module, transposed: bool) -> torch.nn.Module:
    """The float module with the independently decoded weights: what transformers computes from them."""
    ref = copy.deepcopy(float_mod)
    with torch.no_grad():
        for name in ("gate_up_proj", "down_proj"):
            w = _decoded_buffers(q, name)
            getattr(ref, name).copy_(w.transpose(1, 2) if transposed else w)
        for name in ("gate_up_proj_bias", "down_proj_bias"):
            if hasattr(q, name):
                getattr(ref, name).copy_(getattr(q, name))
    return ref


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).abs().max() / b.detach().float().abs().max())


def _quantized(make, scheme: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    flt = make()
    q = copy.deepcopy(flt)
    quantize_experts_fp4(q, FP4_SCHEMES[scheme])
    return flt, q


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("layout", ["gpt_oss", "qwen3"])
def test_the_reference_is_the_dequantized_math(layout, scheme):
    make, transposed = (_gpt_oss, True) if layout == "gpt_oss" else (_qwen3, False)
    flt, q = _quantized(make, scheme)
    assert q.gate_up_proj.dtype == torch.uint8 and q.gate_up_proj.shape == (E, 2 * I, H // 2)
    assert q.down_proj.shape == (E, H, I // 2) and q.down_proj_scale.shape == (E, H, I // FP4_SCHEMES[scheme].block)
    if scheme == "mxfp4":  # e8m0: powers of two, no global
        assert q.down_proj_global is None and torch.equal(torch.frexp(q.down_proj_scale)[0], torch.full_like(q.down_proj_scale, .5))
    else:  # one global per expert and projection, e4m3 block scales
        assert torch.equal(q.down_proj_global, q.down_proj_global[:, :1].expand(-1, H))
        assert torch.equal(q.down_proj_scale.to(torch.float8_e4m3fn).float(), q.down_proj_scale)
    x, idx, w = _inputs()
    want = _float_from(q, flt, transposed)(x, idx, w)
    got = fp4_experts_forward(q, x, idx, w)
    assert _rel(got, want) < TOL
    assert _rel(want, flt(x, idx, w)) > 10 * TOL  # 4 bits cost something: the comparison is not float vs float
    assert torch.equal(quantized_experts_forward(q, x, idx, w), got)  # experts.py hands FP4 over
    grouped = grouped_quantized_experts_forward(q, x, idx, w)  # torch._grouped_mm runs on the CPU too
    assert _rel(grouped, got) < TOL and torch.equal(grouped, grouped_fp4_experts_forward(q, x, idx, w))


def _swap_nibbles(q):
    q.down_proj[0] = (q.down_proj[0] >> 4) | (q.down_proj[0] << 4)


def _deinterleave(q):  # a reader that took gpt-oss's rows as gate block then up block
    order = torch.cat((torch.arange(0, 2 * I, 2), torch.arange(1, 2 * I, 2)))
    q.gate_up_proj.copy_(q.gate_up_proj[:, order]), q.gate_up_proj_scale.copy_(q.gate_up_proj_scale[:, order])


def _scale_exponent(q):  # one block of one expert one e8m0 exponent off
    q.gate_up_proj_scale[0, 0, 0] *= 2


def _drop_bias(q):
    q.down_proj_bias.data.zero_()


@pytest.mark.parametrize("fault", [_swap_nibbles, _deinterleave, _scale_exponent, _drop_bias])
def test_planted_faults_move_the_output_past_the_tolerance(fault):
    flt, q = _quantized(_gpt_oss, "mxfp4")
    x, idx, w = _inputs()
    want = _float_from(q, flt, True)(x, idx, w)
    assert _rel(fp4_experts_forward(q, x, idx, w), want) < TOL
    with torch.no_grad():
        fault(q)
    assert _rel(fp4_experts_forward(q, x, idx, w), want) > 10 * TOL, fault.__name__


def _decode_disk(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """gpt-oss on disk → (E, C in, R out) as GptOssExperts holds it, by hand: e8m0 = 2^(s − 127)."""
    codes = _codes(blocks)  # (E, R, C/32, 32)
    v = TABLE[codes] * torch.pow(2.0, scales.double() - 127)[..., None]
    return v.flatten(-2).transpose(1, 2).float()


def test_gpt_oss_checkpoint_round_trip():
    flt, q = _quantized(_gpt_oss, "mxfp4")
    disk = gpt_oss_mxfp4_tensors(flt, "model.layers.0.mlp.experts.")
    assert {k: (v.dtype, tuple(v.shape)) for k, v in disk.items()} == {
        "model.layers.0.mlp.experts.gate_up_proj_blocks": (torch.uint8, (E, 2 * I, H // 32, 16)),
        "model.layers.0.mlp.experts.gate_up_proj_scales": (torch.uint8, (E, 2 * I, H // 32)),
        "model.layers.0.mlp.experts.gate_up_proj_bias": (torch.bfloat16, (E, 2 * I)),
        "model.layers.0.mlp.experts.down_proj_blocks": (torch.uint8, (E, H, I // 32, 16)),
        "model.layers.0.mlp.experts.down_proj_scales": (torch.uint8, (E, H, I // 32)),
        "model.layers.0.mlp.experts.down_proj_bias": (torch.bfloat16, (E, H))}
    read = copy.deepcopy(flt)
    read_gpt_oss_mxfp4(read, disk, "model.layers.0.mlp.experts.")  # a dict offers `in` and .get, as CheckpointTensors
    for name in ("gate_up_proj", "down_proj"):
        assert torch.equal(getattr(read, name), getattr(q, name))  # the in-memory quantizer's buffers exactly
        assert torch.equal(getattr(read, f"{name}_scale"), getattr(q, f"{name}_scale"))
        assert torch.equal(getattr(read, f"{name}_bias"), getattr(flt, f"{name}_bias").bfloat16().float())
        p = f"model.layers.0.mlp.experts.{name}"
        assert torch.equal(_decode_disk(disk[f"{p}_blocks"], disk[f"{p}_scales"]), _decoded_buffers(read, name).transpose(1, 2))
    again = gpt_oss_mxfp4_tensors(read, "model.layers.0.mlp.experts.")  # a quantized module packs as it holds
    assert all(torch.equal(again[k], disk[k]) for k in disk)
    x, idx, w = _inputs()
    ref = copy.deepcopy(flt)  # transformers over the on-disk tensors decoded by hand
    with torch.no_grad():
        for name in ("gate_up_proj", "down_proj"):
            p = f"model.layers.0.mlp.experts.{name}"
            getattr(ref, name).copy_(_decode_disk(disk[f"{p}_blocks"], disk[f"{p}_scales"]))
            getattr(ref, f"{name}_bias").copy_(disk[f"{p}_bias"].float())
    assert _rel(fp4_experts_forward(read, x, idx, w), ref(x, idx, w)) < TOL
    off = dict(disk)  # an e8m0 exponent off by one on disk is seen
    off["model.layers.0.mlp.experts.gate_up_proj_scales"] = disk["model.layers.0.mlp.experts.gate_up_proj_scales"].clone()
    off["model.layers.0.mlp.experts.gate_up_proj_scales"][0, 0, 0] += 1
    bad = copy.deepcopy(flt)
    read_gpt_oss_mxfp4(bad, off, "model.layers.0.mlp.experts.")
    assert _rel(fp4_experts_forward(bad, x, idx, w), ref(x, idx, w)) > 10 * TOL


def test_a_hand_written_gpt_oss_checkpoint_gives_the_known_answer():
    """One expert of 32 × 32, every weight known: gate_up bytes 0x21 (codes 1, 2: 0.5, 1.0) at e8m0 128 (×2), so each
    row is 1, 2, 1, 2 … and a ones input gives 48 in every gate and up, clamped to the limit 7; down bytes 0x11 (0.5
    each) at e8m0 127 (×1), so each output is 16 × the gated value, plus its bias, times the routing weight."""
    cfg = GptOssConfig(hidden_size=32, intermediate_size=32, num_local_experts=2, num_experts_per_tok=1)
    m = GptOssExperts(cfg)
    gu_bias, down_bias = torch.zeros(2, 64), torch.full((2, 32), 0.25)
    load = dict(gate_up_blocks=torch.full((2, 64, 1, 16), 0x21, dtype=torch.uint8),
                gate_up_scales=torch.full((2, 64, 1), 128, dtype=torch.uint8),
                down_blocks=torch.full((2, 32, 1, 16), 0x11, dtype=torch.uint8),
                down_scales=torch.full((2, 32, 1), 127, dtype=torch.uint8), gate_up_bias=gu_bias, down_bias=down_bias)
    load_gpt_oss_mxfp4(m, **load)
    got = fp4_experts_forward(m, torch.ones(3, 32), torch.zeros(3, 1, dtype=torch.long), torch.full((3, 1), 0.5))
    gated = (7 + 1) * 7 * torch.sigmoid(torch.tensor(7 * cfg.swiglu_alpha))
    assert torch.allclose(got, (16 * gated + 0.25) * 0.5 * torch.ones(3, 32), rtol=1e-6)


def test_gpt_oss_checkpoint_refusals_name_the_tensor():
    flt = _gpt_oss()
    disk = gpt_oss_mxfp4_tensors(flt, "e.")
    del disk["e.down_proj_bias"]
    with pytest.raises(UnsupportedModel, match="e.down_proj_bias missing"):
        read_gpt_oss_mxfp4(copy.deepcopy(flt), disk, "e.")
    small = _gpt_oss()
    small.num_experts = E - 1  # the file's experts do not fit the model's
    with pytest.raises(UnsupportedModel, match="gate_up_proj_blocks hold"):
        read_gpt_oss_mxfp4(small, gpt_oss_mxfp4_tensors(flt, "e."), "e.")
    short = gpt_oss_mxfp4_tensors(flt, "e.")
    short["e.down_proj_blocks"], short["e.down_proj_scales"] = short["e.down_proj_blocks"][:, :-1], short["e.down_proj_scales"][:, :-1]
    kept = copy.deepcopy(flt)
    with pytest.raises(UnsupportedModel, match="down_proj_blocks hold"):
        read_gpt_oss_mxfp4(kept, short, "e.")
    assert kept.gate_up_proj.dtype == torch.float32 and torch.equal(kept.gate_up_proj_bias, flt.gate_up_proj_bias)  # untouched


@pytest.mark.parametrize("layout", ["qwen3", "gpt_oss"])
def test_per_expert_nvfp4_weights_keep_each_linear_global(layout):
    """ModelOpt's per-expert gate/up/down linears, each its own global (up's scaled ×8 so the globals differ)."""
    flt = _qwen3() if layout == "qwen3" else _gpt_oss()
    g = torch.Generator().manual_seed(3)
    gate, up, down = (torch.randn(E, n, k, generator=g) * s for n, k, s in ((I, H, .1), (I, H, .8), (H, I, .1)))
    unpack = lambda w: modelopt_nvfp4_unpack(**modelopt_nvfp4_pack(quantize_nvfp4(w)))  # noqa: E731 (the file's way)
    ws = {n: [unpack(t[e]) for e in range(E)] for n, t in (("gate", gate), ("up", up), ("down", down))}
    assert ws["gate"][0].global_scale != ws["up"][0].global_scale
    q = copy.deepcopy(flt)
    install_fp4_experts(q, FP4_SCHEMES["nvfp4"], ws["down"], ws["up"], ws["gate"])
    deq = {n: torch.stack([w.dequantize() for w in v]) for n, v in ws.items()}
    rows = torch.stack((deq["gate"], deq["up"]), 2).flatten(1, 2) if layout == "gpt_oss" else torch.cat((deq["gate"], deq["up"]), 1)
    assert torch.equal(_decoded_buffers(q, "gate_up_proj"), rows) and torch.equal(_decoded_buffers(q, "down_proj"), deq["down"])
    x, idx, w = _inputs()
    ref = copy.deepcopy(flt)
    with torch.no_grad():
        t = layout == "gpt_oss"
        ref.gate_up_proj.copy_(rows.transpose(1, 2) if t else rows), ref.down_proj.copy_(deq["down"].transpose(1, 2) if t else deq["down"])
    assert _rel(fp4_experts_forward(q, x, idx, w), ref(x, idx, w)) < TOL
    with pytest.raises(ValueError, match="expected 4 per-expert weights"):
        install_fp4_experts(copy.deepcopy(flt), FP4_SCHEMES["nvfp4"], ws["down"][:-1], ws["up"], ws["gate"])


class _Block(torch.nn.Module):
    def __init__(self, experts: torch.nn.Module):
        super().__init__()
        self.proj, self.experts = torch.nn.Linear(H, H), experts


def test_quantize_model_holds_experts_and_refuses_what_it_cannot_before_any_swap():
    model = _Block(_qwen3())
    assert quantize_model(model, FP4_SCHEMES["nvfp4"]) == ["proj", "experts"]
    assert model.experts.quant_scheme.name == "nvfp4" and type(model.proj).__name__ == "Fp4Linear"
    cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=48, num_experts=E, num_experts_per_tok=TOP_K)
    narrow = _Block(Qwen3MoeExperts(cfg))  # K = 48 of down_proj: not whole MXFP4 blocks of 32
    with pytest.raises(NotImplementedError, match=r"experts: Qwen3MoeExperts.down_proj: input width K = 48"):
        quantize_model(narrow, FP4_SCHEMES["mxfp4"])
    assert type(narrow.proj) is torch.nn.Linear and narrow.experts.down_proj.dtype == torch.float32  # untouched
    own = _Block(_qwen3())
    own.experts.not_quantizable_reason = "a module with its own float forward"
    with pytest.raises(NotImplementedError, match="its own float forward"):
        quantize_model(own, FP4_SCHEMES["nvfp4"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("layout", ["gpt_oss", "qwen3"])
def test_grouped_path_matches_the_reference_on_cuda(layout, scheme):
    _, q = _quantized(_gpt_oss if layout == "gpt_oss" else _qwen3, scheme)
    q = q.cuda()
    x, idx, w = (t.cuda() for t in _inputs())
    xb = x.bfloat16()
    want = fp4_experts_forward(q, xb, idx, w.bfloat16())
    got = grouped_quantized_experts_forward(q, xb, idx, w.bfloat16())
    assert got.dtype == torch.bfloat16 and _rel(got, want) < 2e-2
    static = [xb.clone(), idx.clone(), w.bfloat16().clone()]
    grouped_fp4_experts_forward(q, *static)  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = grouped_fp4_experts_forward(q, *static)
    graph.replay()
    assert torch.equal(out, got)


# --- whole cells ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("model,quant,graph", [("qwen3-30b-a3b", "nvfp4", "piecewise"), ("mixtral-8x7b", "mxfp4", "breakable"),
                                               ("gpt-oss-120b", "mxfp4", "piecewise"), ("gpt-oss-120b", "fp4", "breakable")])
def test_synthetic_fp4_moe_cells_pass(model, quant, graph):
    from harness.cell.run import CellSpec, run_cell
    from harness.outcome import Status

    out = run_cell(CellSpec(model, tiny=True, weights="synthetic", quant=quant, graph=graph, max_tokens=64, max_new_tokens=2))
    assert out.status == Status.PASS, out.reason
    assert out.metrics.quant.quant_layers == 10 and out.metrics.quant.quant_logprob_diff > 0  # 4 linears + the experts, 2 layers


def test_a_width_the_mxfp4_blocks_do_not_divide_is_an_unsupported_cell():
    from harness.cell.run import CellSpec, run_cell
    from harness.outcome import Status

    out = run_cell(CellSpec("qwen3-30b-a3b", tiny=True, weights="synthetic", quant="mxfp4", max_tokens=64, max_new_tokens=2))
    assert out.status == Status.UNSUPPORTED and "K = 48 is not a multiple of the mxfp4 block 32" in out.reason
