"""Graph memory against the KV cache: what the captured graphs cost the context a GPU can hold.

A serving engine sizes its KV cache from what is left of the GPU after the weights and the graphs; a prefill graph
pool that grows with the bucket ladder quietly shrinks the longest context it can serve (a 1.8 GB prefill graph
failing long-context prefill, sgl-project/sglang#40094; Kimi-K2's 8 GB of graphs leaving 8,050 tokens of KV,
#13466). The cell records, per GPU (per rank), the weights, the graph pool and the KV bytes per token, and from
them the largest context that fits beside the graphs and without them; when the graphs take more than the matrix's
share of what the KV cache could have had, the verdict carries a `memory` line (the status stands: a pass that
costs too much context is still correct). Activations and allocator slack are not counted: the numbers are an
upper bound on the context, the same for both sides of the comparison.
"""

from __future__ import annotations

import torch

from harness.metrics import CellMetrics
from harness.shape.graph_pool import GPU_MEMORY_UTILIZATION, context_fit
GIB = 1 << 30


def weights_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers on this rank (each storage counted once: tied embeddings)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key[0] and key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def memory_budget(device: str) -> int | None:
    """Bytes a serving engine would plan with on this rank's GPU (None off CUDA: a host has no graph pool to weigh)."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(torch.device(device)).total_memory * GPU_MEMORY_UTILIZATION)


def memory_fit(m: CellMetrics, budget: int | None, share: float) -> str | None:
    """Fill the context fields of `m` from its weights, graph pool and KV bytes per token against `budget`; the
    `memory` line when the pool takes more than `share` of what the KV cache could have had, else None."""
    m.memory.memory_budget_bytes = budget
    pool, per_token, weights = m.capture.graph_pool_bytes or 0, m.memory.kv_bytes_per_token, m.memory.weights_bytes
    if budget is None or not per_token or weights is None:
        return None
    fit = context_fit(budget, weights, pool, per_token)
    m.memory.max_context_tokens, m.memory.max_context_tokens_without_graphs = fit.tokens, fit.tokens_without_graphs
    if fit.room <= 0:
        return (f"memory: the weights ({weights / GIB:.1f} GiB) fill this rank's {budget / GIB:.0f} GiB budget "
                f"({GPU_MEMORY_UTILIZATION:.0%} of the GPU): no room for a KV cache, graphs or not")
    if not fit.over(share):
        return None
    lost = fit.tokens_without_graphs - fit.tokens
    return (f"memory: the graph pool ({pool / GIB:.2f} GiB) takes {fit.pool_share:.0%} of what the KV cache could have "
            f"had beside the weights ({fit.room / GIB:.1f} GiB of a {budget / GIB:.0f} GiB budget), over the {share:.0%} "
            f"allowed: {fit.tokens:,} tokens of context instead of {fit.tokens_without_graphs:,} ({lost:,} fewer)")
