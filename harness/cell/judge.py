"""The judge: compares a graph run with an eager run of the same weights and gives a status.

Layers: eager twice (differences there are the eager path's, not the graph's); graph
run with crashes classified; greedy tokens with top-k containment at the first divergence (vLLM's
check_logprobs_close rule: a near-tie flip is not a bug, and nothing after it is comparable); logprob
differences on positions where tokens agree, prompt and output, against a per-dtype threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.outcome import Status
from pcg_core.engine import SequenceOutput

# Max |logprob(graph) - logprob(eager)| on agreeing positions. fp32: padded and unpadded GEMMs differ by
# reduction order only (~1e-6 measured); bf16/fp16: one rounding of 2^-8 relative per layer output, summed
# over the stack, moves logits by a few 1e-2 (upstream HF comparisons use ±5e-2 for logprobs).
LOGPROB_TOL = {"float32": 1e-3, "float16": 5e-2, "bfloat16": 1e-1}
# Max KL(eager ‖ graph) at prompt positions. A logprob shift of δ on the likely tokens gives KL ≈ δ²/2, so these
# sit well above what the logprob bounds allow on agreeing tokens while still catching a skewed distribution.
KL_TOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 5e-2}
# Relative difference of a piece's output (graph replay vs eager at the same padding) that names it as the
# first diverging piece; same kernels give 0, so this only has to stay above compiler-level noise.
PIECE_RTOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}


@dataclass
class Judgement:
    """The judge's finding on one candidate: pass or fail_accuracy, why, and the numbers behind it."""

    status: Status
    reason: str
    token_match: float = 1.0
    max_prompt_logprob_diff: float = 0.0
    max_output_logprob_diff: float = 0.0
    topk_containment_ok: bool = True
    divergences: list[str] = field(default_factory=list)


def _diff(a: float, b: float) -> float:
    """|a - b|, with a NaN on either side as infinitely far: max() would drop a NaN, and a NaN logprob is the
    loudest failure there is, not a pass."""
    d = abs(a - b)
    return math.inf if math.isnan(d) else d


def compare(
    ref: dict[str, list[SequenceOutput]], cand: dict[str, list[SequenceOutput]], tol: float
) -> Judgement:
    """Judge candidate outputs against reference outputs, case by case, sequence by sequence."""
    matched = total = 0
    max_p = max_o = 0.0
    containment_ok = True
    notes: list[str] = []
    for case, refs in ref.items():
        cands = cand[case]
        if len(cands) != len(refs):
            return Judgement(Status.FAIL_ACCURACY, f"{case}: {len(cands)} outputs for {len(refs)} prompts", 0.0)
        for i, (r, c) in enumerate(zip(refs, cands)):
            where = f"{case}[{i}]"
            if r.prompt_logprobs is not None and c.prompt_logprobs is not None:
                for a, b in zip(r.prompt_logprobs, c.prompt_logprobs):
                    max_p = max(max_p, _diff(a, b))
            total += len(r.output_ids)
            for t, (a, b) in enumerate(zip(r.output_ids, c.output_ids)):
                if a == b:
                    matched += 1
                    max_o = max(max_o, _diff(r.output_logprobs[t], c.output_logprobs[t]))
                    continue
                ok = a in c.output_topk_ids[t] and b in r.output_topk_ids[t]
                containment_ok &= ok
                notes.append(
                    f"{where}: first divergence at output {t}: eager {a} vs graph {b}"
                    + ("" if ok else " (not in each other's top-k)")
                )
                break
    token_match = matched / total if total else 1.0
    v = Judgement(Status.PASS, "", token_match, max_p, max_o, containment_ok, notes)
    problems = []
    if not containment_ok:
        problems.append("greedy tokens diverge outside top-k: " + "; ".join(n for n in notes if "not in" in n)[:400])
    for side, worst in (("prompt", max_p), ("output", max_o)):
        if worst > tol:
            problems.append(f"{side} logprob diff {worst:.3g} > {tol:g}" + (" (a NaN logprob)" if math.isinf(worst) else ""))
    if problems:
        v.status, v.reason = Status.FAIL_ACCURACY, "; ".join(problems)
    elif notes:
        v.reason = f"{len(notes)} near-tie divergence(s) with top-k containment"
    return v
