"""The judge's layers that need both engines at once (policy.py numbers them): layer 3, KL of the next-token
distributions and the same-padding difference (lockstep_stats), and layer 5, the first diverging piece.

Both run a case in lockstep: the eager engine and the graph engine each on its own KV cache (a graph that skips
or misplaces a KV write then reads its own wrong cache, as it does in the suite), the eager side padded to the
graph's bucket (same shapes, so same-kernel pieces agree bitwise), decode steps fed eager's greedy tokens on both
sides so every step stays comparable. Prefill (in the case's chunks) and decode are both covered.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from harness.cell.prompts import Case
from pcg_core.attention.kv_cache import KVCache
from pcg_core.engine import Engine, PackedBatch, PrefixCache
from pcg_core.engine.engine import LOGITS_CHUNK
from pcg_core.engine.schedule import Schedule


class GraphSide(Protocol):
    """What the lockstep runs on its graph side: an Engine, or padding.py's eager engine padding as a graph would."""

    @property
    def cache(self) -> KVCache: ...

    def bucket_for(self, num_tokens: int) -> int | None: ...

    def pack_prompts(self, prompts: list[list[int]], extra_slots: int, images: Any = None,
                     prefix_cache: PrefixCache | None = None, /) -> object: ...

    def forward(self, batch: PackedBatch, *, observer: Any = None, decode: bool = False) -> torch.Tensor: ...

    def remember(self, prefix_cache: PrefixCache, sequences: list[list[int]], /) -> None: ...


@dataclass
class Step:
    """One forward of a case on both sides: what it was, the hidden states, and the attention inputs seen."""

    label: str
    decode: bool
    ref: torch.Tensor  # eager at the graph's padding
    cand: torch.Tensor  # the graph
    probes: torch.Tensor | None = None  # a token per row whose logprob the noise estimates compare
    unpadded: torch.Tensor | None = None  # eager unpadded (noise=True, where the graph pads)
    again: torch.Tensor | None = None  # eager at the graph's padding once more (noise=True)
    ref_stages: dict[int, torch.Tensor] = field(default_factory=dict)
    cand_stages: dict[int, torch.Tensor] = field(default_factory=dict)


@torch.no_grad()
def lockstep(eager: Engine, graph: GraphSide, case: Case, observe: bool = False, noise: bool = False) -> Iterator[Step]:
    """The case's forwards on both engines, one Step each (observe: record every attention input too; noise: run
    eager unpadded before and at the same padding again after, for the noise the eager path itself shows). The
    forwards are the suite's own (engine/schedule.py), fed eager's tokens on both sides. A case of several rounds
    runs them in order, each side with its own prefix cache (what a round's sequences fed in goes into it, so both
    caches hold the same prefixes)."""
    caches = (PrefixCache(eager.cache), PrefixCache(graph.cache)) if case.rounds else (None, None)
    for k, (prompts, new, images, join_at) in enumerate(case.round_parts()):
        label = f"round {k + 1} of {len(case.rounds)}, " if case.rounds else ""
        yield from _lockstep_round(eager, graph, prompts, new, images, join_at, case.chunk, caches, label, observe,
                                   noise)


def _lockstep_round(eager: Engine, graph: GraphSide, prompts: list[list[int]], new: list[int], images,
                    join_at: list[int] | None, chunk: int | None,
                    caches: tuple[PrefixCache | None, PrefixCache | None], round_label: str, observe: bool,
                    noise: bool) -> Iterator[Step]:
    batch, seq_slots, cached = eager.pack_prompts(prompts, max(new), images, caches[0])
    graph.pack_prompts(prompts, max(new), images, caches[1])  # the same slots on the graph's own cache; eager's
    # batches run on both sides, so where the graph engine packs otherwise, the suite's comparison is what sees it
    schedule = Schedule(batch, prompts, cached, seq_slots, new, chunk, join_at)
    while (fwd := schedule.next()) is not None:
        part, n = fwd.batch, len(fwd.batch)
        bucket = graph.bucket_for(n)
        step = Step(f"{round_label}{fwd.label}, bucket {bucket}", fwd.decode, torch.empty(0), torch.empty(0))
        # The real rows only: padding rows are nobody's output, and a backend may stage them as it likes.
        obs_ref = (lambda layer, q: step.ref_stages.__setitem__(layer, q[:n].float().clone())) if observe else None
        obs_cand = (lambda layer, q: step.cand_stages.__setitem__(layer, q[:n].float().clone())) if observe else None
        if noise and bucket is not None and bucket != n:  # first: the padded runs after it leave the cache as theirs
            step.unpadded = eager.forward(part, eager=True).clone()
        step.ref = eager.forward(part, eager=True, observer=obs_ref, pad_to=bucket).clone()
        if noise:
            step.again = eager.forward(part, eager=True, pad_to=bucket).clone()
        step.cand = graph.forward(part, observer=obs_cand, decode=fwd.decode).clone()
        # probe tokens: the next token of the packed stream (a prompt target, mostly from the tail), the last row's own
        step.probes = torch.tensor(part.token_ids[1:] + part.token_ids[-1:], device=step.ref.device)
        yield step
        rows = torch.tensor(fwd.emit_rows, dtype=torch.int64, device=step.ref.device)
        schedule.advance(eager.logits(step.ref[rows]).argmax(-1).tolist() if fwd.emit_rows else [])
    for engine, cache in zip((eager, graph), caches):
        if cache is not None:
            engine.remember(cache, schedule.fed())


def _kl_rows(eager: Engine, ref: torch.Tensor, cand: torch.Tensor) -> float:
    """max over rows of KL(ref ‖ cand) of the next-token distributions; NaN if any row is NaN."""
    worst = 0.0
    for s in range(0, ref.shape[0], LOGITS_CHUNK):
        lp_ref = torch.log_softmax(eager.logits(ref[s : s + LOGITS_CHUNK]), dim=-1)
        lp_cand = torch.log_softmax(eager.logits(cand[s : s + LOGITS_CHUNK]), dim=-1)
        k = float((lp_ref.exp() * (lp_ref - lp_cand)).sum(dim=-1).max())  # torch's max keeps a NaN
        if math.isnan(k):
            return k
        worst = max(worst, k)
    return worst


@dataclass
class LockstepStats:
    """One case in lockstep: the worst KL at prompt and at decode positions, and the worst relative difference of
    a forward's hidden states (graph vs eager at the same padding), with the forward it was in."""

    prompt_kl: float = 0.0
    decode_kl: float = 0.0
    same_padding_rel: float = 0.0
    where: str = ""
    eager_same_padding_rel: float = 0.0  # eager vs eager, same padding (noise=True)
    padding_noise: float = 0.0  # max |Δlogprob| of a probe token, eager padded vs unpadded (noise=True)
    padding_rel: float = 0.0  # worst per-row relative difference of hidden states, eager padded vs unpadded (noise=True)


def _probe_diff(eager: Engine, a: torch.Tensor, b: torch.Tensor, probes: torch.Tensor) -> float:
    """max over rows of |logprob_a − logprob_b| of the row's probe token."""
    worst = 0.0
    for s in range(0, a.shape[0], LOGITS_CHUNK):
        idx = probes[s : s + LOGITS_CHUNK, None]
        la = torch.log_softmax(eager.logits(a[s : s + LOGITS_CHUNK]), dim=-1).gather(1, idx)
        lb = torch.log_softmax(eager.logits(b[s : s + LOGITS_CHUNK]), dim=-1).gather(1, idx)
        worst = _worse(worst, float((la - lb).abs().max()))
    return worst


def nan_max(values) -> float:
    """max that keeps a NaN (Python's max drops it when it is not first); 0 for none."""
    vals = list(values)
    return math.nan if any(math.isnan(v) for v in vals) else max(vals, default=0.0)


def _worse(a: float, b: float) -> float:
    """The larger of two, a NaN on either side winning (it is the loudest failure)."""
    return b if math.isnan(b) or (not math.isnan(a) and b > a) else a


@torch.no_grad()
def lockstep_stats(eager: Engine, graph: GraphSide, case: Case, noise: bool = False) -> LockstepStats:
    """KL (eager's tokens fed to both) and the same-padding difference of every forward of one case; with noise,
    what eager itself shows: run twice at one padding, and padded against unpadded."""
    st = LockstepStats()
    for step in lockstep(eager, graph, case, noise=noise):
        if step.again is not None:
            st.eager_same_padding_rel = _worse(st.eager_same_padding_rel, rel_diff(step.ref, step.again))
        if step.unpadded is not None:
            assert step.probes is not None  # _lockstep_round sets them on every step
            st.padding_noise = _worse(st.padding_noise, _probe_diff(eager, step.ref, step.unpadded, step.probes))
            st.padding_rel = _worse(st.padding_rel, _row_rel(step.unpadded, step.ref))
        k = _kl_rows(eager, step.ref, step.cand)
        if step.decode:
            st.decode_kl = _worse(st.decode_kl, k)
        else:
            st.prompt_kl = _worse(st.prompt_kl, k)
        rel = rel_diff(step.ref, step.cand)
        if not math.isnan(st.same_padding_rel) and (math.isnan(rel) or rel > st.same_padding_rel):
            st.same_padding_rel, st.where = rel, step.label
    return st


@dataclass(frozen=True)
class PieceDiagnosis:
    """Layer 5's answer: the first piece whose output differs from eager (None when none does or none can be told
    apart), in which case and forward, its relative difference, and a sentence for the cell's reason."""

    piece: str | None
    rel_diff: float | None
    note: str

    def __str__(self) -> str:
        return self.note


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖a‖ (NaN when b holds a NaN)."""
    return float((a.float() - b.float()).norm() / a.float().norm().clamp_min(1e-30))


def _row_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max over rows of ‖a_r − b_r‖ / ‖a_r‖: one row's difference does not drown in the others' norm (NaN wins)."""
    a, b = a.float(), b.float()
    rel = (a - b).norm(dim=-1) / a.norm(dim=-1).clamp_min(1e-30)
    return float(rel.max()) if rel.numel() else 0.0  # torch's max keeps a NaN


@torch.no_grad()
def first_diverging_piece(eager: Engine, graph: Engine, case: Case, rtol: float) -> PieceDiagnosis:
    """The first forward of `case` (prefill chunk or decode step) where a piece's output differs from eager at the
    same padding, and that piece. A piece's output is what the next attention receives, so every attention input
    that runs outside a graph (eager, and the holes of piecewise/breakable replay) is compared; the final hidden
    states close the list."""
    for step in lockstep(eager, graph, case, observe=True):
        n = len(step.ref_stages)
        stages = [(f"piece {i} (up to attention {i})", step.ref_stages[i], step.cand_stages.get(i))
                  for i in sorted(step.ref_stages)]
        stages.append((f"piece {n} (after the last attention)", step.ref, step.cand))
        for name, a, b in stages:
            if b is None:
                rel = rel_diff(step.ref, step.cand)
                if rel > rtol:
                    return PieceDiagnosis(None, rel, f"{case.name}, {step.label}: output differs ({rel:.3g}); "
                                          f"{graph.stats.backend} runs attention inside the graph, so pieces "
                                          "cannot be told apart")
                break
            rel = rel_diff(a, b)
            if rel > rtol:
                return PieceDiagnosis(name, rel, f"{case.name}, {step.label}: first diverging {name}, "
                                      f"relative difference {rel:.3g}")
    return PieceDiagnosis(None, None, f"{case.name}: no piece diverges from eager at the same padding, each side on "
                          "its own KV cache, prefill and decode (look at input staging, the bucket choice or what runs "
                          "outside the forward)")
