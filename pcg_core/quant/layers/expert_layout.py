"""How a fused experts module lays out its float weights, read the same way by every quantizer and forward
(experts.py: 8-bit and int4; fp4_experts.py: FP4).

transformers' experts hold each projection as [E, N out, K in] (Qwen3-MoE, Mixtral), or transposed as [E, K in,
N out] (`is_transposed`: gpt-oss's GptOssExperts), optionally with a bias per expert and output (`has_bias`:
`<name>_bias` [E, N]). Quantized experts always hold the canonical [E, N, K] rows, as a linear layer holds its
weight (so 128×128 blocks and int4 groups run along K, the input), keep the biases as the module's float
parameters, and add them after each projection. Gate and up stay in the module's row order (concatenated, or
gpt-oss's interleave): its own `_apply_gate` reads them, as it does unquantized.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from pcg_core.quant.schemes.w8a8 import Fp4Scheme, Int4Scheme, Scheme


def first_projection(module: torch.nn.Module) -> tuple[str, bool]:
    """(name of the first projection, whether it is gated): gate_up_proj, or up_proj for ungated experts."""
    gated = getattr(module, "has_gate", True) and hasattr(module, "gate_up_proj")
    return ("gate_up_proj" if gated else "up_proj"), gated


# The experts' own attributes, typed (torch's Module types every attribute it does not hold as Tensor | Module).
def expert_count(module: torch.nn.Module) -> int:
    """transformers' `num_experts`."""
    return getattr(module, "num_experts")


def held_scheme(module: torch.nn.Module) -> Scheme | Int4Scheme | Fp4Scheme:
    """The scheme quantized experts are held in: their `quant_scheme`, set where their buffers are installed."""
    return getattr(module, "quant_scheme")


def gate(module: torch.nn.Module, h: torch.Tensor, gated: bool) -> torch.Tensor:
    """h through the experts' own gate (`_apply_gate`: gpt-oss's clamped, interleaved swiglu) or activation."""
    return getattr(module, "_apply_gate" if gated else "act_fn")(h)


def in_out(module: torch.nn.Module, name: str) -> tuple[int, int]:
    """(N out, K in) of projection `name` of a float module, in either layout."""
    w = getattr(module, name)
    return (w.shape[2], w.shape[1]) if getattr(module, "is_transposed", False) else (w.shape[1], w.shape[2])


def canonical_weight(module: torch.nn.Module, name: str, e: int) -> torch.Tensor:
    """Expert e's float weight of projection `name` as a linear layer holds it: [N out, K in], contiguous, in the
    module's dtype (transposed layouts turned)."""
    w = getattr(module, name)[e].detach()
    return (w.t() if getattr(module, "is_transposed", False) else w).contiguous()


def expert_bias(module: torch.nn.Module, name: str) -> torch.Tensor | None:
    """Projection `name`'s biases [E, N] (float parameters, never quantized), or None when the experts have none."""
    return getattr(module, f"{name}_bias", None) if getattr(module, "has_bias", False) else None


def add_bias(y: torch.Tensor, module: torch.nn.Module, name: str, experts: int | torch.Tensor) -> torch.Tensor:
    """y [T, N] out of projection `name` plus the bias of expert `experts` (one id, or each row's id: the grouped
    path's sorted expert ids, a static-shape gather), in y's dtype; y itself when the experts have no bias."""
    b = expert_bias(module, name)
    return y if b is None else y + b[experts].to(y.dtype)


# float32 elements of one chunk's transients (1 GiB) when every expert's weight is dequantized at once (the
# grouped forwards, a float twin): one elementwise pass over all experts took several times the 16-bit result in
# float32 and int64 temporaries (~90 GB for DeepSeek-V3's 256 gate_up experts in FP8 blocks), so a GPU held one or two
# such cells; by chunks the peak is the result plus one chunk's temporaries.
DEQUANT_CHUNK_ELEMENTS = 1 << 28


def dequantize_by_chunks(dequantize: Callable[[slice], torch.Tensor], experts: int, rows: int, cols: int,
                         dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[experts, rows, cols] in `dtype`, filled chunk by chunk of experts with dequantize(experts slice) (each
    chunk's math as over all experts at once: the same values bitwise). Static shapes and sync-free: capturable."""
    out = torch.empty(experts, rows, cols, dtype=dtype, device=device)
    step = max(1, DEQUANT_CHUNK_ELEMENTS // max(1, rows * cols))
    for start in range(0, experts, step):
        chunk = slice(start, min(start + step, experts))
        out[chunk] = dequantize(chunk)
    return out


def expert_rows(module: torch.nn.Module, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                routed: bool) -> Iterator[tuple[int, torch.Tensor | None, torch.Tensor]]:
    """The experts' reference loop: (e, rows, weight [R, 1]) per expert it runs, in expert order. Every expert on
    every token (rows None), weighted 0 where not routed: static shapes, sync-free, capturable (the engine's own
    eager path off the GPU kernels). `routed`: only the experts some token routes to, each on its routed rows
    (ids outside the experts skipped) — the same numbers for every row, as each expert's math (activation
    quantizer included) is row-local and an unrouted expert added 0, at a fraction of the work (all 128 experts'
    launches per layer of every short forward were most of a quantized Qwen3-30B-A3B cell's reference layer on the
    GPU); it reads the routing on the host, so eager only: twins (pcg_core.quant.twin)."""
    n = expert_count(module)
    if not routed:
        for e in range(n):
            yield e, None, (top_k_weights * (top_k_index == e)).sum(dim=-1, keepdim=True)  # 0 if not routed
        return
    # the (token, slot) pairs sorted by expert, stably (each expert's rows in token order), and read on the host once
    ids, k = top_k_index.reshape(-1), top_k_index.shape[-1]
    order = torch.argsort(ids, stable=True)
    experts, counts = torch.unique_consecutive(ids[order], return_counts=True)
    for e, pairs in zip(experts.tolist(), torch.split(order, counts.tolist())):
        if 0 <= e < n:  # a slot routed nowhere (as the dense loop ignores it)
            yield e, pairs // k, top_k_weights.reshape(-1)[pairs, None]


def rows_of(x: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """x's rows an expert of expert_rows runs on: all of them, or the routed ones."""
    return x if rows is None else x[rows]


def add_rows(out: torch.Tensor, rows: torch.Tensor | None, y: torch.Tensor) -> None:
    """out += y, y holding every row of out (rows None) or the routed rows (each once per expert)."""
    if rows is None:
        out += y
    else:
        out.index_add_(0, rows, y)
