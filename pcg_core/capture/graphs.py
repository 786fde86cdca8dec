"""CUDA-graph plumbing shared by the capture backends: one memory pool, a capture stream, weak references.

All graphs of a backend share one pool and are captured largest bucket first; their outputs are held by weak
reference (a tensor that aliases the memory without owning it), so once a capture ends its blocks return to
the pool and the next, smaller bucket reuses them. That is what keeps graph memory near one bucket's worth.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch


def weak_ref(t: Any) -> Any:
    """A tensor viewing `t`'s memory without keeping it alive; other values pass through (tuples mapped)."""
    if isinstance(t, (tuple, list)):
        return type(t)(weak_ref(x) for x in t)
    if not isinstance(t, torch.Tensor) or t.device.type != "cuda":
        return t
    storage = t.untyped_storage()
    alias = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), t.device, storage.nbytes())
    return torch.empty((), dtype=t.dtype, device=t.device).set_(alias, t.storage_offset(), t.size(), t.stride())


@contextmanager
def no_gc_during_capture() -> Iterator[None]:
    """Collect cyclic garbage now, then keep Python's collector off until the captures end.

    Dead engines (and their CUDA graphs) often sit in reference cycles that only the cyclic collector frees.
    If it runs mid-capture, destroying those graphs releases their pool memory (cudaFree) while the stream is
    capturing, which invalidates the capture ("operation not permitted when stream is capturing"). Collecting
    first and pausing the collector keeps every free out of the capture window.
    """
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class GraphPool:
    """The shared pool, the side stream captures run on, a count of captured graphs, and the open capture."""

    def __init__(self, device: torch.device):
        self.enabled = device.type == "cuda"
        self.device = device
        self.handle = torch.cuda.graph_pool_handle() if self.enabled else None
        self.stream = torch.cuda.Stream(device=device) if self.enabled else None
        self.graphs_captured = 0
        self.open: torch.cuda.CUDAGraph | None = None

    def begin(self) -> torch.cuda.CUDAGraph:
        g = torch.cuda.CUDAGraph()
        g.capture_begin(pool=self.handle)
        self.open = g
        return g

    def capture(self, fn: Callable[..., Any], *args: Any) -> tuple[torch.cuda.CUDAGraph, Any]:
        """Record fn(*args) into a new graph of this pool; returns the graph and fn's output (strongly held)."""
        g = self.begin()
        out = fn(*args)
        self.end(g)
        return g, out

    def end(self, g: torch.cuda.CUDAGraph) -> torch.cuda.CUDAGraph:
        g.capture_end()
        self.open = None  # only now: if capture_end raised, abort() still has the capture to close
        self.graphs_captured += 1
        return g

    def abort(self) -> None:
        """End a capture that an exception interrupted, so the stream leaves capture mode and later CUDA
        work in this process (another engine, an eager fallback) is not refused; the graph is discarded."""
        g, self.open = self.open, None
        if g is None:
            return
        with torch.cuda.stream(self.stream):  # a capture must end on the stream it began on
            try:
                g.capture_end()
            except Exception:  # noqa: BLE001 - an invalidated capture ends with an error; it ends all the same
                # ...but before torch takes the CUDA generator out of capture mode, so every later random op
                # would fail ("Offset increment outside graph capture"). An empty capture's end does it.
                empty = torch.cuda.CUDAGraph()
                empty.capture_begin()  # a pool of its own: the failed one may still be marked as recording
                empty.capture_end()
