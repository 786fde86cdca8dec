"""Per-batch attention metadata, as tensors the attention op reads from the forward context.

Every field is a view of a buffer the engine allocates once, so a graph captured for a bucket reads the same
addresses on every replay (`full` capture needs that; piecewise and breakable do not, but share the code).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    num_tokens: int  # padded token count (the bucket), or the exact count for an eager run
    num_actual: int  # real tokens; rows [num_actual:num_tokens] are padding
    slot_mapping: torch.Tensor  # [T] int64: KV slot each token writes (padding → the cache's pad slot)
    positions: torch.Tensor  # [T] int64: position of each token in its sequence
    seq_ids: torch.Tensor  # [T] int32: sequence of each token (padding → -2, matches no slot)
    valid: torch.Tensor  # [T] bool: False on padding rows
    mask: torch.Tensor  # [T, S] bool: token t may attend to cache slot s (same sequence, causal)
