"""pcg_core/quant/schemes/fp4.py: the FP4 packings against hand-worked known answers, bit-exact round trips into the canonical
layout, the reference quantizers' error bound, and two outside oracles that read and write the same bytes:

- compressed-tensors 0.20.1 (CPU): `NVFP4PackedCompressor.compress/decompress` (its CPU fallbacks; the Triton
  kernels it prefers need a GPU), `pack_fp4_to_uint8` / `unpack_fp4_from_uint8`, and `ModelOptNvfp4Converter.process`
  (ModelOpt → compressed-tensors renaming, which inverts weight_scale_2), the last an independent statement of the
  ModelOpt convention. Its decompress returns bf16, so that comparison is our W rounded to bf16.
- transformers: `integrations.mxfp4._convert_moe_packed_tensors` (gpt-oss's dequantizer) and `GptOssExperts`'
  eager forward, which splits gate/up as [..., ::2] / [..., 1::2] of the (E, in, out) parameter.

Planted faults (nibbles swapped, the global-scale convention flipped, e8m0's bias off by one, the gate/up interleave
undone) are written into our bytes as a faulty packer would write them, and the same oracle check must then fail.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pcg_core.errors import ConfigError
from pcg_core.quant.layers.fp4_linear import Fp4Linear
from pcg_core.quant.schemes.fp4 import (E2M1_VALUES, MXFP4_BLOCK, NVFP4_BLOCK, Fp4Weight, ct_nvfp4_pack,
                                        ct_nvfp4_unpack, e2m1_decode, e2m1_encode, e8m0_decode, e8m0_encode,
                                        interleave_gate_up, modelopt_nvfp4_pack, modelopt_nvfp4_unpack,
                                        mxfp4_experts_pack, mxfp4_experts_unpack, mxfp4_experts_weight, pack_e2m1,
                                        quantize_mxfp4, quantize_nvfp4, split_gate_up, unpack_e2m1)


def _ct() -> SimpleNamespace:
    """compressed-tensors' pieces the oracles use (a dev dependency: skip without it)."""
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.nvfp4 import helpers
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import (
        ModelOptNvfp4Converter,
    )
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from compressed_tensors.quantization.quant_scheme import NVFP4A16
    return SimpleNamespace(compressor=NVFP4PackedCompressor, helpers=helpers, modelopt=ModelOptNvfp4Converter,
                           dequantize=dequantize, scheme=QuantizationScheme(targets=["Linear"], **NVFP4A16))


# one NVFP4 block, worked by hand: byte j = (code 2j+1) << 4 | code 2j; code bit 3 = sign, bits 0..2 index
# 0, .5, 1, 1.5, 2, 3, 4, 6
ROW = [0x21, 0x8F, 0x7A, 0x53, 0xC4, 0xE6, 0xD9, 0x0B]
ROW_CODES = [1, 2, 15, 8, 10, 7, 3, 5, 4, 12, 6, 14, 9, 13, 11, 0]
ROW_VALUES = [0.5, 1.0, -6.0, -0.0, -1.0, 6.0, 1.5, 3.0, 2.0, -2.0, 4.0, -4.0, -0.5, -3.0, -1.5, 0.0]


def _w(*shape, seed=0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- known answers -----------------------------------------------------------------------------------------------


def test_e2m1_values_and_nibble_order():
    packed = torch.tensor([ROW], dtype=torch.uint8)
    assert unpack_e2m1(packed).tolist() == [ROW_CODES]
    vals = e2m1_decode(unpack_e2m1(packed))
    assert vals.tolist() == [ROW_VALUES]
    assert torch.signbit(vals[0, 3]) and not torch.signbit(vals[0, 15])  # code 8 is −0, code 0 is +0
    assert pack_e2m1(torch.tensor([ROW_CODES], dtype=torch.uint8)).tolist() == [ROW]
    assert len(E2M1_VALUES) == 16 and E2M1_VALUES[7] == 6.0 and E2M1_VALUES[15] == -6.0


def test_e2m1_rounds_to_nearest_with_ties_to_even_codes():
    y = torch.tensor([0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.01, 100.0, -0.1, -0.75, 0.0])
    # ties: .25→0, .75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4 (the even code); past 6 saturates; −0.1 → −0 (code 8)
    assert e2m1_encode(y).tolist() == [0, 1, 2, 2, 4, 4, 6, 6, 7, 7, 8, 10, 0]
    every = torch.tensor(E2M1_VALUES)
    assert torch.equal(e2m1_decode(e2m1_encode(every)), every) and e2m1_encode(every).tolist() == list(range(16))


def test_e8m0_is_two_to_the_s_minus_127():
    assert e8m0_decode(torch.tensor([127, 128, 126, 0, 254], dtype=torch.uint8)).tolist() == [1.0, 2.0, 0.5, 2.0**-127, 2.0**127]
    every = torch.arange(255, dtype=torch.uint8)
    assert e8m0_decode(every).tolist() == [2.0 ** (s - 127) for s in range(255)]
    assert torch.equal(e8m0_encode(e8m0_decode(every)), every)
    with pytest.raises(ValueError, match="powers of two"):
        e8m0_encode(torch.tensor([3.0]))


def test_modelopt_multiplies_and_compressed_tensors_divides_by_the_global():
    weight = torch.tensor([ROW], dtype=torch.uint8)
    scale = torch.tensor([[2.0]]).to(torch.float8_e4m3fn)
    assert scale.view(torch.uint8).item() == 0x40  # e4m3fn 2.0: exponent field 8 (bias 7), mantissa 0
    want = torch.tensor([ROW_VALUES]) * 0.5
    mo = modelopt_nvfp4_unpack(weight, scale, torch.tensor(0.25), input_scale=torch.tensor(3.0))
    assert mo.global_scale == 0.25 and torch.equal(mo.dequantize(), want)  # 2 · 0.25
    assert torch.signbit(mo.dequantize()[0, 3])
    ct = ct_nvfp4_unpack(weight, scale, torch.tensor([4.0]))
    assert ct.global_scale == 0.25 and torch.equal(ct.dequantize(), want)  # 2 / 4
    # the same number read in the other convention is 16× off: the conventions are not interchangeable
    assert torch.equal(modelopt_nvfp4_unpack(weight, scale, torch.tensor(4.0)).dequantize(), want * 16)
    # input_scale (W4A4's activation scale) is validated but never applied: W4A16 on Hopper
    assert torch.equal(modelopt_nvfp4_unpack(weight, scale, torch.tensor(0.25), torch.tensor(100.0)).dequantize(), want)


def test_gpt_oss_blocks_known_answer():
    blocks = torch.zeros(1, 2, 1, 16, dtype=torch.uint8)
    blocks[0, 0, 0, 0] = 0x21  # row 0: k0 = 0.5, k1 = 1.0
    blocks[0, 1, 0, 15] = 0xF9  # row 1: k30 = −0.5, k31 = −6.0
    scales = torch.tensor([[[128], [126]]], dtype=torch.uint8)  # 2^1 and 2^-1
    out = mxfp4_experts_unpack(blocks, scales, "down_proj")
    assert out.shape == (1, 32, 2)  # (E, in = C, out = R): transformers' GptOssExperts layout
    want = torch.zeros(1, 32, 2)
    want[0, 0, 0], want[0, 1, 0], want[0, 30, 1], want[0, 31, 1] = 1.0, 2.0, -0.25, -3.0
    assert torch.equal(out, want)


# --- round trips and the quantizers' error ------------------------------------------------------------------------


def _half_step(w: torch.Tensor, q: Fp4Weight) -> torch.Tensor:
    """Half the e2m1 gap around each element, in weight units: .25, .5 and 1 times the block scale below 2, 4, 6."""
    eff = q.scales.repeat_interleave(q.block, -1) * (q.global_scale or 1.0)
    y = w.abs() / eff.clamp_min(1e-30)
    return torch.where(y <= 2, 0.25, torch.where(y <= 4, 0.5, 1.0)) * eff


@pytest.mark.parametrize("fmt", ["modelopt", "ct", "mxfp4"])
def test_quantize_pack_unpack_dequantize_is_exact(fmt):
    if fmt == "mxfp4":
        w = _w(3, 64, 96)  # (E, R, C)
        q = quantize_mxfp4(w)
        blocks, scales = mxfp4_experts_pack(q)
        assert blocks.shape == (3, 64, 3, 16) and scales.shape == (3, 64, 3)
        back = mxfp4_experts_weight(blocks, scales)
        assert torch.equal(mxfp4_experts_pack(back)[0], blocks) and torch.equal(mxfp4_experts_pack(back)[1], scales)
        assert torch.equal(mxfp4_experts_unpack(blocks, scales), q.dequantize().transpose(1, 2))
    else:
        w = _w(48, 128)
        q = quantize_nvfp4(w)
        pack, unpack = (modelopt_nvfp4_pack, modelopt_nvfp4_unpack) if fmt == "modelopt" else (ct_nvfp4_pack, ct_nvfp4_unpack)
        t = pack(q)
        assert t["weight" if fmt == "modelopt" else "weight_packed"].shape == (48, 64)
        assert t["weight_scale"].dtype == torch.float8_e4m3fn and t["weight_scale"].shape == (48, 8)
        back = unpack(*t.values())
        assert back.global_scale == q.global_scale and all(torch.equal(a, b) for a, b in zip(pack(back).values(), t.values()))
    assert torch.equal(back.codes, q.codes) and torch.equal(back.dequantize(), q.dequantize())


@pytest.mark.parametrize("quantize", [quantize_nvfp4, quantize_mxfp4])
def test_reference_quantizers_stay_within_half_an_e2m1_step(quantize):
    w = _w(32, 256) * 3
    w[0, :32] = 0.0  # an all-zero block
    q = quantize(w)
    err = (q.dequantize() - w).abs()
    assert bool((err <= _half_step(w, q) * (1 + 1e-6)).all())
    assert float(err.norm() / w.norm()) < 0.12 and bool((q.dequantize()[0, :32] == 0).all())
    if quantize is quantize_nvfp4:
        assert torch.equal(q.scales.to(torch.float8_e4m3fn).float(), q.scales) and q.scales.max() <= 448
        g = q.global_scale
        assert g == 2.0 ** round(torch.log2(torch.tensor(g)).item())  # a power of two, see quantize_nvfp4
    else:
        assert torch.equal(e8m0_decode(e8m0_encode(q.scales)), q.scales)


# --- oracles -----------------------------------------------------------------------------------------------------


def _ct_reads(packed: dict[str, torch.Tensor], want: torch.Tensor) -> bool:
    """compressed-tensors' decompressor, fed these tensors, gives W (bf16, as it returns it)."""
    ct = _ct()
    out = ct.compressor.decompress(dict(packed), ct.scheme)["weight"]
    return torch.equal(out, want.to(out.dtype))


def _modelopt_reads(packed: dict[str, torch.Tensor], want: torch.Tensor) -> bool:
    """compressed-tensors' ModelOpt converter renames (and inverts weight_scale_2), then its decompressor reads."""
    named = _ct().modelopt(targets=["Linear"]).process({f"m.proj.{k}": v for k, v in packed.items()})
    return _ct_reads({k.rpartition(".")[2]: v for k, v in named.items() if "input" not in k}, want)


def _transformers_reads(blocks: torch.Tensor, scales: torch.Tensor, want: torch.Tensor) -> bool:
    from transformers.integrations.mxfp4 import _convert_moe_packed_tensors
    return torch.equal(_convert_moe_packed_tensors(blocks, scales, dtype=torch.float32), want)


def test_compressed_tensors_writes_what_we_read():
    w = _w(32, 64)
    q, ct = quantize_nvfp4(w), _ct()
    g = torch.tensor([1 / q.global_scale])  # a power of two: its reciprocal is exact
    theirs = ct.compressor.compress({"weight": w, "weight_scale": q.scales, "weight_global_scale": g}, ct.scheme)
    assert torch.equal(theirs["weight_packed"], ct_nvfp4_pack(q)["weight_packed"])  # byte for byte
    back = ct_nvfp4_unpack(theirs["weight_packed"], theirs["weight_scale"], theirs["weight_global_scale"])
    assert torch.equal(back.dequantize(), q.dequantize())


def test_compressed_tensors_reads_what_we_write():
    q, ct = quantize_nvfp4(_w(32, 64)), _ct()
    ours = ct_nvfp4_pack(q)
    theirs = ct.helpers.unpack_fp4_from_uint8(ours["weight_packed"], 32, 64, dtype=torch.float32)
    vals = e2m1_decode(q.codes)
    assert torch.equal(theirs, vals) and torch.equal(torch.signbit(theirs), torch.signbit(vals))
    assert torch.equal(ct.helpers.pack_fp4_to_uint8(vals), ours["weight_packed"])
    assert _ct_reads(ours, q.dequantize()) and _modelopt_reads(modelopt_nvfp4_pack(q, 0.5), q.dequantize())


def test_an_arbitrary_compressed_tensors_global_reads_to_an_ulp():
    """Real checkpoints' globals (448·6/amax, not a power of two) have no exact fp32 reciprocal: we multiply by
    fp32(1/g) where compressed-tensors divides by g, a relative difference of an ulp or two."""
    ct = _ct()
    from compressed_tensors.quantization.utils.helpers import generate_gparam
    w = _w(32, 64)
    g = generate_gparam(w.min(), w.max())
    assert g.item() != 2.0 ** round(torch.log2(g).item())
    s = (w.reshape(32, 4, 16).abs().amax(-1) / 6 * g).to(torch.float8_e4m3fn)
    theirs = ct.compressor.compress({"weight": w, "weight_scale": s.float(), "weight_global_scale": g}, ct.scheme)
    ref = ct.dequantize(ct.helpers.unpack_fp4_from_uint8(theirs["weight_packed"], 32, 64, dtype=torch.float32),
                        theirs["weight_scale"].float(), args=ct.scheme.weights, dtype=torch.float32, global_scale=g)
    ours = ct_nvfp4_unpack(theirs["weight_packed"], theirs["weight_scale"], g).dequantize()
    torch.testing.assert_close(ours, ref, rtol=5e-7, atol=0)


def test_transformers_dequantizes_our_gpt_oss_blocks_exactly():
    q = quantize_mxfp4(_w(2, 16, 64) * 5)
    blocks, scales = mxfp4_experts_pack(q)
    assert _transformers_reads(blocks, scales, mxfp4_experts_unpack(blocks, scales))
    _ct()
    from compressed_tensors.compressors.mx_utils import decompress_mx_scale
    s = torch.arange(1, 255, dtype=torch.uint8)
    assert torch.equal(decompress_mx_scale(s).float(), e8m0_decode(s))  # compressed-tensors' MX scale decoder agrees


def _gpt_oss_forward_matches(fault: str | None) -> bool:
    """transformers' GptOssExperts (eager) run on our dequantized blocks equals the gpt-oss MLP computed from the
    separate gate and up matrices we meant to store."""
    from transformers.models.gpt_oss.configuration_gpt_oss import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
    e, h, i = 2, 64, 32
    cfg = GptOssConfig(num_local_experts=e, hidden_size=h, intermediate_size=i)
    cfg._experts_implementation = "eager"
    gate, up, down = _w(e, i, h, seed=1), _w(e, i, h, seed=2), _w(e, h, i, seed=3)
    gate_b, up_b, down_b = _w(e, i, seed=4), _w(e, i, seed=5), _w(e, h, seed=6)
    rows = torch.cat((gate, up), 1) if fault == "gate_up_interleave_undone" else interleave_gate_up(gate, up)
    gu = quantize_mxfp4(rows)
    dq = quantize_mxfp4(down)
    experts = GptOssExperts(cfg)
    with torch.no_grad():
        experts.gate_up_proj.copy_(mxfp4_experts_unpack(*mxfp4_experts_pack(gu)))
        experts.gate_up_proj_bias.copy_(interleave_gate_up(gate_b[..., None], up_b[..., None])[..., 0])
        experts.down_proj.copy_(mxfp4_experts_unpack(*mxfp4_experts_pack(dq), name="down_proj"))
        experts.down_proj_bias.copy_(down_b)
        x = _w(6, h, seed=7)
        idx = torch.tensor([[0], [1], [1], [0], [1], [0]])
        got = experts(x, router_indices=idx, routing_weights=torch.ones(6, 1))
    g_ref, u_ref = split_gate_up(quantize_mxfp4(interleave_gate_up(gate, up)).dequantize().transpose(1, 2))
    want = torch.empty(6, h)
    for t in range(6):
        k = int(idx[t, 0])
        a = (x[t] @ g_ref[k] + gate_b[k]).clamp(max=cfg.swiglu_limit)
        b = (x[t] @ u_ref[k] + up_b[k]).clamp(-cfg.swiglu_limit, cfg.swiglu_limit)
        want[t] = ((b + 1) * a * torch.sigmoid(a * cfg.swiglu_alpha)) @ dq.dequantize()[k].t() + down_b[k]
    return torch.allclose(got, want, rtol=1e-4, atol=1e-4)


def test_gpt_oss_gate_and_up_are_interleaved_rows():
    assert _gpt_oss_forward_matches(None)  # transformers' own forward agrees with gate = even rows, up = odd
    gate, up = torch.zeros(1, 2, 3), torch.ones(1, 2, 3)
    rows = interleave_gate_up(gate, up)
    assert rows[0, :, 0].tolist() == [0, 1, 0, 1]
    assert all(torch.equal(a, b) for a, b in zip(split_gate_up(rows.transpose(1, 2)), (gate.transpose(1, 2), up.transpose(1, 2))))


# --- planted faults -----------------------------------------------------------------------------------------------


def _plant(family: str, fault: str | None) -> bool:
    """Run the oracle check of one format family, with the fault (if any) written into our bytes."""
    if family == "gpt_oss_mlp":
        return _gpt_oss_forward_matches(fault)
    if family == "mxfp4":
        q = quantize_mxfp4(_w(2, 8, 64))
        blocks, scales = mxfp4_experts_pack(q)
        if fault == "e8m0_bias_off_by_one":
            scales = scales + 1  # a packer using bias 128
        elif fault == "nibbles_swapped":
            blocks = (blocks << 4) | (blocks >> 4)
        return _transformers_reads(blocks, scales, q.dequantize().transpose(1, 2))
    q = quantize_nvfp4(_w(16, 64))
    assert q.global_scale != 1.0
    t = modelopt_nvfp4_pack(q) if family == "modelopt" else ct_nvfp4_pack(q)
    wname, gname = ("weight", "weight_scale_2") if family == "modelopt" else ("weight_packed", "weight_global_scale")
    if fault == "global_flipped":
        t[gname] = 1 / t[gname]  # a writer using the other format's convention (multiplier ↔ reciprocal)
    elif fault == "nibbles_swapped":
        t[wname] = (t[wname] << 4) | (t[wname] >> 4)
    return (_modelopt_reads if family == "modelopt" else _ct_reads)(t, q.dequantize())


@pytest.mark.parametrize("family, fault", [("ct", "nibbles_swapped"), ("modelopt", "nibbles_swapped"),
                                           ("mxfp4", "nibbles_swapped"), ("ct", "global_flipped"),
                                           ("modelopt", "global_flipped"), ("mxfp4", "e8m0_bias_off_by_one"),
                                           ("gpt_oss_mlp", "gate_up_interleave_undone")])
def test_planted_fault_is_caught(family, fault):
    assert _plant(family, None), f"the {family} check fails even without a fault"
    assert not _plant(family, fault), f"the {family} check did not notice {fault}"


# --- the module ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", [NVFP4_BLOCK, MXFP4_BLOCK])
def test_fp4_linear_is_the_dequantized_gemm(block):
    lin = torch.nn.Linear(64, 24, bias=True)
    mod = Fp4Linear.from_linear(lin, block)
    q = quantize_nvfp4(lin.weight.detach()) if block == NVFP4_BLOCK else quantize_mxfp4(lin.weight.detach())
    assert mod.weight_packed.shape == (24, 32) and mod.weight_scale.shape == (24, 64 // block)
    assert torch.equal(mod.dequantized_weight(), q.dequantize())
    back = mod.weight_fp4()
    assert torch.equal(back.codes, q.codes) and back.global_scale == q.global_scale
    x = _w(2, 3, 64)
    torch.testing.assert_close(mod(x), x @ q.dequantize().t() + lin.bias.detach(), rtol=1e-5, atol=1e-5)
    y = mod(x.to(torch.bfloat16))
    assert y.dtype == torch.bfloat16 and y.shape == (2, 3, 24)
    assert "e2m1" not in mod.state_dict() and set(mod.state_dict()) == {"weight_packed", "weight_scale", "global_scale", "bias"}


# --- bad input ---------------------------------------------------------------------------------------------------


def _nv():
    return ct_nvfp4_pack(quantize_nvfp4(_w(8, 32)))


def _mx():
    return mxfp4_experts_pack(quantize_mxfp4(_w(1, 4, 64)))


@pytest.mark.parametrize("call, match", [
    (lambda: modelopt_nvfp4_unpack(_nv()["weight_packed"].to(torch.int8), _nv()["weight_scale"], torch.tensor(1.0)),
     r"weight is torch.int8 \(8, 16\); expected uint8 \(N, K/2\)"),
    (lambda: modelopt_nvfp4_unpack(_nv()["weight_packed"], _nv()["weight_scale"].float(), torch.tensor(1.0)),
     r"weight_scale is torch.float32 \(8, 2\); expected torch.float8_e4m3fn \(8, 2\)"),
    (lambda: modelopt_nvfp4_unpack(_nv()["weight_packed"], _nv()["weight_scale"][:, :1], torch.tensor(1.0)),
     r"weight_scale is torch.float8_e4m3fn \(8, 1\); expected torch.float8_e4m3fn \(8, 2\)"),
    (lambda: modelopt_nvfp4_unpack(_nv()["weight_packed"], _nv()["weight_scale"], torch.tensor(1.0, dtype=torch.bfloat16)),
     r"weight_scale_2 is torch.bfloat16 \(\); expected a float32 scalar"),
    (lambda: modelopt_nvfp4_unpack(_nv()["weight_packed"], _nv()["weight_scale"], torch.tensor(1.0), torch.tensor(-1.0)),
     r"input_scale = -1.0; expected a finite positive scale"),
    (lambda: ct_nvfp4_unpack(_nv()["weight_packed"][:, :5], _nv()["weight_scale"], _nv()["weight_global_scale"]),
     r"weight_packed is torch.uint8 \(8, 5\); expected uint8 \(N, K/2\) with K a multiple of 16"),
    (lambda: ct_nvfp4_unpack(_nv()["weight_packed"], _nv()["weight_scale"], torch.ones(2)),
     r"weight_global_scale is torch.float32 \(2,\); expected a float32 scalar"),
    (lambda: mxfp4_experts_weight(_mx()[0][..., :8], _mx()[1]),
     r"gate_up_proj_blocks is torch.uint8 \(1, 4, 2, 8\); expected uint8 \(E, R, C/32, 16\)"),
    (lambda: mxfp4_experts_weight(_mx()[0], _mx()[1].to(torch.int32), name="down_proj"),
     r"down_proj_scales is torch.int32 \(1, 4, 2\); expected torch.uint8 \(1, 4, 2\)"),
    (lambda: mxfp4_experts_weight(_mx()[0], _mx()[1].index_fill(2, torch.tensor([1]), 255)),
     r"gate_up_proj_scales: e8m0 value 255 \(NaN\) in 4 block scale\(s\); expected 0..254"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises(ConfigError, match=match):
        call()
