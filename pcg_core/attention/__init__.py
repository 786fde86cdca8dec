"""Attention: the split op, its metadata, the KV cache it addresses, and the backends that implement it."""

from pcg_core.attention import sdpa as _sdpa  # noqa: F401  (registers the sdpa backend)
from pcg_core.attention.backend import AttentionBackend, attention_backend_names, get_attention_backend, register_attention_backend
from pcg_core.attention.kv_cache import KVCache, KVCacheFull
from pcg_core.attention.metadata import AttentionMetadata
from pcg_core.attention.op import ATTN_IMPLEMENTATION

__all__ = [
    "ATTN_IMPLEMENTATION",
    "AttentionBackend",
    "AttentionMetadata",
    "KVCache",
    "KVCacheFull",
    "attention_backend_names",
    "get_attention_backend",
    "register_attention_backend",
]
