"""The paged KV cache: per layer a [slots + 1, kv_heads, head_dim] tensor for K and one for V, cut into pages (MLA
models: one latent tensor per layer, V a view of it).

A sequence owns whole pages (`page_size` slots each), not necessarily adjacent: its block table lists them in
order, and position p lives in slot `pages[p // page_size] * page_size + p % page_size`. Every slot also carries
the id of its sequence and its position (`slot_seq`, `slot_pos`), and every page its sequence and its first
position (`page_seq`, `page_pos`): that is all a mask (sdpa), a block mask (flex) or a gather (varlen) needs.
The extra last slot is the pad slot: padded tokens write there and no sequence ever reads it.

Slot-major, like vLLM's: K[:num_slots] viewed as [pages, page_size, heads, dim] is the page pool a paged
kernel takes, and one token's K for all heads is one contiguous row. Page 128 suits flex (its KV block), 1
gives the old one-slot-per-token cache.
"""

from __future__ import annotations

import torch
from transformers import PretrainedConfig

from pcg_core.errors import ConfigError


class KVCacheFull(RuntimeError):
    """More slots were asked for than the cache holds; the message names `kv_slots`."""


class KVCache:
    def __init__(self, config: PretrainedConfig, num_slots: int, dtype: torch.dtype, device: torch.device,
                 page_size: int = 1):
        if not isinstance(page_size, int) or page_size < 1:
            raise ConfigError(f"page_size must be a positive integer, got {page_size!r}", field="page_size")
        self.page_size = page_size
        self.num_pages = -(-num_slots // page_size)
        self.num_slots = self.num_pages * page_size  # whole pages
        self.pad_slot = self.num_slots
        layers = config.num_hidden_layers
        # MLA (DeepSeek-V3, Kimi-K2): one latent row per token, the normed compressed KV then the rotated shared
        # key part; keys are the whole row (one KV head), values its first kv_lora_rank columns — a view, no copy.
        self.latent = bool(getattr(config, "kv_lora_rank", None))
        if self.latent:
            rank = config.kv_lora_rank
            self.k = [torch.zeros(self.num_slots + 1, 1, rank + config.qk_rope_head_dim, dtype=dtype, device=device)
                      for _ in range(layers)]
            self.v = [k[..., :rank] for k in self.k]
        else:
            n_kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
            head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            shape = (self.num_slots + 1, n_kv, head_dim)
            self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
            self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.slot_seq = torch.full((self.num_slots + 1,), -1, dtype=torch.int32, device=device)
        self.slot_pos = torch.zeros(self.num_slots + 1, dtype=torch.int64, device=device)
        self.page_seq = torch.full((self.num_pages,), -1, dtype=torch.int32, device=device)
        self.page_pos = torch.zeros(self.num_pages, dtype=torch.int64, device=device)
        self.block_tables: dict[int, list[int]] = {}  # sequence → its pages, in position order (host side)
        self._free: list[int] = list(range(self.num_pages))

    def reset(self, page_order: list[int] | None = None) -> None:
        """Forget all sequences (the tensors keep their addresses, so captured graphs stay valid). page_order:
        the order free pages are handed out in (tests scatter sequences over the pool with it)."""
        self.slot_seq.fill_(-1)
        self.slot_pos.zero_()
        self.page_seq.fill_(-1)
        self.page_pos.zero_()
        self.block_tables.clear()
        if page_order is not None and sorted(page_order) != list(range(self.num_pages)):
            raise ValueError(f"page_order must be a permutation of the {self.num_pages} pages")
        self._free = list(page_order) if page_order is not None else list(range(self.num_pages))

    def allocate(self, seq_id: int, length: int) -> list[int]:
        """Reserve pages for positions 0..length-1 of sequence `seq_id`; returns the slot of each position."""
        if seq_id in self.block_tables:
            raise ValueError(f"sequence {seq_id} already holds pages")
        need = -(-length // self.page_size)
        if need > len(self._free):
            used = self.num_pages - len(self._free)
            raise KVCacheFull(f"KV cache full: {used} of {self.num_pages} pages of {self.page_size} slots used, "
                              f"{need} more asked for {length} tokens; raise kv_slots")
        pages, self._free = self._free[:need], self._free[need:]
        self.block_tables[seq_id] = pages
        ps = self.page_size
        dev = self.slot_pos.device
        page_t = torch.tensor(pages, dtype=torch.int64, device=dev)
        first = torch.arange(need, dtype=torch.int64, device=dev) * ps
        slots = (page_t[:, None] * ps + torch.arange(ps, device=dev)).flatten()
        # A page belongs to its sequence whole: slots past `length` in the last page carry the positions that
        # would follow, which no query of this sequence reaches (queries stay below `length`).
        self.slot_seq[slots] = seq_id
        self.slot_pos[slots] = (first[:, None] + torch.arange(ps, device=dev)).flatten()
        self.page_seq[page_t] = seq_id
        self.page_pos[page_t] = first
        return [pages[p // ps] * ps + p % ps for p in range(length)]

    @property
    def nbytes(self) -> int:
        tensors = self.k if self.latent else self.k + self.v  # a latent cache's values are views of its keys
        return sum(t.numel() * t.element_size() for t in tensors)

    @property
    def bytes_per_token(self) -> int:
        """KV memory one token takes over all layers (MLA: (kv_lora_rank + qk_rope_head_dim) × layers × dtype)."""
        return self.nbytes // (self.num_slots + 1)
