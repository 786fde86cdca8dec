"""The forward context: the one piece of global state the design needs.

Split ops (attention today) run between captured graphs and take only tensors and constants as arguments, so
the per-batch metadata they need (slot mapping, mask, KV cache, capture hooks) is read from here. The engine
sets it around every forward; nothing else is global.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from pcg_core.attention.metadata import AttentionMetadata
    from pcg_core.engine.kv_cache import KVCache


@dataclass
class ForwardContext:
    attn_metadata: "AttentionMetadata"
    kv_cache: "KVCache"
    attn_backend: Any
    # Token bucket this forward is padded to (None: unpadded eager run).
    bucket: int | None = None
    # "eager" | "warmup" | "capture" | "replay": what graph wrappers should do on this forward.
    mode: str = "eager"
    # Breakable capture installs a recorder here; split ops end a segment through it.
    segment_recorder: Any = None
    # Debugging hook observer(layer, query): sees each attention input, i.e. the output of the piece before it.
    observer: Any = None


_CURRENT: ForwardContext | None = None


def get_forward_context() -> ForwardContext:
    if _CURRENT is None:
        raise RuntimeError("no forward context is set: pcg ops must run inside Engine.forward")
    return _CURRENT


def has_forward_context() -> bool:
    return _CURRENT is not None


@contextmanager
def set_forward_context(ctx: ForwardContext) -> Iterator[ForwardContext]:
    global _CURRENT
    prev, _CURRENT = _CURRENT, ctx
    try:
        yield ctx
    finally:
        _CURRENT = prev
