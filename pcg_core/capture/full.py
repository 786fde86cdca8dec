"""`full`: one CUDA graph per bucket for the whole decoder forward, attention included.

It declares that it needs a capturable attention backend (static shapes, no host sync); building it with any
other raises a ConfigError that says why, and `capabilities()` exports the same declaration for pre-checks.

With compiler "inductor" the forward is traced and cut at the split ops once, the pieces compiled by inductor
with the token dimension symbolic (as `piecewise` does), and the whole split module recorded as one graph per
bucket: fused kernels, and a single launch per forward. With "eager" the decoder runs as transformers wrote it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from pcg_core.capture.graphs import weak_ref
from pcg_core.capture.piecewise import PiecewiseBackend, ReplayPlan
from pcg_core.capture.registry import register_capture_backend
from pcg_core.forward_context import CaptureMode

if TYPE_CHECKING:
    from pcg_core.attention.metadata import FreshPath


@register_capture_backend
class FullBackend(PiecewiseBackend):
    name = "full"
    requires_capturable_attention = True  # the base class refuses other attention backends with a ConfigError
    entry_per_key = True  # one graph per key, no pieces of its own: a miss would run eagerly

    def _traced(self) -> bool:
        return self.config.compiler == "inductor"

    def _graph_attention(self) -> bool:
        return False  # the split ops are inside the one graph already

    def records_split_ops(self) -> bool:
        return True  # in the one graph

    def capture_passes(self, bucket: int) -> tuple[FreshPath, ...]:
        return self.variants(bucket)  # a pass per variant: each is the whole forward (not piecewise's one pass)

    def setup(self) -> None:
        if self._traced():
            super().setup()
        self.stats.pieces = 1
        self.stats.submodules = self.stats.submodules or 1

    def run_padded(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return super().run_padded(input_ids, positions) if self._traced() else self.body(input_ids, positions)

    def capture(self, bucket, input_ids, positions, ctx) -> ReplayPlan:
        ctx.mode = CaptureMode.EAGER  # the pieces run their code into this one graph, not graphs of their own
        try:
            graph, out = self.pool.capture(self.run_padded, input_ids, positions)
        finally:
            ctx.mode = CaptureMode.CAPTURE
        return ReplayPlan((graph,), weak_ref(out))
