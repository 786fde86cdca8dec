"""`piecewise`: trace the forward once with dynamo (token dimension dynamic), split the FX graph at the split
ops, compile each piece, capture one CUDA graph per piece per bucket. Where the attention backend's op is
capturable (its metadata lives in static buffers the engine refreshes before each forward) each split op gets
graphs of its own too, so nothing between the graphs runs Python; `graph_attention=False` keeps them eager.

At serve time the split graph module is called directly with the arguments dynamo recorded (the user inputs
and the symbolic token count swapped in), so no dynamo guard is evaluated per forward and nothing recompiles.
Where every submodule of a bucket holds a graph, the bucket keeps a replay plan instead: its graphs in call
order, replayed back to back. Each graph reads the memory the one before it wrote (the addresses the capture
recorded), so the split module's Python — one call per submodule, 57 for a 28-layer model — is skipped and
the host can run ahead of the GPU.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch.fx.passes.split_module import split_module

from pcg_core.capture.base import GraphBackend
from pcg_core.capture.graphs import GraphPool, weak_ref
from pcg_core.capture.registry import register_capture_backend
from pcg_core.forward_context import CaptureMode, GraphKey, get_forward_context, graph_key, set_forward_context
from pcg_core.split_ops import is_split_node, uncapturable_split_op_in

if TYPE_CHECKING:
    from pcg_core.attention.metadata import FreshPath


def split_at_split_ops(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, list[str], list[str]]:
    """Cut `gm` so that each split-op call sits alone in its submodule.

    Returns (split module, names of the pieces to capture, names of the split-op submodules).
    """
    partition: dict[torch.fx.Node, int] = {}
    part, split_parts = 0, set()
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if is_split_node(node):
            part += 1
            partition[node] = part
            split_parts.add(part)
            part += 1
        else:
            partition[node] = part
    split_gm = split_module(gm, None, lambda n: partition[n], keep_original_order=True)  # type: ignore[arg-type]  # torch types root_m a Module; its docstring: not used
    names = [name for name, _ in split_gm.named_children()]
    pieces = [n for n in names if int(n.rsplit("_", 1)[1]) not in split_parts]
    splits = [n for n in names if int(n.rsplit("_", 1)[1]) in split_parts]
    return split_gm, pieces, splits


_QUANTIZED = (torch.float8_e4m3fn, torch.int8)


def quantizes(piece: torch.fx.GraphModule) -> bool:
    """Whether the piece casts activations to FP8 or INT8 (a quantized linear's input)."""
    return any(getattr(n.meta.get("example_value"), "dtype", None) in _QUANTIZED for n in piece.graph.nodes)


def compile_piece_inductor(piece: torch.fx.GraphModule) -> Any:
    """Inductor codegen for one piece, token dimension kept symbolic (the fake inputs dynamo left in the graph).

    A piece that quantizes activations is compiled rounding its intermediates to their dtype as eager does
    (emulate_precision_casts): a fused RMSNorm otherwise hands the quantizer float32 values eager would have
    rounded to bf16 first, and FP8's rounding turns those 2^-9 differences into whole steps. Measured on the H200
    (Llama-3.1-8B, 4 layers, fp8_per_tensor): graph vs eager at the same padding 0.056 apart without it, no piece
    apart with it."""
    from torch._inductor import config, standalone_compile

    fakes = [n.meta["example_value"] for n in piece.graph.nodes if n.op == "placeholder"]
    with config.patch(emulate_precision_casts=quantizes(piece)):
        return standalone_compile(piece, fakes, dynamic_shapes="from_graph")


class PieceRunner(torch.nn.Module):
    """One captured piece: a CUDA graph per bucket, output held by weak reference. What it does on a call is
    the forward context's mode, set by the forward's owner. A split op's runner (`split=True`) keeps a graph per
    variant (`variants(bucket)`: its fresh-sequence path frozen in it, forward_context.graph_key), and runs eagerly
    while an observer watches the attention inputs (a diagnosis wants to see every layer)."""

    def __init__(self, fn: Any, index: int, pool: GraphPool, split: bool = False,
                 variants: Callable[[int], tuple[FreshPath, ...]] | None = None):
        super().__init__()
        self.fn = fn
        self.index = index
        self.pool = pool
        self.split = split
        self.variants = variants or (lambda bucket: ("",))
        self.graphs: dict[GraphKey, tuple[torch.cuda.CUDAGraph, Any]] = {}

    def forward(self, *args: Any) -> Any:
        ctx = get_forward_context()
        if self.split and ctx.observer is not None:
            return self.fn(*args)
        if ctx.mode is CaptureMode.REPLAY:
            entry = self.graphs.get(self.key(ctx.bucket, ctx.attn_metadata.fresh_path)) if ctx.bucket is not None else None
            if entry is not None:
                entry[0].replay()
                return entry[1]
        elif ctx.mode is CaptureMode.CAPTURE:
            assert ctx.bucket is not None  # a capture is of one bucket
            return self._capture(ctx.bucket, ctx.attn_metadata, args) if self.split else self._record(ctx.bucket, args)
        elif ctx.mode is CaptureMode.WARMUP and self.split and ctx.bucket is not None:
            for fresh in self.variants(ctx.bucket)[1:]:  # every other variant warmed on the warm-up's real inputs,
                with _variant(ctx.attn_metadata, fresh):  # then the plain one, whose output the pieces after read
                    self.fn(*args)
        return self.fn(*args)

    def _record(self, key: GraphKey, args: tuple[Any, ...]) -> Any:
        graph, out = self.pool.capture(self.fn, *args)
        self.graphs[key] = (graph, weak_ref(out))
        return out

    def _capture(self, bucket: int, md: Any, args: tuple[Any, ...]) -> Any:
        """Every variant of this split op at `bucket`, back to back in the one capture pass: the pieces around share
        one graph, so each variant must read and write where they do, and while this pass runs everything live in
        the forward is held, which keeps a variant's temporaries off it (a later pass, replaying the pieces' graphs
        with their outputs weakly held, let them land on memory a later piece reads)."""
        out = self._record(graph_key(bucket, ""), args)
        for fresh in self.variants(bucket)[1:]:
            with _variant(md, fresh):
                other = self._record(graph_key(bucket, fresh), args)
            if _data_ptrs(other) != _data_ptrs(out):  # split ops write into `out` arguments and return nothing
                raise RuntimeError(f"piecewise: split op variant {graph_key(bucket, fresh)} returned its output "
                                   "elsewhere than its plain variant, where the pieces after it read")
        return out

    def key(self, bucket: int, fresh_path: FreshPath) -> GraphKey:
        """A split op's graphs are kept per variant; a piece's per bucket."""
        return graph_key(bucket, fresh_path if self.split else "")


@contextmanager
def _variant(md: Any, fresh: FreshPath) -> Iterator[None]:
    """The forward's metadata at another variant for the block (the engine decides it per forward otherwise)."""
    md.fresh_path = fresh
    try:
        yield
    finally:
        md.fresh_path = ""


def _data_ptrs(out: Any) -> list[int]:
    return [t.data_ptr() for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]


@register_capture_backend
class PiecewiseBackend(GraphBackend):
    name = "piecewise"
    entry_per_key = False  # a bucket without a whole-forward plan (an eager split op) still replays its pieces

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.split_gm: torch.fx.GraphModule | None = None
        self._example_inputs: list[Any] = []
        self._ids_index = self._pos_index = -1
        self._sym_indices: list[int] = []

    # Trace and split -----------------------------------------------------------------------------------
    def _on_graph(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        if self.split_gm is not None:
            raise RuntimeError("piecewise: dynamo traced the forward a second time (a recompile); this is a bug")
        split_gm, pieces, splits = split_at_split_ops(gm)
        t0 = time.perf_counter()
        for i, name in enumerate(pieces):
            piece = getattr(split_gm, name)
            if self.config.compiler == "inductor":
                piece = compile_piece_inductor(piece)
            setattr(split_gm, name, PieceRunner(piece, i, self.pool))
        if self._graph_attention():
            graphed = [n for n in splits if not uncapturable_split_op_in(getattr(split_gm, n))]  # linear attention stays eager
            for j, name in enumerate(graphed):
                setattr(split_gm, name, PieceRunner(getattr(split_gm, name), len(pieces) + j, self.pool, split=True,
                                                    variants=self.variants))
            self.stats.graphed_split_ops = len(graphed)
        self.stats.compile_s = time.perf_counter() - t0
        self.stats.pieces, self.stats.split_ops = len(pieces), len(splits)
        self.stats.submodules = len(pieces) + len(splits)
        self.split_gm = split_gm
        self._example_inputs = list(example_inputs)
        return split_gm

    def _graph_attention(self) -> bool:
        """Record the split ops too: asked for, and the attention backend declares its op capturable."""
        return bool(self.config.graph_attention and self.pool.enabled and self.attn_backend is not None
                    and self.attn_backend.capturable)

    def setup(self) -> None:
        bucket = self.config.ladder[-1]
        input_ids, positions, ctx = self.make_inputs(bucket)
        torch._dynamo.mark_dynamic(input_ids, 0)
        torch._dynamo.mark_dynamic(positions, 0)
        compiled = torch.compile(self.body, backend=self._on_graph, fullgraph=True, dynamic=False)
        t0 = time.perf_counter()
        with set_forward_context(ctx):
            compiled(input_ids, positions)
        self.stats.trace_s = time.perf_counter() - t0 - self.stats.compile_s
        # We dispatch the split graph directly from now on, so dynamo's cache entry is dead weight: drop it, or
        # every further engine built on this code counts as a recompile (and the 9th one fails) and the entry
        # keeps this engine's graph alive after the engine is gone.
        torch._dynamo.eval_frame.remove_from_cache(self.body)
        for i, x in enumerate(self._example_inputs):
            if x is input_ids:
                self._ids_index = i
            elif x is positions:
                self._pos_index = i
            elif isinstance(x, torch.SymInt):
                self._sym_indices.append(i)
        if self._pos_index < 0:
            raise RuntimeError("piecewise: could not find positions among the traced graph's inputs")
        # input_ids may be absent: a VLM's body reads only its length (its embeddings come from a static buffer).

    def _args(self, input_ids: torch.Tensor, positions: torch.Tensor) -> list[Any]:
        args = list(self._example_inputs)
        if self._ids_index >= 0:
            args[self._ids_index] = input_ids
        args[self._pos_index] = positions
        for i in self._sym_indices:
            args[i] = input_ids.shape[0]
        return args

    # Capture and replay ---------------------------------------------------------------------------------
    # The graphs live in the PieceRunners, one per piece per bucket, so no whole-forward entry is kept: every
    # forward runs the split module, and each runner captures, replays or runs its piece as ctx.mode says.
    def run_padded(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        assert self.split_gm is not None  # compiled before any forward
        return self.split_gm(*self._args(input_ids, positions))[0]

    def capture_passes(self, bucket: int) -> tuple[FreshPath, ...]:
        return ("",)  # one pass: the split ops' runners record each variant back to back (PieceRunner._capture)

    def capture(self, bucket, input_ids, positions, ctx) -> ReplayPlan | None:
        out = self.run_padded(input_ids, positions)
        for fresh in self.variants(bucket)[1:]:  # the other variants' plans; the plain one is the caller's to keep
            if (graphs := self._graphs_in_call_order(bucket, fresh)) is not None:
                self.entries[self.key(bucket, fresh)] = ReplayPlan(graphs, weak_ref(out))
        graphs = self._graphs_in_call_order(bucket, "")
        return None if graphs is None else ReplayPlan(graphs, weak_ref(out))

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx) -> torch.Tensor:
        if ctx.observer is not None and self.stats.graphed_split_ops:  # the observer wants the split ops eager
            return self.run_padded(input_ids, positions)
        return super().run(input_ids, positions, ctx)

    def replay(self, entry: ReplayPlan) -> torch.Tensor:
        return entry.replay()

    def records_split_ops(self) -> bool:
        return self._graph_attention()

    def _graphs_in_call_order(self, bucket: int, fresh_path: FreshPath = "") -> tuple[torch.cuda.CUDAGraph, ...] | None:
        """Every submodule's graph for `bucket` (the split ops' at `fresh_path`'s variant) in the order the split
        module calls them, or None where one of them runs eagerly (an uncapturable split op) or the split module does
        more than call them."""
        assert self.split_gm is not None  # compiled before any capture
        graphs = []
        for node in self.split_gm.graph.nodes:
            if node.op == "call_module":
                runner = getattr(self.split_gm, node.target)
                entry = runner.graphs.get(runner.key(bucket, fresh_path)) if isinstance(runner, PieceRunner) else None
                if entry is None:
                    return None
                graphs.append(entry[0])
            elif node.op not in ("placeholder", "output") and node.target is not operator.getitem:
                return None
        return tuple(graphs)


class ReplayPlan:
    """One bucket's graphs, replayed in call order; `out` is the forward's output (held by weak reference)."""

    __slots__ = ("graphs", "out")

    def __init__(self, graphs: tuple[torch.cuda.CUDAGraph, ...], out: Any):
        self.graphs, self.out = graphs, out

    def replay(self) -> torch.Tensor:
        for g in self.graphs:
            g.replay()
        return self.out
