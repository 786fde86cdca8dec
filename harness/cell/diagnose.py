"""Judge layers that need both engines at once: KL at prompt positions and the first diverging piece."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pcg_core.engine import Engine
from pcg_core.engine.engine import LOGITS_CHUNK as CHUNK


@dataclass(frozen=True)
class PieceDiagnosis:
    """Layer 5's answer: the first piece whose output differs from eager (None when none does or none can be told
    apart), its relative difference, and a sentence for the cell's reason."""

    piece: str | None
    rel_diff: float | None
    note: str

    def __str__(self) -> str:
        return self.note


@torch.no_grad()
def max_prompt_kl(eager: Engine, graph: Engine, prompts: list[list[int]]) -> float:
    """max over prompt positions of KL(eager ‖ graph) of the next-token distributions (same weights)."""
    h_ref = eager.forward(eager.prefill_batch(prompts))
    h_cand = graph.forward(graph.prefill_batch(prompts))
    worst = 0.0
    for s in range(0, h_ref.shape[0], CHUNK):
        lp_ref = torch.log_softmax(eager.lm_head(h_ref[s : s + CHUNK]).float(), dim=-1)
        lp_cand = torch.log_softmax(graph.lm_head(h_cand[s : s + CHUNK]).float(), dim=-1)
        kl = (lp_ref.exp() * (lp_ref - lp_cand)).sum(dim=-1)
        k = float(kl.max())  # torch's max propagates a NaN; Python's max(worst, k) would drop it
        if math.isnan(k):
            return k
        worst = max(worst, k)
    return worst


@torch.no_grad()
def first_diverging_piece(graph: Engine, prompts: list[list[int]], rtol: float) -> PieceDiagnosis:
    """Name the first piece whose output differs from an eager run at the same padding.

    A piece's output is what the next attention receives, so every attention input that runs outside a graph
    (eager, and the holes of piecewise/breakable replay) is compared; the final hidden states close the list.
    """
    batch = graph.prefill_batch(prompts)
    ref: dict[int, torch.Tensor] = {}
    cand: dict[int, torch.Tensor] = {}
    h_ref = graph.forward(batch, eager=True, observer=lambda layer, q: ref.__setitem__(layer, q.float().clone())).float()
    h_cand = graph.forward(batch, observer=lambda layer, q: cand.__setitem__(layer, q.float().clone())).float()
    stages = [(f"piece {i} (up to attention {i})", ref[i], cand.get(i)) for i in sorted(ref)]
    stages.append((f"piece {len(ref)} (after the last attention)", h_ref, h_cand))
    for name, a, b in stages:
        if b is None:
            return PieceDiagnosis(None, None, f"{graph.stats.backend}: attention runs inside the graph, so pieces cannot be told apart")
        rel = float((a - b).norm() / a.norm().clamp_min(1e-30))
        if rel > rtol:
            return PieceDiagnosis(name, rel, f"first diverging: {name}, relative difference {rel:.3g}")
    return PieceDiagnosis(None, None, "no piece diverges from eager at the same padding (look at input staging, padding or bucket choice)")
