"""e2m1 (FP4) codes: their 16 values and the two-a-byte packing (low nibble = even k), what the FP4 formats
(fp4.py) and the FP4 W4A16 op's reference (kernels/fp4_gemm.py) share, in a module of its own so that neither imports the
other's module (fp4.py's Fp4Linear calls the op). e2m1: bit 3 the sign, bits 0..2 index the magnitudes 0, .5, 1,
1.5, 2, 3, 4, 6 (code 8 is −0)."""

from __future__ import annotations

import torch

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def e2m1_table(device: torch.device | str | None = None) -> torch.Tensor:
    """The 16 values of e2m1, indexed by code (float32; entry 8 is −0.0)."""
    return torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of uint8 codes 0..15 (a gather: sync-free, so also what a captured forward runs)."""
    return e2m1_table(codes.device)[codes.long()]


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """uint8 (…, K/2) of codes (…, K): byte j holds code 2j in its LOW nibble and 2j + 1 in its high one."""
    if codes.shape[-1] % 2:
        raise ValueError(f"packing e2m1 needs an even K, got {codes.shape[-1]}")
    if codes.numel() and int(codes.max()) > 15:
        raise ValueError("e2m1 codes must lie in 0..15")
    pairs = codes.to(torch.uint8).unflatten(-1, (-1, 2))
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 codes (…, 2·K2) of bytes (…, K2), low nibble first (sync-free)."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)
