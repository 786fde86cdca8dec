"""The capture-backend interface and the bucket loop every graph backend shares.

A backend is built around `body(input_ids[T], positions[T]) -> hidden[T, H]` (the decoder without lm_head)
and `make_inputs(T)`, which fills the engine's static buffers with an all-padding batch of T tokens and
returns them with a forward context. `prepare()` does all tracing and capturing up front; at serve time
`run()` only replays (or, on a CPU, runs the same split/segmented/padded path without graphs).
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from pcg_core.capture.graphs import GraphPool, no_gc_during_capture
from pcg_core.capture.stats import CaptureStats
from pcg_core.config import CaptureConfig
from pcg_core.forward_context import ForwardContext, set_forward_context

Body = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
MakeInputs = Callable[[int], "tuple[torch.Tensor, torch.Tensor, ForwardContext]"]


class CaptureBackend:
    """`disabled`: eager, unpadded. Subclasses pad to buckets and capture."""

    name = "disabled"
    pads = False

    def __init__(self, body: Body, config: CaptureConfig, device: torch.device, make_inputs: MakeInputs, attn_backend=None):
        self.body = body
        self.config = config
        self.attn_backend = attn_backend
        self.device = device
        self.make_inputs = make_inputs
        self.stats = CaptureStats(backend=self.name, buckets=config.ladder if self.pads else [])

    def prepare(self) -> None:
        """Trace, compile and capture everything; nothing of this happens at serve time."""

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Forward at a planned bucket (inputs already padded to ctx.bucket)."""
        return self.body(input_ids, positions)

    def eager(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.body(input_ids, positions)


class GraphBackend(CaptureBackend):
    pads = True

    def __init__(self, body: Body, config: CaptureConfig, device: torch.device, make_inputs: MakeInputs, attn_backend=None):
        super().__init__(body, config, device, make_inputs, attn_backend)
        self.pool = GraphPool(device)

    # Subclass hooks -----------------------------------------------------------------------------------
    def setup(self) -> None:
        """Work done once before the bucket loop (piecewise: trace and split)."""

    def warmup(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> None:
        raise NotImplementedError

    def capture(self, bucket: int, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> None:
        raise NotImplementedError

    # Shared bucket loop -------------------------------------------------------------------------------
    def prepare(self) -> None:
        self.setup()
        if not self.pool.enabled:
            return  # CPU: the split/segment/pad path runs, there is nothing to capture
        with no_gc_during_capture():
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            reserved0 = torch.cuda.memory_reserved(self.device)
            t0 = time.perf_counter()
            try:
                with torch.cuda.stream(self.pool.stream):
                    for bucket in sorted(self.config.ladder, reverse=True):  # largest first: later ones reuse its blocks
                        input_ids, positions, ctx = self.make_inputs(bucket)
                        ctx.mode = "warmup"
                        with set_forward_context(ctx):
                            self.warmup(input_ids, positions, ctx)
                        ctx.mode = "capture"
                        with set_forward_context(ctx):
                            self.capture(bucket, input_ids, positions, ctx)
            except BaseException:
                self.pool.abort()
                raise
            torch.cuda.synchronize(self.device)
        self.stats.capture_s = time.perf_counter() - t0
        torch.cuda.empty_cache()
        self.stats.graph_pool_bytes = max(0, torch.cuda.memory_reserved(self.device) - reserved0)
        self.stats.graphs_captured = self.pool.graphs_captured
