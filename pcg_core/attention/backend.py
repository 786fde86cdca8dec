"""Attention backends: a registry, so that new kernels plug in without touching the op or the capture code.

Registered like capture backends (`@register_attention_backend` reads `cls.name`, the getter returns the class).
Each backend declares what it can do — features, devices, whether its op can be recorded in a CUDA graph — and
`capabilities()` publishes those declarations, so the matrix pre-check and `pcgh request` never keep a list.

A backend is built per engine, over that engine's KV cache, and owns the static buffers its metadata needs
(a mask, a block mask, cu_seqlens) sized for the largest bucket. Two calls per forward:
- `begin_forward(md)`: after the engine wrote the batch into its input buffers, before any graph runs; on the
  host's side of the graph, so it may copy host data in (varlen's cu_seqlens) or run device ops (sdpa's mask).
  A backend whose begin_forward is device work alone declares `prep_capturable`: the engine then records it in
  a graph per bucket and, at replay, calls `rebind(md)` for the Python side.
- `forward(q, k, v, out, params, md)`: per layer, inside the split op (between graphs, or recorded in a
  `full` graph), writes this layer's KV and the attention output.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

import torch

from pcg_core.errors import ConfigError
from pcg_core.registry import ATTENTION_BACKENDS

if TYPE_CHECKING:
    from pcg_core.attention.kv_cache import KVCache
    from pcg_core.attention.metadata import AttentionMetadata, LayerParams

# Score modifiers and shapes a backend may support; `LayerParams.features` names what a call needs.
FEATURES = ("causal", "gqa", "sliding_window", "softcap", "sinks", "mla", "length_temperature")


class AttentionBackend(ABC):
    name: ClassVar[str] = ""
    # Can the whole op be recorded into a CUDA graph (static shapes, no host sync)? A capture backend that
    # declares requires_capturable_attention (full) needs it.
    capturable: ClassVar[bool] = False
    why_not_capturable: ClassVar[str] = ""
    page_size: ClassVar[int] = 16  # the KV page size it prefers (the engine's default)
    # Device types it runs on, and why not on the others (device type → reason).
    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    why_not_device: ClassVar[dict[str, str]] = {}
    # Compute dtypes it runs, and why not the others (a FlashAttention kernel has no float32 one).
    dtypes: ClassVar[tuple[str, ...]] = ("float32", "float16", "bfloat16")
    why_not_dtype: ClassVar[str] = ""
    # Device types where it compiles a kernel per shape and dtype (flex on CUDA: inductor, seconds each): a check
    # that would only run it in another dtype (the judge's float32 runs) uses another backend there.
    compiled_per_shape: ClassVar[tuple[str, ...]] = ()
    # KV-cache dtypes (pcg_core.known.KV_CACHE_DTYPES) it reads correctly: an FP8 cache only through KVCache.read,
    # which dequantizes; a backend that reads the cache tensors itself declares "auto" alone.
    kv_caches: ClassVar[tuple[str, ...]] = ("auto",)
    # Is begin_forward device work only, on static buffers, shaped by the bucket alone? Then the engine records it
    # per bucket in a prep graph (engine/prep.py) and calls `rebind` instead at replay.
    prep_capturable: ClassVar[bool] = False
    # Does it take a cheaper path for a forward of fresh sequences (AttentionMetadata.fresh_path: nothing cached before
    # it, so the forward's own K and V are all it attends over)? The engine then decides the path per forward.
    fresh_path: ClassVar[bool] = False

    def __init__(self, cache: KVCache, max_tokens: int):
        device = cache.slot_seq.device
        if reason := self.dtype_reason(str(cache.dtype).removeprefix("torch.")):
            raise ConfigError(reason, field="dtype")
        if reason := self.device_reason(device.type):
            raise ConfigError(reason, field="attention")
        if reason := self.kv_cache_reason(cache.kv_cache):
            raise ConfigError(reason, field="kv_cache")
        self.cache = cache
        self.max_tokens = max(1, max_tokens)
        self.device = device
        self.checked_layers: set[int] = set()  # layers whose score modifiers check_call accepted

    # Declarations ------------------------------------------------------------------------------------------
    @classmethod
    def features(cls) -> dict[str, str | None]:
        """Each of FEATURES → None (supported) or why not. A classmethod: it may depend on the installed torch."""
        return {f: None for f in FEATURES}

    @classmethod
    def dtype_reason(cls, dtype: str) -> str | None:
        """Why this backend cannot compute in `dtype` (float32, float16, bfloat16), or None."""
        if dtype in cls.dtypes:
            return None
        return f"attention backend {cls.name!r} cannot compute in {dtype}: {cls.why_not_dtype or 'it runs ' + ', '.join(cls.dtypes)}"

    @classmethod
    def device_reason(cls, device_type: str) -> str | None:
        if device_type in cls.devices:
            return None
        why = cls.why_not_device.get(device_type, f"it runs on {', '.join(cls.devices)} only")
        return f"attention backend {cls.name!r} cannot run on {device_type}: {why}"

    @classmethod
    def kv_cache_reason(cls, kv_cache: str) -> str | None:
        """None if it reads a `kv_cache` cache correctly, else why not."""
        if kv_cache in cls.kv_caches:
            return None
        return (f"attention backend {cls.name!r} does not declare kv_cache {kv_cache!r} (it reads {', '.join(cls.kv_caches)}: "
                "an FP8 cache must be read through KVCache.read, which dequantizes); use kv_cache auto or sdpa")

    def check_call(self, params: LayerParams, gqa: bool) -> None:
        """Refuse, naming the feature, a call this backend would compute wrongly (rather than silently)."""
        feats = self.features()
        for f in sorted(params.features(gqa)):
            if feats.get(f, "not declared") is not None:
                raise ConfigError(f"attention backend {self.name!r} does not support {f} ({feats.get(f) or 'not declared'}); "
                                  f"use one that does (sdpa supports all of them)", field="attention")

    def kernels_built(self) -> tuple[int, float]:
        """(kernels this backend compiled for itself so far, host seconds spent building them): what a cell's
        capture and run phases pay the first time each shape is met (flex: one inductor kernel per token count and
        modifier set); 0 for a backend that calls ready-made kernels."""
        return 0, 0.0

    # Per forward ---------------------------------------------------------------------------------------------
    def begin_forward(self, md: AttentionMetadata) -> None:
        """Fill this backend's metadata buffers for the batch in `md` (outside any graph)."""

    def rebind(self, md: AttentionMetadata) -> None:
        """After a prep graph replayed begin_forward's device work for `md`'s bucket: set the per-forward Python
        state begin_forward sets (views, objects), as it set them for that bucket."""
        raise NotImplementedError(f"attention backend {self.name!r} does not declare prep_capturable")

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, params: LayerParams,
                md: AttentionMetadata) -> None:
        """q [T, H, D], k and v [T, Hkv, D]: write k, v to the cache at md.slot_mapping, attention into out [T, H, D]
        (padding rows exactly zero)."""


def write_kv(cache: KVCache, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store this forward's K and V rows in their slots (padding rows land in the pad slot), quantized with the
    layer's scale tensors where the cache is FP8 (KVCache.write). A latent (MLA) cache stores K only: its V is a
    view of K's first columns, and so is the v it is handed."""
    cache.write(layer, k, v, slot_mapping)


def zero_padding(out: torch.Tensor, attn: torch.Tensor, valid: torch.Tensor) -> None:
    """out = attn on real rows, exactly 0 on padding rows (whatever the kernel left there: NaN, garbage)."""
    out.copy_(torch.where(valid[:, None, None], attn, 0.0))  # a Python zero: no zero tensor made (a launch) per call


def register_attention_backend(cls: type[AttentionBackend]) -> type[AttentionBackend]:
    return ATTENTION_BACKENDS.register(cls)


def attention_backend_names() -> list[str]:
    return ATTENTION_BACKENDS.names()


def get_attention_backend(name: str) -> type[AttentionBackend]:
    """The class registered as `name`; raises ConfigError (field "attention") naming the known ones."""
    return ATTENTION_BACKENDS.get(name)
