"""CUDA-graph plumbing shared by the capture backends: one memory pool, a capture stream, weak references.

All graphs of a backend share one pool and are captured largest bucket first; their outputs are held by weak
reference (a tensor that aliases the memory without owning it), so once a capture ends its blocks return to
the pool and the next, smaller bucket reuses them. That is what keeps graph memory near one bucket's worth.
"""

from __future__ import annotations

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


class GraphPool:
    """The shared pool, the side stream captures run on, and a count of captured graphs."""

    def __init__(self, device: torch.device):
        self.enabled = device.type == "cuda"
        self.device = device
        self.handle = torch.cuda.graph_pool_handle() if self.enabled else None
        self.stream = torch.cuda.Stream(device=device) if self.enabled else None
        self.graphs_captured = 0

    def begin(self) -> torch.cuda.CUDAGraph:
        g = torch.cuda.CUDAGraph()
        g.capture_begin(pool=self.handle)
        return g

    def end(self, g: torch.cuda.CUDAGraph) -> torch.cuda.CUDAGraph:
        g.capture_end()
        self.graphs_captured += 1
        return g
