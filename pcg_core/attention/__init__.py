"""Attention: the split op, its metadata, the paged KV cache it addresses, and the backends that implement it."""

from pcg_core.attention import flex as _flex  # noqa: F401  (registers the flex backend)
from pcg_core.attention import sdpa as _sdpa  # noqa: F401  (registers the sdpa backend)
from pcg_core.attention import varlen as _varlen  # noqa: F401  (registers the varlen backend)
from pcg_core.attention.backend import (
    FEATURES,
    AttentionBackend,
    attention_backend_names,
    get_attention_backend,
    register_attention_backend,
)
from pcg_core.attention.kv_cache import KVCache, KVCacheFull
from pcg_core.attention.metadata import AttentionMetadata, LayerParams
from pcg_core.attention.op import ATTN_IMPLEMENTATION

__all__ = [
    "ATTN_IMPLEMENTATION",
    "FEATURES",
    "AttentionBackend",
    "AttentionMetadata",
    "KVCache",
    "KVCacheFull",
    "LayerParams",
    "attention_backend_names",
    "get_attention_backend",
    "register_attention_backend",
]
