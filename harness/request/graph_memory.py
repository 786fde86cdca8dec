"""`pcgh request`'s graph memory: the prefill graphs' pool per GPU and the context it costs, before anything runs.

A serving engine sizes its KV cache from what the weights and the graphs leave; a graph pool that eats a large
share of that quietly shortens the longest context (Kimi-K2's 8 GB of graphs leaving 8,050 tokens of KV,
sgl-project/sglang#13466). The pool is harness/shape/graph_pool.py's estimate, fitted to the pools the H200 cells
measured; the weights and the KV bytes per token are the matrix's memory fit's (harness/matrix/fit.py); the rule is the
cell's (harness/cell/memory.py): the GPU at 90% and a `memory` note past the matrix's default share (10%).
"""

from __future__ import annotations

from typing import Any, cast

from harness.cell.spec import GPU_MAX_TOKENS, CellSpec
from harness.matrix.fit import DTYPE_BYTES, estimate, kv_bytes_per_token
from harness.shape.graph_pool import GPU_MEMORY_UTILIZATION, context_fit, estimate_pool
from harness.shape.params import H200_BYTES
from harness.shape.structure import Structure

MAX_TOKENS = GPU_MAX_TOKENS  # the GPU ladder's largest bucket: a cell's own default on cuda
MEMORY_SHARE = cast(float, CellSpec.__dataclass_fields__["memory_share"].default)  # the cell's own default share
_GIB = 1 << 30


def graph_memory(config: dict[str, Any], s: Structure, tps: list[int], graphs: list[str], scheme: str | None,
                 weight_width: str | None, where: str = "config") -> dict[str, Any] | None:
    """For capture backends `graphs` on H200s: the estimated pool per GPU, the context beside weights + pool and
    without the pool, and the pool's share of the KV cache's room — at the first of `tps` whose weights per GPU (in
    the checkpoint's own width) leave room, else the last. None when the config has no parameter count."""
    if not tps:
        return None
    budget = int(H200_BYTES * GPU_MEMORY_UTILIZATION)
    for tp in tps:
        est = estimate(config, f"tp{tp}", "bfloat16", weight_width, MAX_TOKENS, where=where)
        if est is None:
            return None
        if est.weights < budget:
            break
    assert est is not None  # tps is not empty, and each pass returned on None
    pools = estimate_pool(s, MAX_TOKENS, tp, scheme or "none")
    per_token = kv_bytes_per_token(s, tp, DTYPE_BYTES["bfloat16"])
    without = context_fit(budget, est.weights, 0, per_token) if per_token else None
    by_graph = {}
    for graph in graphs:
        pool = pools.by_graph.get(graph)
        if pool is None:  # a capture backend from a plugin: no measured pools, no estimate
            continue
        fit = context_fit(budget, est.weights, pool, per_token) if per_token else None
        by_graph[graph] = {"pool_bytes": pool, "context_tokens": fit.tokens if fit else None,
                           "pool_share": round(fit.pool_share, 4) if fit is not None and fit.room > 0 else None}
    return {"gpu": pools.gpu, "tp": tp, "max_tokens": MAX_TOKENS, "budget_bytes": budget, "weights_bytes": est.weights,
            "weights_fit": est.weights < budget, "kv_bytes_per_token": per_token,
            "context_tokens_without_graphs": without.tokens if without else None,
            "by_graph": by_graph, "band": list(pools.band), "calibration_cells": pools.cells}


def memory_note(g: dict[str, Any]) -> str | None:
    """The request's `memory` note: the backends whose pool takes more than MEMORY_SHARE of the KV cache's room."""
    over = {k: v for k, v in g["by_graph"].items() if v["pool_share"] is not None and v["pool_share"] > MEMORY_SHARE}
    if not over:
        return None
    words = ", ".join(f"{k} {v['pool_bytes'] / _GIB:.1f} GiB ({v['pool_share']:.0%}, {v['context_tokens']:,} tokens)"
                      for k, v in over.items())
    return (f"memory: at tp{g['tp']} on {g['gpu']}s the estimated graph pool takes more than {MEMORY_SHARE:.0%} of what "
            f"the KV cache could have beside the weights — {words}, against "
            f"{g['context_tokens_without_graphs']:,} tokens without graphs")
