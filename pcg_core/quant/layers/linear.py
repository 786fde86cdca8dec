"""`QuantLinear`: an nn.Linear whose weight is stored quantized, swapped into transformers' model in its place.

Two paths, one module. On CUDA in bf16 the scheme's kernel runs (`torch._scaled_mm` for per-tensor and row-wise
FP8, torch's `scaled_mm` for block FP8, our Triton `pcg::int8_scaled_mm` for INT8, kernels/int8_gemm.py), the activation
quantization written in plain torch ops so that inductor fuses it into the piece around it. Everywhere else (CPU, other dtypes, shapes a kernel refuses) the reference runs:
schemes.reference_linear, the plain math the kernels are held to. Both paths are static-shape and sync-free,
so a QuantLinear is captured like any other op.
"""

from __future__ import annotations

import torch

from pcg_core.quant.layers.fp4_linear import Fp4Linear
from pcg_core.quant.schemes.fp4 import Fp4Scheme
from pcg_core.quant.layers.fp4_experts import fp4_unsupported_reason, quantize_experts_fp4
from pcg_core.quant.layers.int4_linear import Int4Linear, W4A8Linear
from pcg_core.quant.schemes.int4 import Int4Scheme
from pcg_core.quant.kernels.fp8_gemm import block_fp8_mm, pad_rows, scaled_fp8_mm
from pcg_core.quant.kernels.int8_gemm import available as int8_kernel_available
from pcg_core.quant.layers.experts import check_quantizable, is_experts, quantize_experts
from pcg_core.quant.schemes.w8a8 import (BLOCK, Scheme, dequantize_weight, quantize_activation, quantize_weight, reference_linear,
                                     weight_scale_shape)


class QuantLinear(torch.nn.Module):
    """y = x Wᵀ + b with W = dequantize(weight, weight_scale). Buffers keep the checkpoint's names (weight,
    weight_scale, input_scale) so a state dict reads like the file it came from."""

    weight: torch.Tensor
    weight_scale: torch.Tensor
    input_scale: torch.Tensor | None  # None: dynamic activations
    bias: torch.Tensor | None

    def __init__(self, in_features: int, out_features: int, scheme: Scheme, bias: bool = False,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.in_features, self.out_features, self.scheme, self.dtype = in_features, out_features, scheme, dtype
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=scheme.qdtype, device=device))
        self.register_buffer("weight_scale", torch.ones(weight_scale_shape(scheme, out_features, in_features), device=device))
        self.register_buffer("input_scale", None if scheme.act_dynamic else torch.ones((), device=device))
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, scheme: Scheme, input_scale: torch.Tensor | None = None) -> QuantLinear:
        """Quantize a float linear layer (a synthetic model's). A static scheme needs its calibrated input_scale."""
        w = linear.weight
        mod = cls(linear.in_features, linear.out_features, scheme, linear.bias is not None, w.device, w.dtype)
        q, s = quantize_weight(w, scheme)
        mod.weight.copy_(q)
        mod.weight_scale.copy_(s.reshape(mod.weight_scale.shape))
        if mod.input_scale is not None:
            if input_scale is None:
                raise ValueError(f"{scheme.name} quantizes activations with a static scale: pass input_scale")
            mod.input_scale.copy_(input_scale.reshape(()))
        if mod.bias is not None:
            mod.bias.copy_(linear.bias)
        return mod

    def dequantized_weight(self) -> torch.Tensor:
        """W (N, K) float32: for callers that use the weight as a matrix (MLA's absorbed kv_b_proj)."""
        return dequantize_weight(self.weight, self.weight_scale, self.scheme).float()

    @property
    def quant_scheme(self) -> Scheme:
        """The name every quantized module answers to (scheme_of), as Int4Linear and Fp4Linear carry it."""
        return self.scheme

    def reference(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 (M, K) through the plain math this layer's kernels are held to, on any device."""
        return reference_linear(x2, self.weight, self.weight_scale, self.scheme, self.input_scale, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, scheme={self.scheme.name}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if _kernel_ok(x2, self):
            out = _cuda_linear(x2, self)
        else:
            out = self.reference(x2)
        return out.reshape(*lead, self.out_features)


QUANTIZED_LINEARS = (QuantLinear, Int4Linear, Fp4Linear)  # W4A8Linear is an Int4Linear


def reference_forward(mod: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x (M, K) through a quantized linear's reference math on any device (the plain implementation of its op,
    which CPU runs and every CUDA kernel is held to): each quantized linear class says its own (`reference`)."""
    if not isinstance(mod, QUANTIZED_LINEARS):
        raise TypeError(f"{type(mod).__name__} is not a quantized linear ({', '.join(c.__name__ for c in QUANTIZED_LINEARS)})")
    return mod.reference(x)


def scheme_of(module: torch.nn.Module) -> Scheme | Int4Scheme | Fp4Scheme | None:
    """The scheme a module's weights are held in, or None for a float module: one reading for every quantized kind
    (a QuantLinear's `scheme`; the `quant_scheme` that Int4Linear, Fp4Linear and quantized experts carry), so the
    cell and the float twin agree on which modules are quantized."""
    return getattr(module, "quant_scheme", None)


def quantized_modules(model: torch.nn.Module) -> dict[str, str]:
    """Module name → scheme name for every quantized linear and experts module of a model."""
    return {name: scheme.name for name, mod in model.named_modules() if (scheme := scheme_of(mod)) is not None}


def _kernel_ok(x: torch.Tensor, mod: QuantLinear) -> bool:
    """Whether the CUDA kernel runs: bf16 on CUDA, and the dimensions the kernels accept (block FP8: whole
    128-blocks; otherwise K and N multiples of 16). Decided by the layer's static widths, never by the token
    count, so a traced graph holds one branch for every bucket."""
    if not (x.is_cuda and x.dtype == torch.bfloat16):
        return False
    n, k = mod.out_features, mod.in_features
    if mod.scheme.weights == "block":
        return n % BLOCK == 0 and k % BLOCK == 0
    return n % 16 == 0 and k % 16 == 0


def _cuda_linear(x: torch.Tensor, mod: QuantLinear) -> torch.Tensor:
    s, m = mod.scheme, x.shape[0]
    if s.kind == "int8":
        xq, sx = quantize_activation(x, s, mod.input_scale)
        if int8_kernel_available():  # scales applied in the GEMM's epilogue, bf16 written once
            return torch.ops.pcg.int8_scaled_mm(xq, mod.weight, sx, mod.weight_scale, mod.bias)
        xq = pad_rows(xq, 8, 24)  # ≥ 24 rows: _int_mm needs M > 16
        acc = torch._int_mm(xq, mod.weight.t())[:m]
        out = acc.float() * sx * mod.weight_scale.view(1, -1)
    elif s.weights == "block":  # cuBLASLt refuses fast accumulation with block scales
        xq, sx = quantize_activation(pad_rows(x, 4), s)
        out = block_fp8_mm(xq, sx, mod.weight, mod.weight_scale)[:m]
    else:
        # Per-tensor and row-wise scales: fast accumulation (as the serving engines' FP8 GEMMs run on Hopper),
        # held to the reference by the kernel tests like every other path.
        xq, sx = quantize_activation(x, s, mod.input_scale)
        if s.weights == "channel":  # FP8 channel weights come with per-token activations (fp8_per_token)
            sa, sb = sx, mod.weight_scale.view(1, -1)
        else:
            sa, sb = sx.reshape(()), mod.weight_scale.reshape(())
        out = scaled_fp8_mm(xq, mod.weight, sa, sb)
    if mod.bias is not None:
        out = out + mod.bias
    return out.to(torch.bfloat16)


def quantize_model(model: torch.nn.Module, scheme: Scheme | Int4Scheme | Fp4Scheme, skip: tuple[str, ...] = ("lm_head",),
                   input_absmax: dict[str, float] | None = None) -> list[str]:
    """Swap every nn.Linear of `model` (but those whose name ends with one of `skip`, those its checkpoints keep in
    16 bits (kept_16bit) and a VLM's vision tower) for a QuantLinear holding
    its weight quantized (Int4Linear, W4A8Linear, Fp4Linear for the 4-bit schemes), and quantize fused MoE experts
    in place (experts.py): what a synthetic cell runs. Returns the names quantized. A static scheme needs the
    calibrated input absmax (calibrate.record_input_absmax)."""
    if not scheme.act_dynamic and input_absmax is None:
        raise ValueError(f"{scheme.name} has static activation scales: pass input_absmax from a calibration run")
    skip = tuple(skip) + kept_16bit(model)
    if isinstance(scheme, Fp4Scheme):
        return _quantize_fp4(model, scheme, skip)
    tower = vision_tower_prefixes(model)  # a VLM's vision tower stays 16-bit, as its checkpoints keep it
    swapped = []
    for mod in model.modules():  # experts this module cannot hold quantized: refused before any swap
        if is_experts(mod):
            check_quantizable(mod)
    for name, mod in list(model.named_modules()):
        if isinstance(scheme, Int4Scheme):  # int4 (W4A16 or W4A8): no activation scales to calibrate
            if is_experts(mod):
                quantize_experts(mod, scheme)
                swapped.append(name)
            elif type(mod) is torch.nn.Linear and not name.endswith(skip) and not name.startswith(tower):
                parent, _, attr = name.rpartition(".")
                layer = (W4A8Linear if scheme.w4a8 else Int4Linear).from_scheme(mod, scheme)
                setattr(model.get_submodule(parent) if parent else model, attr, layer)
                swapped.append(name)
            continue
        if is_experts(mod):
            absmax = None if input_absmax is None or scheme.act_dynamic else {k: input_absmax[f"{name}.{k}"] for k in ("gate_up", "down")}
            quantize_experts(mod, scheme, absmax)
            swapped.append(name)
            continue
        if type(mod) is not torch.nn.Linear or name.endswith(skip) or name.startswith(tower):
            continue
        parent, _, attr = name.rpartition(".")
        static = None if scheme.act_dynamic or input_absmax is None else _static_scale(input_absmax, name, scheme)  # None: refused above
        setattr(model.get_submodule(parent) if parent else model, attr, QuantLinear.from_linear(mod, scheme, static))
        swapped.append(name)
    return swapped


# Linears a model's published quantized checkpoints keep in 16 bits (their quantization_config's
# modules_to_not_convert / ignore), by model_type, as name suffixes. Qwen/Qwen3-Next-80B-A3B-Instruct-FP8 lists, in
# every layer, linear_attn.in_proj_ba (β and the decay's input: 2 × 32 heads = 64 rows, not one 128-row FP8 block)
# and the MoE's scalar mlp.shared_expert_gate (1 row), beside norms, conv1d, A_log, dt_bias and the router (not
# linears); in_proj_qkvz, out_proj, the full-attention and shared-expert projections and the experts are FP8.
# A synthetic cell quantizes what a real checkpoint does, so its cost and kernels are the real model's.
KEPT_16BIT: dict[str, tuple[str, ...]] = {
    "qwen3_next": ("linear_attn.in_proj_ba", "mlp.shared_expert_gate"),
}


def kept_16bit(model: torch.nn.Module) -> tuple[str, ...]:
    """Name suffixes of the linears `model`'s quantized checkpoints keep in 16 bits (KEPT_16BIT; () if none)."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    return KEPT_16BIT.get(getattr(text, "model_type", None) or "", ())


def vision_tower_prefixes(model: torch.nn.Module) -> tuple[str, ...]:
    """Name prefixes of a VLM's vision tower (transformers' `model.visual`), left unquantized; () for a text model."""
    inner = getattr(model, "model", None)
    tower = getattr(inner, "visual", None)
    return tuple(f"{n}." for n, m in model.named_modules() if tower is not None and m is tower)


def _static_scale(input_absmax: dict[str, float], name: str, scheme: Scheme) -> torch.Tensor:
    """A static scheme's input scale for linear `name` from its calibrated absmax. A linear the calibration never
    ran (MLA's absorbed kv_b_proj: its weight is read as a matrix, its forward never called) has no range to scale
    by: NaN, so that a call would show at once instead of running on a made-up scale."""
    if name not in input_absmax:
        return torch.tensor(float("nan"))
    return torch.tensor(max(input_absmax[name], 1e-6) / scheme.qmax)


def _quantize_fp4(model: torch.nn.Module, scheme: Fp4Scheme, skip: tuple[str, ...]) -> list[str]:
    """Every dense linear swapped for an Fp4Linear (weight-only: no activation scales) and fused MoE experts held
    in FP4 in place, either layout (fp4_experts.py). Experts it cannot hold and widths the e2m1 blocks do not
    divide are refused before any swap, so a model is never left half quantized."""
    experts = [(n, m) for n, m in model.named_modules() if is_experts(m)]
    for name, mod in experts:
        if why := fp4_unsupported_reason(mod, scheme):
            raise NotImplementedError(f"{scheme.name}: MoE experts {name or '(root)'}: {why}")
    inside = tuple(f"{n}." for n, _ in experts) + vision_tower_prefixes(model)
    linears = [(n, m) for n, m in model.named_modules()
               if type(m) is torch.nn.Linear and not n.endswith(skip) and not n.startswith(inside)]
    if bad := [(n, m.in_features) for n, m in linears if m.in_features % scheme.block]:
        raise NotImplementedError(f"{scheme.name}: {bad[0][0]} has K = {bad[0][1]}, not a multiple of the FP4 block "
                                  f"{scheme.block}")
    for name, mod in linears:
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, Fp4Linear.from_scheme(mod, scheme))
    for _, mod in experts:
        quantize_experts_fp4(mod, scheme)
    done = {n for n, _ in linears} | {n for n, _ in experts}
    return [n for n, _ in model.named_modules() if n in done]
