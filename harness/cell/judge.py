"""The judge: compares a graph run with an eager run of the same weights and gives a status.

Layers: eager twice (differences there are the eager path's, not the graph's); graph run with crashes
classified; greedy tokens, where a flip is excused only by evidence — eager's top-2 margin at that position plus
the graph's margin the other way must fit in the movement the noise allows both tokens (each logprob may move by
the noise: the logprob tolerance, or what eager-vs-eager measured if that is more) — and nothing after it is
compared (the contexts differ); logprob differences on positions where tokens agree, prompt and output, against a
per-dtype threshold; KL and the same-padding check (diagnose.py's lockstep). Top-k containment alone excuses
nothing: with flat distributions a real bug's flip is almost always "contained".
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
# With the eager compiler a replay runs eager's own kernels at eager's shapes, so the graph at a bucket matches eager
# padded to that bucket bitwise (the runtime's guarantee, tests/pcg_core/test_gpu.py); this bound only leaves room
# for a nondeterministic kernel that eager-twice did not show. It is what catches, in half precision, an error of
# a percent or so that hides inside the logprob tolerance.
SAME_PADDING_RTOL_EAGER = 1e-3


def same_padding_rtol(dtype: str, compiler: str, eager_noise: float = 0.0) -> float:
    """Max relative difference of any forward's hidden states, graph vs eager at the graph's padding: compiler
    noise, or twice what eager run twice at one padding measured (a nondeterministic kernel), if that is more."""
    base = min(PIECE_RTOL[dtype], SAME_PADDING_RTOL_EAGER) if compiler == "eager" else PIECE_RTOL[dtype]
    return max(base, 2 * eager_noise) if math.isfinite(eager_noise) else base


def logprob_bound(tol: float, padding_noise: float = 0.0) -> float:
    """The bound on |Δlogprob| against unpadded eager: the dtype's tolerance, widened to what eager itself shows
    between the graph's padding and none (eager padded vs unpadded). Those differences are padding's, not the
    graph's: the same-padding check holds the graph to eager at its own padding, and the runtime's own tests hold
    padding rows apart from real ones (tests/pcg_core). Measured on the H200 in bf16: up to 0.1 on dense models
    24 layers deep, 0.24 on Mixtral×2, where a padded GEMM's rounding flips a router's choice of experts."""
    return max(tol, padding_noise) if math.isfinite(padding_noise) else tol


@dataclass
class Judgement:
    """The judge's finding on one candidate: pass or fail_accuracy, why, and the numbers behind it."""

    status: Status
    reason: str
    token_match: float = 1.0
    max_prompt_logprob_diff: float = 0.0
    max_output_logprob_diff: float = 0.0
    topk_containment_ok: bool = True  # every flip's tokens were in each other's top-k (recorded, never an excuse)
    divergences: list[str] = field(default_factory=list)
    failed_cases: list[str] = field(default_factory=list)  # the cases with an unexcused flip or a logprob past tol
    # The sequence farthest from its own eager reference (largest |Δ logprob| over its prompt and agreeing output
    # tokens, a divergence counting as infinite): case[index], or "" when every sequence is equal.
    worst_sequence: str = ""


def tie_margin(tol: float, eager_self_diff: float | None = None) -> float:
    """The noise a token's logprob may move by: the logprob tolerance (what the logprob check itself accepts on
    agreeing tokens), or eager's own run-to-run difference where that is larger. A flip swaps two tokens, each
    moving by at most this, so eager's margin plus the graph's must fit in twice it."""
    measured = eager_self_diff if eager_self_diff is not None and math.isfinite(eager_self_diff) else 0.0
    return max(tol, measured)


def _diff(a: float, b: float) -> float:
    """|a - b|, with a NaN on either side as infinitely far: max() would drop a NaN, and a NaN logprob is the
    loudest failure there is, not a pass."""
    d = abs(a - b)
    return math.inf if math.isnan(d) else d


def _lp(ids: list[int], lps: list[float], token: int) -> float | None:
    """The logprob `token` had in a top-k list, or None when it was not in it."""
    for i, lp in zip(ids, lps):
        if i == token:
            return lp
    return None


def _flip(r: SequenceOutput, c: SequenceOutput, t: int, margin: float) -> tuple[bool, bool, str]:
    """Is the flip at output t a near-tie? (excused, contained, the sentence). Eager's preference for its token
    over the graph's plus the graph's for its own over eager's is how far the two tokens' logprobs swung apart;
    within noise moves of both (2 × margin) it is a near-tie."""
    a, b = r.output_ids[t], c.output_ids[t]
    e_a, e_b = _lp(r.output_topk_ids[t], r.output_topk_logprobs[t], a), _lp(r.output_topk_ids[t], r.output_topk_logprobs[t], b)
    g_a, g_b = _lp(c.output_topk_ids[t], c.output_topk_logprobs[t], a), _lp(c.output_topk_ids[t], c.output_topk_logprobs[t], b)
    contained = e_b is not None and g_a is not None
    if not contained:
        return False, False, f"eager {a} vs graph {b}, not in each other's top-k"
    e_gap, g_gap = _diff(e_a, e_b), _diff(g_b, g_a)
    excused = e_gap + g_gap <= 2 * margin
    words = "a near-tie" if excused else "beyond the noise"
    return excused, True, (f"eager {a} vs graph {b}, {words}: eager's top-2 margin {e_gap:.3g} + the graph's "
                           f"{g_gap:.3g} {'≤' if excused else '>'} 2 × noise {margin:.3g}")


def compare(
    ref: dict[str, list[SequenceOutput]], cand: dict[str, list[SequenceOutput]], tol: float, margin: float | None = None
) -> Judgement:
    """Judge candidate outputs against reference outputs, case by case, sequence by sequence. `margin`: the
    near-tie bound (tie_margin); by default the logprob tolerance."""
    margin = tol if margin is None else margin
    matched = total = 0
    max_p = max_o = 0.0
    contained_all = True
    notes: list[str] = []
    bad: list[str] = []
    failed: list[str] = []
    worst, worst_at = 0.0, ""
    for case, refs in ref.items():
        cands = cand.get(case, [])
        if len(cands) != len(refs):
            return Judgement(Status.FAIL_ACCURACY, f"{case}: {len(cands)} outputs for {len(refs)} prompts", 0.0,
                             failed_cases=[case])
        bad_before, case_p, case_o = len(bad), 0.0, 0.0
        for i, (r, c) in enumerate(zip(refs, cands)):
            where = f"{case}[{i}]"
            seq = 0.0
            if r.prompt_logprobs is not None and c.prompt_logprobs is not None:
                for a, b in zip(r.prompt_logprobs, c.prompt_logprobs):
                    seq = max(seq, _diff(a, b))
            case_p = max(case_p, seq)
            total += len(r.output_ids)
            if c.cached_tokens != r.cached_tokens:  # the two prefix caches served the prompt otherwise
                bad.append(f"{where}: {c.cached_tokens} prompt tokens from the prefix cache for eager's {r.cached_tokens}")
            if len(c.output_ids) != len(r.output_ids):
                bad.append(f"{where}: {len(c.output_ids)} output tokens for eager's {len(r.output_ids)}")
            for t, (a, b) in enumerate(zip(r.output_ids, c.output_ids)):
                if a == b:
                    matched += 1
                    d = _diff(r.output_logprobs[t], c.output_logprobs[t])
                    case_o, seq = max(case_o, d), max(seq, d)
                    continue
                seq = math.inf
                excused, contained, words = _flip(r, c, t, margin)
                contained_all &= contained
                note = f"{where}: first divergence at output {t}: {words}"
                notes.append(note)
                if not excused:
                    bad.append(note)
                break
            if seq > worst:
                worst, worst_at = seq, where
        max_p, max_o = max(max_p, case_p), max(max_o, case_o)
        if len(bad) > bad_before or case_p > tol or case_o > tol:
            failed.append(case)
    token_match = matched / total if total else 1.0
    v = Judgement(Status.PASS, "", token_match, max_p, max_o, contained_all, notes, failed,
                  f"{worst_at} ({'diverges' if math.isinf(worst) else f'{worst:.3g}'})" if worst_at else "")
    problems = []
    if bad:
        problems.append(f"greedy tokens diverge in {len(bad)} sequence(s): " + "; ".join(bad)[:600])
    for side, worst in (("prompt", max_p), ("output", max_o)):
        if worst > tol:
            problems.append(f"{side} logprob diff {worst:.3g} > {tol:g}" + (" (a NaN logprob)" if math.isinf(worst) else ""))
    if problems:
        v.status, v.reason = Status.FAIL_ACCURACY, "; ".join(problems) + f"; worst sequence {v.worst_sequence}"
    elif notes:
        v.reason = f"{len(notes)} near-tie flip(s) within the noise: " + "; ".join(notes)[:600]
    return v
