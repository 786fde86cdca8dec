"""FP4 MoE experts (NVFP4, MXFP4): transformers' fused expert tensors held as e2m1 codes with block scales, and
the two forwards over them, as experts.py does for the 8-bit and int4 schemes.

Every projection is held in the canonical orientation [E, N out, K in], whatever the module's own layout:
- `<name>` uint8 [E, N, K/2]: codes two a byte along K, low nibble first (Fp4Linear's `weight_packed`);
- `<name>_scale` float32 [E, N, K/B]: block scales (e4m3 values for NVFP4, powers of two for MXFP4);
- `<name>_global` float32 [E, N] (NVFP4) or None (MXFP4): a multiplier per output row, so gate and up keep their
  own globals when a checkpoint stores them as two linears (ModelOpt, compressed-tensors); one value per expert
  and projection when quantized here.
W = (e2m1[code] · scale) · global, as Fp4Weight.dequantize. gpt-oss's experts (GptOssExperts: transposed [E, in,
out] weights, gate/up interleaved along out, biases, its clamped swiglu) are held the same way, transposed once at
quantization: its checkpoint rows ARE the canonical rows, and its `_apply_gate` reads the interleave as before.
Biases stay float parameters.

Both forwards dequantize (weight-only: activations stay 16-bit), are static-shape and sync-free, so capturable:
`fp4_experts_forward` (the reference, every device: each expert on every token in float32, weighted by its
routing weight) and `grouped_fp4_experts_forward` (rows sorted by expert, two torch._grouped_mm over weights
dequantized to the activations' dtype). experts.py's forwards dispatch here for an Fp4Scheme.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

import pcg_core.quant.kernels.moe_gemm as moe_gemm
from pcg_core.errors import UnsupportedModel
from pcg_core.quant.schemes.e2m1 import e2m1_table, pack_e2m1, unpack_e2m1
from pcg_core.quant.layers.expert_layout import (add_bias, add_rows, canonical_weight, dequantize_by_chunks, expert_count,
                                                 expert_rows, first_projection, gate, held_scheme, in_out, rows_of)
from pcg_core.quant.schemes.fp4 import (FP4_SCHEMES, MXFP4_BLOCK, NVFP4_BLOCK, Fp4Scheme, Fp4Weight, interleave_gate_up,
                                mxfp4_experts_pack, mxfp4_experts_weight,
                                quantize_mxfp4, quantize_nvfp4)

PROJECTIONS = ("gate_up_proj", "up_proj", "down_proj")
GPT_OSS_KEYS = ("gate_up_proj_blocks", "gate_up_proj_scales", "gate_up_proj_bias", "down_proj_blocks",
                "down_proj_scales", "down_proj_bias")


class Tensors(Protocol):
    """What a checkpoint reader offers (files.CheckpointTensors): `key in t` and `t.get(key)`."""

    def __contains__(self, key: str) -> bool: ...

    def get(self, key: str) -> torch.Tensor: ...


def _projections(module: torch.nn.Module) -> list[str]:
    return [n for n in PROJECTIONS if isinstance(getattr(module, n, None), torch.Tensor)]


def _is_fp4(module: torch.nn.Module) -> bool:
    return isinstance(getattr(module, "quant_scheme", None), Fp4Scheme)


def fp4_unsupported_reason(module: torch.nn.Module, scheme: Fp4Scheme) -> str | None:
    """Why this experts module cannot be held in `scheme`, or None: a forward of its own that would read the
    buffers as floats, a norm after each expert (not in these forwards), or an input width the blocks do not
    divide."""
    kind = type(module).__name__
    if why := getattr(module, "not_quantizable_reason", None):
        return why
    if getattr(module, "has_post_expert_norm", False):
        return f"{kind}: a norm after each expert is not in the FP4 experts' forwards yet"
    for name in _projections(module):
        n, k = in_out(module, name)
        if k % scheme.block:
            return (f"{kind}.{name}: input width K = {k} is not a multiple of the {scheme.name} block {scheme.block} "
                    f"(e2m1 codes share a scale over whole blocks)")
    return None


# --- holding ---------------------------------------------------------------------------------------------------


def quantize_fp4_expert(w: torch.Tensor, block: int) -> Fp4Weight:
    """The reference quantizer of one expert's canonical [N, K] weight: MXFP4 blockwise (no global), NVFP4 with
    the expert's own global (as a per-expert checkpoint has it)."""
    if block == MXFP4_BLOCK:
        return quantize_mxfp4(w)
    if block != NVFP4_BLOCK:
        raise ValueError(f"FP4 experts take blocks of {NVFP4_BLOCK} or {MXFP4_BLOCK}, not {block}")
    return quantize_nvfp4(w)


def _stack(ws: Sequence[Fp4Weight]) -> tuple[Fp4Weight, torch.Tensor | None]:
    """Per-expert weights (N, K) stacked to (E, N, K), their globals as rows [E, N] (None if none has one)."""
    if not ws or len({w.block for w in ws}) != 1 or len({tuple(w.codes.shape) for w in ws}) != 1:
        raise ValueError("per-expert FP4 weights must be as many as the experts, of one shape and one block")
    codes, scales = torch.stack([w.codes for w in ws]), torch.stack([w.scales for w in ws])
    n = codes.shape[1]
    if all(w.global_scale is None for w in ws):
        return Fp4Weight(codes, scales, ws[0].block), None
    g = torch.tensor([1.0 if w.global_scale is None else w.global_scale for w in ws], dtype=torch.float32)
    return Fp4Weight(codes, scales, ws[0].block), g[:, None].expand(-1, n).contiguous()


def install_fp4_projection(module: torch.nn.Module, name: str, w: Fp4Weight, global_rows: torch.Tensor | None,
                           scheme: Fp4Scheme) -> None:
    """Projection `name` becomes the canonical buffers (module docstring) from w (E, N, K) and its row globals."""
    if w.codes.dim() != 3 or w.block != scheme.block:
        raise ValueError(f"{name}: FP4 experts want (E, N, K) codes in blocks of {scheme.block}, got "
                         f"{tuple(w.codes.shape)} in blocks of {w.block}")
    if global_rows is not None and tuple(global_rows.shape) != tuple(w.codes.shape[:2]):
        raise ValueError(f"{name}: globals {tuple(global_rows.shape)} are not one per row {tuple(w.codes.shape[:2])}")
    _register(module, name, pack_e2m1(w.codes), w.scales, global_rows, scheme)


def _register(module: torch.nn.Module, name: str, packed: torch.Tensor, scales: torch.Tensor,
              global_rows: torch.Tensor | None, scheme: Fp4Scheme) -> None:
    dev = getattr(module, name).device
    module._parameters.pop(name, None)
    module.register_buffer(name, packed.to(dev))
    module.register_buffer(f"{name}_scale", scales.float().to(dev))
    module.register_buffer(f"{name}_global", None if global_rows is None else global_rows.float().to(dev))
    module.register_buffer("fp4_e2m1", e2m1_table(dev), persistent=False)
    setattr(module, "fp4_block", scheme.block)
    setattr(module, "quant_scheme", scheme)


def _check(module: torch.nn.Module, scheme: Fp4Scheme) -> None:
    if why := fp4_unsupported_reason(module, scheme):
        raise NotImplementedError(why)


def quantize_experts_fp4(module: torch.nn.Module, scheme: Fp4Scheme) -> None:
    """Quantize a float experts module in place, either layout ([E, N, K] Qwen3-MoE/Mixtral, or gpt-oss's
    transposed, biased, interleaved one): each projection by the reference quantizer of the scheme's block."""
    _check(module, scheme)
    for name in _projections(module):
        # expert by expert into the packed buffers: the whole projection in float32 (and the quantizer's
        # temporaries of it) was ~100 GB for DeepSeek-V3's 256 gate_up experts
        experts = getattr(module, name).shape[0]
        n, k = in_out(module, name)
        dev = getattr(module, name).device
        packed = torch.empty(experts, n, k // 2, dtype=torch.uint8, device=dev)
        scales = torch.empty(experts, n, k // scheme.block, device=dev)
        globs = []
        for e in range(experts):
            q = quantize_fp4_expert(canonical_weight(module, name, e).float(), scheme.block)
            packed[e], scales[e] = pack_e2m1(q.codes), q.scales
            globs.append(q.global_scale)
        glob = None if globs[0] is None else torch.tensor(globs, device=dev)[:, None].expand(-1, n).contiguous()
        _register(module, name, packed, scales, glob, scheme)


def install_fp4_experts(module: torch.nn.Module, scheme: Fp4Scheme, down: Sequence[Fp4Weight],
                        up: Sequence[Fp4Weight], gate: Sequence[Fp4Weight] | None = None) -> None:
    """A float experts module takes per-expert FP4 weights as a checkpoint stores them (ModelOpt's and
    compressed-tensors' `experts.<e>.{gate,up,down}_proj`, each unpacked by schemes/fp4.py into an (N, K) Fp4Weight):
    gate and up rows become the module's gate_up_proj (concatenated, or interleaved for gpt-oss's layout), each
    row keeping its linear's own global."""
    _check(module, scheme)
    e = expert_count(module)
    if any(len(ws) != e for ws in (down, up, *([gate] if gate is not None else []))):
        raise ValueError(f"{type(module).__name__}: expected {e} per-expert weights for every projection")
    parts: dict[str, tuple[Fp4Weight, torch.Tensor | None]] = {"down_proj": _stack(down)}
    if gate is not None:
        (g, gg), (u, ug) = _stack(gate), _stack(up)
        glob = None if gg is None and ug is None else \
            _gate_up(module, _ones_if_none(gg, g)[..., None], _ones_if_none(ug, u)[..., None])[..., 0]
        parts["gate_up_proj"] = (Fp4Weight(_gate_up(module, g.codes, u.codes), _gate_up(module, g.scales, u.scales),
                                           g.block), glob)
    else:
        parts["up_proj"] = _stack(up)
    for name, (w, _) in parts.items():  # every projection checked before any is replaced
        if not isinstance(getattr(module, name, None), torch.Tensor):
            raise ValueError(f"{type(module).__name__} has no {name}")
        if tuple(w.codes.shape[1:]) != in_out(module, name):
            raise ValueError(f"{type(module).__name__}.{name}: per-expert weights are {tuple(w.codes.shape[1:])} "
                             f"(N, K); the module's are {in_out(module, name)}")
    for name, (w, glob) in parts.items():
        install_fp4_projection(module, name, w, glob, scheme)


def _gate_up(module: torch.nn.Module, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate_up rows [E, 2I, …] in the module's order: gate then up (transformers' chunk), or interleaved (gpt-oss)."""
    if getattr(module, "is_concatenated", True):
        return torch.cat((gate, up), dim=1)
    return interleave_gate_up(gate, up)


def _ones_if_none(g: torch.Tensor | None, w: Fp4Weight) -> torch.Tensor:
    return torch.ones(w.codes.shape[:2]) if g is None else g


# --- gpt-oss's on-disk MXFP4 experts ---------------------------------------------------------------------------


def load_gpt_oss_mxfp4(module: torch.nn.Module, gate_up_blocks: torch.Tensor, gate_up_scales: torch.Tensor,
                       down_blocks: torch.Tensor, down_scales: torch.Tensor, gate_up_bias: torch.Tensor | None = None,
                       down_bias: torch.Tensor | None = None) -> None:
    """A float GptOssExperts takes its checkpoint's MXFP4 tensors (schemes/fp4.py's layout notes): the blocks' rows are
    the canonical rows (gate/up interleaved), so codes and e8m0 scales are held as stored. Biases (bf16 on disk)
    are copied into the module's float bias parameters."""
    scheme = FP4_SCHEMES["mxfp4"]
    _check(module, scheme)
    parts = []
    for name, blocks, scales, bias in (("gate_up_proj", gate_up_blocks, gate_up_scales, gate_up_bias),
                                       ("down_proj", down_blocks, down_scales, down_bias)):
        w = mxfp4_experts_weight(blocks, scales, name)
        want = (expert_count(module), *in_out(module, name))
        if tuple(w.codes.shape) != want:
            raise UnsupportedModel(f"gpt-oss MXFP4: {name}_blocks hold (E, R, C) = {tuple(w.codes.shape)}; the model "
                                   f"wants {want}")
        param = getattr(module, f"{name}_bias")
        if bias is not None and tuple(bias.shape) != tuple(param.shape):
            raise UnsupportedModel(f"gpt-oss MXFP4: {name}_bias is {tuple(bias.shape)}; expected {tuple(param.shape)}")
        parts.append((name, w, bias, param))
    for name, w, bias, param in parts:  # both checked before either is replaced
        if bias is not None:
            with torch.no_grad():
                param.copy_(bias.to(param.dtype))
        install_fp4_projection(module, name, w, None, scheme)


def read_gpt_oss_mxfp4(module: torch.nn.Module, tensors: Tensors, prefix: str) -> None:
    """load_gpt_oss_mxfp4 from a checkpoint reader (files.CheckpointTensors): `<prefix>gate_up_proj_blocks` …
    (prefix ends with "experts."). A missing tensor is an error naming it; the biases are required, as gpt-oss
    always stores them."""
    missing = [prefix + k for k in GPT_OSS_KEYS if prefix + k not in tensors]
    if missing:
        raise UnsupportedModel(f"gpt-oss MXFP4 experts: {', '.join(missing)} missing from the checkpoint")
    t = {k: tensors.get(prefix + k) for k in GPT_OSS_KEYS}
    load_gpt_oss_mxfp4(module, t["gate_up_proj_blocks"], t["gate_up_proj_scales"], t["down_proj_blocks"],
                       t["down_proj_scales"], t["gate_up_proj_bias"], t["down_proj_bias"])


def gpt_oss_mxfp4_tensors(module: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """The gpt-oss on-disk tensors of a GptOssExperts (synthetic checkpoints): a float module quantized by the
    reference MXFP4 quantizer, one already held in MXFP4 packed as it is. Biases in bf16, as gpt-oss ships them."""
    out = {}
    for name in ("gate_up_proj", "down_proj"):
        if _is_fp4(module):
            if getattr(module, "fp4_block") != MXFP4_BLOCK:
                raise ValueError(f"gpt-oss's format is MXFP4; these experts are held in {held_scheme(module).name}")
            w = Fp4Weight(unpack_e2m1(getattr(module, name)).cpu(), getattr(module, f"{name}_scale").cpu(), MXFP4_BLOCK)
        else:
            w = quantize_mxfp4(getattr(module, name).detach().float().cpu().transpose(1, 2))
        out[f"{prefix}{name}_blocks"], out[f"{prefix}{name}_scales"] = mxfp4_experts_pack(w)
        out[f"{prefix}{name}_bias"] = getattr(module, f"{name}_bias").detach().cpu().to(torch.bfloat16)
    return out


# --- forwards ----------------------------------------------------------------------------------------------------


def fp4_dequantized(module: torch.nn.Module, name: str, dtype: torch.dtype, e: int | None = None) -> torch.Tensor:
    """Expert e's (or every expert's, by chunks of experts: expert_layout.dequantize_by_chunks) canonical weight
    [(E,) N, K] of projection `name` in `dtype`: the products of Fp4Weight.dequantize in its order, sync-free
    elementwise work on the device."""
    if e is not None:
        return _fp4_dequantized(module, name, dtype, e)
    packed = getattr(module, name)
    experts, n, k = packed.shape[0], packed.shape[1], packed.shape[2] * 2  # two E2M1 codes per byte along K
    return dequantize_by_chunks(lambda sel: _fp4_dequantized(module, name, dtype, sel), experts, n, k, dtype,
                                packed.device)


def _fp4_dequantized(module: torch.nn.Module, name: str, dtype: torch.dtype, sel: int | slice) -> torch.Tensor:
    packed, scale = getattr(module, name)[sel], getattr(module, f"{name}_scale")[sel]
    v = getattr(module, "fp4_e2m1")[unpack_e2m1(packed).long()].unflatten(-1, (-1, getattr(module, "fp4_block"))) * scale[..., None]
    glob = getattr(module, f"{name}_global")
    if glob is not None:
        v = v * glob[sel][..., None, None]
    return v.flatten(-2).to(dtype)


def fp4_experts_forward(module: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                        top_k_weights: torch.Tensor, routed: bool = False) -> torch.Tensor:
    """The reference: every expert on every token, weights dequantized in float32, biases added in float32, the
    module's own gate (`_apply_gate`: gpt-oss's clamped, interleaved swiglu) or activation in the input dtype.
    `routed`: only the routed experts on their routed rows, the same numbers (expert_rows; eager only)."""
    first, gated = first_projection(module)
    x = hidden_states.float()
    out = torch.zeros_like(hidden_states, dtype=torch.float32)
    for e, rows, weight in expert_rows(module, top_k_index, top_k_weights, routed):
        h = add_bias(rows_of(x, rows) @ fp4_dequantized(module, first, torch.float32, e).t(), module, first, e)
        proj = gate(module, h.to(hidden_states.dtype), gated)
        y = add_bias(proj.float() @ fp4_dequantized(module, "down_proj", torch.float32, e).t(), module, "down_proj", e)
        add_rows(out, rows, y * weight.float())
    return out.to(hidden_states.dtype)


def fp4_expert_weights(module: torch.nn.Module, name: str) -> moe_gemm.ExpertWeights:
    """Projection `name` as moe_gemm reads it: the packed codes, block scales and row globals held."""
    return moe_gemm.ExpertWeights("fp4", getattr(module, name), getattr(module, f"{name}_scale"), group=getattr(module, "fp4_block"),
                                  global_rows=getattr(module, f"{name}_global"))


def grouped_fp4_experts_forward(module: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                                top_k_weights: torch.Tensor) -> torch.Tensor:
    """Rows sorted by expert (stable: one order on every run) and two grouped GEMMs over every expert's weight
    dequantized to the activations' dtype; each row's bias gathered by its expert id."""
    first, gated = first_projection(module)
    top_k = top_k_index.shape[-1]
    expert_ids, order = torch.sort(top_k_index.reshape(-1), stable=True)
    rows = hidden_states[order // top_k]  # [S, H], S = tokens × top_k
    counts = torch.histc(expert_ids.float() if rows.device.type == "cpu" else expert_ids.int(), bins=expert_count(module),
                         min=0, max=expert_count(module) - 1)
    offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    proj = moe_gemm.project(rows, counts, offsets, lambda: fp4_expert_weights(module, first),
                            lambda: fp4_dequantized(module, first, rows.dtype))
    proj = add_bias(proj, module, first, expert_ids)
    proj = gate(module, proj, gated)
    out = moe_gemm.project(proj, counts, offsets, lambda: fp4_expert_weights(module, "down_proj"),
                           lambda: fp4_dequantized(module, "down_proj", rows.dtype))
    out = add_bias(out, module, "down_proj", expert_ids)
    out = out.float() * top_k_weights.reshape(-1)[order, None].float()
    unsorted = torch.empty_like(out).index_copy_(0, order, out)  # a permutation: every row written once
    return unsorted.view(-1, top_k, out.shape[-1]).sum(dim=1).to(hidden_states.dtype)
