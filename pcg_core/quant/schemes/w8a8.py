"""The 8-bit quantization schemes: how weights and activations are quantized, and the plain math they stand for.

A scheme is granularity, not file format: ModelOpt `FP8`, compressed-tensors `FP8` and a per-tensor HF `fp8`
checkpoint all load into `fp8_per_tensor` (formats/detect.py maps each format onto a scheme). Everything here is
plain torch and runs on a CPU: the quantizers write synthetic checkpoints and quantize synthetic models, the
dequantizers are the reference every kernel path is held to.

Conventions (those of the checkpoints, docs/quantization.md): a weight is
(N out, K in) as in nn.Linear; a scale is a *multiplier* (W ≈ q · scale), also where a format calls it
`weight_scale_inv`; block scales are (⌈N/128⌉, ⌈K/128⌉); activation groups run along K.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from pcg_core.quant.schemes import registry
from pcg_core.quant.schemes.fp4 import FP4_SCHEMES, Fp4Scheme
from pcg_core.quant.schemes.int4 import INT4_SCHEMES, Int4Scheme

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
INT8_MAX = 127.0
BLOCK = 128  # DeepSeek-style blocks: weights 128×128, activations 1×128
_TINY = 1e-12  # a scale is never 0: an all-zero row quantizes to zeros, not NaN

WeightGranularity = Literal["tensor", "channel", "block"]
ActGranularity = Literal["tensor", "token", "group"]


@dataclass(frozen=True)
class Scheme:
    """One way to run a linear layer in 8 bits. `act_dynamic`: activation scales computed per forward (else a
    static `input_scale` from the checkpoint, per tensor)."""

    name: str
    kind: Literal["fp8", "int8"]
    weights: WeightGranularity
    acts: ActGranularity
    act_dynamic: bool
    description: str

    @property
    def qdtype(self) -> torch.dtype:
        return FP8 if self.kind == "fp8" else torch.int8

    @property
    def qmax(self) -> float:
        return FP8_MAX if self.kind == "fp8" else INT8_MAX


_ALL = {name: Scheme(name=name, description=description, **fields)
        for name, description, fields in registry.math_params("w8a8")}
SCHEMES: dict[str, Scheme] = {n: s for n, s in _ALL.items() if registry.SCHEME_INFO[n].matrix}
# A variant a checkpoint can declare that no matrix value names: same granularity family, static activations.
INT8_STATIC = _ALL["int8_w8a8_static"]


def get_scheme(name: str) -> Scheme | Int4Scheme | Fp4Scheme:
    """The math object of scheme `name` or an alias of it (schemes/registry.py declares both); KeyError otherwise."""
    name = registry.info(name).name
    for table in (_ALL, INT4_SCHEMES, FP4_SCHEMES):
        if name in table:
            return table[name]
    raise KeyError(f"quantization scheme {name!r} is declared but has no math object")


# Weights ------------------------------------------------------------------------------------------------------
def _to_q(x: torch.Tensor, scheme: Scheme) -> torch.Tensor:
    if scheme.kind == "fp8":
        return x.clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return x.round().clamp(-128, 127).to(torch.int8)


def _blocks(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """t [N, K] zero-padded to whole blocks and viewed [N/rows, rows, K/cols, cols]."""
    n, k = t.shape
    pn, pk = -(-n // rows) * rows, -(-k // cols) * cols
    if (pn, pk) != (n, k):
        t = torch.nn.functional.pad(t, (0, pk - k, 0, pn - n))
    return t.view(pn // rows, rows, pk // cols, cols)


def expand_block_scale(scale: torch.Tensor, n: int, k: int, rows: int = BLOCK, cols: int = BLOCK) -> torch.Tensor:
    """A (⌈n/rows⌉, ⌈k/cols⌉) block scale as one multiplier per element [n, k]."""
    return scale.repeat_interleave(rows, 0).repeat_interleave(cols, 1)[:n, :k]


def quantize_weight(w: torch.Tensor, scheme: Scheme) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [N, K] in the scheme's dtype, scale) with w ≈ dequantize_weight(q, scale, scheme). Scales are float32:
    per tensor a 0-d tensor, per channel [N, 1], per block [⌈N/128⌉, ⌈K/128⌉]."""
    w = w.detach().float()
    if scheme.weights == "tensor":
        scale = (w.abs().amax() / scheme.qmax).clamp(min=_TINY)
        return _to_q(w / scale, scheme), scale
    if scheme.weights == "channel":
        scale = (w.abs().amax(dim=1, keepdim=True) / scheme.qmax).clamp(min=_TINY)
        return _to_q(w / scale, scheme), scale
    n, k = w.shape
    scale = (_blocks(w, BLOCK, BLOCK).abs().amax(dim=(1, 3)) / scheme.qmax).clamp(min=_TINY)
    return _to_q(w / expand_block_scale(scale, n, k), scheme), scale


def weight_scale_shape(scheme: Scheme, n: int, k: int) -> tuple[int, ...]:
    """The shape of an [n, k] weight's scale: () per tensor, [n, 1] per channel, [⌈n/128⌉, ⌈k/128⌉] per block."""
    if scheme.weights == "tensor":
        return ()
    if scheme.weights == "channel":
        return (n, 1)
    return (-(-n // BLOCK), -(-k // BLOCK))


def dequantize_weight(q: torch.Tensor, scale: torch.Tensor, scheme: Scheme) -> torch.Tensor:
    """The float32 weight a quantized one stands for: the reference every kernel path is held to."""
    if scheme.weights == "block":
        return q.float() * expand_block_scale(scale.float(), *q.shape)
    return q.float() * scale.float()  # 0-d or [N, 1]: broadcasts


# Activations --------------------------------------------------------------------------------------------------
def activation_scale(x: torch.Tensor, scheme: Scheme, input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The activation scale for x [M, K]: the static input_scale (0-d), per token [M, 1], or per 128-group
    [M, ⌈K/128⌉]; float32."""
    if not scheme.act_dynamic:
        if input_scale is None:
            raise ValueError(f"scheme {scheme.name} has static activation scales, and none was given")
        return input_scale.float().reshape(())
    a = x.float().abs()
    if scheme.acts == "token":
        amax = a.amax(dim=-1, keepdim=True)
    elif scheme.acts == "group":
        m, k = a.shape
        pk = -(-k // BLOCK) * BLOCK
        amax = torch.nn.functional.pad(a, (0, pk - k)).view(m, pk // BLOCK, BLOCK).amax(dim=-1)
    else:
        amax = a.amax()
    return (amax / scheme.qmax).clamp(min=_TINY)


def expand_activation_scale(scale: torch.Tensor, k: int) -> torch.Tensor:
    """An activation scale that broadcasts over x [M, k]: per-group scales repeated over their 128 columns."""
    return scale.repeat_interleave(BLOCK, dim=-1)[..., :k] if scale.dim() == 2 and scale.shape[-1] > 1 else scale


def quantize_activation(x: torch.Tensor, scheme: Scheme, input_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(xq in the scheme's dtype, its scale) for x [M, K]."""
    scale = activation_scale(x, scheme, input_scale)
    return _to_q(x.float() / expand_activation_scale(scale, x.shape[-1]), scheme), scale


def reference_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, scheme: Scheme,
                     input_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """What a quantized linear computes, in float32 math: activations quantized and dequantized as the kernel
    would see them, times the dequantized weight; in x's dtype."""
    xq, sx = quantize_activation(x, scheme, input_scale)
    xd = xq.float() * expand_activation_scale(sx, x.shape[-1])
    out = xd @ dequantize_weight(q, scale, scheme).t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)
