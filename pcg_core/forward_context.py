"""The forward context: the one piece of global state the design needs.

Split ops (attention today) run between captured graphs and take only tensors and constants as arguments, so
the per-batch metadata they need (slot mapping, positions, the attention backend with its KV cache, capture
hooks) is read from here. The owner of a forward sets it: the engine around every serving forward, the capture
backend around warm-up and capture.
Nothing else is global. This module sits below attention and capture, so it names their types only for checking.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol
from collections.abc import Callable, Iterator

if TYPE_CHECKING:
    import torch

    from pcg_core.attention.backend import AttentionBackend
    from pcg_core.attention.metadata import AttentionMetadata, FreshPath


class CaptureMode(StrEnum):
    """What graph wrappers do on this forward; set by whoever owns the forward, read by the pieces."""

    EAGER = "eager"  # no graphs: an eager reference, an unpadded batch, tracing
    WARMUP = "warmup"  # the run before a capture (lazy init, autotuning); nothing is recorded
    CAPTURE = "capture"  # record graphs for ctx.bucket
    REPLAY = "replay"  # replay the graphs recorded for ctx.bucket where there are any


class SegmentHook(Protocol):
    """Installed by breakable capture: a split op ends the running graph segment through it."""

    def hole(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None: ...


class AttentionObserver(Protocol):
    """Debugging hook: sees each attention input (the output of the piece before it) that runs outside a graph."""

    def __call__(self, layer: int, query: torch.Tensor) -> None: ...


class AttentionProbe(Protocol):
    """A judge's hook: called after each attention call outside a graph with the call's backend, inputs, output and
    metadata, so that it can call the backend again (the padding probe, harness/cell/judge/padding.py)."""

    def __call__(self, backend: AttentionBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out: torch.Tensor, params: Any, md: AttentionMetadata) -> None: ...


@dataclass
class ForwardContext:
    attn_metadata: AttentionMetadata
    attn_backend: AttentionBackend  # it holds the KV cache it addresses
    # Token bucket this forward is padded to (None: unpadded eager run).
    bucket: int | None = None
    mode: CaptureMode = CaptureMode.EAGER
    segment_recorder: SegmentHook | None = None
    observer: AttentionObserver | None = None
    attention_probe: AttentionProbe | None = None
    # Per-sequence states of linear-attention layers (pcg_core/linear_attention/state.py), for models that have them.
    linear_state: Any = None


GraphKey = int | tuple[int, str]


def graph_key(bucket: int, fresh_path: FreshPath) -> GraphKey:
    """What a graph that records split ops is kept under: its bucket, and for a variant captured with the split ops'
    fresh-sequence paths (AttentionMetadata.fresh_path) the bucket tagged with that path. The plain bucket stays the
    key of the one variant every model has."""
    return (bucket, fresh_path) if fresh_path else bucket


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
