"""4-bit integer codes packed 8 per int32 word, and the dequantization W = (q − z)·s per group: what the int4
formats (int4.py) and the W4A16 op's reference (kernels/w4a16_gemm.py) share, in a module of its own so that neither imports
the other's module (int4.py's Int4Linear calls the op)."""

from __future__ import annotations

import torch

PLAIN_ORDER = tuple(range(8))
NIBBLES = 8  # per int32 word


def pack_nibbles(codes: torch.Tensor, dim: int, order: tuple[int, ...] = PLAIN_ORDER) -> torch.Tensor:
    """int32 words of 8 codes (0..15) along `dim`: nibble i (bits 4i..4i+3) holds element order[i] of its 8."""
    codes = codes.movedim(dim, -1)
    if codes.shape[-1] % NIBBLES:
        raise ValueError(f"packing 4-bit codes needs a multiple of {NIBBLES} along dim {dim}, got {codes.shape[-1]}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) > 15):
        raise ValueError("4-bit codes must lie in 0..15")
    g = codes.reshape(*codes.shape[:-1], -1, NIBBLES).to(torch.int64)
    word = torch.zeros(g.shape[:-1], dtype=torch.int64, device=codes.device)
    for i, j in enumerate(order):
        word |= g[..., j] << (4 * i)
    word = torch.where(word >= 2**31, word - 2**32, word)  # the same 32 bits, as a signed int32 holds them
    return word.to(torch.int32).movedim(-1, dim)


def unpack_nibbles(words: torch.Tensor, dim: int, order: tuple[int, ...] = PLAIN_ORDER) -> torch.Tensor:
    """The inverse of pack_nibbles: uint8 codes, 8 per word along `dim`."""
    w = words.movedim(dim, -1).to(torch.int64) & 0xFFFFFFFF
    out = torch.empty(*w.shape, NIBBLES, dtype=torch.uint8, device=words.device)
    for i, j in enumerate(order):
        out[..., j] = ((w >> (4 * i)) & 0xF).to(torch.uint8)
    return out.reshape(*w.shape[:-1], -1).movedim(-1, dim)


def dequantize_codes(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int) -> torch.Tensor:
    """W (…, N, K) float32 = (q − z)·s of uint8 codes (…, N, K) with scales and zeros (…, N, K/group)."""
    s = scales.repeat_interleave(group, dim=-1)
    z = zeros.repeat_interleave(group, dim=-1)
    return (q.float() - z) * s
