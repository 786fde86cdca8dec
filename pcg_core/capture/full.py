"""`full`: one CUDA graph per bucket for the whole decoder forward, attention included.

Only offered when the attention backend can be captured (static shapes, no host sync); otherwise building it
raises and says why.
"""

from __future__ import annotations

import torch

from pcg_core.capture.base import GraphBackend
from pcg_core.capture.graphs import weak_ref
from pcg_core.config import ConfigError


class FullBackend(GraphBackend):
    name = "full"

    def __init__(self, *args, attn_backend=None, **kwargs):
        if attn_backend is not None and not attn_backend.capturable:
            raise ConfigError(
                f"--graph full needs an attention backend that can be captured in a CUDA graph; "
                f"{attn_backend.name!r} cannot ({attn_backend.why_not_capturable or 'it is not marked capturable'}). "
                "Use --graph piecewise or breakable, which run attention between graphs."
            )
        super().__init__(*args, attn_backend=attn_backend, **kwargs)
        self.entries: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def setup(self) -> None:
        self.stats.pieces = 1
        self.stats.submodules = 1

    def warmup(self, input_ids, positions, ctx) -> None:
        self.body(input_ids, positions)

    def capture(self, bucket, input_ids, positions, ctx) -> None:
        g = self.pool.begin()
        out = self.body(input_ids, positions)
        self.pool.end(g)
        self.entries[bucket] = (g, weak_ref(out))

    def run(self, input_ids, positions, ctx) -> torch.Tensor:
        entry = self.entries.get(ctx.bucket)
        if entry is None:
            return self.body(input_ids, positions)
        entry[0].replay()
        return entry[1]
