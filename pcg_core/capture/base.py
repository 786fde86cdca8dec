"""The capture-backend interface, the `disabled` backend, and the bucket loop every graph backend shares.

A backend is built around `body(input_ids[T], positions[T]) -> hidden[T, H]` (the decoder without lm_head)
and `make_inputs(T)`, which fills the engine's static buffers with an all-padding batch of T tokens and
returns them with a forward context. `prepare()` does all tracing and capturing up front; at serve time
`run()` only replays (or, on a CPU, runs the same split/segmented/padded path without graphs).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar
from collections.abc import Callable

import torch

from pcg_core.capture.graphs import GraphPool, no_gc_during_capture
from pcg_core.capture.registry import CAPTURE_BACKENDS, register_capture_backend
from pcg_core.capture.stats import CaptureStats
from pcg_core.config import CaptureConfig
from pcg_core.errors import ConfigError
from pcg_core.forward_context import CaptureMode, ForwardContext, GraphKey, graph_key, set_forward_context

if TYPE_CHECKING:
    from pcg_core.attention.backend import AttentionBackend
    from pcg_core.attention.metadata import FreshPath

Body = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
MakeInputs = Callable[[int], "tuple[torch.Tensor, torch.Tensor, ForwardContext]"]


class CaptureBackend(ABC):
    """How the decoder forward of a planned bucket runs. The engine drives every backend the same way:

    1. `__init__(body, config, device, make_inputs, attn_backend)`: cheap; refuses an attention backend the
       backend's declared needs rule out (`requires_capturable_attention`).
    2. `prepare()`: once, when the engine is built: trace, compile and capture every bucket of the ladder.
    3. `run(input_ids, positions, ctx)`: every serving forward padded to `ctx.bucket` (`pads` backends only);
       the engine has set `ctx.mode` to REPLAY.

    Eager references and batches above the largest bucket never reach the backend: the engine runs `body`.
    """

    name: ClassVar[str] = ""
    pads: ClassVar[bool] = False  # pads batches to the bucket ladder, so the engine calls run()
    requires_capturable_attention: ClassVar[bool] = False  # the attention op is recorded inside the graph

    def __init__(self, body: Body, config: CaptureConfig, device: torch.device, make_inputs: MakeInputs,
                 attn_backend: AttentionBackend | None = None):
        if self.requires_capturable_attention and attn_backend is not None and not attn_backend.capturable:
            raise ConfigError(_uncapturable_attention_message(self.name, attn_backend), field="backend")
        self.body = body
        self.config = config
        self.attn_backend = attn_backend
        self.device = device
        self.make_inputs = make_inputs
        self.stats = CaptureStats(backend=self.name, buckets=config.ladder if self.pads else [])
        # Set by the engine before prepare(): the smallest forward that takes the split ops' fresh-sequence paths
        # (AttentionMetadata.fresh_path), None where the model has none, and the paths a forward from there may take.
        self.fresh_min: int | None = None
        self.fresh_paths: tuple[FreshPath, ...] = ()

    @abstractmethod
    def prepare(self) -> None:
        """Trace, compile and capture everything; nothing of this happens at serve time."""

    @abstractmethod
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Forward at a planned bucket (inputs already padded to ctx.bucket)."""


def _uncapturable_attention_message(name: str, attn: AttentionBackend) -> str:
    # The fix comes from the built-in backends' own declarations: those that pad and run attention between graphs.
    others = [n for n, cls in CAPTURE_BACKENDS.items()
              if n in CAPTURE_BACKENDS.built_in and cls.pads and not cls.requires_capturable_attention]
    return (
        f"capture backend {name!r} needs an attention backend that can be captured in a CUDA graph; {attn.name!r} "
        f"cannot ({attn.why_not_capturable or 'it is not marked capturable'}). "
        f"Use backend {' or '.join(repr(n) for n in others)}, which run attention between graphs."
    )


@register_capture_backend
class DisabledBackend(CaptureBackend):
    """`disabled`: no padding, no graphs; the reference every graph backend is judged against."""

    name = "disabled"

    def prepare(self) -> None:
        pass

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        return self.body(input_ids, positions)


class GraphBackend(CaptureBackend):
    """Pads to buckets and captures each, largest first, into one pool; replays the bucket's entry at serve time.

    Subclasses say how one bucket is captured (`capture`, returning the entry kept in `entries`) and replayed
    (`replay`); a bucket without an entry runs `run_padded`, the backend's own padded forward: on a CPU the
    split/segmented path without graphs, under piecewise the per-piece graphs it keeps in its pieces.
    """

    pads = True
    # A forward whose key has no entry runs `run_padded` with no graph at all (full, breakable): every key a forward
    # may look up must then have been captured. Piecewise keeps graphs in its pieces as well, so a bucket without a
    # whole-forward plan still replays them.
    entry_per_key: ClassVar[bool] = True

    def __init__(self, body: Body, config: CaptureConfig, device: torch.device, make_inputs: MakeInputs,
                 attn_backend: AttentionBackend | None = None):
        super().__init__(body, config, device, make_inputs, attn_backend)
        self.pool = GraphPool(device)
        self.entries: dict[GraphKey, Any] = {}  # graph_key(bucket, fresh_path) → what replay() needs

    # Subclass hooks -----------------------------------------------------------------------------------
    def setup(self) -> None:
        """Work done once before the bucket loop (piecewise: trace and split); runs on a CPU too."""

    def run_padded(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The backend's padded forward where `entries` has nothing for the bucket; also what warm-up runs."""
        return self.body(input_ids, positions)

    def warmup(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> None:
        self.run_padded(input_ids, positions)

    @abstractmethod
    def capture(self, bucket: int, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> Any:
        """Record one bucket (ctx.mode is CAPTURE); returns the entry `replay` takes, or None to keep none."""

    def replay(self, entry: Any) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} keeps entries but cannot replay them")

    def records_split_ops(self) -> bool:
        """Whether the split ops are recorded in this backend's graphs: then a split op's per-forward choice (its
        fresh-sequence path) is frozen in them, and each bucket from fresh_min up gets a graph per choice."""
        return False

    def key(self, bucket: int, fresh_path: FreshPath) -> GraphKey:
        """The entry a forward at `bucket` replays."""
        return graph_key(bucket, fresh_path if self.records_split_ops() else "")

    def looked_up(self, bucket: int) -> tuple[FreshPath, ...]:
        """The fresh_path values a forward at `bucket` may have: the plain one, and from fresh_min up the paths."""
        low = self.fresh_min
        return ("", *self.fresh_paths) if low is not None and bucket >= low else ("",)

    def variants(self, bucket: int) -> tuple[FreshPath, ...]:
        """The fresh_path values captured at `bucket`: every one a forward may have where the graphs record split ops
        (the plain one first), else the plain one."""
        return self.looked_up(bucket) if self.records_split_ops() else ("",)

    def capture_passes(self, bucket: int) -> tuple[FreshPath, ...]:
        """The fresh_path values of the capture passes at `bucket`: a pass per variant, unless the backend records
        them all in one (piecewise)."""
        return self.variants(bucket)

    # Shared bucket loop and lookup --------------------------------------------------------------------
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        entry = self.entries.get(self.key(ctx.bucket, ctx.attn_metadata.fresh_path)) if ctx.bucket is not None else None
        if entry is None:
            return self.run_padded(input_ids, positions)
        return self.replay(entry)

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
                        for fresh in self.capture_passes(bucket):
                            self._capture_bucket(bucket, fresh)
            except BaseException:
                self.pool.abort()
                raise
            torch.cuda.synchronize(self.device)
        if missing := self.missing_entries():
            raise RuntimeError(f"capture backend {self.name!r} captured no graph for {missing[:4]}: those forwards would "
                               "run eagerly under a graph backend, and graph = eager would hold trivially")
        self.stats.capture_s = time.perf_counter() - t0
        torch.cuda.empty_cache()
        self.stats.graph_pool_bytes = max(0, torch.cuda.memory_reserved(self.device) - reserved0)
        self.stats.graphs_captured = self.pool.graphs_captured

    def missing_entries(self) -> list[GraphKey]:
        """The keys a forward may look up (each bucket; from fresh_min up, its fresh variants too) that no capture
        stored, where a miss would run with no graph (`entry_per_key`)."""
        if not self.entry_per_key:
            return []
        looked_up = {self.key(b, fresh) for b in self.config.ladder for fresh in self.looked_up(b)}
        return sorted((k for k in looked_up if k not in self.entries), key=str)

    def _capture_bucket(self, bucket: int, fresh_path: FreshPath = "") -> None:
        input_ids, positions, ctx = self.make_inputs(bucket)
        ctx.attn_metadata.fresh_path = fresh_path
        ctx.mode = CaptureMode.WARMUP
        with set_forward_context(ctx):
            self.warmup(input_ids, positions, ctx)
        ctx.mode = CaptureMode.CAPTURE
        with set_forward_context(ctx):
            entry = self.capture(bucket, input_ids, positions, ctx)
        if entry is not None:
            self.entries[self.key(bucket, fresh_path)] = entry
