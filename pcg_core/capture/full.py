"""`full`: one CUDA graph per bucket for the whole decoder forward, attention included.

It declares that it needs a capturable attention backend (static shapes, no host sync); building it with any
other raises a ConfigError that says why, and `capabilities()` exports the same declaration for pre-checks.
"""

from __future__ import annotations

import torch

from pcg_core.capture.base import GraphBackend
from pcg_core.capture.graphs import weak_ref
from pcg_core.capture.registry import register_capture_backend


@register_capture_backend
class FullBackend(GraphBackend):
    name = "full"
    requires_capturable_attention = True  # the base class refuses other attention backends with a ConfigError

    def setup(self) -> None:
        self.stats.pieces = 1
        self.stats.submodules = 1

    def capture(self, bucket, input_ids, positions, ctx) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        graph, out = self.pool.capture(self.body, input_ids, positions)
        return graph, weak_ref(out)

    def replay(self, entry: tuple[torch.cuda.CUDAGraph, torch.Tensor]) -> torch.Tensor:
        graph, out = entry
        graph.replay()
        return out
