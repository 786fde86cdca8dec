"""int4 weight checkpoints (AWQ, GPTQ, compressed-tensors pack-quantized and int-quantized): reading a linear's
tensors into Int4Linear / W4A8Linear, and writing them for synthetic checkpoints in the producers' exact layouts.

Every format converts into schemes/int4.py's one canonical layout at load, so nothing past the loader knows which
producer wrote a weight. The rule that keeps weights honest is the 8-bit loader's: a linear is quantized exactly
when its packed tensor is in the files, and then every companion tensor (zeros, scales, g_idx, shape) must be
there in the shapes the declared group size implies; a linear stored in 16 bits is kept in 16 bits.

compressed-tensors `pack-quantized` (its PackedQuantizationCompressor, 4 bits): `weight_packed` int32 (N, K/8),
signed codes + 8 in plain nibble order along K (the same words as our unsigned codes), `weight_scale` (N, K/G) in
the model's dtype, `weight_zero_point` int32 (N/8, K/G) (asymmetric only; signed zero + 8, packed along N),
`weight_shape` (2,) = (N, K), `weight_g_idx` (K,) with act-order "group". W4A8 / W4AFP8 store the same tensors and
declare `input_activations` (8 bits, per token, dynamic: no activation tensors on disk); they load into W4A8Linear
(MoE experts' per-expert tensors into W4A8 experts: formats/experts.py, layers/experts.py).

compressed-tensors `int-quantized` with 4-bit weights (CT_INT; its IntQuantizationCompressor, which llm-compressor
picks for any int weights with quantized activations, so for its W4A8 and W4AFP8 presets): `weight` int8 (N, K)
holding the signed values in [-8, 7] unpacked, `weight_scale` (N, K/G) or (N, 1) per channel in the model's dtype,
`weight_zero_point` int8 in [-8, 7] of the scale's shape (asymmetric only). No weight_shape, and no g_idx: that
compressor neither writes nor reads one, so act-order "group" is refused by the declaration. A linear is quantized
exactly when its `weight` is stored as int8; a value outside [-8, 7] is refused, never wrapped into 4 bits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pcg_core.errors import ConfigError, UnsupportedModel
from pcg_core.quant.formats.files import CheckpointTensors
from pcg_core.quant.layers.int4_linear import Int4Linear, W4A8Linear
from pcg_core.quant.schemes.int4 import (NIBBLES, Int4Scheme, Int4Weight, awq_pack, awq_unpack, gptq_pack, gptq_unpack,
                                         original_codes, pack_nibbles, unpack_nibbles, with_act_order)

CT_INT = "compressed-tensors int-quantized"  # 4-bit values stored one per int8 (the Int4Format's name)
INT4_FORMATS = ("awq", "gptq", "gptq_v2", "compressed-tensors", CT_INT)
# The tensor whose presence says a linear is quantized, per format (int-quantized's only when stored as int8).
PACKED = {"awq": "qweight", "gptq": "qweight", "gptq_v2": "qweight", "compressed-tensors": "weight_packed",
          CT_INT: "weight"}
INT4_RANGE = (-8, 7)  # the signed 4-bit values int-quantized stores
STORED_SCALES = {"awq": torch.float16, "gptq": torch.float16, "gptq_v2": torch.float16}  # CT: the model's dtype


@dataclass(frozen=True)
class Int4Format:
    """How one checkpoint stores its int4 linears: the format (INT4_FORMATS) and the group size it declares."""

    name: str
    group: int

    def packed_key(self, module: str) -> str:
        return f"{module}.{PACKED[self.name]}"

    def is_packed(self, tensors: CheckpointTensors, module: str) -> bool:
        """Whether the files hold `module` (as they spell it) in 4 bits, read from the header (no tensor loaded):
        int-quantized's `weight` only when stored as int8 (a linear it leaves alone keeps a 16-bit `weight`)."""
        key = self.packed_key(module)
        return key in tensors and (self.name != CT_INT or tensors.stored_dtype(key) == "I8")


# --- compressed-tensors pack-quantized --------------------------------------------------------------------------


def ct_pack(weight: Int4Weight, sym: bool, scale_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The compressed-tensors tensors of W = weight.original(); act-order ("group") when the weight has a perm."""
    n, k = weight.q.shape
    q, groups = original_codes(weight)
    out = {"weight_packed": pack_nibbles(q, 1), "weight_scale": weight.scales.to(scale_dtype).contiguous(),
           "weight_shape": torch.tensor([n, k], dtype=torch.int64)}
    if not sym:
        out["weight_zero_point"] = pack_nibbles(weight.zeros.round().to(torch.uint8), 0)
    elif not bool((weight.zeros == 8).all()):
        raise ValueError("a symmetric compressed-tensors weight has every zero point at 8 (signed 0)")
    if weight.perm is not None:
        out["weight_g_idx"] = groups.to(torch.int32)
    return out


def ct_unpack(packed: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, shape: torch.Tensor,
              g_idx: torch.Tensor | None, group: int) -> Int4Weight:
    """Canonical from compressed-tensors tensors (zero_point None: symmetric, every zero 8)."""
    n, k = (int(d) for d in shape.tolist())
    g = k if group == -1 else group
    if tuple(packed.shape) != (n, k // NIBBLES) or packed.dtype != torch.int32:
        raise ConfigError(f"weight_packed is {packed.dtype} {tuple(packed.shape)}; weight_shape {(n, k)} needs int32 "
                          f"{(n, k // NIBBLES)}")
    if k % g or tuple(scale.shape) != (n, k // g):
        raise ConfigError(f"weight_scale is {tuple(scale.shape)}; {n} outputs × {k} inputs in groups of {g} need "
                          f"{(n, k // g)}")
    q = unpack_nibbles(packed, 1)
    if zero_point is None:
        zeros = torch.full((n, k // g), 8.0)
    elif tuple(zero_point.shape) != (n // NIBBLES, k // g):
        raise ConfigError(f"weight_zero_point is {tuple(zero_point.shape)}; need {(n // NIBBLES, k // g)} (packed along N)")
    else:
        zeros = unpack_nibbles(zero_point, 0).float()
    w = Int4Weight(q, scale.float().contiguous(), zeros.contiguous(), g)
    return with_act_order(w, g_idx, "weight_g_idx")


# --- compressed-tensors int-quantized (4-bit values in int8) -----------------------------------------------------


def ct_int_pack(weight: Int4Weight, sym: bool, scale_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The int-quantized tensors of W = weight.dequantize(): signed values q − 8 as int8, the scales, and (asymmetric)
    the signed zero points z − 8 as int8. Act-order cannot be stored: the format has no g_idx."""
    if weight.perm is not None:
        raise ValueError("compressed-tensors int-quantized has no g_idx: write act-order weights as pack-quantized")
    out = {"weight": (weight.q.to(torch.int16) - 8).to(torch.int8), "weight_scale": weight.scales.to(scale_dtype)}
    if not sym:
        out["weight_zero_point"] = (weight.zeros.round() - 8).to(torch.int8)
    elif not bool((weight.zeros == 8).all()):
        raise ValueError("a symmetric compressed-tensors weight has every zero point at 8 (signed 0)")
    return {k: v.contiguous() for k, v in out.items()}


def ct_int_unpack(weight: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, group: int) -> Int4Weight:
    """Canonical from int-quantized tensors (zero_point None: symmetric). Every value and zero point must be a
    signed 4-bit one: a 9 stored in int8 is not a 4-bit weight, and wrapping it (9 → −7) would flip its sign."""
    if weight.dtype != torch.int8 or weight.dim() != 2:
        raise ConfigError(f"weight is {weight.dtype} {tuple(weight.shape)}; int-quantized 4-bit weights are int8 (N, K)")
    n, k = weight.shape
    g = k if group == -1 else group
    if k % g or k % NIBBLES:
        raise ConfigError(f"weight has {k} input channels; 4-bit weights need a multiple of {NIBBLES} and of the group {g}")
    shapes = ((n, k // g),) + (((n,),) if g == k else ())  # per channel: (N, 1) as compressed-tensors writes, or (N,)
    if tuple(scale.shape) not in shapes:
        raise ConfigError(f"weight_scale is {tuple(scale.shape)}; {n} outputs × {k} inputs in groups of {g} need "
                          f"{(n, k // g)}")
    if not scale.dtype.is_floating_point:
        raise ConfigError(f"weight_scale is {scale.dtype}; scales are floating point")
    _in_4_bits(weight, "weight")
    zeros = torch.full((n, k // g), 8.0)
    if zero_point is not None:
        if zero_point.dtype != torch.int8 or tuple(zero_point.shape) not in shapes:
            raise ConfigError(f"weight_zero_point is {zero_point.dtype} {tuple(zero_point.shape)}; asymmetric 4-bit "
                              f"weights need int8 {(n, k // g)}")
        _in_4_bits(zero_point, "weight_zero_point")
        zeros = zero_point.reshape(n, k // g).float() + 8
    return Int4Weight((weight.to(torch.int16) + 8).to(torch.uint8), scale.float().reshape(n, k // g).contiguous(),
                      zeros.contiguous(), g)


def _in_4_bits(t: torch.Tensor, what: str) -> None:
    lo, hi = INT4_RANGE
    bad = (t < lo) | (t > hi)
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise ConfigError(f"{what} holds {int(t[where])} at {list(where)} ({int(bad.sum())} values outside [{lo}, {hi}]); "
                          f"the checkpoint declares 4-bit weights, whose int-quantized values are {lo}..{hi}")


# --- reading --------------------------------------------------------------------------------------------------


def read_int4_linear(mod: torch.nn.Linear, name: str, tensors: CheckpointTensors, fmt: Int4Format,
                     scheme: Int4Scheme) -> Int4Linear:
    """The linear `name` (as the files spell it) from its int4 tensors; every error names the tensor."""
    w = read_int4_weight(name, tensors, fmt, scheme, (mod.out_features, mod.in_features))
    bias = tensors.get(f"{name}.bias") if mod.bias is not None else None
    out = (W4A8Linear if scheme.w4a8 else Int4Linear).from_weight(w, bias, mod.weight.dtype).to(mod.weight.device)
    if isinstance(out, W4A8Linear) and scheme.activations is not None:  # scheme.w4a8
        out.act = scheme.activations
    out.quant_scheme = scheme  # what the cell reads back: the family name the matrix's quant axis uses
    return out


def read_int4_weight(name: str, tensors: CheckpointTensors, fmt: Int4Format, scheme: Int4Scheme,
                     shape: tuple[int, int]) -> Int4Weight:
    """The canonical weight of the linear `name` (as the files spell it: a layer's linear or one expert's
    projection), checked against the (N, K) the model expects and the declared act-order."""
    path = tensors.path

    def need(suffix: str) -> torch.Tensor:
        return tensors.companion(fmt.packed_key(name), f"{name}.{suffix}", fmt.name)

    def maybe(suffix: str) -> torch.Tensor | None:
        """g_idx: optional without act-order; with it, missing would silently read as k // G (wrong weights)."""
        return need(suffix) if scheme.act_order else tensors.optional(f"{name}.{suffix}")

    try:
        if fmt.name == "awq":
            w = awq_unpack(_int32(need("qweight"), "qweight"), _int32(need("qzeros"), "qzeros"), need("scales"),
                           fmt.group)
        elif fmt.name in ("gptq", "gptq_v2"):
            w = gptq_unpack(_int32(need("qweight"), "qweight"), _int32(need("qzeros"), "qzeros"),
                            need("scales"), maybe("g_idx"), fmt.group, v2=fmt.name == "gptq_v2")
        elif fmt.name == CT_INT:
            w = _read_ct_int(name, tensors, fmt, scheme, need)
        else:
            zp = need("weight_zero_point") if not scheme.sym else None
            if scheme.sym and f"{name}.weight_zero_point" in tensors:  # a ConfigError: prefixed with path and name below
                raise ConfigError("weight_zero_point is there, but the checkpoint declares symmetric weights (no zero "
                                  "points)")
            w = ct_unpack(need("weight_packed"), need("weight_scale"), zp, need("weight_shape"), maybe("weight_g_idx"),
                          fmt.group)
    except UnsupportedModel:  # already names the file and the tensor (a missing companion)
        raise
    except ConfigError as e:
        raise UnsupportedModel(f"{path}: {name}: {e}") from e
    if tuple(w.q.shape) != tuple(shape):
        raise UnsupportedModel(f"{path}: {name}'s int4 tensors hold a {tuple(w.q.shape)} weight; the model's linear is "
                               f"{tuple(shape)}")
    if w.perm is not None and not scheme.act_order:
        raise UnsupportedModel(f"{path}: {name} has an act-order g_idx, but the checkpoint declares none (desc_act / "
                               "actorder); the declaration or the files are wrong")
    return w


def _read_ct_int(name: str, tensors: CheckpointTensors, fmt: Int4Format, scheme: Int4Scheme,
                 need: Callable[[str], torch.Tensor]) -> Int4Weight:
    """The int-quantized tensors of `name`; errors are ConfigErrors, which read_int4_weight prefixes with the file
    and the linear."""
    if f"{name}.weight_g_idx" in tensors:
        raise ConfigError("weight_g_idx is there, but compressed-tensors int-quantized has no act-order (its compressor "
                          "ignores g_idx); only pack-quantized act-order is read")
    if scheme.sym and f"{name}.weight_zero_point" in tensors:
        raise ConfigError("weight_zero_point is there, but the checkpoint declares symmetric weights (no zero points)")
    zp = need("weight_zero_point") if not scheme.sym else None
    return ct_int_unpack(need("weight"), need("weight_scale"), zp, fmt.group)


def _int32(t: torch.Tensor, what: str) -> torch.Tensor:
    if t.dtype != torch.int32:
        raise ConfigError(f"{what} is {t.dtype}; int4 codes are packed 8 per int32")
    return t


# --- writing --------------------------------------------------------------------------------------------------


def int4_tensors(weight: Int4Weight, fmt: Int4Format, sym: bool, scale_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A linear's tensors (suffix → tensor) as `fmt`'s producer writes them (contiguous, as safetensors needs)."""
    if fmt.name == "awq":
        out = awq_pack(weight)
    elif fmt.name in ("gptq", "gptq_v2"):
        out = gptq_pack(weight, v2=fmt.name == "gptq_v2")
    elif fmt.name == CT_INT:
        out = ct_int_pack(weight, sym, scale_dtype)
    else:
        out = ct_pack(weight, sym, scale_dtype)
    return {k: v.contiguous() for k, v in out.items()}


def stored_weight(weight: Int4Weight, fmt: Int4Format, scale_dtype: torch.dtype) -> Int4Weight:
    """The weight as its files will hold it: scales rounded to the stored dtype (what a loader can give back)."""
    dtype = STORED_SCALES.get(fmt.name, scale_dtype)
    return Int4Weight(weight.q, weight.scales.to(dtype).float(), weight.zeros, weight.group, weight.perm)


def common_group(scheme: Int4Scheme, in_features: list[int]) -> int:
    """One group size valid for every linear (a checkpoint declares one): the scheme's, or at tiny widths the
    largest of 64 and 32 every K is a multiple of."""
    return min(scheme.group_for(k) for k in in_features)


def declaration(fmt: str, scheme: Int4Scheme, group: int, ignore: tuple[str, ...]) -> dict:
    """config.json's quantization_config as each producer writes it (CT_INT: compressed-tensors int-quantized, as
    llm-compressor writes its W4A8 / W4AFP8 presets)."""
    if scheme.w4a8 and fmt not in ("compressed-tensors", CT_INT):
        raise ValueError(f"{scheme.name} (8-bit activations) is written as compressed-tensors pack-quantized or "
                         f"int-quantized only, not {fmt}")
    if fmt == CT_INT and (not scheme.w4a8 or scheme.act_order):
        raise ValueError(f"{scheme.name}: compressed-tensors int-quantized holds 4-bit weights with 8-bit activations "
                         "(W4A8, W4AFP8) without act-order; write W4A16 and act-order as pack-quantized")
    if fmt == "awq":
        if scheme.sym or scheme.act_order:
            raise ValueError("AWQ checkpoints are asymmetric (zero points) without act-order")
        return {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm",
                "modules_to_not_convert": list(ignore) or None}
    if fmt in ("gptq", "gptq_v2"):
        return {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": scheme.act_order, "sym": scheme.sym,
                "checkpoint_format": fmt, "true_sequential": True, "static_groups": False, "damp_percent": 0.01,
                "lm_head": False}
    if fmt in ("compressed-tensors", CT_INT):
        weights = {"num_bits": 4, "type": "int", "symmetric": scheme.sym, "dynamic": False,
                   "strategy": "channel" if group == -1 else "group", "group_size": None if group == -1 else group,
                   "actorder": "group" if scheme.act_order else None}
        acts = None  # W4A16; W4A8 / W4AFP8 as compressed-tensors' presets declare their activations
        if scheme.w4a8:
            acts = {"num_bits": 8, "type": "int" if scheme.activations == "int8" else "float", "symmetric": True,
                    "dynamic": True, "strategy": "token"}
        ct_format = "int-quantized" if fmt == CT_INT else "pack-quantized"
        return {"quant_method": "compressed-tensors", "format": ct_format, "quantization_status": "compressed",
                "ignore": list(ignore), "kv_cache_scheme": None,
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts,
                                              "format": ct_format}}}
    raise ValueError(f"no int4 writer for format {fmt!r} (have: {', '.join(INT4_FORMATS)})")
