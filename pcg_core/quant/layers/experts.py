"""Quantized MoE experts: transformers' fused expert tensors ([E, 2I, H] gate_up, [E, H, I] down) held quantized,
and two forwards over them.

The weights are quantized per expert with the scheme's granularity (a per-tensor scale per expert and
projection, per channel, or 128×128 blocks), always in the canonical [E, N out, K in] orientation a linear layer
has (expert_layout.py): gpt-oss's transposed [E, K, N] experts are turned first, so blocks and int4 groups run
along the input; their biases stay float parameters, added after each projection (float32 in the reference, the
activations' dtype in the grouped path, as fp4_experts.py and transformers' grouped path add them), and gate/up
stay in the module's row order for its own `_apply_gate` (gpt-oss's interleaved, clamped swiglu). Both forwards
quantize the activations as the scheme does before each projection (per token and per 128-group scales are per
row, so routing rows apart changes nothing) and are static-shape and sync-free, hence capturable:
- `quantized_experts_forward`, the reference (every device): the dense path of pcg_core.model.experts, every
  expert on every token weighted by its routing weight, weights dequantized in float32;
- `grouped_quantized_experts_forward` (CUDA): rows sorted by expert and two grouped GEMMs over the weights
  dequantized to the activations' dtype, as transformers' grouped_mm path runs a 16-bit model. Each token
  only meets its own experts; moe_gemm's grouped kernel reads the codes as held (no 16-bit copy per forward),
  or, where it does not take the layout (moe_gemm.takes) or is switched off, the weights are dequantized chunk by
  chunk of experts into the 16-bit operand (expert_layout.dequantize_by_chunks: float32 temporaries one chunk's).
int4 experts take the same two forwards with the weights dequantized from the canonical int4 layout (act-order
undone in the weight, not applied to the rows): weight-only ones (awq, gptq) with the activations left in 16 bits,
W4A8 ones (w4a8, w4afp8: the scheme's `activations`) with each projection's input quantized per token to int8 or
FP8 first, exactly as W4A8Linear's pcg::w4a8_linear does (w4a8.quantize_act): per-token scales are per row, so
the grouped path's sorted rows quantize as the reference's do.
FP4 experts (either layout, gpt-oss's biased, transposed ones too) are fp4_experts.py's; both forwards here hand
them over, so every caller of these forwards runs them right.
"""

from __future__ import annotations

from typing import cast

import torch

import pcg_core.quant.kernels.moe_gemm as moe_gemm
from pcg_core.quant.layers.expert_layout import (add_bias, add_rows, canonical_weight, dequantize_by_chunks, expert_count,
                                                 expert_rows, first_projection, gate, held_scheme, in_out, rows_of)
from pcg_core.quant.schemes.fp4 import Fp4Scheme
from pcg_core.quant.layers.fp4_experts import (fp4_dequantized, fp4_expert_weights, fp4_experts_forward,
                                        grouped_fp4_experts_forward)
from pcg_core.quant.schemes.int4 import Int4Scheme, Int4Weight, pack_nibbles, quantize_int4_ordered, unpack_nibbles
from pcg_core.quant.schemes.w8a8 import (BLOCK, Scheme, expand_activation_scale, quantize_activation,
                                    quantize_weight, weight_scale_shape)
from pcg_core.quant.kernels.w4a8_gemm import quantize_act

PROJECTIONS = ("gate_up_proj", "up_proj", "down_proj")


def is_experts(module: torch.nn.Module) -> bool:
    """transformers' fused experts module: 3-D expert weights, one row block per expert."""
    w = getattr(module, "down_proj", None)
    return isinstance(w, torch.Tensor) and w.dim() == 3 and hasattr(module, "num_experts")


def quantize_experts(module: torch.nn.Module, scheme: Scheme | Int4Scheme, input_absmax: dict[str, float] | None = None) -> None:
    """Replace the module's expert weights by quantized buffers (same names) and `<name>_scale` beside them; a
    static scheme also gets `<name>_input_scale` from the calibrated absmax (keys "gate_up"/"down", the inputs
    of the first and the second projection, over all experts). int4: see quantize_experts_int4."""
    check_quantizable(module)
    if isinstance(scheme, Int4Scheme):
        quantize_experts_int4(module, scheme)
        return
    for name in PROJECTIONS:
        w = getattr(module, name, None)
        if not isinstance(w, torch.Tensor):
            continue
        experts, (n, k) = w.shape[0], in_out(module, name)
        q = torch.empty(experts, n, k, dtype=scheme.qdtype, device=w.device)  # filled expert by expert: no list
        scale = torch.empty(experts, *weight_scale_shape(scheme, n, k), device=w.device)  # of copies to stack
        for e in range(experts):
            q[e], scale[e] = quantize_weight(canonical_weight(module, name, e), scheme)
        input_scale = None
        if not scheme.act_dynamic:
            key = "down" if name == "down_proj" else "gate_up"
            if input_absmax is None or key not in input_absmax:
                raise ValueError(f"{scheme.name} has static activation scales: calibrate the experts' {key} input first")
            input_scale = torch.tensor(max(input_absmax[key], 1e-6) / scheme.qmax)
        install(module, scheme, name, q, scale, input_scale)


def quantizable(module: torch.nn.Module) -> bool:
    """Whether the experts are ones this module quantizes: either layout ([E, N, K], or transposed), with or
    without biases, but no norm after each expert and no forward of its own that would read quantized buffers
    as floats (`not_quantizable_reason`)."""
    return not (getattr(module, "not_quantizable_reason", None) or getattr(module, "has_post_expert_norm", False))


def check_quantizable(module: torch.nn.Module) -> None:
    if not quantizable(module):
        raise NotImplementedError(getattr(module, "not_quantizable_reason", None) or
                                  f"{type(module).__name__}: a norm after each expert is not in the quantized experts' "
                                  f"forwards yet")


def install(module: torch.nn.Module, scheme: Scheme, name: str, q: torch.Tensor, scale: torch.Tensor,
            input_scale: torch.Tensor | None) -> None:
    """Projection `name`'s weights become quantized buffers: q [E, N, K] under the parameter's name, its scales
    as `<name>_scale`, a static scheme's activation scale as `<name>_input_scale` (one for all experts)."""
    dev = getattr(module, name).device
    module._parameters.pop(name, None)
    module.register_buffer(name, q.to(dev))
    module.register_buffer(f"{name}_scale", scale.float().to(dev))
    if not scheme.act_dynamic:
        assert input_scale is not None, f"{scheme.name} has static activation scales: pass input_scale"
        module.register_buffer(f"{name}_input_scale", input_scale.float().reshape(()).to(dev))
    setattr(module, "quant_scheme", scheme)


# int4 experts: weight-only (awq, gptq) and W4A8 (w4a8, w4afp8) -----------------------------------------------
def quantize_experts_int4(module: torch.nn.Module, scheme: Int4Scheme) -> None:
    """Each expert's projection quantized as an int4 linear is (its own groups, zeros and act-order), held in the
    canonical layout stacked over experts: `<name>` int32 [E, N, K/8] (codes packed along K), `<name>_scales`
    and `<name>_zeros` float32 [E, N, K/G], `<name>_perm` [E, K] with act-order. Transposed experts are turned
    first (expert_layout.canonical_weight), so the groups run along K, the input."""
    check_quantizable(module)
    for name in PROJECTIONS:
        w = getattr(module, name, None)
        if not isinstance(w, torch.Tensor):
            continue
        experts, (n, k) = w.shape[0], in_out(module, name)
        group = scheme.group_for(k)
        # expert by expert into the packed buffers: no list of every expert's unpacked codes to stack
        packed = torch.empty(experts, n, k // 8, dtype=torch.int32, device=w.device)
        scales = torch.empty(experts, n, k // group, device=w.device)
        zeros = torch.empty_like(scales)
        perm = torch.empty(experts, k, dtype=torch.int64, device=w.device) if scheme.act_order else None
        for e in range(experts):
            q = quantize_int4_ordered(canonical_weight(module, name, e), group, scheme.sym, scheme.act_order)
            packed[e], scales[e], zeros[e] = pack_nibbles(q.q, 1), q.scales, q.zeros
            if perm is not None:
                assert q.perm is not None  # quantized with act_order
                perm[e] = q.perm
        _register_int4(module, scheme, name, packed, scales, zeros, perm, group)


def install_int4(module: torch.nn.Module, scheme: Int4Scheme, name: str, weights: list[Int4Weight]) -> None:
    """Projection `name` held as its experts' canonical int4 weights (one group for all): `<name>` int32
    [E, N, K/8], `<name>_scales`/`<name>_zeros` [E, N, K/G], `<name>_perm` with act-order: [E, K], or [E, S, K]
    when the N rows are S shards with a permutation each (a checkpoint's gate and up fused). The scheme, set as
    `quant_scheme`, tells the forwards the activations: its `activations` (None, "int8" or "fp8"); a per-token
    scale does not depend on K's order, so act-order stays undone in the weight for W4A8 too."""
    perms = [w.perm for w in weights]  # one group for all: every expert's perm, or none
    _register_int4(module, scheme, name, torch.stack([pack_nibbles(w.q, 1) for w in weights]),
                   torch.stack([w.scales for w in weights]), torch.stack([w.zeros for w in weights]),
                   None if perms[0] is None else torch.stack(cast(list[torch.Tensor], perms)), weights[0].group)


def _register_int4(module: torch.nn.Module, scheme: Int4Scheme, name: str, packed: torch.Tensor, scales: torch.Tensor,
                   zeros: torch.Tensor, perm: torch.Tensor | None, group: int) -> None:
    dev = getattr(module, name).device
    module._parameters.pop(name, None)
    module.register_buffer(name, packed.to(dev))
    module.register_buffer(f"{name}_scales", scales.to(dev))
    module.register_buffer(f"{name}_zeros", zeros.to(dev))
    module.register_buffer(f"{name}_perm", None if perm is None else perm.to(dev))
    setattr(module, f"{name}_group", group)
    setattr(module, "quant_scheme", scheme)


def _int4_dequantized(module: torch.nn.Module, name: str, dtype: torch.dtype, e: int | slice | None = None) -> torch.Tensor:
    """Expert e's (or a slice of experts', or every expert's: [E, N, K]) weight of projection `name` dequantized in
    the checkpoint's own K order (act-order's permutation undone, so the activation is not permuted): sync-free
    elementwise work."""
    sel = slice(None) if e is None else e
    q, scales, zeros = (getattr(module, f"{name}{suffix}")[sel] for suffix in ("", "_scales", "_zeros"))
    group = getattr(module, f"{name}_group")
    w = (unpack_nibbles(q, -1).float() - zeros.repeat_interleave(group, -1)) * scales.repeat_interleave(group, -1)
    perm = getattr(module, f"{name}_perm")
    if perm is not None:  # column j of the stored weight is input channel perm[j] (of its row shard)
        perm = perm[sel]
        shards = perm.shape[-2] if perm.dim() == w.dim() else 1
        view = w.unflatten(-2, (shards, -1))  # [..., S, N/S, K]
        index = (perm if perm.dim() == w.dim() else perm.unsqueeze(-2)).unsqueeze(-2).expand_as(view)
        w = torch.empty_like(view).scatter_(-1, index, view).flatten(-3, -2)
    return w.to(dtype)


def _is_int4(module: torch.nn.Module) -> bool:
    """int4 experts (install_int4's canonical buffers), weight-only or W4A8 alike."""
    return isinstance(held_scheme(module), Int4Scheme)


def _int4_activation(x: torch.Tensor, module: torch.nn.Module) -> torch.Tensor:
    """x [T, K] as int4 experts' projections take it, in float32: a W4A8 scheme's per-token 8-bit quantization
    (`activations`: "int8" or "fp8") multiplied back by its scale, as pcg::w4a8_linear's reference does; a
    weight-only scheme's x as it is."""
    scheme = held_scheme(module)
    assert isinstance(scheme, Int4Scheme)  # int4 experts only (_is_int4)
    act = scheme.activations
    if act is None:
        return x.float()
    xq, sx = quantize_act(x, act)
    return xq.float() * sx


def _project(x: torch.Tensor, module: torch.nn.Module, name: str, e: int, k: slice = slice(None)) -> torch.Tensor:
    """x [T, K] through expert e's projection `name` (expert_weight, float32), activations quantized as the scheme
    does (float32 out); `k`: the weight's input columns x holds (a row-parallel shard's)."""
    w = expert_weight(module, name, e)[:, k]
    if _is_int4(module):
        return _int4_activation(x, module) @ w.t()
    scheme = held_scheme(module)
    assert isinstance(scheme, Scheme)  # 8-bit: FP4 experts never get here (quantized_experts_forward hands them over)
    xq, sx = quantize_activation(x, scheme, getattr(module, f"{name}_input_scale", None))
    return (xq.float() * expand_activation_scale(sx, x.shape[-1])) @ w.t()


def quantized_experts_forward(module: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                              top_k_weights: torch.Tensor, routed: bool = False) -> torch.Tensor:
    """The reference: every expert on every token weighted by its routing weight (0 where not routed), each
    projection in float32 (_project) plus its bias, the module's own gate or activation in the input dtype.
    `routed`: only the routed experts on their routed rows, the same numbers (expert_rows; eager only)."""
    if isinstance(held_scheme(module), Fp4Scheme):  # FP4 experts hold their own layout (fp4_experts.py)
        return fp4_experts_forward(module, hidden_states, top_k_index, top_k_weights, routed)
    first, gated = first_projection(module)
    # `row_shards` (pcg_core.distributed.quant_experts.emulate_expert_row_shards): the down projection's input rounded
    # per K slice and each slice's partial sum taken to the model's dtype before they are added, as that many
    # row-parallel ranks compute it
    parts = getattr(module, "row_shards", 1)
    outs = [torch.zeros_like(hidden_states, dtype=torch.float32) for _ in range(parts)]
    for e, rows, weight in expert_rows(module, top_k_index, top_k_weights, routed):
        x = rows_of(hidden_states, rows)
        h = add_bias(_project(x, module, first, e), module, first, e).to(hidden_states.dtype)
        proj = gate(module, h, gated)
        step = proj.shape[-1] // parts
        for r in range(parts):
            k = slice(r * step, (r + 1) * step) if parts > 1 else slice(None)
            down = _project(proj[:, k], module, "down_proj", e, k)
            add_rows(outs[r], rows, (add_bias(down, module, "down_proj", e) if r == 0 else down) * weight.float())
    out = outs[0].to(hidden_states.dtype)
    for partial in outs[1:]:
        out = out + partial.to(hidden_states.dtype)
    return out


def _fake_quant(x: torch.Tensor, module: torch.nn.Module, name: str) -> torch.Tensor:
    """x [S, K] quantized as the scheme does before projection `name` and dequantized again, in x's dtype."""
    scheme = held_scheme(module)
    if isinstance(scheme, Int4Scheme):  # _is_int4
        return x if scheme.activations is None else _int4_activation(x, module).to(x.dtype)
    assert isinstance(scheme, Scheme)  # 8-bit: FP4 experts never get here (grouped_quantized_experts_forward hands them over)
    xq, sx = quantize_activation(x, scheme, getattr(module, f"{name}_input_scale", None))
    return (xq.float() * expand_activation_scale(sx, x.shape[-1])).to(x.dtype)


def _all_dequantized(module: torch.nn.Module, name: str, dtype: torch.dtype) -> torch.Tensor:
    """Every expert's weight of projection `name` dequantized: [E, N, K] in `dtype`, by chunks of experts
    (expert_layout.dequantize_by_chunks: float32 temporaries of one chunk at a time)."""
    q = getattr(module, name)
    e, n = q.shape[:2]
    if _is_int4(module):
        k = q.shape[2] * 8  # codes packed 8 per int32 along K
        return dequantize_by_chunks(lambda sel: _int4_dequantized(module, name, dtype, sel), e, n, k, dtype, q.device)
    return dequantize_by_chunks(lambda sel: _8bit_dequantized(module, name, dtype, sel), e, n, q.shape[2], dtype,
                                q.device)


def _8bit_dequantized(module: torch.nn.Module, name: str, dtype: torch.dtype, sel: slice) -> torch.Tensor:
    """The experts `sel`'s weights of projection `name` (8-bit schemes) dequantized: [C, N, K] in `dtype`, the
    float32 product of code and scale rounded once."""
    s = held_scheme(module)
    assert isinstance(s, Scheme)  # 8-bit experts only (_all_dequantized, expert_weight)
    q, scale = getattr(module, name)[sel], getattr(module, f"{name}_scale")[sel].float()
    if s.weights == "block":
        e, n, k = q.shape
        scale = scale.repeat_interleave(BLOCK, 1).repeat_interleave(BLOCK, 2)[:, :n, :k]
    elif s.weights == "tensor":
        scale = scale.view(-1, 1, 1)
    return (q.float() * scale).to(dtype)  # channel scales are [E, N, 1] already


def dequantized_experts_weight(module: torch.nn.Module, name: str, dtype: torch.dtype) -> torch.Tensor:
    """Every expert's weight of projection `name` as the float module held it (its own layout: transposed experts
    turned back), dequantized (the dequantize-then-`_grouped_mm` path's operand, in the tests and benchmarks)."""
    if isinstance(held_scheme(module), Fp4Scheme):
        w = fp4_dequantized(module, name, dtype)
    else:
        w = _all_dequantized(module, name, dtype)
    return w.transpose(1, 2).contiguous() if getattr(module, "is_transposed", False) else w


def expert_weight(module: torch.nn.Module, name: str, e: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Expert e's canonical weight [N, K] of projection `name` dequantized (8-bit, int4 or FP4), in `dtype`."""
    if isinstance(held_scheme(module), Fp4Scheme):
        return fp4_dequantized(module, name, dtype, e)
    if _is_int4(module):
        return _int4_dequantized(module, name, dtype, e)
    return _8bit_dequantized(module, name, dtype, slice(e, e + 1))[0]


def expert_weights(module: torch.nn.Module, name: str) -> moe_gemm.ExpertWeights:
    """Projection `name` of 8-bit, int4 or FP4 experts as moe_gemm reads them."""
    scheme = held_scheme(module)
    if isinstance(scheme, Int4Scheme):
        return moe_gemm.ExpertWeights("int4", getattr(module, name), getattr(module, f"{name}_scales"), "none",
                                      getattr(module, f"{name}_zeros"), getattr(module, f"{name}_group"),
                                      getattr(module, f"{name}_perm"))
    if isinstance(scheme, Scheme):
        return moe_gemm.ExpertWeights("8bit", getattr(module, name), getattr(module, f"{name}_scale"), scheme.weights)
    return fp4_expert_weights(module, name)


def grouped_quantized_experts_forward(module: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                                      top_k_weights: torch.Tensor) -> torch.Tensor:
    if isinstance(held_scheme(module), Fp4Scheme):
        return grouped_fp4_experts_forward(module, hidden_states, top_k_index, top_k_weights)
    top_k = top_k_index.shape[-1]
    expert_ids, order = torch.sort(top_k_index.reshape(-1), stable=True)  # stable: one row order on every run
    rows = hidden_states[order // top_k]  # [S, H], S = tokens × top_k, grouped by expert
    counts = torch.histc(expert_ids.float() if rows.device.type == "cpu" else expert_ids.int(), bins=expert_count(module),
                         min=0, max=expert_count(module) - 1)
    offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    first, gated = first_projection(module)
    proj = moe_gemm.project(_fake_quant(rows, module, first), counts, offsets, lambda: expert_weights(module, first),
                            lambda: _all_dequantized(module, first, rows.dtype))
    proj = add_bias(proj, module, first, expert_ids)  # each row's expert's bias: a gather, static shapes
    proj = gate(module, proj, gated)
    out = moe_gemm.project(_fake_quant(proj, module, "down_proj"), counts, offsets,
                           lambda: expert_weights(module, "down_proj"),
                           lambda: _all_dequantized(module, "down_proj", rows.dtype))
    out = add_bias(out, module, "down_proj", expert_ids)
    out = out.float() * top_k_weights.reshape(-1)[order, None].float()
    unsorted = torch.empty_like(out).index_copy_(0, order, out)  # a permutation: every row written once
    return unsorted.view(-1, top_k, out.shape[-1]).sum(dim=1).to(hidden_states.dtype)


def intermediate_absmax(module: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor) -> float:
    """Largest |input| of the down projection over the tokens each float expert is routed (either layout, bias
    added): its calibration."""
    first, gated = first_projection(module)
    worst = 0.0
    for e in range(expert_count(module)):
        rows = (top_k_index == e).any(dim=-1)
        if not bool(rows.any()):
            continue
        h = add_bias(torch.nn.functional.linear(hidden_states[rows], canonical_weight(module, first, e)), module, first, e)
        proj = gate(module, h, gated)
        worst = max(worst, float(proj.abs().max()))
    return worst
