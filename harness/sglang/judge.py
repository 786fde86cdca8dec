"""The judge of an SGLang cell: two servers, graphs on and off, are not bitwise comparable, so the verdict is held to
tolerance layers, each measured rather than assumed.

1. **The reference against itself**: the eager server runs the suite twice; beyond the dtype's bounds the cell is
   eager_nondeterministic (nothing could tell the graphs' error from its noise), within them the noise it shows
   widens the bound and the near-tie margin, as pcg's own judge does (harness/cell/judge/tokens.py's rule).
2. **The proof of replay**: the candidate server's own count of prefill forwards a CUDA graph ran, per case. A case
   that fits the prefill graphs (one forward's tokens at most the largest bucket, no chunking) with a forward run
   eagerly, or no graph forward at all, is not a pass: SGLang falls back to eager silently (padding over 2×, above
   the largest bucket, input embeddings), and then the cell would compare eager with eager.
3. **Tokens and logprobs**: the candidate against the reference, greedy tokens (a flip excused only within the
   noise) and logprobs on agreeing positions.
"""

from __future__ import annotations

from collections.abc import Mapping

from harness.cell.judge.tokens import Judgement, compare
from harness.cell.judge.tolerances import logprob_bound, tie_margin
from harness.cell.prompts import Case
from harness.outcome import Status
from harness.sglang.client import GraphPasses
from pcg_core.engine import SequenceOutput

Outputs = Mapping[str, list[SequenceOutput]]


def expects_graphs(case: Case, largest: int) -> bool:
    """Whether every prefill forward of `case` fits the prefill graphs (SGLang may split a request's prefill into
    several forwards, each no wider than the whole)."""
    return case.chunk is None and case.prefill_tokens <= largest


def replay_problems(cases: list[Case], passes: Mapping[str, GraphPasses], largest: int) -> list[str]:
    """Each case that should have replayed and did not, with the server's counts."""
    out = []
    for case in cases:
        p = passes[case.name]
        if expects_graphs(case, largest) and (p.prefill_eager > 0 or p.prefill_graph == 0):
            out.append(f"{case.name}: {p.prefill_graph:g} prefill forward(s) by graph, {p.prefill_eager:g} eager")
    return out


def judge_sglang(cases: list[Case], ref: Outputs, ref_again: Outputs, cand: Outputs,
                 passes: Mapping[str, GraphPasses], largest: int, tol: float) -> tuple[Status, str, Judgement]:
    """The verdict: (status, reason, the candidate's judgement with its numbers)."""
    itself = compare(dict(ref), dict(ref_again), tol)
    if itself.status != Status.PASS:
        return (Status.EAGER_NONDETERMINISTIC, f"the reference server (prefill graphs disabled) against itself: "
                f"{itself.reason}", itself)
    noise = max(itself.max_prompt_logprob_diff, itself.max_output_logprob_diff)
    judgement = compare(dict(ref), dict(cand), logprob_bound(tol, noise), tie_margin(tol, noise))
    if problems := replay_problems(cases, passes, largest):
        return (Status.FAIL_CAPTURE, f"the prefill graphs did not replay for {len(problems)} case(s) that fit them "
                "(an eager fallback is not a pass): " + "; ".join(problems)[:800], judgement)
    return judgement.status, judgement.reason, judgement
