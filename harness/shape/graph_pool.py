"""The CUDA-graph pool a model's prefill graphs will take, estimated from its config alone, before anything runs.

Why not from first principles: what a pool holds is the peak of one bucket's live intermediates (the graphs of
every bucket and piece share one pool, captured largest first), and which intermediates live depends on the
capture backend, the attention path and the kernels. So the estimate is a small linear model of the widths that set
that peak, per token of the largest bucket, fitted to the pools the H200 cells measured
(benchmarks/results/**/*.jsonl; `python benchmarks/graph_pool_fit.py` refits it and writes graph_pool.json):

    pool ≈ c·1 MiB + T·2 bytes·(h·hidden + d·dense MLP width + m·top_k·expert width + q·heads·head_dim
                                 [MLA: a·heads·(kv_lora_rank + rope dims)]) × the scheme's factor

per capture backend, the widths per GPU (÷ tp). The layer count is not in it: the measured pools of 2- to 28-layer
models do not grow with depth. Nor are the split ops' fresh-path variants (a graph per path per bucket from
FRESH_PATH_MIN_TOKENS): recorded into the same pool, they left DeepSeek-V3:4's full pool at 6,546 MiB with three a
bucket against 6,930 with one (benchmarks/results/2026-12-07f-h100-one-path/). Left out: sdpa's plain-math path (soft-cap, sinks), whose scores over the whole cache
make the pool grow with the cache — the estimate is for flex or varlen there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from harness.shape.structure import Structure

TABLE = Path(__file__).with_name("graph_pool.json")
# The share of a GPU's memory a serving engine plans with (vLLM's gpu_memory_utilization default): what the cell's
# memory line (harness/cell/memory.py) and `pcgh request`'s context weigh the graphs against.
GPU_MEMORY_UTILIZATION = 0.90
FEATURES = ("const", "hidden", "dense", "moe", "heads", "mla")
_MIB = 1 << 20


@cache
def table() -> dict[str, Any]:
    """The fitted coefficients (graph_pool.json): per capture backend, per quantization scheme, and their calibration."""
    return json.loads(TABLE.read_text(encoding="utf-8"))


def features(s: Structure, max_tokens: int, tp: int = 1, dtype_bytes: float = 2.0) -> dict[str, float]:
    """The widths the pool's peak scales with, in bytes at `max_tokens` tokens, per GPU of a tp-way model."""
    t = max_tokens * dtype_bytes
    moe_layers = set(s.moe.layers) if s.moe else set()
    n = len(s.attention)
    dense = any(i not in moe_layers for i in range(n)) or bool(s.moe and s.moe.residual_intermediate)
    heads = max(1, (s.heads or 1) // tp)
    mla = "mla" in s.attention
    head_dim = s.head_dim or ((s.hidden or 0) // (s.heads or 1))
    latent = s.f.get_int("kv_lora_rank", 0) + s.f.get_int("qk_rope_head_dim", 0)
    width = max(s.intermediate or 0, s.moe.residual_intermediate if s.moe else 0)
    return {
        "const": _MIB,
        "hidden": t * (s.hidden or 0),
        "dense": t * width / tp if dense else 0.0,
        "moe": t * s.moe.top_k * s.moe.expert_intermediate / tp if s.moe and moe_layers & set(range(n)) else 0.0,
        "heads": 0.0 if mla else t * heads * head_dim,
        "mla": t * heads * latent if mla else 0.0,
    }


@dataclass(frozen=True)
class PoolEstimate:
    """Bytes per GPU by capture backend, and the band the calibration measured around such estimates."""

    by_graph: dict[str, int]
    band: tuple[float, float]  # measured / estimated, 5th and 95th percentile over the calibration cells
    cells: int  # how many measured pools the coefficients were fitted to
    gpu: str

    def words(self) -> str:
        pools = ", ".join(f"{g} {b / (1 << 30):.2f}" for g, b in self.by_graph.items())
        return (f"{pools} GiB per GPU (fitted to {self.cells} pools measured on the {self.gpu}; 90% of them within "
                f"{self.band[0]:.1f}–{self.band[1]:.1f}× of this estimate)")


def estimate_pool(s: Structure, max_tokens: int, tp: int = 1, quant: str = "none",
                  dtype_bytes: float = 2.0) -> PoolEstimate:
    """The graph pool of each capture backend that captures (`disabled` has none) for a model of structure `s`."""
    t = table()
    f = features(s, max_tokens, tp, dtype_bytes)
    factor = t["quant_factor"].get(quant, 1.0)
    by_graph = {g: int(factor * sum(c[k] * f[k] for k in FEATURES)) for g, c in t["coefficients"].items()}
    return PoolEstimate(by_graph, (t["band"][0], t["band"][1]), t["cells"], t["gpu"])


@dataclass(frozen=True)
class ContextFit:
    """What a GPU's KV cache can hold beside the weights, with the graph pool and without it (a serving engine
    sizes its KV cache from what is left after both)."""

    room: int  # bytes of the budget the weights leave
    tokens: int  # context that fits beside the weights and the pool
    tokens_without_graphs: int
    pool_share: float  # pool / room (inf when the weights leave no room)

    def over(self, share: float) -> bool:
        return self.pool_share > share


def context_fit(budget: int, weights: int, pool: int, kv_bytes_per_token: float) -> ContextFit:
    """The context a `budget`-byte GPU holds beside `weights` with and without a `pool`-byte graph pool."""
    room = budget - weights
    if room <= 0:
        return ContextFit(room, 0, 0, float("inf"))
    return ContextFit(room, int(max(0, room - pool) // kv_bytes_per_token), int(room // kv_bytes_per_token), pool / room)
