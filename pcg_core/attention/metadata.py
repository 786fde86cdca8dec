"""Per-batch attention metadata, and the per-layer parameters of one attention call.

Every tensor field is a view of a buffer the engine allocates once, so a graph captured for a bucket reads the
same addresses on every replay (`full` capture needs that; piecewise and breakable do not, but share the code).
`host_seq_ids` and `host_positions` are the real rows as the engine had them on the host: backends that need
per-sequence counts (varlen's cu_seqlens, its KV gather) build their buffers from them before the forward,
never by reading device tensors back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

# The split ops' fresh-sequence path a forward takes (AttentionMetadata.fresh_path): "" none, the cache-reading path;
# "packed": every sequence causal over its own rows, bounded by cu_seqlens (attention/fresh.py); "one": one sequence
# from row 0 with the padding after it, where plain causal attention over every row of the forward is exact for the
# real rows (a padding row sees them, they see no padding row), so a dense kernel takes it — cuDNN's on Hopper,
# where FlashAttention-2's varlen kernel is 3× slower at MLA's head widths (docs/attention.md).
FreshPath = Literal["", "packed", "one"]


@dataclass
class AttentionMetadata:
    num_tokens: int  # padded token count (the bucket), or the exact count for an eager run
    num_actual: int  # real tokens; rows [num_actual:num_tokens] are padding
    slot_mapping: torch.Tensor  # [T] int64: KV slot each token writes (padding → the cache's pad slot)
    positions: torch.Tensor  # [T] int64: position of each token in its sequence
    seq_ids: torch.Tensor  # [T] int32: sequence of each token (padding → -2, matches no slot)
    valid: torch.Tensor  # [T] bool: False on padding rows
    host_seq_ids: torch.Tensor | None = None  # [num_actual] int64 on the CPU
    host_positions: torch.Tensor | None = None  # [num_actual] int64 on the CPU
    # The split ops' fresh-sequence path (MLA's expanded prefill, pcg_core/attention/mla_op.py; FreshPath): taken
    # where no real sequence of this forward has KV cached before it and the forward is wide enough for it to pay.
    # Decided on the host by the engine (Engine.fresh_path), the same way for a graph and for its eager reference at
    # that padding; graphs that record split ops keep one variant per value (forward_context.graph_key).
    fresh_path: FreshPath = ""
    # cu_seqlens of the forward's sequences, then its padding ([FRESH_PATH_MAX_SEQS + 2] int32, attention/fresh.py's
    # sequence_bounds), built once per forward with the upload where a split op has a fresh path over them (MLA);
    # None: each call builds its own.
    fresh_bounds: torch.Tensor | None = None


@dataclass(frozen=True)
class LayerParams:
    """What one attention call adds to the batch's metadata: its layer and the model's score modifiers."""

    layer: int
    scale: float
    sliding_window: int = 0  # 0: none; else a key at distance ≥ window is masked (transformers: the window
    #                          includes the current token, so window 1 sees only itself)
    softcap: float = 0.0  # 0: none; else scores → softcap·tanh(scores / softcap) before the mask
    sinks: torch.Tensor | None = None  # [heads] logits of a per-head sink (gpt-oss): in the softmax, no value
    temperature_len: int = 0  # 0: none; else a query at position p > L scales its scores by log2(p)/log2(L),
    #                           after the soft-cap (Grok's length temperature)
    latent: bool = False  # MLA, absorbed: queries in the latent space, keys the latent cache rows, values their
    #                       first kv_lora_rank columns (one KV head; qk 576 / v 512 dims at DeepSeek-V3's widths)

    def features(self, gqa: bool) -> set[str]:
        """The features this call needs from a backend (the names `AttentionBackend.features` declares)."""
        need = {"causal"}
        if gqa:
            need.add("gqa")
        if self.sliding_window > 0:
            need.add("sliding_window")
        if self.softcap:
            need.add("softcap")
        if self.sinks is not None:
            need.add("sinks")
        if self.latent:
            need.add("mla")
        if self.temperature_len:
            need.add("length_temperature")
        return need
