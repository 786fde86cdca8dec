"""`breakable`: compile-free capture. The eager forward is captured in segments that end at each split op;
the split op runs in a hole between segments, at capture and at every replay.

No dynamo, no FX: the split op's implementation itself ends the running segment (through the recorder the
forward context carries), runs eagerly, and starts the next segment in the same memory pool.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

import torch

from pcg_core.capture.base import GraphBackend
from pcg_core.capture.graphs import GraphPool, weak_ref
from pcg_core.capture.registry import register_capture_backend
from pcg_core.forward_context import set_forward_context


class SegmentRecorder:
    """Cuts the capture at each split op (the forward context's `SegmentHook`). Without CUDA it only counts
    segments and holes."""

    def __init__(self, pool: GraphPool):
        self.pool = pool
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.holes: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self._current: torch.cuda.CUDAGraph | None = None

    def start(self) -> None:
        if self.pool.enabled:
            self._current = self.pool.begin()

    def hole(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        if self.pool.enabled:
            assert self._current is not None  # start() began it
            self.graphs.append(self.pool.end(self._current))
        fn(*args)
        self.holes.append((fn, weak_ref(args)))
        self.start()

    def finish(self) -> None:
        if self.pool.enabled:
            assert self._current is not None  # start() began it
            self.graphs.append(self.pool.end(self._current))

    @property
    def segments(self) -> int:
        return len(self.holes) + 1


@register_capture_backend
class BreakableBackend(GraphBackend):
    name = "breakable"

    def setup(self) -> None:
        # Count segments once (also on a CPU, where this is all breakable capture can exercise).
        input_ids, positions, ctx = self.make_inputs(self.config.ladder[0])
        recorder = SegmentRecorder(GraphPool(torch.device("cpu")))
        ctx.segment_recorder = recorder
        with set_forward_context(ctx):
            self.body(input_ids, positions)
        self.stats.pieces = self.stats.submodules = recorder.segments
        self.stats.split_ops = len(recorder.holes)

    def capture(self, bucket, input_ids, positions, ctx) -> tuple[SegmentRecorder, torch.Tensor]:
        recorder = SegmentRecorder(self.pool)
        ctx.segment_recorder = recorder
        recorder.start()
        out = self.body(input_ids, positions)
        recorder.finish()
        ctx.segment_recorder = None
        return recorder, weak_ref(out)

    def replay(self, entry: tuple[SegmentRecorder, torch.Tensor]) -> torch.Tensor:
        recorder, out = entry
        for i, graph in enumerate(recorder.graphs):
            graph.replay()
            if i < len(recorder.holes):
                fn, args = recorder.holes[i]
                fn(*args)
        return out
