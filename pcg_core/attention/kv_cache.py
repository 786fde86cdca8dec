"""The KV cache: per layer a [kv_heads, slots + 1, head_dim] tensor for K and one for V, addressed by slot.

Each sequence owns a contiguous range of slots for its prompt and its generated tokens. Every slot carries
the id of its sequence and its position, which is all the attention mask needs. The extra last slot is the
pad slot: padded tokens write there, and no sequence ever reads it. It lives next to the attention code because
attention is what addresses it (the engine only allocates slots).
"""

from __future__ import annotations

import torch
from transformers import PretrainedConfig


class KVCacheFull(RuntimeError):
    """More slots were asked for than the cache holds; the message names `kv_slots`."""


class KVCache:
    def __init__(self, config: PretrainedConfig, num_slots: int, dtype: torch.dtype, device: torch.device):
        n_kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (n_kv, num_slots + 1, head_dim)
        self.num_slots = num_slots
        self.pad_slot = num_slots
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.slot_seq = torch.full((num_slots + 1,), -1, dtype=torch.int32, device=device)
        self.slot_pos = torch.zeros(num_slots + 1, dtype=torch.int64, device=device)
        self._next = 0

    def reset(self) -> None:
        """Forget all sequences (the tensors keep their addresses, so captured graphs stay valid)."""
        self.slot_seq.fill_(-1)
        self.slot_pos.zero_()
        self._next = 0

    def allocate(self, seq_id: int, length: int) -> int:
        """Reserve `length` slots for sequence `seq_id` (positions 0..length-1); returns the first slot."""
        base = self._next
        if base + length > self.num_slots:
            raise KVCacheFull(f"KV cache full: {base} of {self.num_slots} slots used, {length} more asked; raise kv_slots")
        self.slot_seq[base : base + length] = seq_id
        self.slot_pos[base : base + length] = torch.arange(length, device=self.slot_pos.device)
        self._next = base + length
        return base

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)
