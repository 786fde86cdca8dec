"""Layer 4 of the judge (policy.py numbers the layers): the graph's tokens and logprobs against unpadded eager.

Greedy tokens, where a flip is excused only by evidence — eager's top-2 margin at that position plus the graph's
margin the other way must fit in the movement the noise allows both tokens (each logprob may move by the noise: the
logprob tolerance, or what eager-vs-eager measured if that is more) — and nothing after it is compared (the
contexts differ); logprob differences on positions where tokens agree, prompt and output, against a per-dtype
threshold (tolerances.py). Top-k containment alone excuses nothing: with flat distributions a real bug's flip is
almost always "contained". The same rule holds eager against itself (layer 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.outcome import Status
from pcg_core.engine import SequenceOutput


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
    if e_b is None or g_a is None:  # not contained
        return False, False, f"eager {a} vs graph {b}, not in each other's top-k"
    assert e_a is not None and g_b is not None  # each side's own greedy token is in its own top-k
    e_gap, g_gap = _diff(e_a, e_b), _diff(g_b, g_a)
    excused = e_gap + g_gap <= 2 * margin
    words = "a near-tie" if excused else "beyond the noise"
    return excused, True, (f"eager {a} vs graph {b}, {words}: eager's top-2 margin {e_gap:.3g} + the graph's "
                           f"{g_gap:.3g} {'≤' if excused else '>'} 2 × noise {margin:.3g}")


def _sequence(r: SequenceOutput, c: SequenceOutput, where: str, margin: float, notes: list[str],
              bad: list[str]) -> tuple[float, float, float, int, bool]:
    """One sequence against its eager reference: (worst |Δ| over prompt positions, worst |Δ| over agreeing output
    tokens, the sequence's worst over both, a divergence counting as infinite, the agreeing output tokens, whether a
    flip's tokens were in each other's top-k). A divergence's sentence goes to `notes`, and to `bad` with whatever
    else fails the sequence."""
    prompt = 0.0
    if r.prompt_logprobs is not None and c.prompt_logprobs is not None:
        for a, b in zip(r.prompt_logprobs, c.prompt_logprobs):
            prompt = max(prompt, _diff(a, b))
    if c.cached_tokens != r.cached_tokens:  # the two prefix caches served the prompt otherwise
        bad.append(f"{where}: {c.cached_tokens} prompt tokens from the prefix cache for eager's {r.cached_tokens}")
    if len(c.output_ids) != len(r.output_ids):
        bad.append(f"{where}: {len(c.output_ids)} output tokens for eager's {len(r.output_ids)}")
    output, seq, matched, contained = 0.0, prompt, 0, True
    for t, (a, b) in enumerate(zip(r.output_ids, c.output_ids)):
        if a == b:
            matched += 1
            d = _diff(r.output_logprobs[t], c.output_logprobs[t])
            output, seq = max(output, d), max(seq, d)
            continue
        seq = math.inf
        excused, contained, words = _flip(r, c, t, margin)
        note = f"{where}: first divergence at output {t}: {words}"
        notes.append(note)
        if not excused:
            bad.append(note)
        break
    return prompt, output, seq, matched, contained


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
            prompt, output, seq, agreed, contained = _sequence(r, c, where, margin, notes, bad)
            case_p, case_o = max(case_p, prompt), max(case_o, output)
            matched, total = matched + agreed, total + len(r.output_ids)
            contained_all &= contained
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
