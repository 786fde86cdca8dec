"""Static input buffers: token ids, positions and attention metadata, allocated once at the largest bucket.

The attention backend's own metadata (a mask, a block mask, cu_seqlens) is its business: the engine calls its
`begin_forward` after `fill`.

A forward padded to bucket b uses the first b rows of each buffer, so a graph captured for b finds its inputs
at the same addresses on every replay. A batch above the largest bucket gets fresh tensors (it runs eagerly).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pcg_core.attention.metadata import AttentionMetadata
from pcg_core.attention.kv_cache import KVCache

PAD_SEQ = -2  # sequence id of padding rows: matches no slot (free slots carry -1)


@dataclass
class PackedBatch:
    """A ragged batch on the host: tokens of many sequences back to back."""

    token_ids: list[int]
    positions: list[int]
    seq_ids: list[int]
    slots: list[int]

    def __len__(self) -> int:
        return len(self.token_ids)


class InputBuffers:
    def __init__(self, capacity: int, cache: KVCache, device: torch.device):
        self.capacity = capacity
        self.cache = cache
        self.device = device
        self._bufs = self._alloc(capacity) if capacity > 0 else None

    def _alloc(self, n: int) -> dict[str, torch.Tensor]:
        d = self.device
        return {
            "input_ids": torch.zeros(n, dtype=torch.int64, device=d),
            "positions": torch.zeros(n, dtype=torch.int64, device=d),
            "slot_mapping": torch.zeros(n, dtype=torch.int64, device=d),
            "seq_ids": torch.zeros(n, dtype=torch.int32, device=d),
            "valid": torch.zeros(n, dtype=torch.bool, device=d),
        }

    def fill(self, batch: PackedBatch, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Write `batch` padded to `num_tokens` rows; returns (input_ids, positions, metadata) views."""
        n = len(batch)
        if num_tokens < n:
            raise ValueError(f"cannot pad {n} tokens down to {num_tokens}")
        pad = num_tokens - n
        host = torch.tensor(
            [
                batch.token_ids + [0] * pad,
                batch.positions + [0] * pad,
                batch.slots + [self.cache.pad_slot] * pad,
                batch.seq_ids + [PAD_SEQ] * pad,
            ],
            dtype=torch.int64,
        )
        bufs = self._bufs if num_tokens <= self.capacity else self._alloc(num_tokens)
        v = {k: t[:num_tokens] for k, t in bufs.items()}
        staged = host.to(self.device, non_blocking=True)
        v["input_ids"].copy_(staged[0])
        v["positions"].copy_(staged[1])
        v["slot_mapping"].copy_(staged[2])
        v["seq_ids"].copy_(staged[3])
        torch.ge(v["seq_ids"], 0, out=v["valid"])
        md = AttentionMetadata(
            num_tokens=num_tokens,
            num_actual=n,
            slot_mapping=v["slot_mapping"],
            positions=v["positions"],
            seq_ids=v["seq_ids"],
            valid=v["valid"],
            host_seq_ids=host[3, :n],
            host_positions=host[1, :n],
        )
        return v["input_ids"], v["positions"], md
