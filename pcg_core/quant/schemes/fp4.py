"""4-bit float weights (NVFP4, MXFP4): the on-disk packings, and the one canonical layout every one converts into.

The FP4 sibling of int4.py, plain torch on a CPU. Each format is unpacked at load into `Fp4Weight` — e2m1 codes
(…, N out, K in) as nn.Linear holds weights, float32 block scales (…, N, K/B) and an optional global scale that
*multiplies*: W = e2m1[code] · scale · global. The packers write synthetic checkpoints in the exact formats;
`Fp4Weight.dequantize` is the reference the W4A16 kernels will be held to (Hopper has no FP4 MMA, so every FP4
checkpoint runs weight-only here).

e2m1 (4 bits): bit 3 the sign, bits 0..2 index the magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 (code 8 is −0).

Formats (docs/quantization.md, "Tensor layouts on disk"):
- ModelOpt NVFP4: weight uint8 (N, K/2), two codes a byte, LOW nibble = even k; weight_scale float8_e4m3fn
  (N, K/16); weight_scale_2 fp32 scalar, a multiplier; input_scale fp32 scalar (W4A4 only, see the unpacker).
- compressed-tensors nvfp4-pack-quantized: weight_packed as ModelOpt's weight; weight_scale e4m3 (N, K/16);
  weight_global_scale fp32 (1,), the RECIPROCAL (dequant divides by it; its writer picks 448·6/amax).
- gpt-oss MXFP4 experts: *_blocks uint8 (E, R, C/32, 16) (32 codes in 16 bytes, low nibble first), *_scales
  uint8 (E, R, C/32) e8m0 = 2^(s − 127), 255 NaN. R are output rows: gate_up_proj has R = 2I with gate and up
  interleaved row by row (gate even), down_proj R = H. transformers dequantizes to (E, R, C) and transposes to
  GptOssExperts' (E, in, out), so the interleave ends up in the last dim (its glu takes [..., ::2] as gate).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pcg_core.errors import ConfigError
from pcg_core.quant.schemes import registry
from pcg_core.quant.schemes.e2m1 import E2M1_VALUES, e2m1_decode, e2m1_table, pack_e2m1, unpack_e2m1  # noqa: F401 (the FP4 words, here too)

E2M1_MAX = 6.0
E4M3_MAX = 448.0
NVFP4_BLOCK = 16
MXFP4_BLOCK = 32
E8M0_BIAS = 127
E8M0_NAN = 255
MX_BYTES = MXFP4_BLOCK // 2  # bytes of one gpt-oss block
# midpoints between neighbouring magnitudes, and whether a tie goes up (to the even code, as IEEE rounds)
_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def e2m1_encode(y: torch.Tensor) -> torch.Tensor:
    """uint8 codes of the e2m1 values nearest y (already divided by its scale): ties to the even code, magnitudes
    past 6 saturate to 6, the sign kept even when the value rounds to zero (−0, code 8) as compressed-tensors does."""
    a = y.float().abs()
    mag = torch.zeros(y.shape, dtype=torch.uint8, device=y.device)
    for mid, tie_up in _MIDPOINTS:
        mag += (a >= mid if tie_up else a > mid).to(torch.uint8)
    return mag | (torch.signbit(y).to(torch.uint8) << 3)


def e8m0_decode(scales: torch.Tensor, name: str = "scales") -> torch.Tensor:
    """2^(s − 127) as float32, exactly: e8m0 is an fp32 exponent field (same bias), so s goes straight into bits
    23..30; s = 0 is the fp32 subnormal 2^-127. 255 is NaN in the format and refused."""
    if scales.dtype != torch.uint8:
        raise ConfigError(f"{name}: e8m0 scales must be uint8, got {scales.dtype}")
    if scales.numel() and bool((scales == E8M0_NAN).any()):
        raise ConfigError(f"{name}: e8m0 value 255 (NaN) in {int((scales == E8M0_NAN).sum())} block scale(s); "
                          f"expected 0..254")
    s = scales.to(torch.int32)
    return torch.where(s > 0, s << 23, torch.full_like(s, 1 << 22)).view(torch.float32)


def e8m0_encode(scales: torch.Tensor) -> torch.Tensor:
    """uint8 e8m0 of float32 powers of two in 2^-127..2^127 (the inverse of e8m0_decode)."""
    bits = scales.float().contiguous().view(torch.int32)
    s = bits >> 23
    ok = (((bits & 0x7FFFFF) == 0) & (s >= 1) & (s <= 254)) | (bits == 1 << 22)
    if not bool(ok.all()):
        raise ValueError("e8m0 holds only powers of two in 2^-127..2^127")
    return torch.where(bits == 1 << 22, 0, s).to(torch.uint8)


@dataclass(frozen=True)
class Fp4Scheme:
    """A 4-bit float weight-only (W4A16) scheme as a cell runs it: the block the e2m1 codes share a scale over.
    `act_dynamic` (no static activation scale to calibrate) and `kind` speak the 8-bit Scheme's words where code
    asks them of any scheme. A checkpoint that quantizes activations too (NVFP4 W4A4) runs as this: Hopper has no
    FP4 MMA, so its activation scales are read and checked, never applied."""

    name: str
    block: int
    description: str
    kind: str = "fp4"
    act_dynamic: bool = True


FP4_SCHEMES: dict[str, Fp4Scheme] = {name: Fp4Scheme(name=name, description=description, **fields)
                                    for name, description, fields in registry.math_params("fp4")}


@dataclass
class Fp4Weight:
    """The canonical layout: codes uint8 (…, N, K) in 0..15, scales float32 (…, N, K/block), global_scale a
    multiplier or None. Leading dims are experts (gpt-oss); a linear layer has none."""

    codes: torch.Tensor
    scales: torch.Tensor
    block: int
    global_scale: float | None = None

    def __post_init__(self):
        k = self.codes.shape[-1]
        if self.codes.dtype != torch.uint8 or self.scales.dtype != torch.float32:
            raise ValueError(f"Fp4Weight wants uint8 codes and float32 scales, got {self.codes.dtype}/{self.scales.dtype}")
        if k % self.block or tuple(self.scales.shape) != (*self.codes.shape[:-1], k // self.block):
            raise ValueError(f"Fp4Weight: scales {tuple(self.scales.shape)} do not fit codes {tuple(self.codes.shape)} "
                             f"in blocks of {self.block}")

    def dequantize(self) -> torch.Tensor:
        """W (…, N, K) float32 = (e2m1 · scale) · global: the first product is exact (2 × 4 significant bits for
        e4m3 scales), so the only rounding is the global's, as in a fused kernel."""
        v = e2m1_decode(self.codes).unflatten(-1, (-1, self.block)) * self.scales[..., None]
        if self.global_scale is not None:
            v = v * self.global_scale
        return v.flatten(-2)

    def reference_linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return torch.nn.functional.linear(x.float(), self.dequantize(), None if bias is None else bias.float())


# --- reference quantizers (synthetic checkpoints) ---------------------------------------------------------------


def _pow2_at_least(x: torch.Tensor) -> torch.Tensor:
    """The least power of two ≥ x > 0, exactly (frexp, not a rounded log2)."""
    m, e = torch.frexp(x)
    return torch.ldexp(torch.ones_like(x), torch.where(m == 0.5, e - 1, e))


def _encode(w: torch.Tensor, eff: torch.Tensor, block: int) -> torch.Tensor:
    y = w.float().unflatten(-1, (-1, block)) / torch.where(eff == 0, 1.0, eff)[..., None]
    return e2m1_encode(y).flatten(-2)


def quantize_nvfp4(w: torch.Tensor) -> Fp4Weight:
    """NVFP4 of W (…, N, K): blocks of 16, e4m3 scales, an fp32 global. The global is the power of two at least
    amax/(448·6) (ModelOpt's amax/(448·6) rounded up), so both the multiplier (ModelOpt) and the reciprocal
    (compressed-tensors) hold it exactly and round trips are bit-exact. Block scales are rounded UP to e4m3, so no
    element saturates and the error is at most half an e2m1 step everywhere."""
    if w.shape[-1] % NVFP4_BLOCK:
        raise ValueError(f"NVFP4 needs K = {w.shape[-1]} to be a multiple of {NVFP4_BLOCK}")
    bmax = w.float().unflatten(-1, (-1, NVFP4_BLOCK)).abs().amax(-1)
    amax = bmax.max() if bmax.numel() else torch.tensor(0.0)
    g = _pow2_at_least(amax / (E4M3_MAX * E2M1_MAX)) if amax > 0 else torch.tensor(1.0)
    g = torch.where(g * (E4M3_MAX * E2M1_MAX) < amax, 2 * g, g)  # the division rounded down onto a power of two
    want = (bmax / (E2M1_MAX * g)).clamp(max=E4M3_MAX)
    s8 = want.to(torch.float8_e4m3fn)
    up = (s8.float() < want).to(torch.uint8)  # one e4m3 step up: the next bit pattern (want ≤ 448 keeps it finite)
    scales = (s8.view(torch.uint8) + up).view(torch.float8_e4m3fn).float()
    return Fp4Weight(_encode(w, scales * g, NVFP4_BLOCK), scales, NVFP4_BLOCK, float(g))


def quantize_mxfp4(w: torch.Tensor) -> Fp4Weight:
    """MXFP4 of W (…, N, K): blocks of 32, each scale the least power of two putting the block's absmax ≤ 6 (so no
    element saturates; the OCP recipe's floor(log2 amax) − 2 may clip), clamped to e8m0's 2^-127..2^127."""
    if w.shape[-1] % MXFP4_BLOCK:
        raise ValueError(f"MXFP4 needs K = {w.shape[-1]} to be a multiple of {MXFP4_BLOCK}")
    bmax = w.float().unflatten(-1, (-1, MXFP4_BLOCK)).abs().amax(-1)
    scales = _pow2_at_least(torch.where(bmax > 0, bmax / E2M1_MAX, 2.0**-127))
    scales = torch.where(scales * E2M1_MAX < bmax, 2 * scales, scales).clamp(2.0**-127, 2.0**127)
    return Fp4Weight(_encode(w, scales, MXFP4_BLOCK), scales, MXFP4_BLOCK)


# --- checks ------------------------------------------------------------------------------------------------------


def _expect(fmt: str, name: str, t: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...] | None) -> None:
    if t.dtype != dtype or (shape is not None and tuple(t.shape) != shape):
        want = f"{dtype} {shape}" if shape is not None else f"{dtype}"
        raise ConfigError(f"{fmt}: {name} is {t.dtype} {tuple(t.shape)}; expected {want}")


def _scalar(fmt: str, name: str, t: torch.Tensor) -> float:
    if t.dtype != torch.float32 or t.numel() != 1:
        raise ConfigError(f"{fmt}: {name} is {t.dtype} {tuple(t.shape)}; expected a float32 scalar (shape () or (1,))")
    v = float(t.reshape(()))
    if not v > 0 or v == float("inf"):
        raise ConfigError(f"{fmt}: {name} = {v}; expected a finite positive scale")
    return v


def _nvfp4_codes(fmt: str, wname: str, packed: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if packed.dtype != torch.uint8 or packed.dim() != 2 or (2 * packed.shape[1]) % NVFP4_BLOCK:
        raise ConfigError(f"{fmt}: {wname} is {packed.dtype} {tuple(packed.shape)}; expected uint8 (N, K/2) with "
                          f"K a multiple of {NVFP4_BLOCK}")
    n, k = packed.shape[0], 2 * packed.shape[1]
    _expect(fmt, "weight_scale", scale, torch.float8_e4m3fn, (n, k // NVFP4_BLOCK))
    s = scale.float()
    if not bool((torch.isfinite(s) & (s >= 0)).all()):
        raise ConfigError(f"{fmt}: weight_scale holds NaN or negative block scales; expected finite e4m3 ≥ 0")
    return unpack_e2m1(packed), s


def _e4m3_scales(w: Fp4Weight, fmt: str) -> torch.Tensor:
    if w.block != NVFP4_BLOCK or w.codes.dim() != 2:
        raise ValueError(f"{fmt} holds 2-D weights in blocks of {NVFP4_BLOCK}, not {w.block} ({w.codes.dim()}-D)")
    s8 = w.scales.to(torch.float8_e4m3fn)
    if not torch.equal(s8.float(), w.scales):
        raise ValueError(f"{fmt}: block scales are not e4m3 values")
    return s8


# --- ModelOpt NVFP4 ----------------------------------------------------------------------------------------------


def modelopt_nvfp4_pack(w: Fp4Weight, input_scale: float | None = None) -> dict[str, torch.Tensor]:
    """weight, weight_scale, weight_scale_2 (the global, a multiplier) and, if given, input_scale."""
    out = {"weight": pack_e2m1(w.codes), "weight_scale": _e4m3_scales(w, "ModelOpt NVFP4"),
           "weight_scale_2": torch.tensor(1.0 if w.global_scale is None else w.global_scale, dtype=torch.float32)}
    if input_scale is not None:
        out["input_scale"] = torch.tensor(input_scale, dtype=torch.float32)
    return out


def modelopt_nvfp4_unpack(weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor,
                          input_scale: torch.Tensor | None = None) -> Fp4Weight:
    """Canonical from ModelOpt's tensors: W = e2m1 · weight_scale · weight_scale_2.

    input_scale is the W4A4 activation scale (NVFP4 quantizes activations too on Blackwell). We run FP4 as W4A16
    on Hopper, so it is read and validated (a float32 positive scalar) but NOT applied: numerics then differ from
    a Blackwell W4A4 run, and our CPU W4A16 reference is what the kernels are judged against."""
    fmt = "ModelOpt NVFP4"
    codes, s = _nvfp4_codes(fmt, "weight", weight, weight_scale)
    g = _scalar(fmt, "weight_scale_2", weight_scale_2)
    if input_scale is not None:
        _scalar(fmt, "input_scale", input_scale)
    return Fp4Weight(codes, s, NVFP4_BLOCK, g)


# --- compressed-tensors nvfp4-pack-quantized ---------------------------------------------------------------------


def ct_nvfp4_pack(w: Fp4Weight) -> dict[str, torch.Tensor]:
    """weight_packed, weight_scale, weight_global_scale = 1 / global (the reciprocal convention)."""
    g = torch.tensor([1.0 if w.global_scale is None else w.global_scale], dtype=torch.float32)
    return {"weight_packed": pack_e2m1(w.codes), "weight_scale": _e4m3_scales(w, "compressed-tensors NVFP4"),
            "weight_global_scale": 1.0 / g}


def ct_nvfp4_unpack(weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_global_scale: torch.Tensor,
                    input_global_scale: torch.Tensor | None = None) -> Fp4Weight:
    """Canonical from compressed-tensors' tensors: W = e2m1 · weight_scale / weight_global_scale. The multiplier is
    1/global in fp32: exact for power-of-two globals (ours), within an ulp of compressed-tensors' own
    scale/global for others. input_global_scale (the NVFP4 preset's W4A4 activations) is checked, not applied,
    as ModelOpt's input_scale is."""
    fmt = "compressed-tensors NVFP4"
    codes, s = _nvfp4_codes(fmt, "weight_packed", weight_packed, weight_scale)
    _scalar(fmt, "weight_global_scale", weight_global_scale)
    if input_global_scale is not None:
        _scalar(fmt, "input_global_scale", input_global_scale)
    return Fp4Weight(codes, s, NVFP4_BLOCK, float(1.0 / weight_global_scale.reshape(())))


# --- gpt-oss MXFP4 experts ---------------------------------------------------------------------------------------


def mxfp4_experts_weight(blocks: torch.Tensor, scales: torch.Tensor, name: str = "gate_up_proj") -> Fp4Weight:
    """Canonical (E, R, C) from `{name}_blocks` (E, R, C/32, 16) and `{name}_scales` (E, R, C/32): R output rows in
    the checkpoint's order (gate_up_proj's gate/up interleave kept), C input channels."""
    fmt = "gpt-oss MXFP4"
    if blocks.dtype != torch.uint8 or blocks.dim() != 4 or blocks.shape[-1] != MX_BYTES:
        raise ConfigError(f"{fmt}: {name}_blocks is {blocks.dtype} {tuple(blocks.shape)}; expected uint8 "
                          f"(E, R, C/32, {MX_BYTES})")
    _expect(fmt, f"{name}_scales", scales, torch.uint8, tuple(blocks.shape[:-1]))
    s = e8m0_decode(scales, f"{fmt}: {name}_scales")
    return Fp4Weight(unpack_e2m1(blocks).flatten(-2), s, MXFP4_BLOCK)


def mxfp4_experts_unpack(blocks: torch.Tensor, scales: torch.Tensor, name: str = "gate_up_proj",
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The GptOssExperts parameter (E, C in, R out) that transformers dequantizes the pair into (the transpose of
    the canonical (E, R, C)); for gate_up_proj its last dim alternates gate, up."""
    return mxfp4_experts_weight(blocks, scales, name).dequantize().transpose(1, 2).to(dtype).contiguous()


def mxfp4_experts_pack(w: Fp4Weight) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks, scales) of a canonical (E, R, C) MXFP4 weight (no global scale in this format)."""
    if w.block != MXFP4_BLOCK or w.codes.dim() != 3 or w.global_scale not in (None, 1.0):
        raise ValueError(f"gpt-oss MXFP4 holds (E, R, C) weights in blocks of {MXFP4_BLOCK} without a global scale")
    return pack_e2m1(w.codes).unflatten(-1, (-1, MX_BYTES)), e8m0_encode(w.scales)


def interleave_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate_up rows (E, 2I, H) from gate and up (E, I, H): row 2i gate i, row 2i + 1 up i (gpt-oss's order)."""
    return torch.stack((gate, up), dim=-2).flatten(-3, -2)


def split_gate_up(gate_up_proj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate, up) of a GptOssExperts gate_up_proj (E, H, 2I): even columns gate, odd up."""
    return gate_up_proj[..., 0::2], gate_up_proj[..., 1::2]
